"""Config checks run before any data is read or anything is compiled.

Every message names the field and the fix. ``check_resume_compatible`` compares a config with the
one saved in a workdir, so resuming with a config that would not fit the checkpoint names the
differing fields instead of failing later with a shape error.
"""

from __future__ import annotations

import json
import os
from typing import Any

import ml_collections

import models

CONFIG_FILE = 'config.json'
# Config fields that may change when a run is resumed (everything else must match).
RESUMABLE_FIELDS = ('train.num_steps', 'train.eval_every', 'train.log_every',
                    'train.checkpoint_every', 'train.keep_checkpoints', 'train.eval_batch_size',
                    'train.compilation_cache_dir', 'train.skip_nonfinite', 'data.data_dir',
                    'data.prefetch', 'mesh.data', 'mesh.fsdp', 'mesh.tensor')


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks the training fields, with messages that name the field and the fix."""
  t, o = config.train, config.optim
  for name in ('num_steps', 'batch_size', 'eval_batch_size', 'eval_every', 'log_every',
               'checkpoint_every', 'keep_checkpoints', 'num_seeds'):
    if t[name] <= 0:
      raise ValueError(f'train.{name} must be > 0, got {t[name]}.')
  if config.data.max_length <= 1:
    raise ValueError(f'data.max_length must be > 1 ([CLS] plus text), got '
                     f'{config.data.max_length}.')
  if o.learning_rate < 0:
    raise ValueError(f'optim.learning_rate must be >= 0, got {o.learning_rate}.')
  if o.grad_accum_steps <= 0 or t.num_steps % o.grad_accum_steps:
    raise ValueError(f'train.num_steps={t.num_steps} must be a positive multiple of '
                     f'optim.grad_accum_steps={o.grad_accum_steps}.')
  if o.warmup_steps < 0 or o.warmup_steps > t.num_steps // o.grad_accum_steps:
    raise ValueError(f'optim.warmup_steps={o.warmup_steps} must be between 0 and the number of '
                     f'optimizer updates ({t.num_steps // o.grad_accum_steps}); shorten the '
                     'warmup or train longer.')


def check_config_applicable(config: ml_collections.ConfigDict) -> None:
  """Raises ValueError if the model options do not fit together (before any data is read)."""
  validate_config(config)
  models.ModelConfig.from_config(config, vocab_size=2, num_classes=2)


def _flatten(d: dict, prefix: str = '') -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f'{prefix}{k}.'))
    else:
      out[f'{prefix}{k}'] = v
  return out


def check_resume_compatible(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses a workdir whose saved config differs in fields that shape the run."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return
  with open(path) as f:
    saved = _flatten(json.load(f))
  current = _flatten(json.loads(config.to_json_best_effort()))
  differing = sorted(k for k in set(saved) | set(current)
                     if k not in RESUMABLE_FIELDS and saved.get(k) != current.get(k))
  if differing:
    details = ', '.join(f'{k}: saved {saved.get(k)!r} vs now {current.get(k)!r}'
                        for k in differing)
    raise ValueError(f'The workdir {workdir} holds a run with a different config ({details}). '
                     'Use a new --workdir, or the saved settings to resume.')


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The resolved config saved by ``train_and_evaluate`` in a workdir."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f'No {CONFIG_FILE} in {workdir!r}: is this the --workdir of a '
                            'train.py run?')
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))
