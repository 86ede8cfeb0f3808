"""``validate(config, workdir)``: every check of a run, once, before any data is read, anything
is compiled or the workdir is touched; every message names the field and the fix."""

from __future__ import annotations

import functools
import math
import os
from typing import Any, NamedTuple, Sequence

from flax import traverse_util
import jax
import ml_collections

import data
import models
import storage
from data import datasets
from data import sources
from data.config import DataConfig
import settings
from settings import groups
from training import checkpoints
from training import partitioning
from training.config import FIXED_ON_RESUME, RunConfig, run_config

CONFIG_FILE = 'config.json'
DATA_FILE = 'data_fingerprint.json'
flatten = functools.partial(traverse_util.flatten_dict, sep='.')  # keys as the flags name fields


def model_config(config: RunConfig | ml_collections.ConfigDict, *, vocab_size: int,
                 num_classes: int) -> models.ModelConfig:
  """The model of a run: the ``model`` and ``rope`` groups plus the data's sizes."""
  return run_config(config).model_config(vocab_size=vocab_size, num_classes=num_classes)


class Validated(NamedTuple):
  """What the checks decide: the placement and the data fingerprint."""

  placement: partitioning.Placement
  fingerprint: dict[str, Any]


def validate(config: RunConfig, workdir: str | None = None,
             devices: Sequence[jax.Device] | None = None) -> Validated:
  """Checks a run's devices and workdir (its groups are checked as they are built)."""
  placement = check_devices(config, devices)
  fingerprint = data_fingerprint(config.data)
  if workdir is not None:
    check_resume_compatible(config, check_workdir(workdir), fingerprint)
  return Validated(placement, fingerprint)


def check_workdir(workdir: str) -> str:
  """The absolute workdir; ValueError if it is empty or names something that is not a folder."""
  if not str(workdir).strip():
    raise ValueError('--workdir is empty: name the folder for the checkpoints, metrics and '
                     'results, e.g. --workdir=runs/first (a new folder is created).')
  workdir = storage.canonical(workdir)
  if storage.exists(workdir) and not storage.is_dir(workdir):
    raise ValueError(f'--workdir={workdir} is a file, not a folder: choose a new folder name '
                     '(it is created) or an existing run\'s folder.')
  return workdir


def check_devices(config: RunConfig,
                  devices: Sequence[jax.Device] | None = None) -> partitioning.Placement:
  """The placement of ``config.mesh`` on ``devices`` (default: all), the batch sizes checked on
  it. A per-device batch size makes the global one; the evaluation's is then rounded up to a
  multiple of the data-parallel devices and processes (one command fits any slice)."""
  mesh, t = partitioning.make_mesh(config.mesh, devices), config.train
  dp, processes = partitioning.data_parallel_size(mesh), jax.process_count()
  unit, eval_size = math.lcm(dp, processes), t.eval_batch_size
  if t.per_device_batch_size:
    eval_size = math.ceil(eval_size / unit) * unit
  placement = partitioning.Placement(mesh, partitioning.logical_rules(config.mesh),
                                     t.batch_size or t.per_device_batch_size * dp, eval_size)
  for name in ('batch_size', 'eval_batch_size'):
    if (size := getattr(placement, name)) % unit:
      raise ValueError(f'train.{name}={size} is not divisible by the {dp} data-parallel '
                       f'devices and {processes} processes; use a multiple of {unit}.')
  sources.check_shards(config.data.num_shards, placement.batch_size)
  impl = config.model.attention_impl
  if impl in models.config.PALLAS_SCHEMES and mesh.size > 1:
    raise ValueError(f'model.attention_impl={impl} runs on one device only: the Pallas kernel is '
                     'not wrapped in shard_map yet, and XLA cannot partition it over the '
                     f'{mesh.size} devices of this mesh. Use chunked, xla or cudnn here.')
  return placement


def has_checkpoints(workdir: str) -> bool:
  """Whether the workdir holds a checkpoint (only then is there a run to resume)."""
  directory = os.path.join(storage.canonical(workdir), checkpoints.CHECKPOINT_DIR)
  if not any(n.isdigit() for n in storage.listdir(directory)):
    return False
  # Only orbax knows which are complete: on object storage a step's folder exists while it is
  # written (a run killed during its first save has none to resume).
  try:
    ckpt = checkpoints.Checkpointer(workdir, 1, read_only=True)
  except checkpoints.CheckpointError:  # corrupt steps, which the run's own start sets aside
    return True
  try:
    return bool(ckpt.all_steps())
  finally:
    ckpt.close()


def config_differences(saved: RunConfig, config: RunConfig, fields: Sequence[str]) -> list[str]:
  """'field: saved X vs now Y' for every one of the dotted ``fields`` that differs, bar the fields
  of schemes the run does not use."""
  saved_values, current = flatten(settings.to_dict(saved)), flatten(settings.to_dict(config))
  unread = (models.unread_fields(saved.model.position)
            if saved.model.position == config.model.position else set())
  return [f'{k}: saved {saved_values[k]!r} vs now {current[k]!r}'
          for k in sorted(fields) if k not in unread and saved_values[k] != current[k]]


def check_resume_compatible(config: RunConfig, workdir: str, fingerprint: dict[str, Any]) -> None:
  """Refuses to resume a run whose saved config differs in fields that shape it, or whose data
  changed (a workdir without checkpoints takes any config)."""
  if not has_checkpoints(workdir):
    return
  # A field added since the run started has its default there.
  if storage.exists(os.path.join(workdir, CONFIG_FILE)) and (
      differing := config_differences(load_config(workdir), config, FIXED_ON_RESUME)):
    raise ValueError(f'The workdir {workdir} holds a run with a different config '
                     f'({", ".join(differing)}). Use a new --workdir, or the saved settings '
                     'to resume.')
  path = os.path.join(workdir, DATA_FILE)
  if storage.exists(path) and (changed := data_changes(_read_json(path), fingerprint)):
    raise ValueError(f'The data of the run in {workdir} changed since it started: '
                     f'{"; ".join(changed)}. Resuming would train on other examples: restore '
                     'the file(s), or use a new --workdir.')


_EMBEDDED = 'embedded dataset '  # the fingerprint key of an embedded dataset's version


def data_fingerprint(data_config: DataConfig) -> dict[str, Any]:
  """Size and SHA-256 of each of the user's data files; an embedded dataset's version; {} for TFDS
  datasets (versioned, and prepared elsewhere)."""
  entry = data.DATASETS.get(data_config.name)
  if entry and entry.kind == 'embedded':
    builder = datasets.embedded_builder(data_config.name, data_config.data_dir)
    return {f'{_EMBEDDED}{data_config.name}': {'version': str(builder.version)}}
  if data_config.name != 'files':
    return {}
  paths = {*data_config.train_files, *data_config.validation_files, *data_config.test_files}
  return {storage.canonical(p): {'size': storage.size(p), 'sha256': storage.sha256(p)}
          for p in sorted(paths) if storage.is_file(p)}


def data_changes(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
  """One phrase per file or embedded dataset that differs."""
  changes = []
  for key in sorted(set(saved) | set(now)):
    if saved.get(key) == now.get(key) or (key.startswith(_EMBEDDED) and key not in saved):
      continue
    if key.startswith(_EMBEDDED):
      changes.append(f'the {key} is version {now.get(key, {}).get("version")} now, '
                     f'{saved[key]["version"]} when this run was made')
    else:
      changes.append(f'{key} ' + ('is gone' if key not in now else 'is new' if key not in saved
                                  else f'has other content ({saved[key]["size"]} bytes before, '
                                  f'{now[key]["size"]} now)'))
  return changes


def save_config(config_dict: dict[str, Any], workdir: str,
                fingerprint: dict[str, Any] | None) -> None:
  """Writes the resolved config and, unless None, the data fingerprint (process 0)."""
  if jax.process_index() != 0:
    return
  storage.write_json(os.path.join(workdir, CONFIG_FILE), config_dict)
  if fingerprint is not None:
    storage.write_json(os.path.join(workdir, DATA_FILE), fingerprint)


def load_config(workdir: str) -> RunConfig:
  """A workdir's saved config; a field added since takes its default, one removed is dropped."""
  if not storage.is_dir(workdir):
    raise FileNotFoundError(f'The workdir {workdir!r} does not exist: pass the --workdir of a '
                            'train.py run.')
  path = os.path.join(workdir, CONFIG_FILE)
  if not storage.exists(path):
    raise FileNotFoundError(f'No {CONFIG_FILE} in {workdir!r}, so it is not the workdir of a '
                            'train.py run (or that run did not get past its start): pass the '
                            '--workdir given to train.py.')
  saved = _read_json(path)
  if missing := [g for g in groups(RunConfig) if not isinstance(saved.get(g), dict)]:
    kind = 'a Hugging Face config' if 'model_type' in saved else 'not a train.py config'
    raise ValueError(f'{path} is {kind} (it has no {", ".join(missing)} group), so the settings '
                     f'of the run in {workdir} are unknown. Restore the file from a backup, or '
                     'retrain; export_hf.py and convert_hf.py write into other folders.')
  if saved['data'].get('name') == 'files':
    saved['data'].setdefault('quoting', 'csv')  # how .tsv files were read before the field
  return run_config(saved, strict=False)


def _read_json(path: str) -> dict[str, Any]:
  try:
    content = storage.read_json(path)
    if not isinstance(content, dict):
      raise ValueError('not a JSON object')
  except (OSError, ValueError) as e:
    raise ValueError(f'{path} is unreadable ({type(e).__name__}: {e}); it holds the config of the '
                     'run in this workdir. Restore it (train.py writes it at the start of a run), '
                     'or use a new --workdir.') from None
  return content
