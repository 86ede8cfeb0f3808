"""``validate(config, workdir)``: every check of a run's config, once, before any data is read,
anything is compiled or the workdir is touched. Every message names the field and the fix; a
workdir whose saved config differs in a field that shapes the run is refused, naming the fields.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Sequence

import jax
import ml_collections

import data
import models
import rope
from data import storage
from training import optim
from training import partitioning

CONFIG_FILE = 'config.json'
# Config fields that may change when a run is resumed (everything else must match).
RESUMABLE_FIELDS = ('train.num_steps', 'train.eval_every', 'train.log_every',
                    'train.checkpoint_every', 'train.keep_checkpoints', 'train.eval_batch_size',
                    'train.compilation_cache_dir', 'train.skip_nonfinite', 'data.data_dir',
                    'data.prefetch', 'mesh.data', 'mesh.fsdp', 'mesh.tensor', 'mesh.dcn_data',
                    'mesh.dcn_fsdp', 'mesh.dcn_tensor', 'mesh.rules', 'model.attention_impl',
                    'model.remat')


def model_config(config: ml_collections.ConfigDict, *, vocab_size: int,
                 num_classes: int) -> models.ModelConfig:
  """The model of a run: the ``model`` and ``rope`` groups plus the data's sizes."""
  return models.ModelConfig(**config.model, rope=rope.RopeConfig(**config.rope),
                            vocab_size=vocab_size, num_classes=num_classes)


def validate(config: ml_collections.ConfigDict, workdir: str | None = None,
             devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """Checks a run's config (and its workdir, if given); returns the mesh over ``devices``."""
  check_run_fields(config)
  check_model(config)
  mesh = check_devices(config, devices)
  if workdir is not None:
    check_resume_compatible(config, workdir)
  return mesh


def check_run_fields(config: ml_collections.ConfigDict) -> None:
  """The train, optim and data fields (what the runs of an ablation share)."""
  t, o, d = config.train, config.optim, config.data
  for name in ('num_steps', 'batch_size', 'eval_batch_size', 'eval_every', 'log_every',
               'checkpoint_every', 'keep_checkpoints', 'num_seeds'):
    if t[name] <= 0:
      raise ValueError(f'train.{name} must be > 0, got {t[name]}: pass a positive integer, '
                       f'e.g. --config.train.{name}={max(1, abs(t[name]) or 1)}.')
  if d.max_length <= 1:
    raise ValueError(f'data.max_length must be > 1 ([CLS] plus at least one token), got '
                     f'{d.max_length}: pass e.g. --config.data.max_length=64.')
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
  optim.learning_rate_schedule(o, t.num_steps // o.grad_accum_steps)  # the schedule's name
  for field, value, valid in (('name', d.name, data.DATASET_NAMES),
                              ('tokenizer', d.tokenizer, data.TOKENIZERS)):
    if value not in valid:
      raise ValueError(f'data.{field}={value!r} is not valid; valid choices: '
                       f'{", ".join(valid)}.')


def check_model(config: ml_collections.ConfigDict) -> models.ModelConfig:
  """The model and rope fields, with placeholder data sizes (the data is not read yet)."""
  cfg = model_config(config, vocab_size=1, num_classes=1)
  if cfg.position == 'learned' and cfg.max_length < config.data.max_length:
    raise ValueError(f'model.max_length={cfg.max_length} is shorter than '
                     f'data.max_length={config.data.max_length}: model.position=learned has no '
                     'embedding for the later positions. Raise model.max_length.')
  return cfg


def check_devices(config: ml_collections.ConfigDict,
                  devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """The mesh of ``config.mesh`` on ``devices`` (default: all), the batch sizes checked on it."""
  mesh = partitioning.make_mesh(config.mesh, devices)
  dp, processes = partitioning.data_parallel_size(mesh), jax.process_count()
  for name in ('batch_size', 'eval_batch_size'):
    size = config.train[name]
    if size % dp or size % processes:
      raise ValueError(f'train.{name}={size} is not divisible by the {dp} data-parallel '
                       f'devices and {processes} processes; use a multiple of '
                       f'{math.lcm(dp, processes)}.')
  return mesh


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


def save_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes the resolved config into the workdir (process 0)."""
  if jax.process_index() == 0:
    storage.write_json(os.path.join(workdir, CONFIG_FILE),
                       json.loads(config.to_json_best_effort()))


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


def _flatten(d: dict, prefix: str = '') -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f'{prefix}{k}.'))
    else:
      out[f'{prefix}{k}'] = v
  return out


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
