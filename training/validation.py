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
from data import datasets
import rope
from configs import default
from settings import lists
from data import sources
import storage
from training import checkpoints
from training import metrics
from training import optim
from training import partitioning

CONFIG_FILE = 'config.json'
MEMBER_MODES = ('auto', 'vmap', 'loop')
_GROUPS = ('model', 'rope', 'optim', 'data', 'train', 'mesh')  # every run config's
DATA_FILE = 'data_fingerprint.json'
# Config fields that may change when a run is resumed (everything else must match).
RESUMABLE_FIELDS = ('train.num_steps', 'train.eval_every', 'train.log_every',
                    'train.checkpoint_every', 'train.keep_checkpoints', 'train.eval_batch_size',
                    'train.compilation_cache_dir', 'train.skip_nonfinite', 'data.data_dir',
                    'train.eval_max_length', 'train.members',
                    'data.prefetch', 'mesh.data', 'mesh.fsdp', 'mesh.tensor', 'mesh.dcn_data',
                    'mesh.dcn_fsdp', 'mesh.dcn_tensor', 'mesh.rules', 'model.attention_impl',
                    'model.attention_chunk_size', 'train.init_from', 'train.init_head',
                    'model.remat', 'train.profile_steps', 'train.wandb_project')


def model_config(config: ml_collections.ConfigDict, *, vocab_size: int,
                 num_classes: int) -> models.ModelConfig:
  """The model of a run: the ``model`` and ``rope`` groups plus the data's sizes."""
  return models.ModelConfig(**config.model, rope=rope.RopeConfig(**config.rope),
                            task=config.train.task, vocab_size=vocab_size, num_classes=num_classes)


def validate(config: ml_collections.ConfigDict, workdir: str | None = None,
             devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """Checks a run's config (and its workdir, if given); returns the mesh over ``devices``."""
  if workdir is not None:
    workdir = check_workdir(workdir)
  check_run_fields(config)
  check_model(config)
  mesh = check_devices(config, devices)
  if workdir is not None:
    check_resume_compatible(config, workdir)
  return mesh


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


def _check_groups(config: ml_collections.ConfigDict) -> None:
  if not isinstance(config, ml_collections.ConfigDict):
    raise ValueError(f'The config is a {type(config).__name__}, not an ml_collections.ConfigDict: '
                     'get_config() must return a ConfigDict (see configs/default.py).')
  missing = [g for g in _GROUPS if g not in config]
  if missing:
    raise ValueError(f'The config has no {", ".join(missing)} group(s): start from '
                     'configs/default.get_config() and change what differs.')


def _check_optimizer(o: ml_collections.ConfigDict) -> None:
  """Finite hyper-parameters in their ranges (a NaN passes every comparison, so test for it)."""
  for field, value, ok, rule in (
      ('learning_rate', o.learning_rate, o.learning_rate > 0, '> 0'),
      ('b1', o.b1, 0 <= o.b1 < 1, 'in [0, 1)'), ('b2', o.b2, 0 <= o.b2 < 1, 'in [0, 1)'),
      ('eps', o.eps, o.eps > 0, '> 0'), ('weight_decay', o.weight_decay, o.weight_decay >= 0,
                                         '>= 0'),
      ('grad_clip_norm', o.grad_clip_norm, o.grad_clip_norm >= 0, '>= 0 (0: off)'),
      ('position_lr_multiplier', o.position_lr_multiplier, o.position_lr_multiplier >= 0,
       '>= 0'),
      ('end_lr_factor', o.end_lr_factor, 0 <= o.end_lr_factor <= 1, 'in [0, 1]'),
      ('layer_decay', o.layer_decay, 0 < o.layer_decay <= 1, 'in (0, 1] (1: off)')):
    if not (math.isfinite(value) and ok):
      raise ValueError(f'optim.{field} must be a finite number {rule}, got {value}: fix '
                       f'--config.optim.{field}.')


def check_run_fields(config: ml_collections.ConfigDict) -> None:
  """The train, optim and data fields (what the runs of an ablation share)."""
  _check_groups(config)
  t, o, d = config.train, config.optim, config.data
  if (t.batch_size > 0) == (t.per_device_batch_size > 0) or min(t.batch_size,
                                                                t.per_device_batch_size) < 0:
    raise ValueError(f'Set exactly one of train.batch_size (global, got {t.batch_size}) and '
                     f'train.per_device_batch_size (per data-parallel device, got '
                     f'{t.per_device_batch_size}); the other must be 0, e.g. '
                     '--config.train.batch_size=0 --config.train.per_device_batch_size=4.')
  for name in ('num_steps', 'eval_batch_size', 'eval_every', 'log_every',
               'checkpoint_every', 'keep_checkpoints', 'num_seeds'):
    if t[name] <= 0:
      raise ValueError(f'train.{name} must be > 0, got {t[name]}: pass a positive integer, '
                       f'e.g. --config.train.{name}={max(1, abs(t[name]) or 1)}.')
  if t.profile_steps:
    metrics.parse_step_window(t.profile_steps)
  if d.max_length <= 1:
    raise ValueError(f'data.max_length must be > 1 ([CLS] plus at least one token), got '
                     f'{d.max_length}: pass e.g. --config.data.max_length=64.')
  _check_optimizer(o)
  if o.grad_accum_steps <= 0 or t.num_steps % o.grad_accum_steps:
    raise ValueError(f'train.num_steps={t.num_steps} must be a positive multiple of '
                     f'optim.grad_accum_steps={o.grad_accum_steps}; change one of them.')
  # LRA Retrieval's recipe warms up for 8,000 of its 5,000 steps ('rsqrt' then only warms up).
  if o.warmup_steps < 0 or (o.warmup_steps > t.num_steps // o.grad_accum_steps
                            and o.schedule != 'rsqrt'):
    raise ValueError(f'optim.warmup_steps={o.warmup_steps} must be between 0 and the number of '
                     f'optimizer updates ({t.num_steps // o.grad_accum_steps}); shorten the '
                     'warmup or train longer.')
  optim.schedule_shape(o, t.num_steps // o.grad_accum_steps)  # the schedule's name
  optim.learning_rates(o)
  if not 0 < d.mask_rate < 1 or d.eval_tokens <= 0:
    raise ValueError(f'data.mask_rate must be in (0, 1) and data.eval_tokens > 0, got '
                     f'{d.mask_rate} and {d.eval_tokens}.')
  lists.parse(d.eval_lengths, 'data.eval_lengths', int, example='128,256')
  for field, value, valid in (('data.name', d.name, data.DATASET_NAMES),
                              ('train.task', t.task, models.TASKS),
                              ('data.tokenizer', d.tokenizer, data.TOKENIZERS),
                              ('train.members', t.members, MEMBER_MODES)):
    if value not in valid:
      raise ValueError(f'{field}={value!r} is not valid; valid choices: '
                       f'{", ".join(valid)}.')


def check_model(config: ml_collections.ConfigDict) -> models.ModelConfig:
  """The model and rope fields, with placeholder data sizes (the data is not read yet)."""
  cfg = model_config(config, vocab_size=1, num_classes=1)
  if cfg.position == 'learned' and cfg.max_length < config.data.max_length:
    raise ValueError(f'model.max_length={cfg.max_length} is shorter than '
                     f'data.max_length={config.data.max_length}: model.position=learned has no '
                     'embedding for the later positions. Raise model.max_length.')
  if cfg.language_model:
    fields = _tfds_fields(config.data.name)
    if fields and fields.pair:
      raise ValueError(f'data.name={config.data.name!r} is a sentence-pair task; pre-train '
                       '(train.task mlm or clm) on a corpus or a one-text dataset.')
    return cfg
  _check_labels(config.data)
  _check_pairs(config.data, cfg)
  return cfg


def _tfds_fields(name: str) -> data.TextFields | None:
  """How a labelled TFDS dataset's examples become (text, label); None for other datasets."""
  entry = data.DATASETS.get(name)
  return entry.fields if entry and entry.fields and not entry.fields.corpus else None


def _check_labels(d: ml_collections.ConfigDict) -> None:
  """data.regression where the labels are real numbers, and only there."""
  fields = _tfds_fields(d.name)
  if fields and fields.regression != d.regression:
    raise ValueError(f'data.name={d.name!r} has {"real-valued" if fields.regression else "class"} '
                     f'labels: set data.regression={fields.regression}.')
  if d.regression and d.name != 'files' and not fields:
    raise ValueError(f'data.regression=True reads real-valued labels from your own files (or '
                     f'glue/stsb), but data.name={d.name!r}; use data.name=files.')


def _check_pairs(d: ml_collections.ConfigDict, cfg: models.ModelConfig) -> None:
  """Sentence pairs (data.text_b_column, a GLUE pair task) and the model's way of reading them
  agree."""
  fields = _tfds_fields(d.name)
  pairs = bool(d.text_b_column) or bool(fields and fields.pair)
  if d.text_b_column and d.name != 'files':
    raise ValueError(f'data.text_b_column={d.text_b_column!r} names a column of your own files, '
                     f'but data.name={d.name!r}; use data.name=files or drop text_b_column.')
  if cfg.dual_encoder and not pairs:
    raise ValueError('model.dual_encoder=True encodes the two texts of a pair, but the data has '
                     'one text per example: set data.text_b_column, or model.dual_encoder=False.')
  if pairs and not cfg.dual_encoder and cfg.type_vocab_size < 2:
    raise ValueError(f'Sentence pairs ({d.name}) are joined as [CLS] a [SEP] b [SEP] with token '
                     'types 0 and 1, so they need model.type_vocab_size >= 2 (got '
                     f'{cfg.type_vocab_size}); or set model.dual_encoder=True to encode the '
                     'texts one at a time.')


def check_devices(config: ml_collections.ConfigDict,
                  devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """The mesh of ``config.mesh`` on ``devices`` (default: all), the batch sizes checked on it."""
  mesh = partitioning.make_mesh(config.mesh, devices)
  dp, processes = partitioning.data_parallel_size(mesh), jax.process_count()
  for name, size in (('batch_size', global_batch_size(config, mesh)),
                     ('eval_batch_size', global_eval_batch_size(config, mesh))):
    if size % dp or size % processes:
      raise ValueError(f'train.{name}={size} is not divisible by the {dp} data-parallel '
                       f'devices and {processes} processes; use a multiple of '
                       f'{math.lcm(dp, processes)}.')
  sources.check_shards(config.data.num_shards, global_batch_size(config, mesh))
  impl = config.model.attention_impl
  if impl in models.config.PALLAS_SCHEMES and mesh.size > 1:
    raise ValueError(f'model.attention_impl={impl} runs on one device only: the Pallas kernel is '
                     'not wrapped in shard_map yet, and XLA cannot partition it over the '
                     f'{mesh.size} devices of this mesh. Use chunked, xla or cudnn here.')
  return mesh


def global_batch_size(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> int:
  """``train.batch_size``, or ``train.per_device_batch_size`` x the data-parallel devices."""
  t = config.train
  return t.batch_size or t.per_device_batch_size * partitioning.data_parallel_size(mesh)


def global_eval_batch_size(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> int:
  """``train.eval_batch_size``; with a per-device batch size, rounded up to a multiple of the
  data-parallel devices and processes (so that one command fits any slice)."""
  size = config.train.eval_batch_size
  if config.train.per_device_batch_size:
    unit = math.lcm(partitioning.data_parallel_size(mesh), jax.process_count())
    size = math.ceil(size / unit) * unit
  return size


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


def config_differences(saved: dict[str, Any], config: ml_collections.ConfigDict,
                       ignore: Sequence[str] = ()) -> list[str]:
  """'field: saved X vs now Y' for every dotted field that differs (``ignore`` aside)."""
  saved, current = flatten(saved), flatten(json.loads(config.to_json_best_effort()))
  return [f'{k}: saved {saved.get(k)!r} vs now {current.get(k)!r}'
          for k in sorted(set(saved) | set(current))
          if k not in ignore and saved.get(k) != current.get(k)]


def check_resume_compatible(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses to resume a run whose saved config differs in fields that shape it, or whose data
  files changed. A workdir without checkpoints has nothing to resume and takes any config."""
  if not has_checkpoints(workdir):
    return
  path = os.path.join(workdir, CONFIG_FILE)
  if storage.exists(path):  # a field added since the run started has its default there
    differing = config_differences(load_config(workdir).to_dict(), config, RESUMABLE_FIELDS)
    if differing:
      raise ValueError(f'The workdir {workdir} holds a run with a different config '
                       f'({", ".join(differing)}). Use a new --workdir, or the saved settings '
                       'to resume.')
  path = os.path.join(workdir, DATA_FILE)
  if storage.exists(path):
    changed = data_changes(_read_json(path), config.data)
    if changed:
      raise ValueError(f'The data of the run in {workdir} changed since it started: '
                       f'{"; ".join(changed)}. Resuming would train on other examples: restore '
                       'the file(s), or use a new --workdir.')


_EMBEDDED = 'embedded dataset '  # the fingerprint key of an embedded dataset's version


def data_fingerprint(data_config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Size and SHA-256 of each of the user's data files (data.name=files); an embedded dataset's
  version (its generator changes with the version); {} for TFDS datasets (versioned, and
  prepared elsewhere)."""
  entry = data.DATASETS.get(data_config.name)
  if entry and entry.kind == 'embedded':
    builder = datasets.embedded_builder(data_config.name, data_config.data_dir)
    return {f'{_EMBEDDED}{data_config.name}': {'version': str(builder.version)}}
  if data_config.name != 'files':
    return {}
  paths = {p for key in ('train_files', 'validation_files', 'test_files')
           for p in lists.parse(data_config[key], f'data.{key}')}
  return {storage.canonical(p): {'size': storage.size(p), 'sha256': storage.sha256(p)}
          for p in sorted(paths) if storage.is_file(p)}


def data_changes(saved: dict[str, Any], data_config: ml_collections.ConfigDict) -> list[str]:
  """What differs between a saved fingerprint and the data now, one phrase per file or embedded
  dataset (a fingerprint saved before versions were recorded has none: not a change)."""
  now = data_fingerprint(data_config)
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


def save_config(config: ml_collections.ConfigDict, workdir: str, *, resumed: bool) -> None:
  """Writes the resolved config, and at a fresh start the data fingerprint (process 0)."""
  if jax.process_index() != 0:
    return
  storage.write_json(os.path.join(workdir, CONFIG_FILE), json.loads(config.to_json_best_effort()))
  if not resumed:
    storage.write_json(os.path.join(workdir, DATA_FILE), data_fingerprint(config.data))


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The resolved config saved by ``train_and_evaluate`` in a workdir."""
  if not storage.is_dir(workdir):
    raise FileNotFoundError(f'The workdir {workdir!r} does not exist: pass the --workdir of a '
                            'train.py run.')
  path = os.path.join(workdir, CONFIG_FILE)
  if not storage.exists(path):
    raise FileNotFoundError(f'No {CONFIG_FILE} in {workdir!r}, so it is not the workdir of a '
                            'train.py run (or that run did not get past its start): pass the '
                            '--workdir given to train.py.')
  saved = _read_json(path)
  missing = [g for g in _GROUPS if not isinstance(saved.get(g), dict)]
  if missing:
    kind = 'a Hugging Face config' if 'model_type' in saved else 'not a train.py config'
    raise ValueError(f'{path} is {kind} (it has no {", ".join(missing)} group), so the settings '
                     f'of the run in {workdir} are unknown. Restore the file from a backup, or '
                     'retrain; export_hf.py and convert_hf.py write into other folders.')
  if saved['data'].get('name') == 'files':
    saved['data'].setdefault('quoting', 'csv')  # how .tsv files were read before the field
  return ml_collections.ConfigDict(_with_defaults(saved, default.get_config().to_dict()))


def _with_defaults(saved: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
  """``saved`` plus the default of every field it lacks: a run saved before a field existed
  behaves as it did, which each new field's default preserves."""
  merged = dict(saved)
  for key, value in defaults.items():
    if key not in merged:
      merged[key] = value
    elif isinstance(value, dict) and isinstance(merged[key], dict):
      merged[key] = _with_defaults(merged[key], value)
  return merged


def flatten(d: dict, prefix: str = '') -> dict[str, Any]:
  """A nested dict as 'a.b' -> value."""
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(flatten(v, f'{prefix}{k}.'))
    else:
      out[f'{prefix}{k}'] = v
  return out


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
