"""A fine-tune's model comes from its source (``train.init_from``), as ``from_pretrained``'s does:
the fields that shape the parameters are the source run's unless the command line sets them
(``init_from.check_source`` refuses those that cannot load). They are filled into the ConfigDict
before the ``RunConfig`` is built, so the run's config is built and checked once.
"""

from __future__ import annotations

from typing import Any, Collection

import ml_collections

import models
import settings
import storage
from training import validation
from training.config import PARAMETER_FIELDS, RunConfig

# The dataset is the fine-tune's own (a SentencePiece vocabulary is tied to it: check_source).
_NOT_CARRIED = ('data.name',)
# A vocabulary trained in the source (wordpiece, bpe) is read from its tokenizer.json
# (init_from.copy_tokenizer); training a new one would give the ids another meaning.
_TOKENIZER = {'wordpiece': 'huggingface', 'bpe': 'huggingface'}


def shaping_fields(source: RunConfig) -> tuple[str, ...]:
  """The PARAMETERS fields of ``source``, and model.max_length where its scheme stops there."""
  return PARAMETER_FIELDS + (('model.max_length',) if models.has_max_length(source.model.position)
                             else ())


def carried(source: RunConfig, explicit: Collection[str] = ()) -> dict[str, Any]:
  """The dotted fields a fine-tune of ``source`` takes from it, but those in ``explicit``."""
  values = validation.flatten(settings.to_dict(source))
  # A list-valued field as the command line gives it (comma-separated), the ConfigDict's type.
  fields = {f: ','.join(map(str, values[f])) if isinstance(values[f], list) else values[f]
            for f in shaping_fields(source) if f not in _NOT_CARRIED}
  fields['data.tokenizer'] = _TOKENIZER.get(source.data.tokenizer, source.data.tokenizer)
  return {f: v for f, v in fields.items() if f not in explicit}


def with_source_model(config: ml_collections.ConfigDict,
                      explicit: Collection[str]) -> ml_collections.ConfigDict:
  """``config`` with its source run's model fields but ``explicit`` (the command line's)."""
  if not (source := config.train.init_from):
    return config
  try:
    source_config = validation.load_config(storage.canonical(source))
  except (OSError, ValueError):
    return config
  if not (changes := carried(source_config, explicit)):
    return config
  filled = ml_collections.ConfigDict(config.to_dict())  # the flags' ConfigDict is locked
  filled.update_from_flattened_dict(changes)
  return filled
