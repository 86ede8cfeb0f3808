"""``RunConfig``: a run's settings, one frozen dataclass per group (``optim``, ``train`` and
``mesh`` here), each field declared once with its default, comment and role (``settings``);
``run_config`` turns a ConfigDict or a saved config.json into a checked ``RunConfig``.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Mapping

import ml_collections

import models
import rope
import settings
from data.config import DataConfig
from models.config import ModelSettings
from training import metrics
from training import optim as optim_lib

P, R, T = settings.Role.PARAMETERS, settings.Role.RESULTS, settings.Role.RUNTIME
MEMBER_MODES = ('auto', 'vmap', 'loop')


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
  """AdamW with warmup and decay (training/optim.py)."""

  learning_rate: float = settings.setting(1e-3, R)  # Peak learning rate.
  # Peak learning rates trained together, one member per (rate, seed); empty: learning_rate.
  learning_rates: tuple[float, ...] = settings.setting((), R, items=float, example='3e-4,1e-3,3e-3')
  # Fine-tuning (train.init_from): layer i of L learns at layer_decay^(L - i) x the rate, the
  # embeddings at layer_decay^(L + 1), the head at 1 (1.0: off; ELECTRA/BEiT use 0.65-0.9).
  layer_decay: float = settings.setting(1.0, R)
  freeze_encoder: bool = settings.setting(False, R)  # Train the classification head only.
  position_lr_multiplier: float = settings.setting(1.0, R)  # x the rate for position parameters.
  warmup_steps: int = settings.setting(50, R)  # Linear warmup steps.
  # Decay after warmup: 'cosine', 'linear', 'constant' or 'rsqrt' (sqrt(warmup / step), LRA).
  schedule: str = settings.setting('cosine', R)
  end_lr_factor: float = settings.setting(0.0, R)  # Final learning rate as a fraction of the peak.
  weight_decay: float = settings.setting(0.01, R)  # AdamW's, on dense kernels only.
  b1: float = settings.setting(0.9, R)  # Adam beta1.
  b2: float = settings.setting(0.999, R)  # Adam beta2.
  eps: float = settings.setting(1e-8, R)  # Adam epsilon.
  grad_clip_norm: float = settings.setting(1.0, R)  # Global-norm gradient clipping (0 = off).
  grad_accum_steps: int = settings.setting(1, R)  # Gradient accumulation (optax.MultiSteps).

  def __post_init__(self):
    """Finite hyper-parameters in their ranges (a NaN passes every comparison, so test for it)."""
    for field, ok, rule in (
        ('learning_rate', self.learning_rate > 0, '> 0'), ('b1', 0 <= self.b1 < 1, 'in [0, 1)'),
        ('b2', 0 <= self.b2 < 1, 'in [0, 1)'), ('eps', self.eps > 0, '> 0'),
        ('weight_decay', self.weight_decay >= 0, '>= 0'),
        ('grad_clip_norm', self.grad_clip_norm >= 0, '>= 0 (0: off)'),
        ('position_lr_multiplier', self.position_lr_multiplier >= 0, '>= 0'),
        ('end_lr_factor', 0 <= self.end_lr_factor <= 1, 'in [0, 1]'),
        ('layer_decay', 0 < self.layer_decay <= 1, 'in (0, 1] (1: off)')):
      value = getattr(self, field)
      if not (math.isfinite(value) and ok):
        raise ValueError(f'optim.{field} must be a finite number {rule}, got {value}: fix '
                         f'--config.optim.{field}.')
    optim_lib.learning_rates(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """The task, the seeds, the batch and the loop."""

  # 'classify' (a classifier on data.name's labels), 'mlm' (BERT's masked language modelling) or
  # 'clm' (causal language modelling: next token, causal attention) on data.name's texts.
  task: str = settings.setting('classify', R)
  seed: int = settings.setting(0, R)  # Seed for parameter init and dropout (data order: data.seed).
  num_seeds: int = settings.setting(1, R)  # Train seeds seed, seed+1, ... together.
  # How the members share the step: 'vmap' (one batched computation), 'loop' (one after another)
  # or 'auto' (loop on CPU, where benchmarks/seeds_bench.py measures vmap slower; else vmap).
  members: str = settings.setting('auto', T)
  batch_size: int = settings.setting(32, R)  # Global batch size (split across hosts and devices).
  # Instead of batch_size (set it to 0): examples per data-parallel device.
  per_device_batch_size: int = settings.setting(0, R)
  num_steps: int = settings.setting(300, R, resume=True)  # Optimizer steps (a resume may extend).
  eval_every: int = settings.setting(100, R, resume=True)  # Validation every this many steps.
  log_every: int = settings.setting(20, T)  # Write train metrics every this many steps.
  checkpoint_every: int = settings.setting(100, T)  # Save every this many steps (and at the end).
  keep_checkpoints: int = settings.setting(2, T)  # Latest checkpoints kept (plus the best).
  eval_batch_size: int = settings.setting(64, T, evaluation=True)  # Global evaluation batch size.
  eval_max_length: int = settings.setting(0, R, resume=True)  # Final test splits up to (0: all).
  # Evaluate only the test splits of these lengths at the end (and at the training length).
  test_lengths: tuple[int, ...] = settings.setting((), R, items=int, resume=True,
                                                   example='64,128,256,512')
  # On a NaN/Inf loss or gradient: False stops the run; True skips the update and counts it.
  skip_nonfinite: bool = settings.setting(False, R, resume=True)
  # JAX's persistent compilation cache ('' = off).
  compilation_cache_dir: str = settings.setting('~/.cache/roformer_jax/xla', T)
  # Start from another run's weights but the head (training/init_from.py; '' = a fresh start).
  init_from: str = settings.setting('', R, resume=True)
  init_head: bool = settings.setting(False, R, resume=True)  # With init_from: the head too.
  # A jax.profiler trace of steps 'first:last' (e.g. '10:15') into workdir/profile ('' = none).
  profile_steps: str = settings.setting('', T)
  wandb_project: str = settings.setting('', T)  # Also log to Weights & Biases ('' = off).
  # Projects (projects/<name>/) whose datasets, task kinds and report sections this run uses:
  # imported before the config is checked (a project's config files set it).
  projects: tuple[str, ...] = settings.setting((), T, items=str, example='chomsky')

  def __post_init__(self):
    if ((self.batch_size > 0) == (self.per_device_batch_size > 0)
        or min(self.batch_size, self.per_device_batch_size) < 0):
      raise ValueError(f'Set exactly one of train.batch_size (global, got {self.batch_size}) '
                       f'and train.per_device_batch_size (per data-parallel device, got '
                       f'{self.per_device_batch_size}); the other must be 0, e.g. '
                       '--config.train.batch_size=0 --config.train.per_device_batch_size=4.')
    for name in ('num_steps', 'eval_batch_size', 'eval_every', 'log_every',
                 'checkpoint_every', 'keep_checkpoints', 'num_seeds'):
      value = getattr(self, name)
      if value <= 0:
        raise ValueError(f'train.{name} must be > 0, got {value}: pass a positive integer, '
                         f'e.g. --config.train.{name}={max(1, abs(value) or 1)}.')
    if self.profile_steps:
      metrics.parse_step_window(self.profile_steps)
    for field, value, valid in (('train.task', self.task, models.TASKS),
                                ('train.members', self.members, MEMBER_MODES)):
      if value not in valid:
        raise ValueError(f'{field}={value!r} is not valid; valid choices: {", ".join(valid)}.')


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
  """The device mesh (training/partitioning.py); one axis may be -1 (fills the devices)."""

  data: int = settings.setting(-1, T)  # Data-parallel axis (within a slice on multi-slice TPU).
  fsdp: int = settings.setting(1, T)  # Fully sharded data-parallel axis (batch and parameters).
  tensor: int = settings.setting(1, T)  # Tensor-parallel axis (heads, MLP units and vocabulary).
  dcn_data: int = settings.setting(1, T)  # Multi-slice TPU: data-parallel factor across slices.
  dcn_fsdp: int = settings.setting(1, T)  # Multi-slice TPU: FSDP factor across slices.
  dcn_tensor: int = settings.setting(1, T)  # Multi-slice TPU: tensor-parallel factor across slices.
  # Overrides of the logical->mesh axis table, e.g. 'vocab=,embed=fsdp+tensor'.
  rules: tuple[str, ...] = settings.setting((), T, items=str, example='vocab=,embed=fsdp')


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
  """Every setting of a run, checked when built but the model (``check_model``: an ablation marks
  the cells whose model cannot be built not applicable)."""

  model: ModelSettings = dataclasses.field(default_factory=ModelSettings)
  # Rotary options (RoPE's model.position): rope.RopeConfig, with the paper's defaults.
  rope: rope.RopeConfig = dataclasses.field(default_factory=rope.RopeConfig)
  optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)

  def __post_init__(self):
    t, o = self.train, self.optim
    if t.num_steps % o.grad_accum_steps or o.grad_accum_steps <= 0:
      raise ValueError(f'train.num_steps={t.num_steps} must be a positive multiple of '
                       f'optim.grad_accum_steps={o.grad_accum_steps}; change one of them.')
    updates = t.num_steps // o.grad_accum_steps
    # LRA Retrieval's recipe warms up for 8,000 of its 5,000 steps ('rsqrt' then only warms up).
    if o.warmup_steps < 0 or (o.warmup_steps > updates and o.schedule != 'rsqrt'):
      raise ValueError(f'optim.warmup_steps={o.warmup_steps} must be between 0 and the number '
                       f'of optimizer updates ({updates}); shorten the warmup or train longer.')
    optim_lib.schedule_shape(o, updates)  # the schedule's name

  def model_config(self, *, vocab_size: int = 1, num_classes: int = 1) -> models.ModelConfig:
    """The ``model`` and ``rope`` groups plus the data's sizes (1 before the data is read)."""
    return models.ModelConfig.of(self.model, rope=self.rope, task=self.train.task,
                                 vocab_size=vocab_size, num_classes=num_classes,
                                 train_length=self.data.max_length)

  def check_model(self) -> models.ModelConfig:
    """The model and rope fields, with placeholder data sizes (the data is not read yet)."""
    cfg, d = self.model_config(), self.data
    # Randomized positions reach N - 1: the authors' learned table has N rows.
    needed, field = max((d.max_length, 'data.max_length'),
                        (d.random_positions, 'data.random_positions'))
    if models.has_max_length(cfg.position) and cfg.max_length < needed:
      raise ValueError(f'model.max_length={cfg.max_length} is shorter than {field}={needed}: '
                       f'model.position={cfg.position} has no embedding for the later positions. '
                       f'Raise model.max_length to {needed}.')
    if cfg.language_model:
      if d.pairs:
        raise ValueError(f'data.name={d.name!r} is a sentence-pair task; pre-train '
                         '(train.task mlm or clm) on a corpus or a one-text dataset.')
    elif cfg.dual_encoder and not d.pairs:
      raise ValueError('model.dual_encoder=True encodes the two texts of a pair, but the data '
                       'has one text per example: set data.text_b_column, or '
                       'model.dual_encoder=False.')
    elif d.pairs and not cfg.dual_encoder and cfg.type_vocab_size < 2:
      raise ValueError(f'Sentence pairs ({d.name}) are joined as [CLS] a [SEP] b [SEP] with '
                       'token types 0 and 1, so they need model.type_vocab_size >= 2 (got '
                       f'{cfg.type_vocab_size}); or set model.dual_encoder=True to encode the '
                       'texts one at a time.')
    return cfg


def derived(config_cls: type = RunConfig) -> dict[str, tuple[str, ...]]:
  """What the roles decide: the fields a resumed run must keep, that runs an ablation compares
  must share, that a fine-tune's source must match, that an evaluation may override."""
  return {'fixed_on_resume': settings.paths(config_cls, lambda m: not m['resume']),
          'results': settings.paths(config_cls, lambda m: m['role'] is not T),
          'parameters': settings.paths(config_cls, lambda m: m['role'] is P),
          'evaluation': settings.paths(config_cls, lambda m: m['evaluation'])}


FIXED_ON_RESUME, RESULT_FIELDS, PARAMETER_FIELDS, EVALUATION_FIELDS = derived().values()


def defaults() -> ml_collections.ConfigDict:
  """The ConfigDict of every group's defaults (``configs/default.py``)."""
  return settings.config_dict(RunConfig)


def run_config(config: RunConfig | Mapping[str, Any], *, strict: bool = True) -> RunConfig:
  """The checked ``RunConfig`` of a ConfigDict or a saved config.json's dict."""
  if isinstance(config, RunConfig):
    import_projects(config.train.projects)  # e.g. in an ablation's worker process
    return config
  if not isinstance(config, (ml_collections.ConfigDict, dict)):
    raise ValueError(f'The config is a {type(config).__name__}, not an ml_collections.ConfigDict: '
                     'get_config() must return a ConfigDict (see configs/default.py).')
  if missing := [g for g in settings.groups(RunConfig) if g not in config]:
    raise ValueError(f'The config has no {", ".join(missing)} group(s): start from '
                     'configs/default.get_config() and change what differs.')
  import_projects(settings.build_group(TrainConfig, config['train'], 'train',
                                       strict=False).projects)
  return settings.build(RunConfig, config, strict=strict)


def import_projects(names: tuple[str, ...]) -> None:
  """Imports projects/<name>/ for each name (it registers its datasets, kinds and sections)."""
  for name in names:
    try:
      importlib.import_module(f'projects.{name}')
    except ModuleNotFoundError as e:
      if e.name != f'projects.{name}':
        raise
      raise ValueError(f'train.projects names {name!r}, but projects/{name}/ does not exist '
                       f'({e}).') from e

