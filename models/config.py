"""``ModelConfig``: the validated, frozen model description built once from the experiment config.

``ModelConfig.from_config(config, vocab_size=..., num_classes=...)`` reads the ``model`` and
``rope`` groups of ``configs/default.py``, fills the size fields left at None from the preset
``model.size`` and validates every field, so a bad experiment fails before anything is traced.
The position scheme is one field (``position``); an ablation changes nothing else.

The config is hashable (a static jit argument and part of the model's graphdef). Evaluation
variants are ``cfg.replace(deterministic=True)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import ml_collections
from flax import nnx

import rope
from models import positions

ATTENTION_KINDS = ('softmax', 'linear')
NORMS = ('post', 'pre')
POOLINGS = ('cls', 'mean')
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class Preset:
  """Encoder sizes of a named preset."""

  num_layers: int
  hidden_size: int
  num_heads: int
  mlp_dim: int


PRESETS = {
    'tiny': Preset(num_layers=2, hidden_size=64, num_heads=4, mlp_dim=128),  # tests
    'small': Preset(num_layers=4, hidden_size=256, num_heads=4, mlp_dim=1024),  # LRA text
    'base': Preset(num_layers=12, hidden_size=768, num_heads=12, mlp_dim=3072),  # RoFormer-base
}


def _choice(field: str, value: Any, choices) -> None:
  if value not in choices:
    raise ValueError(f'{field}={value!r} is not valid; valid choices: '
                     f'{", ".join(map(str, choices))}.')


def _positive(field: str, value: Any) -> None:
  if not value > 0:
    raise ValueError(f'{field} must be > 0, got {value!r}.')


def _rate(field: str, value: float) -> None:
  if not 0.0 <= value < 1.0:
    raise ValueError(f'{field} must be in [0, 1), got {value!r}.')


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeConfig:
  """The ``rope`` config group (used when ``position == 'rotary'``); see ``configs/default.py``."""

  base: float = 10000.0
  layout: str = 'interleaved'
  rotary_dim: int | None = None
  scaling: str = 'none'
  scaling_factor: float = 1.0
  original_max_length: int = 512
  yarn_beta_fast: float = 32.0
  yarn_beta_slow: float = 1.0
  llama3_low_freq_factor: float = 1.0
  llama3_high_freq_factor: float = 4.0
  xpos: bool = False
  xpos_scale_base: float = 512.0
  rotary_value: bool = False

  def rotary(self, head_dim: int) -> rope.Rotary:
    """The ``rope.Rotary`` for heads of ``head_dim`` features (ValueError on bad options)."""
    scaling = None
    if self.scaling != 'none':
      scaling = rope.Scaling(
          kind=self.scaling, factor=self.scaling_factor,
          original_max_length=self.original_max_length, beta_fast=self.yarn_beta_fast,
          beta_slow=self.yarn_beta_slow, low_freq_factor=self.llama3_low_freq_factor,
          high_freq_factor=self.llama3_high_freq_factor)
    return rope.Rotary(head_dim, base=self.base, layout=self.layout, rotary_dim=self.rotary_dim,
                       scaling=scaling, xpos=self.xpos, xpos_scale_base=self.xpos_scale_base)

  def non_default_fields(self) -> list[str]:
    """Names of the rotary-only switches set away from their defaults."""
    default = RopeConfig()
    return [f'rope.{name}' for name in ('rotary_dim', 'scaling', 'xpos', 'rotary_value')
            if getattr(self, name) != getattr(default, name)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Everything that defines the model; field meanings as in ``configs/default.py``.

  Attributes:
    vocab_size: token vocabulary (pad id 0).
    num_classes: classifier outputs.
    num_layers, hidden_size, num_heads, mlp_dim: encoder sizes.
    embedding_size: token-embedding width (projected to hidden_size when different).
    position: position scheme, a name in ``models.positions.SCHEMES``.
    attention: 'softmax' or 'linear' (RoFormer eq. 19).
    dropout_rate: dropout on embeddings, attention output, FFN output and the head.
    attention_dropout_rate: dropout on attention probabilities (softmax only).
    norm: 'post' (BERT/RoFormer) or 'pre' LayerNorm (with a final LayerNorm).
    layer_norm_eps: LayerNorm epsilon.
    init_std: std of the normal init of every weight and embedding (0.02 as BERT/RoFormer;
      small models escape the initial plateau of position tasks faster with larger values).
    pooling: 'cls' (first token) or 'mean' (over real tokens).
    type_vocab_size: token-type embeddings (0 = none).
    max_length: longest sequence the 'learned' scheme supports.
    dtype: compute dtype name, 'float32' or 'bfloat16' (parameters are float32).
    remat: rematerialise each encoder layer.
    fused_qkv: compute the query, key and value projections as one matmul (same parameters).
    shaw_max_distance, shaw_values: Shaw et al. (2018) options.
    t5_num_buckets, t5_max_distance: T5 relative-bias options.
    linear_feature_map: linear-attention feature map, 'elu+1' or 'relu'.
    rope: the rotary options.
    deterministic: no dropout (evaluation); otherwise dropout keys come from the call's rngs.
  """

  vocab_size: int
  num_classes: int
  num_layers: int
  hidden_size: int
  num_heads: int
  mlp_dim: int
  embedding_size: int
  position: str = 'rotary'
  attention: str = 'softmax'
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0
  norm: str = 'post'
  layer_norm_eps: float = 1e-12
  init_std: float = 0.02
  pooling: str = 'cls'
  type_vocab_size: int = 0
  max_length: int = 512
  dtype: str = 'float32'
  remat: bool = False
  fused_qkv: bool = False
  shaw_max_distance: int = 16
  shaw_values: bool = False
  t5_num_buckets: int = 32
  t5_max_distance: int = 128
  linear_feature_map: str = 'elu+1'
  rope: RopeConfig = RopeConfig()
  deterministic: bool = False

  def __post_init__(self):
    _positive('vocab_size', self.vocab_size)
    _positive('num_classes', self.num_classes)
    for field in ('num_layers', 'hidden_size', 'num_heads', 'mlp_dim', 'embedding_size',
                  'max_length', 'layer_norm_eps'):
      _positive(f'model.{field}', getattr(self, field))
    if self.type_vocab_size < 0:
      raise ValueError(f'model.type_vocab_size must be >= 0, got {self.type_vocab_size}.')
    _rate('model.dropout_rate', self.dropout_rate)
    _rate('model.attention_dropout_rate', self.attention_dropout_rate)
    _positive('model.init_std', self.init_std)
    _choice('model.attention', self.attention, ATTENTION_KINDS)
    _choice('model.norm', self.norm, NORMS)
    _choice('model.pooling', self.pooling, POOLINGS)
    _choice('model.dtype', self.dtype, tuple(DTYPES))
    _choice('model.linear_feature_map', self.linear_feature_map, tuple(rope.FEATURE_MAPS))
    _choice('rope.layout', self.rope.layout, rope.LAYOUTS)
    _choice('rope.scaling', self.rope.scaling, rope.SCALING_KINDS)
    if self.hidden_size % self.num_heads:
      raise ValueError(f'model.hidden_size={self.hidden_size} is not divisible by '
                       f'model.num_heads={self.num_heads}.')
    if self.attention == 'linear' and self.attention_dropout_rate > 0:
      raise ValueError('model.attention_dropout_rate must be 0 with model.attention=linear '
                       '(linear attention forms no attention probabilities).')
    positions.validate(self)

  @property
  def initializer(self):
    """N(0, init_std) for every kernel, embedding and position table."""
    return nnx.initializers.normal(self.init_std)

  @property
  def head_dim(self) -> int:
    """Features per attention head."""
    return self.hidden_size // self.num_heads

  @property
  def compute_dtype(self) -> jnp.dtype:
    """The activation dtype."""
    return jnp.dtype(DTYPES[self.dtype])

  def replace(self, **changes: Any) -> ModelConfig:
    """A validated copy with ``changes`` (``dataclasses.replace``)."""
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, *, vocab_size: int,
                  num_classes: int) -> ModelConfig:
    """Builds the config from ``config.model`` and ``config.rope`` (see ``configs/default.py``).

    Size fields that are None take the value of the preset ``config.model.size``;
    ``embedding_size`` None means ``hidden_size``; ``max_length`` None means
    ``config.data.max_length`` (learned positions cover exactly the training length).
    """
    m, r = config.model, config.rope
    _choice('model.size', m.size, tuple(PRESETS))
    preset = PRESETS[m.size]

    def sized(name: str) -> int:
      value = m[name]
      return getattr(preset, name) if value is None else value

    hidden_size = sized('hidden_size')
    rope_config = RopeConfig(
        base=r.base, layout=r.layout, rotary_dim=r.rotary_dim, scaling=r.scaling,
        scaling_factor=r.scaling_factor, original_max_length=r.original_max_length,
        yarn_beta_fast=r.yarn_beta_fast, yarn_beta_slow=r.yarn_beta_slow,
        llama3_low_freq_factor=r.llama3_low_freq_factor,
        llama3_high_freq_factor=r.llama3_high_freq_factor, xpos=r.xpos,
        xpos_scale_base=r.xpos_scale_base, rotary_value=r.rotary_value)
    return cls(
        vocab_size=vocab_size, num_classes=num_classes, num_layers=sized('num_layers'),
        hidden_size=hidden_size, num_heads=sized('num_heads'), mlp_dim=sized('mlp_dim'),
        embedding_size=hidden_size if m.embedding_size is None else m.embedding_size,
        position=m.position, attention=m.attention, dropout_rate=m.dropout_rate,
        attention_dropout_rate=m.attention_dropout_rate, norm=m.norm,
        layer_norm_eps=m.layer_norm_eps, init_std=m.init_std, pooling=m.pooling, type_vocab_size=m.type_vocab_size,
        max_length=config.data.max_length if m.max_length is None else m.max_length,
        dtype=m.dtype, remat=m.remat, fused_qkv=m.fused_qkv,
        shaw_max_distance=m.shaw_max_distance, shaw_values=m.shaw_values,
        t5_num_buckets=m.t5_num_buckets, t5_max_distance=m.t5_max_distance,
        linear_feature_map=m.linear_feature_map, rope=rope_config)
