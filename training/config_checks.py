"""Config checks run before any data is read or anything is compiled.

Every message names the field and the fix. ``check_resume_compatible`` compares a config with the
one saved in a workdir, so resuming with a config that would not fit the checkpoint names the
differing fields instead of failing later with a shape error.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import ml_collections

import models

CONFIG_FILE = 'config.json'
# Config fields that may change when a run is resumed (everything else must match).
RESUMABLE_FIELDS = ('train.num_steps', 'train.eval_every', 'train.log_every',
                    'train.checkpoint_every', 'train.keep_checkpoints', 'train.eval_batch_size',
                    'train.compilation_cache_dir', 'train.skip_nonfinite', 'data.data_dir',
                    'data.prefetch', 'mesh.data', 'mesh.fsdp', 'mesh.tensor', 'mesh.dcn_data',
                    'mesh.dcn_fsdp', 'mesh.dcn_tensor', 'mesh.rules',
                    'model.fused_qkv', 'model.remat')


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks the config before any data is read, with messages that name the field and the fix.

  The training and optimizer fields, the model and rope fields (``models.ModelConfig``:
  position scheme, attention kind, sizes, rotary options), then the dataset and tokenizer names
  (which import the data pipeline, TensorFlow, so the checks before take a second or two).
  """
  _check_training_fields(config)
  _check_model_fields(config)
  _check_data_names(config)  # last: it imports the data pipeline (TensorFlow)


def _check_model_fields(config: ml_collections.ConfigDict) -> None:
  """The model fields (sizes, position scheme, attention, rope), before any data is read."""
  d = config.data
  model_config = models.ModelConfig.from_config(config, vocab_size=2, num_classes=2)
  if model_config.position == 'learned' and model_config.max_length < d.max_length:
    raise ValueError(f'model.max_length={model_config.max_length} is shorter than '
                     f'data.max_length={d.max_length}: model.position=learned has no embedding '
                     'for the later positions. Raise model.max_length (or leave it unset).')


def validate_run_fields(config: ml_collections.ConfigDict) -> None:
  """Checks the train, optim and data fields (what an ablation shares by all its runs)."""
  _check_training_fields(config)
  _check_data_names(config)


def _check_training_fields(config: ml_collections.ConfigDict) -> None:
  t, o = config.train, config.optim
  for name in ('num_steps', 'batch_size', 'eval_batch_size', 'eval_every', 'log_every',
               'checkpoint_every', 'keep_checkpoints', 'num_seeds'):
    if t[name] <= 0:
      raise ValueError(f'train.{name} must be > 0, got {t[name]}: pass a positive integer, '
                       f'e.g. --config.train.{name}={max(1, abs(t[name]) or 1)}.')
  if config.data.max_length <= 1:
    raise ValueError(f'data.max_length must be > 1 ([CLS] plus at least one token), got '
                     f'{config.data.max_length}: pass e.g. --config.data.max_length=64.')
  if o.learning_rate < 0:
    raise ValueError(f'optim.learning_rate must be >= 0, got {o.learning_rate}: pass the peak '
                     'learning rate as a positive number, e.g. --config.optim.learning_rate=1e-3.')
  if o.grad_accum_steps <= 0 or t.num_steps % o.grad_accum_steps:
    raise ValueError(f'train.num_steps={t.num_steps} must be a positive multiple of '
                     f'optim.grad_accum_steps={o.grad_accum_steps}; change one of them.')
  if o.warmup_steps < 0 or o.warmup_steps > t.num_steps // o.grad_accum_steps:
    raise ValueError(f'optim.warmup_steps={o.warmup_steps} must be between 0 and the number of '
                     f'optimizer updates ({t.num_steps // o.grad_accum_steps}); shorten the '
                     'warmup or train longer.')


def _check_data_names(config: ml_collections.ConfigDict) -> None:
  d = config.data
  import data as data_lib  # pylint: disable=g-import-not-at-top  (TensorFlow: only when needed)
  if d.name not in data_lib.DATASET_NAMES:
    raise ValueError(f'data.name={d.name!r} is not a known dataset; valid: '
                     f'{", ".join(data_lib.DATASET_NAMES)}.')
  if d.tokenizer not in data_lib.TOKENIZERS:
    raise ValueError(f'data.tokenizer={d.tokenizer!r} is not valid; valid choices: '
                     f'{", ".join(data_lib.TOKENIZERS)}.')


def check_before_start(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Everything train.py can check in a second or two, before TensorFlow is imported and before
  the workdir is touched: the training, optimizer and model fields, the mesh against the devices,
  the batch sizes against the mesh, a workdir holding another run; then the dataset and tokenizer
  names (which import the data pipeline)."""
  _check_training_fields(config)
  _check_model_fields(config)
  check_devices(config)
  check_resume_compatible(config, os.path.abspath(os.path.expanduser(workdir)))
  _check_data_names(config)


def check_devices(config: ml_collections.ConfigDict, devices=None):
  """Builds the mesh of ``config.mesh`` on ``devices`` (default: all) and checks the batch sizes
  against it, before any data is read. Returns the mesh."""
  import jax  # pylint: disable=g-import-not-at-top
  from training import partitioning  # pylint: disable=g-import-not-at-top
  mesh = partitioning.make_mesh(config.mesh, devices)
  dp, processes = partitioning.data_parallel_size(mesh), jax.process_count()
  for name in ('batch_size', 'eval_batch_size'):
    size = config.train[name]
    if size % dp or size % processes:
      raise ValueError(f'train.{name}={size} is not divisible by the {dp} data-parallel '
                       f'devices and {processes} processes; use a multiple of '
                       f'{math.lcm(dp, processes)}.')
  return mesh


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
  saved = _flatten(_read_json(path))
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
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f'The workdir {workdir!r} does not exist: pass the --workdir of a '
                            'train.py run.')
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f'No {CONFIG_FILE} in {workdir!r}, so it is not the workdir of a '
                            'train.py run (or that run did not get past its start): pass the '
                            '--workdir given to train.py.')
  return ml_collections.ConfigDict(_read_json(path))


def _read_json(path: str) -> dict[str, Any]:
  try:
    with open(path) as f:
      content = json.load(f)
    if not isinstance(content, dict):
      raise ValueError('not a JSON object')
  except (OSError, ValueError) as e:
    raise ValueError(f'{path} is unreadable ({type(e).__name__}: {e}); it holds the config of the '
                     'run in this workdir. Restore it (train.py writes it at the start of a run), '
                     'or use a new --workdir.') from None
  return content
