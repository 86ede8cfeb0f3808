"""``train.init_from``: a new run starts from pre-trained weights (fine-tuning).

The source is a ``train.py`` workdir (its newest checkpoint; of a sweep, the members of the rate
it chose), a Hugging Face RoFormer checkpoint or a ``scripts/convert_hf.py`` output. The fields
that shape the parameters must match the source's (training/carry.py); every parameter but the
head (with ``train.init_head`` it too) is copied, the optimizer starts fresh.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import jax
import numpy as np

import rope
import settings
import storage
from data import tokenizers
from interop import converted, hf
from training import carry
from training import checkpoints
from training import validation
from training.config import PARAMETER_FIELDS, RunConfig
from training.metrics import console

SUMMARY_FILE = 'summary.json'
HEAD = 'head'
# A checkpoint (Hugging Face, or converted) was trained by another codebase: besides the fields
# that shape the parameters, those that decide how they are read (the rope fields an evaluation
# may not change: base, layout, rotary_value, ...) must be its own.
_CHECKPOINT_FIELDS = PARAMETER_FIELDS + tuple(
    f'rope.{f.name}' for f in settings.declared(rope.RopeConfig) if not f.metadata['evaluation'])


class InitFromError(ValueError):
  """The source cannot initialise this run; the message names the field or file and the fix."""


def _field(config: RunConfig, dotted: str) -> Any:
  """A field as the run uses it (a preset's sizes; the data fields only with SentencePiece)."""
  group, _, name = dotted.partition('.')
  if group == 'data' and name != 'tokenizer' and config.data.tokenizer != 'sentencepiece':
    return None
  sizes = config.model.sizes() if group == 'model' else {}
  return sizes[name] if name in sizes else getattr(getattr(config, group), name)


def needed(config: RunConfig, workdir: str) -> bool:
  """Whether a run starts from ``train.init_from``: set, and no checkpoint of its own."""
  return bool(config.train.init_from) and not validation.has_checkpoints(workdir)


def _kind(source: str) -> str:
  """'workdir', 'huggingface' or 'converted'; InitFromError if none."""
  if converted.is_converted(source):
    return 'converted'
  try:
    config = storage.read_json(os.path.join(source, validation.CONFIG_FILE))
    return 'huggingface' if 'model_type' in config else 'workdir'
  except (OSError, ValueError):
    raise InitFromError(f'train.init_from={source!r} is not a train.py workdir, a Hugging Face '
                        f'checkpoint directory or a convert_hf.py output (no readable '
                        f'{validation.CONFIG_FILE} or {converted.CONVERTED_METADATA} there). '
                        'Give the folder of a finished run or of a checkpoint.') from None


class Source(NamedTuple):
  """Where a run's first parameters come from (``check_source``)."""

  path: str  # canonical
  kind: str  # 'workdir', 'huggingface' or 'converted'
  init_head: bool  # train.init_head


def check_source(config: RunConfig) -> Source:
  """Checks that the source's parameters fit this run's model (InitFromError naming fields)."""
  source = storage.canonical(config.train.init_from)
  kind = _kind(source)
  if config.data.tokenizer in ('wordpiece', 'bpe'):
    raise InitFromError(
        f'data.tokenizer={config.data.tokenizer} would train a new vocabulary for this run, '
        f'whose ids mean nothing to the parameters of train.init_from={source!r}. Fine-tune '
        'with the source\'s tokenizer: --config.data.tokenizer=huggingface (its tokenizer.json '
        'is copied into this workdir).')
  if kind == 'workdir':
    if storage.is_file(os.path.join(source, SUMMARY_FILE)):  # before the workdir is touched
      seeds = [config.train.seed + i for i in range(config.train.num_seeds)]
      member_map(*_source_members(source, 1), seeds)
    source_config = validation.load_config(source)
    theirs = {f: _field(source_config, f) for f in carry.shaping_fields(source_config)}
    if (theirs['data.tokenizer'] in ('wordpiece', 'bpe') and config.data.tokenizer == 'huggingface'
        and not config.data.tokenizer_path):
      theirs['data.tokenizer'] = 'huggingface'  # its tokenizer.json is copied (copy_tokenizer)
  else:
    given = converted.checkpoint_fields(source, config.rope.layout)
    theirs = {f: given[f] for f in _CHECKPOINT_FIELDS if f in given}
  if differing := {f: v for f, v in theirs.items() if v != _field(config, f)}:
    raise InitFromError(
        f'train.init_from={source!r} holds parameters for another model: '
        + '; '.join(f'{f} ({v!r} there, {_field(config, f)!r} here)' for f, v in differing.items())
        + '. Set these fields as the source has them: '
        + ' '.join(f'--config.{f}={_flag(v)}' for f, v in differing.items()) + '.')
  return Source(source, kind, config.train.init_head)


def _flag(value: Any) -> Any:
  return ','.join(map(str, value)) if isinstance(value, (tuple, list)) else value


def _source_members(source: str, num_members: int) -> tuple[list[int], list[int]]:
  """(member indices, their seeds) of the source's chosen learning rate."""
  path = os.path.join(source, SUMMARY_FILE)
  if storage.is_file(path):
    summary = storage.read_json(path)
    return summary['chosen_members'], [summary['seeds'][i] for i in summary['chosen_members']]
  if num_members > 1:
    raise InitFromError(f'train.init_from={source!r} has no {SUMMARY_FILE} yet, so which of its '
                        f'{num_members} members to take is not known: let it finish first.')
  return [0], [None]


def _mapped(target: np.ndarray, saved: np.ndarray, members: list[int], path: str) -> np.ndarray:
  if saved.shape[1:] != target.shape[1:]:
    raise InitFromError(f'train.init_from: parameter {path} is {list(saved.shape[1:])} there '
                        f'and {list(target.shape[1:])} here (a vocabulary, class count or '
                        'length differs). Match the source, or leave this parameter out.')
  return saved[np.asarray(members)].astype(target.dtype)


def _newest_intact(source: str) -> tuple[int, Any]:
  """(step, parameters) of the source's newest intact checkpoint; InitFromError if none."""
  try:
    ckpt = checkpoints.Checkpointer(source, 1, read_only=True)
  except checkpoints.CheckpointError as e:
    raise InitFromError(f'train.init_from={source!r} has no usable checkpoint: {e}') from None
  reasons = []
  try:
    for step in ckpt.ranked_steps('latest'):
      try:
        params = ckpt.restore_raw(step)['params']
        if reasons:
          console(f'train.init_from={source!r}: {"; ".join(reasons)}; starting from its step '
                  f'{step}, the newest intact one.', warning=True)
        return step, params
      except checkpoints.CorruptCheckpointError as e:
        reasons.append(f'step {step} is corrupt ({e.reason})')
  finally:
    ckpt.close()
  raise InitFromError(f'train.init_from={source!r} has no ' + (
      f'usable checkpoint ({"; ".join(reasons)}): restore it from a backup, or start from '
      'another run.' if reasons else 'checkpoint yet: let it train first.'))


def member_map(source_members: list[int], source_seeds: list, seeds: list[int]) -> list[int]:
  """The source member each of ``seeds`` starts from: the one of its seed, else the others in
  turn (one source member: all of it). InitFromError where two distinct seeds would start alike
  from a source of several members (the paired statistics take seeds as independent)."""
  distinct = list(dict.fromkeys(seeds))
  if len(source_members) > 1 and len(distinct) > len(source_members):
    raise InitFromError(
        f'train.init_from holds {len(source_members)} members of its chosen learning rate '
        f'(seeds {source_seeds}), too few for train.num_seeds={len(distinct)} here: some members '
        'would start from the same source member, so their seeds would not be independent. Set '
        f'--config.train.num_seeds={len(source_members)} or fewer, or train the source with more '
        'seeds.')
  left = [m for m, s in zip(source_members, source_seeds) if s not in distinct]
  start = {s: source_members[source_seeds.index(s)] if s in source_seeds else left.pop(0)
           if left else source_members[0] for s in distinct}
  return [start[s] for s in seeds]


def _from_workdir(source: str, exp: Any) -> tuple[Any, list[int], str]:
  """(params with a member axis, the source member of each of ours, a description)."""
  step, saved = _newest_intact(source)
  chosen, seeds = _source_members(source, len(jax.tree.leaves(saved)[0]))
  members = member_map(chosen, seeds, exp.seeds)
  return saved, members, f'step {step}, members {members}'


def _from_checkpoint(source: str, kind: str, exp: Any) -> tuple[Any, list[int], str]:
  """As ``_from_workdir``, for a Hugging Face checkpoint or a conversion."""
  result = converted.load_checkpoint(source, exp.model_config)
  if result.cfg.vocab_size != exp.model_config.vocab_size:
    raise InitFromError(f'train.init_from={source!r} has a vocabulary of {result.cfg.vocab_size} '
                        f'tokens, this run\'s tokenizer {exp.model_config.vocab_size}: fine-tune '
                        'with the checkpoint\'s tokenizer (--config.data.tokenizer=huggingface; '
                        'data.tokenizer_path defaults to the checkpoint).')
  saved = jax.tree.map(lambda x: np.asarray(x)[None], result.params)
  return saved, [0] * len(exp.seeds), f'{kind} checkpoint'


def initial_state(state: Any, exp: Any, checked: Source) -> Any:
  """``state`` with its parameters replaced by the ``checked`` source's."""
  source, kind = checked.path, checked.kind
  saved, members, described = (_from_workdir(source, exp) if kind == 'workdir'
                               else _from_checkpoint(source, kind, exp))
  if len(set(members)) == 1 and len(set(exp.seeds)) > 1:
    described += ('; every seed starts from this one source member, so the spread over seeds is '
                  'fine-tuning noise only')
  ours = _flat(state.params)
  theirs = {k: v for k, v in _flat(saved).items()
            if checked.init_head or not k.startswith(HEAD + '/')}
  copied = {k: _mapped(ours[k], v, members, k) for k, v in theirs.items() if k in ours}
  # Each array is named once: ours not copied (the head, unless init_head), or the source's
  # without a counterpart here (a pre-trained language model's prediction head).
  fresh = sorted(set(ours) - set(copied))
  unused = sorted(set(_flat(saved)) - set(ours))
  head = ' (train.init_head=False: the source\'s head is not copied)' if any(
      k.startswith(HEAD + '/') for k in fresh) and not checked.init_head else ''
  console(f'Initialised {len(copied)} of {len(ours)} parameter arrays from {source} '
          f'({described}); newly initialised: {", ".join(fresh) or "none"}{head}; unused from '
          f'the source: {", ".join(unused) or "none"}.')

  def put(path, leaf):  # a copied array on the leaf's sharding
    new = copied.get(_key(path))
    return leaf if new is None else jax.make_array_from_callback(leaf.shape, leaf.sharding,
                                                                 lambda index: new[index])
  return state.replace(params=jax.tree_util.tree_map_with_path(put, state.params))


def copy_tokenizer(config: RunConfig, workdir: str) -> None:
  """The source's SentencePiece model or tokenizer.json, unless the run has one."""
  source = storage.canonical(config.train.init_from)
  if config.data.tokenizer == 'sentencepiece':
    names = (tokenizers.SP_MODEL_FILE, tokenizers.SP_META_FILE)
  elif config.data.tokenizer == 'huggingface' and not config.data.tokenizer_path:
    names = (tokenizers.HF_TOKENIZER_FILE,)
  else:
    return
  for name in names:
    target = os.path.join(workdir, name)
    if storage.exists(target):
      continue
    if _kind(source) == 'workdir':
      storage.copy_file(os.path.join(source, name), target)
    else:
      hf.copy_tokenizer(source, target)


def _key(path) -> str:
  return jax.tree_util.keystr(path, simple=True, separator='/')


def _flat(tree: Any) -> dict[str, Any]:
  return {_key(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
