"""``ModelSettings`` (a run config's ``model`` group) and ``ModelConfig``, the validated, frozen
model description it makes with the rest (``ModelConfig.of(config.model, rope=..., task=...,
vocab_size=..., num_classes=...)``). Every field is checked here, so a bad experiment fails before
anything is traced. Hashable: a static jit argument and part of the graphdef.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import rope
import settings
from models import positions

# train.task -> (a language-modelling head tied to the token embeddings, causal attention):
# classify a text, masked (BERT's MLM) or causal (next token) language modelling.
TASK_MODELS = {'classify': (False, False), 'mlm': (True, False), 'clm': (True, True)}
TASKS = tuple(TASK_MODELS)
ATTENTION_KINDS = ('softmax', 'linear')
# How softmax attention is computed (``models.attention``).
ATTENTION_IMPLEMENTATIONS = ('auto', 'explicit', 'xla', 'cudnn', 'chunked', 'splash',
                             'pallas_flash')
# The Pallas TPU kernels and what each cannot compute; the schemes declare which kernels compute
# them exactly (``models.positions.PositionScheme.pallas_kernels``).
_PALLAS_LIMITS = {'splash': 'it takes no bias on the attention logits',
                  'pallas_flash': 'it takes one additive logits bias and forms no probabilities'}


def _pallas_fits(kernel: str) -> tuple[str, ...]:
  """The schemes that Pallas ``kernel`` computes exactly, in the registry's order."""
  return tuple(name for name, scheme in positions.SCHEMES.items()
               if kernel in scheme.pallas_kernels)


PALLAS_SCHEMES = {kernel: _pallas_fits(kernel) for kernel in _PALLAS_LIMITS}
NORMS = ('post', 'pre')
POOLINGS = ('cls', 'mean')
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
# Encoder sizes: num_layers, hidden_size, num_heads, mlp_dim.
PRESETS = {
    'tiny': (2, 64, 4, 128),  # tests
    'small': (4, 256, 4, 1024),  # LRA text
    'base': (12, 768, 12, 3072),  # RoFormer-base
}
SIZED_FIELDS = ('num_layers', 'hidden_size', 'num_heads', 'mlp_dim')


def _choice(field: str, value: Any, choices) -> None:
  if value not in choices:
    raise ValueError(f'{field}={value!r} is not valid; valid choices: '
                     f'{", ".join(map(str, choices))}.')


P, R, T = settings.Role.PARAMETERS, settings.Role.RESULTS, settings.Role.RUNTIME


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSettings:
  """The ``model`` group: the encoder's settings, each with its default and role."""

  # Preset: 'tiny' (tests), 'small', 'base' (RoFormer-base).
  size: str = settings.setting('tiny', P)
  # Position scheme: none | sinusoidal | learned | shaw | t5 | alibi | rotary | kerple_log |
  # kerple_power | fire | cope (docs/model.md#position-schemes-after-2022).
  position: str = settings.setting(positions.Rotary.name, P)
  # Per-layer hybrids: these layers (0-based) get no position information (NoPE), the others the
  # scheme's hooks (rotation, logits bias, value term); not for sinusoidal and learned.
  nope_layers: tuple[int, ...] = settings.setting((), P, items=int, example='3,7')
  # Instead of nope_layers: layer i is NoPE when (i + 1) % nope_interval == 0 (0: off), as
  # transformers' no_rope_layer_interval (Llama 4's iRoPE and SmolLM3 use 4: layers 3, 7, ...).
  nope_interval: int = settings.setting(0, P)
  # Attention kind: softmax | linear (paper eq. 19).
  attention: str = settings.setting('softmax', P)
  # Softmax attention (the same numbers up to rounding): 'explicit' (written out), 'xla'/'cudnn'
  # (jax.nn.dot_product_attention), 'chunked' (online softmax in blocks: memory linear in length),
  # 'splash'/'pallas_flash' (Pallas TPU kernels, interpreted elsewhere; pallas_flash also takes
  # alibi/t5/shaw's bias), 'auto' (xla; on CPU chunked to evaluate where it can, else explicit).
  attention_impl: str = settings.setting('auto', T, evaluation=True)
  # Queries and keys per block with attention_impl='chunked'.
  attention_chunk_size: int = settings.setting(512, T, evaluation=True)
  # Sizes; None takes the preset's value (embedding_size: hidden_size), see ``sizes``.
  num_layers: int | None = settings.setting(None, P)  # Encoder layers.
  hidden_size: int | None = settings.setting(None, P)  # Model width.
  num_heads: int | None = settings.setting(None, P)  # Attention heads.
  mlp_dim: int | None = settings.setting(None, P)  # Feed-forward width.
  # Token-embedding width (projected to hidden_size if different).
  embedding_size: int | None = settings.setting(None, P)
  dropout_rate: float = settings.setting(0.1, R)  # Dropout on embeddings, attention output and FFN.
  attention_dropout_rate: float = settings.setting(0.0, R)  # Dropout on attention probabilities.
  norm: str = settings.setting('post', P)  # 'post' (BERT/RoFormer) or 'pre' LayerNorm.
  layer_norm_eps: float = settings.setting(1e-12, R)  # LayerNorm epsilon (as BERT/RoFormer).
  init_std: float = settings.setting(0.02, R)  # Std of the normal init of all weights (as BERT).
  # Classification pooling: 'cls' (first token) or 'mean' (over real tokens).
  pooling: str = settings.setting('cls', R)
  # Sentence pairs encoded one text at a time by the shared encoder, the head reading
  # [u, v, u*v, u-v] of their pooled vectors (LRA Retrieval's two towers); False: one joint input.
  dual_encoder: bool = settings.setting(False, R)
  # Token-type embeddings (2 in Hugging Face RoFormer checkpoints; 0 = none).
  type_vocab_size: int = settings.setting(0, P)
  # Positions the `learned` scheme has embeddings for; longer inputs raise. Not PARAMETERS: only
  # `learned` has such a table, and a fine-tune of it keeps its source's (training/carry.py).
  max_length: int = settings.setting(512, R)
  # Compute dtype: 'float32' or 'bfloat16' (parameters stay float32).
  dtype: str = settings.setting('float32', R)
  remat: bool = settings.setting(False, T)  # Rematerialise each layer (jax.checkpoint): memory.
  shaw_max_distance: int = settings.setting(16, P)  # Shaw et al. (2018): distances clipped at +-k.
  # Shaw: also add relative representations to values.
  shaw_values: bool = settings.setting(False, P)
  # T5 bias: buckets (bidirectional: half per direction).
  t5_num_buckets: int = settings.setting(32, P)
  # T5 bias: distance beyond which all share the last bucket: the training length (data.max_length)
  # so that every bucket is trained; the T5 paper's value is 128.
  t5_max_distance: int = settings.setting(64, R)
  # FIRE: hidden width of the MLP f (1 -> width, ReLU -> heads); the paper's 32.
  fire_mlp_width: int = settings.setting(32, P)
  # FIRE: the threshold L of the normaliser psi(max(L, i)) at the start (a learned scale, from 1,
  # multiplies it); 0: the training length (data.max_length), so that the normaliser is constant
  # inside the trained window and interpolates beyond it. Below L the bias depends on the
  # distance only.
  fire_threshold: float = settings.setting(0.0, P)
  # FIRE: one FIRE shared by all layers (the paper's FIRE-S); False: one per layer (FIRE).
  fire_shared: bool = settings.setting(False, P)
  # CoPE: position embeddings per direction; contextual positions are clipped at npos - 1.
  # 0: the authors' default, the training length + 1 (data.max_length + 1).
  cope_npos: int = settings.setting(0, P)
  # Std of the normal init of shaw's and t5's tables (0: model.init_std); at init_std 0.1 some
  # seeds never leave the chance plateau (docs/ablation_probes/diagnostic/report.md).
  relative_init_std: float = settings.setting(0.0, R)
  # Linear attention feature map phi: 'elu+1' or 'relu'.
  linear_feature_map: str = settings.setting('elu+1', R)

  def sizes(self) -> dict[str, int]:
    """The size fields, each None taken from the preset ``size``."""
    _choice('model.size', self.size, tuple(PRESETS))
    out = {name: preset if getattr(self, name) is None else getattr(self, name)
           for name, preset in zip(SIZED_FIELDS, PRESETS[self.size])}
    out['embedding_size'] = self.embedding_size or out['hidden_size']
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig(ModelSettings):
  """Everything that defines the model: the ``model`` and ``rope`` groups and the data's sizes;
  ``deterministic``: no dropout (evaluation)."""

  vocab_size: int
  num_classes: int
  task: str = 'classify'
  # data.max_length (0: model.max_length): fire_threshold and cope_npos follow it when 0.
  train_length: int = 0
  rope: rope.RopeConfig = dataclasses.field(default_factory=rope.RopeConfig)
  deterministic: bool = False

  @classmethod
  def of(cls, model: ModelSettings, **more: Any) -> ModelConfig:
    """The model of ``model`` (the group) with the rest (rope, task, the data's sizes)."""
    return cls(**{f.name: getattr(model, f.name) for f in settings.declared(ModelSettings)},
               **more)

  def __post_init__(self):
    _choice('train.task', self.task, TASKS)
    for name, value in self.sizes().items():
      object.__setattr__(self, name, value)
    object.__setattr__(self, 'nope_layers', tuple(self.nope_layers))  # a JSON list: hashable
    length = self.train_length or self.max_length  # a model built outside a run: its table's
    object.__setattr__(self, 'fire_threshold', self.fire_threshold or float(length))
    object.__setattr__(self, 'cope_npos', self.cope_npos or length + 1)
    self._check()
    positions.validate(self)
    self._check_nope_layers()

  def _check(self) -> None:
    for field in ('vocab_size', 'num_classes') + tuple(f'model.{name}' for name in SIZED_FIELDS + (
        'embedding_size', 'max_length', 'layer_norm_eps', 'init_std', 'attention_chunk_size')):
      if not (value := getattr(self, field.removeprefix('model.'))) > 0:
        raise ValueError(f'{field} must be > 0, got {value!r}.')
    if self.type_vocab_size < 0:
      raise ValueError(f'model.type_vocab_size must be >= 0, got {self.type_vocab_size}.')
    if self.relative_init_std < 0:
      raise ValueError(f'model.relative_init_std must be >= 0 (0: model.init_std), got '
                       f'{self.relative_init_std}.')
    for name in ('dropout_rate', 'attention_dropout_rate'):
      if not 0.0 <= (value := getattr(self, name)) < 1.0:
        raise ValueError(f'model.{name} must be in [0, 1), got {value!r}.')
    for name, choices in (('attention', ATTENTION_KINDS),
                          ('attention_impl', ATTENTION_IMPLEMENTATIONS), ('norm', NORMS),
                          ('pooling', POOLINGS), ('dtype', DTYPES),
                          ('linear_feature_map', rope.FEATURE_MAPS)):
      _choice(f'model.{name}', getattr(self, name), tuple(choices))
    if self.hidden_size % self.num_heads:
      raise ValueError(f'model.hidden_size={self.hidden_size} is not divisible by '
                       f'model.num_heads={self.num_heads}.')
    if self.attention_impl == 'chunked' and self.attention_dropout_rate > 0:
      raise ValueError('model.attention_dropout_rate must be 0 with model.attention_impl=chunked '
                       '(the probabilities are never formed whole); use explicit.')
    if self.attention_impl in PALLAS_SCHEMES:
      self._check_pallas()
    if self.attention == 'linear' and self.attention_dropout_rate > 0:
      raise ValueError('model.attention_dropout_rate must be 0 with model.attention=linear '
                       '(linear attention forms no attention probabilities).')
    if self.dual_encoder and self.language_model:
      raise ValueError(f'model.dual_encoder classifies sentence pairs; train.task={self.task} '
                       'trains a language model. Set model.dual_encoder=False.')

  def _check_pallas(self) -> None:
    """What a Pallas kernel (``model.attention_impl`` splash or pallas_flash) cannot compute."""
    impl = self.attention_impl
    if self.attention != 'softmax':
      raise ValueError(f'model.attention_impl={impl} is a softmax-attention kernel, which '
                       f'model.attention={self.attention} never uses; set '
                       'model.attention_impl=auto.')
    if self.attention_dropout_rate > 0:
      raise ValueError(f'model.attention_dropout_rate must be 0 with model.attention_impl={impl} '
                       '(the kernel never forms the probabilities); use explicit.')
    scheme = positions.SCHEMES.get(self.position)
    if scheme is None:  # positions.validate names the valid choices
      return
    if impl not in scheme.pallas_kernels:
      schemes = _pallas_fits(impl)
      others = [kernel for kernel in _PALLAS_LIMITS if kernel in scheme.pallas_kernels]
      raise ValueError(
          f'model.position={self.position!r} cannot run on model.attention_impl={impl} '
          f'({_PALLAS_LIMITS[impl]}): with {impl} valid choices are: {", ".join(schemes)}. '
          f'For {self.position!r} use model.attention_impl='
          f'{", ".join(others + ["explicit", "xla"])} or chunked.')
    if self.shaw_values and 'model.shaw_values' in scheme.options:
      raise ValueError(f'model.position={self.position!r} with model.shaw_values=True adds a '
                       f'value term from the probabilities, which model.attention_impl={impl} '
                       'never forms; set model.shaw_values=False or use '
                       'model.attention_impl=explicit, xla or chunked.')

  def _check_nope_layers(self) -> None:
    """The per-layer hybrid (``model.nope_layers`` / ``nope_interval``) fits this model."""
    given, interval, n = self.nope_layers, self.nope_interval, self.num_layers
    if not given and not interval:
      return
    field = 'model.nope_layers' if given else f'model.nope_interval={interval}'
    if given and interval:
      raise ValueError(f'model.nope_layers={",".join(map(str, given))} and '
                       f'model.nope_interval={interval} both name the NoPE layers; set one of '
                       'them (the other to empty / 0).')
    if interval < 0:
      raise ValueError(f'model.nope_interval must be >= 0 (0: off), got {interval}.')
    bad = [i for i in given if not 0 <= i < n]
    if bad or len(set(given)) != len(given):
      raise ValueError(f'model.nope_layers={",".join(map(str, given))} must name distinct '
                       f'layers 0 .. {n - 1} (model.num_layers={n}, 0-based), each once.')
    if interval > n:  # a setting that silently changes nothing
      raise ValueError(f'{field} makes no layer of the {n} NoPE ((i + 1) % {interval} == 0 for '
                       f'none of i = 0 .. {n - 1}); lower it or set it to 0.')
    per_layer = [name for name, scheme in positions.SCHEMES.items() if scheme.adds_positions
                 and scheme.embed is positions.PositionScheme.embed]
    if self.position not in per_layer:
      raise ValueError(
          f'{field} removes a scheme\'s per-layer terms (rotation, logits bias, value term), '
          f'but model.position={self.position!r} has none: '
          + ('it adds no position information. '
             if not positions.SCHEMES[self.position].adds_positions else
             'it adds positions to the embeddings, which every layer reads through the residual '
             'stream. ')
          + f'With NoPE layers valid choices are: {", ".join(per_layer)}; or reset '
          f'{field.split("=")[0]}.')

  @property
  def position_free_layers(self) -> tuple[int, ...]:
    """The layers without position information (``model.nope_layers`` or ``nope_interval``)."""
    if self.nope_interval > 0:
      return tuple(i for i in range(self.num_layers) if (i + 1) % self.nope_interval == 0)
    return tuple(sorted(self.nope_layers))

  @property
  def language_model(self) -> bool:
    """Trained with a language-modelling head (``train.task`` mlm or clm), not a classifier."""
    return TASK_MODELS[self.task][0]

  @property
  def causal(self) -> bool:
    """Each position attends only to itself and earlier ones (``train.task=clm``)."""
    return TASK_MODELS[self.task][1]

  @property
  def initializer(self):
    """N(0, init_std) for every kernel, embedding and absolute position table."""
    return nnx.initializers.normal(self.init_std)

  @property
  def relative_initializer(self):
    """N(0, relative_init_std, or init_std if 0) for the relative-position tables."""
    return nnx.initializers.normal(self.relative_init_std or self.init_std)

  @property
  def attention_implementation(self) -> str:
    """``attention_impl``, 'auto' resolved: 'xla' on accelerators; on CPU (the faster there,
    benchmarks/README.md) 'chunked' to evaluate where the scheme runs in blocks, else 'explicit'."""
    if self.attention_impl != 'auto':
      return self.attention_impl
    if jax.default_backend() != 'cpu':
      return 'xla'
    scheme = positions.SCHEMES.get(self.position)
    chunked = (self.deterministic and self.attention == 'softmax'
               and scheme is not None and scheme.supports_chunked)
    return 'chunked' if chunked else 'explicit'

  @property
  def head_dim(self) -> int:
    """Features per attention head."""
    return self.hidden_size // self.num_heads

  @property
  def rotary(self) -> rope.Rotary:
    """The rotary transform of this model's heads (ValueError if the options do not fit)."""
    return rope.Rotary(head_dim=self.head_dim, **dataclasses.asdict(self.rope))

  @property
  def compute_dtype(self) -> jnp.dtype:
    """The activation dtype."""
    return jnp.dtype(DTYPES[self.dtype])

  def replace(self, **changes: Any) -> ModelConfig:
    """A validated copy with ``changes`` (``dataclasses.replace``)."""
    return dataclasses.replace(self, **changes)
