"""``train.init_from``: a new run starts from another run's trained weights (fine-tuning).

The source is a ``train.py`` workdir. Its final checkpoint is read, and of a learning-rate sweep
only the members of the rate it chose on that state (``summary.json``). Each member
of the new run takes the source member of its seed (or, when the seeds differ, the source's
members in turn). Every parameter but the classification head is copied, the head too with
``train.init_head`` (same task, e.g. position interpolation's short fine-tune at a longer
length); the optimizer starts fresh. Fields that define the parameters (position scheme, sizes,
tokenizer, and with SentencePiece the dataset, whose vocabulary the source's ``spm.model`` is,
copied into the new workdir) must match the source's: a difference is an error naming the field. Fields that do
not (``rope.*``, lengths, dropout, the optimizer) may change: that is the point of fine-tuning.
A run that resumes from its own checkpoint never reads ``init_from`` again.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import jax
import ml_collections
import numpy as np

import models
from data import tokenizers
from training import checkpoints
from training import validation
from training.metrics import console

SUMMARY_FILE = 'summary.json'
HEAD = 'head'
# Config fields that decide the parameters' names and shapes.
PARAMETER_FIELDS = ('model.size', 'model.position', 'model.attention', 'model.num_layers',
                    'model.hidden_size', 'model.num_heads', 'model.mlp_dim',
                    'model.embedding_size', 'model.norm', 'model.type_vocab_size',
                    'model.shaw_max_distance', 'model.shaw_values', 'model.t5_num_buckets',
                    'data.tokenizer', 'data.sp_vocab_size', 'data.name')


class InitFromError(ValueError):
  """The source cannot initialise this run; the message names the field or file and the fix."""


def _field(config: ml_collections.ConfigDict, dotted: str) -> Any:
  """A field as the run uses it: sizes left at None are the preset's; the SentencePiece fields
  only count with that tokenizer."""
  group, _, name = dotted.partition('.')
  value = config.get(group, {}).get(name)
  if value is None and name in models.SIZED_FIELDS:
    value = models.PRESETS[config.model.size][models.SIZED_FIELDS.index(name)]
  if group == 'data' and name != 'tokenizer' and config.data.tokenizer != 'sentencepiece':
    return None
  return value


def needed(config: ml_collections.ConfigDict, workdir: str) -> bool:
  """Whether a run starts from ``train.init_from``: set, and no checkpoint of its own yet."""
  directory = os.path.join(os.path.expanduser(workdir), checkpoints.CHECKPOINT_DIR)
  own = os.path.isdir(directory) and any(name.isdigit() for name in os.listdir(directory))
  return bool(config.train.init_from) and not own


def check_source(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The source's config, after checking that its parameters fit this run's model."""
  source = config.train.init_from
  try:
    source_config = validation.load_config(os.path.expanduser(source))
  except FileNotFoundError:
    raise InitFromError(f'train.init_from={source!r} is not a train.py workdir (no '
                        f'{validation.CONFIG_FILE} there). Give the workdir of a finished run.'
                        ) from None
  differing = [f'{f} ({_field(source_config, f)!r} there, {_field(config, f)!r} here)'
               for f in PARAMETER_FIELDS if _field(source_config, f) != _field(config, f)]
  if differing:
    raise InitFromError(f'train.init_from={source!r} was trained with other parameters: '
                        f'{"; ".join(differing)}. Set these fields as the source has them (its '
                        'config.json), or initialise from another run.')
  return source_config


def _source_members(source: str, num_members: int) -> tuple[list[int], list[int]]:
  """(member indices, their seeds) of the source's chosen learning rate."""
  path = os.path.join(source, SUMMARY_FILE)
  if os.path.isfile(path):
    with open(path) as f:
      summary = json.load(f)
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


def initial_state(state: Any, exp: Any, config: ml_collections.ConfigDict) -> Any:
  """``state`` (freshly initialised) with its parameters replaced by the source's."""
  source = os.path.abspath(os.path.expanduser(config.train.init_from))
  check_source(config)
  ckpt = checkpoints.Checkpointer(source, 1, read_only=True)
  steps = ckpt.ranked_steps('latest')
  if not steps:
    raise InitFromError(f'train.init_from={source!r} has no checkpoint yet.')
  step, saved = steps[0], ckpt.restore_raw(steps[0])['params']
  chosen, seeds = _source_members(source, len(jax.tree.leaves(saved)[0]))
  members = [chosen[seeds.index(s)] if s in seeds else chosen[i % len(chosen)]
             for i, s in enumerate(exp.seeds)]
  ours = _flat(state.params)
  theirs = {k: v for k, v in _flat(saved).items()
            if config.train.init_head or not k.startswith(HEAD + '/')}
  copied = {k: _mapped(ours[k], v, members, k) for k, v in theirs.items() if k in ours}
  unexpected, fresh = sorted(set(theirs) - set(ours)), sorted(set(ours) - set(theirs))
  console(f'Initialised {len(copied)} of {len(ours)} parameter arrays from {source} (step '
          f'{step}, members {members}); newly initialised: {", ".join(fresh) or "none"}; '
          f'unused from the source: {", ".join(unexpected) or "none"}.')
  params = _unflat(state.params, {k: copied.get(k) for k in ours})
  return state.replace(params=params)


def copy_tokenizer(config: ml_collections.ConfigDict, workdir: str) -> None:
  """With SentencePiece, the source's vocabulary: its model file, unless the run has one."""
  if config.data.tokenizer != 'sentencepiece':
    return
  source = os.path.expanduser(config.train.init_from)
  for name in (tokenizers.SP_MODEL_FILE, tokenizers.SP_META_FILE):
    if not os.path.exists(os.path.join(workdir, name)):
      shutil.copyfile(os.path.join(source, name), os.path.join(workdir, name))


def _flat(tree: Any) -> dict[str, Any]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(p, simple=True, separator='/'): leaf for p, leaf in leaves}


def _unflat(tree: Any, values: dict[str, np.ndarray | None]) -> Any:
  """``tree`` with the leaves that ``values`` gives (None: kept), on the leaves' shardings."""
  def put(path, leaf):
    new = values[jax.tree_util.keystr(path, simple=True, separator='/')]
    if new is None:
      return leaf
    return jax.make_array_from_callback(leaf.shape, leaf.sharding, lambda index: new[index])
  return jax.tree_util.tree_map_with_path(put, tree)
