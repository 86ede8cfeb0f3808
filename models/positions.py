"""Position schemes, a registry by name (``model.position``); attention never knows which runs.

A ``PositionScheme`` (one per model) holds the shared parameters, adds its ``embed`` term to the
token embeddings and computes once per forward pass the ``PositionContext`` every layer shares.
Each layer's attention calls the ``LayerHooks`` the scheme made for it (Shaw's hold per-layer
parameters): ``rotate``, ``bias`` and ``value_term`` (on the probabilities).

Relative distances are key minus query position, from the explicit positions [batch, length]:
shifting all positions changes nothing; nothing here invents an arange. With
``model.attention_impl='chunked'`` nothing of size length x length is formed: the context keeps
the positions and the schemes' small tables, and the hooks' ``block_bias`` and
``block_value_term`` give one block's terms from its relative distances.
"""

from __future__ import annotations

import math
from typing import Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax import traverse_util

import rope
from models import sharding


class LengthError(ValueError):
  """A sequence is longer than the position scheme supports (raised at trace time)."""


class PositionContext(NamedTuple):
  """Per-forward-pass position state shared by all layers (a pytree; unused fields None).
  ``bias``: float32 [batch, heads, length_q, length_k]; ``relative`` (Shaw): int32 clipped
  distances + k, in [0, 2k], [batch, length_q, length_k]. Blockwise (chunked attention):
  ``positions`` [batch, length] (the keys'; the queries are the first ones; set by the encoder),
  ``pair_table``, which ``block_bias`` reads (T5's bucket embeddings, ALiBi's slopes, KERPLE's
  r1 and r2, FIRE's parameters), and in one block's context ``query_positions`` [batch, block]
  (set by attention: FIRE's normaliser reads the queries' positions)."""

  rotary_tables: rope.RotaryTables | None = None
  bias: jax.Array | None = None
  relative: jax.Array | None = None
  positions: jax.Array | None = None
  pair_table: jax.Array | tuple[jax.Array, ...] | None = None
  query_positions: jax.Array | None = None

  def first_queries(self, num: int) -> PositionContext:
    """The context of queries 0 .. num - 1 only (keys unchanged), for the query-side hooks."""
    tables = self.rotary_tables
    if tables is not None:
      tables = rope.RotaryTables(*(None if t is None else t[..., :num, :] for t in tables))
    return self._replace(
        rotary_tables=tables, bias=None if self.bias is None else self.bias[:, :, :num],
        relative=None if self.relative is None else self.relative[:, :num],
        query_positions=None if self.positions is None else self.positions[:, :num])


def blockwise(cfg) -> bool:
  """Whether attention asks for blocks (``model.attention_impl='chunked'``, or 'auto' resolved
  to it), not whole tensors."""
  return cfg.attention == 'softmax' and cfg.attention_implementation == 'chunked'


def relative_positions(positions_BxL: jax.Array) -> jax.Array:
  """int32 [batch, length_q, length_k]: positions[b, j] - positions[b, i] (key minus query)."""
  positions_BxL = positions_BxL.astype(jnp.int32)
  return positions_BxL[:, None, :] - positions_BxL[:, :, None]


def _gather_row(row_HxR: jax.Array, index_S: jax.Array) -> jax.Array:
  return row_HxR[:, index_S]


# gather_relative(table_BxHxTxR, index_BxTxS)[b, h, t, s] = table[b, h, t, index[b, t, s]]: one
# small gather per (batch, query) row, faster on CPU than a one-hot contraction or
# jnp.take_along_axis (benchmarks/README.md).
gather_relative = jax.vmap(jax.vmap(_gather_row, in_axes=(1, 0), out_axes=1))


def scatter_relative(values_BxHxTxS: jax.Array, index_BxTxS: jax.Array,
                     num_relative: int) -> jax.Array:
  """float32 [batch, heads, length_q, num_relative]: the transpose of ``gather_relative``."""
  batch, heads, length, _ = values_BxHxTxS.shape
  zeros = jax.ShapeDtypeStruct((batch, heads, length, num_relative), jnp.float32)
  transpose = jax.linear_transpose(lambda t: gather_relative(t, index_BxTxS), zeros)
  return transpose(values_BxHxTxS.astype(jnp.float32))[0]


class LayerHooks(nnx.Module):
  """The per-layer hooks an attention layer calls; this base adds no position information."""

  rotary: rope.Rotary | None = None  # what linear attention applies to phi(q), phi(k)
  mixes_values: bool = False  # value_term adds to the output: attention forms explicit probs

  def rotate(self, x_BxLxHxD: jax.Array, ctx: PositionContext, role: str) -> jax.Array:
    """Rotates queries, keys or values (role 'query', 'key', 'value'); same shape and dtype."""
    del ctx, role
    return x_BxLxHxD

  def bias(self, q_BxLxHxD: jax.Array, ctx: PositionContext) -> jax.Array | None:
    """float32 logits term [batch or 1, heads, length_q, length_k], or None."""
    del q_BxLxHxD
    return ctx.bias

  def attention_bias(self, q_BxTxHxD: jax.Array, k_BxSxHxD: jax.Array,
                     visible_Bx1xTxS: jax.Array, ctx: PositionContext) -> jax.Array | None:
    """The term attention adds to its logits: ``bias``, unless the scheme's term also reads the
    keys and which of them each query sees (CoPE's gates); ``visible``: bool, as
    ``models.attention.Visibility.dense``."""
    del k_BxSxHxD, visible_Bx1xTxS
    return self.bias(q_BxTxHxD, ctx)

  def value_term(self, probs_BxHxTxS: jax.Array, ctx: PositionContext) -> jax.Array | None:
    """Added to the attention output [batch, length, heads, head_dim], or None."""
    del probs_BxHxTxS, ctx
    return None

  def block_bias(self, q_BxTxHxD: jax.Array, ctx: PositionContext,
                 relative_BxTxS: jax.Array) -> jax.Array | None:
    """``bias`` for one block of queries and keys with these key-minus-query distances."""
    del q_BxTxHxD, ctx, relative_BxTxS
    return None

  def block_value_term(self, probs_BxHxTxS: jax.Array, ctx: PositionContext,
                       relative_BxTxS: jax.Array) -> jax.Array | None:
    """``value_term`` for one block (``probs`` may be unnormalised: the term is linear)."""
    del probs_BxHxTxS, ctx, relative_BxTxS
    return None


class PositionScheme(nnx.Module):
  """Base scheme: no position information; schemes override some of these."""

  supports_linear: ClassVar[bool] = True  # usable with model.attention='linear' (no logits)
  options: ClassVar[tuple[str, ...]] = ()  # the config switches only this scheme accepts
  # False: the scheme never reads the position ids, so randomizing them changes nothing.
  reads_positions: ClassVar[bool] = True
  # False: the scheme cannot run in blocks of keys (model.attention_impl=chunked).
  supports_chunked: ClassVar[bool] = True
  # False: the scheme adds no position information at all (nothing for a NoPE layer to drop).
  adds_positions: ClassVar[bool] = True
  # True: positions 0 .. model.max_length - 1 only (a learned table of that many rows): longer
  # inputs raise, and model.max_length shapes the parameters, so a fine-tune must keep it.
  has_max_length: ClassVar[bool] = False
  # The model fields only this scheme reads: another scheme's run ignores their values (a saved
  # run resumes, an ablation cell stays finished, when their defaults change).
  fields: ClassVar[tuple[str, ...]] = ()
  # The Pallas TPU kernels (model.attention_impl) that compute this scheme exactly. Neither forms
  # the probabilities (no value term, no probability dropout); splash takes no logits bias,
  # pallas_flash one additive bias. Schemes that act on q, k or the embeddings fit both.
  pallas_kernels: ClassVar[tuple[str, ...]] = ()
  name: ClassVar[str]  # the model.position it is registered under (``register``)

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    del cfg, rngs

  @classmethod
  def check(cls, cfg) -> None:
    """Raises ValueError for options that this scheme cannot use."""

  # The projection of the (pure dict) parameters after each optimizer update, or None.
  project: ClassVar[Callable[[dict], dict] | None] = None

  @classmethod
  def learned(cls, cfg, params: dict) -> dict:
    """What a run's summary records of the scheme's learned settings (none here); ``params``
    may live on devices: read only the leaves recorded."""
    del cfg, params
    return {}

  def embed(self, x_BxLxE: jax.Array, positions_BxL: jax.Array) -> jax.Array:
    """Adds absolute position information to the token embeddings."""
    del positions_BxL
    return x_BxLxE

  def prepare(self, positions_BxL: jax.Array) -> PositionContext:
    """Computes the state that every layer shares, once per forward pass."""
    del positions_BxL
    return PositionContext()

  def layer_hooks(self, *, rngs: nnx.Rngs) -> LayerHooks:
    """The hooks of one encoder layer (called once per layer at construction)."""
    del rngs
    return LayerHooks()


SCHEMES: dict[str, type[PositionScheme]] = {}


def register(name: str, *, supports_linear: bool = True, options: tuple[str, ...] = ()):
  """Class decorator adding a scheme to ``SCHEMES`` under ``name``."""
  def add(cls: type[PositionScheme]) -> type[PositionScheme]:
    cls.name, cls.supports_linear, cls.options = name, supports_linear, options
    SCHEMES[name] = cls
    return cls
  return add


def _switches(cfg) -> list[str]:
  """The scheme-specific switches set away from their defaults."""
  return ((['model.shaw_values'] if cfg.shaw_values else [])
          + (['model.fire_shared'] if cfg.fire_shared else []) + cfg.rope.non_default_fields())


def validate(cfg) -> None:
  """Checks ``cfg.position`` and the options that depend on it (ValueError listing choices)."""
  if cfg.position not in SCHEMES:
    raise ValueError(f'model.position={cfg.position!r} is not valid; valid choices: '
                     f'{", ".join(SCHEMES)}.')
  scheme = SCHEMES[cfg.position]
  if cfg.attention == 'linear' and not scheme.supports_linear:
    linear_ok = [name for name, s in SCHEMES.items() if s.supports_linear]
    raise ValueError(f'model.position={cfg.position!r} adds to the attention logits, which '
                     f'model.attention=linear never forms; with linear attention valid choices '
                     f'are: {", ".join(linear_ok)}.')
  for switch in _switches(cfg):
    if switch not in scheme.options:
      owners = [name for name, s in SCHEMES.items() if switch in s.options]
      raise ValueError(f'{switch} only applies to model.position={" or ".join(owners)}, not '
                       f'{cfg.position!r}; reset it or change model.position.')
  scheme.check(cfg)


def reads_positions(name: str) -> bool:
  """Whether scheme ``name`` reads the position ids (``data.random_positions`` changes it); a
  name that is no scheme gives True, so that the config's validation is what reports it."""
  return name not in SCHEMES or SCHEMES[name].reads_positions


def unread_fields(name: str) -> set[str]:
  """The dotted model fields that only other schemes read (none for a name that is no scheme)."""
  if name not in SCHEMES:
    return set()
  return {f'model.{f}' for s in SCHEMES.values() if s is not SCHEMES[name] for f in s.fields}


def has_max_length(name: str) -> bool:
  """Whether scheme ``name`` stops at ``model.max_length`` (``PositionScheme.has_max_length``);
  a name that is no scheme gives False, so that the config's validation is what reports it."""
  return name in SCHEMES and SCHEMES[name].has_max_length


def projection(cfg) -> Callable[[dict], dict] | None:
  """The scheme's projection of the parameters after each update (KERPLE's clamp), or None."""
  return SCHEMES[cfg.position].project


def learned(cfg, params: dict) -> dict:
  """What the summary records of the scheme's learned settings (FIRE's c and L), or {}."""
  return SCHEMES[cfg.position].learned(cfg, params)


def build(cfg, *, rngs: nnx.Rngs) -> PositionScheme:
  """The scheme named by ``cfg.position``."""
  return SCHEMES[cfg.position](cfg, rngs=rngs)


@register('none')
class NoPositions(PositionScheme):
  """No position information: the sanity baseline (attention sees a bag of tokens)."""

  reads_positions = False
  adds_positions = False
  pallas_kernels = ('splash', 'pallas_flash')


def sinusoidal_table(positions_BxL: jax.Array, width: int) -> jax.Array:
  """float32 [batch, length, width]: PE[m, 2i] = sin(m w_i), PE[m, 2i+1] = cos(m w_i),
  w_i = 10000^(-2i/width) (Vaswani et al. 2017, section 3.5)."""
  omega_P = jnp.asarray(10000.0 ** (-np.arange(0, width, 2) / width), jnp.float32)
  angle_BxLxP = positions_BxL.astype(jnp.float32)[..., None] * omega_P
  pe_BxLxPx2 = jnp.stack([jnp.sin(angle_BxLxP), jnp.cos(angle_BxLxP)], axis=-1)
  return pe_BxLxPx2.reshape(*positions_BxL.shape, width)


@register('sinusoidal')
class Sinusoidal(PositionScheme):
  """Fixed sinusoidal embeddings added to the token embeddings (Vaswani et al. 2017, 3.5)."""

  pallas_kernels = ('splash', 'pallas_flash')

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    del rngs
    self.width = cfg.embedding_size
    self.init_std = cfg.init_std

  @classmethod
  def check(cls, cfg) -> None:
    if cfg.embedding_size % 2:
      raise ValueError(f'model.position=sinusoidal needs an even embedding width, got '
                       f'model.embedding_size={cfg.embedding_size}.')

  def embed(self, x_BxLxE: jax.Array, positions_BxL: jax.Array) -> jax.Array:
    # Vaswani et al. scale the tokens by sqrt(d_model) to match the unit-amplitude table; with
    # BERT/RoFormer-style N(0, 0.02) token embeddings we scale the table down to their RMS instead:
    # at amplitude 1 it drowns the token identity before the embedding LayerNorm (measured: a tiny
    # model stays at chance on the order probe for 300+ steps while rotary solves it).
    table_BxLxE = sinusoidal_table(positions_BxL, self.width) * (self.init_std * math.sqrt(2.0))
    return x_BxLxE + table_BxLxE.astype(x_BxLxE.dtype)


@register('learned')
class Learned(PositionScheme):
  """Learned absolute embeddings for positions 0 .. max_length - 1 (BERT, Devlin et al. 2019).
  A longer sequence raises at trace time; a (traced) position outside [0, max_length) gets a NaN
  embedding, never a silently clipped row."""

  has_max_length = True
  pallas_kernels = ('splash', 'pallas_flash')

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    self.max_length = cfg.max_length
    self.embedding = nnx.Param(
        cfg.initializer(rngs.positions(), (cfg.max_length, cfg.embedding_size), jnp.float32),
        **sharding.param_metadata((None, sharding.EMBED)))

  def embed(self, x_BxLxE: jax.Array, positions_BxL: jax.Array) -> jax.Array:
    length = positions_BxL.shape[1]
    if length > self.max_length:
      raise LengthError(f'Sequence length {length} exceeds model.max_length={self.max_length}, '
                       'the number of learned position embeddings; raise model.max_length or '
                       'use another model.position.')
    valid_BxL = (positions_BxL >= 0) & (positions_BxL < self.max_length)
    rows_BxLxE = jnp.take(self.embedding[...], jnp.where(valid_BxL, positions_BxL, 0), axis=0)
    pe_BxLxE = jnp.where(valid_BxL[..., None], rows_BxLxE, jnp.nan)
    return x_BxLxE + pe_BxLxE.astype(x_BxLxE.dtype)


class ShawHooks(LayerHooks):
  """One layer's relative representations a^K (and a^V) for clipped distances -k .. k."""

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    self.max_distance = cfg.shaw_max_distance
    shape = (2 * cfg.shaw_max_distance + 1, cfg.head_dim)

    def table() -> nnx.Param:
      return nnx.Param(cfg.relative_initializer(rngs.positions(), shape, jnp.float32),
                       **sharding.param_metadata((None, sharding.KV)))

    self.key_table = table()
    self.value_table = table() if cfg.shaw_values else nnx.data(None)
    self.mixes_values = cfg.shaw_values

  def bias(self, q_BxTxHxD: jax.Array, ctx: PositionContext) -> jax.Array:
    """q_i . a^K_(j-i) / sqrt(head_dim) (eq. 4): q_i . a^K_r for the 2k+1 r, then a gather."""
    table_RxD = self.key_table[...].astype(q_BxTxHxD.dtype)
    qa_BxHxTxR = jnp.einsum('BTHD,RD->BHTR', q_BxTxHxD, table_RxD,
                            preferred_element_type=jnp.float32)
    bias_BxHxTxS = gather_relative(qa_BxHxTxR, ctx.relative)
    return bias_BxHxTxS / math.sqrt(q_BxTxHxD.shape[-1])

  def value_term(self, probs_BxHxTxS: jax.Array, ctx: PositionContext) -> jax.Array | None:
    """sum_j p_ij a^V_(j-i) (eq. 3): the probability mass per distance (float32 sum) times a^V."""
    if self.value_table is None:
      return None
    dtype = probs_BxHxTxS.dtype
    mass_BxHxTxR = scatter_relative(probs_BxHxTxS, ctx.relative, self.value_table.shape[0])
    return jnp.einsum('BHTR,RD->BTHD', mass_BxHxTxR.astype(dtype),
                      self.value_table[...].astype(dtype))

  def block_bias(self, q_BxTxHxD, ctx, relative_BxTxS):
    return self.bias(q_BxTxHxD, _shaw_context(relative_BxTxS, self.max_distance))

  def block_value_term(self, probs_BxHxTxS, ctx, relative_BxTxS):
    return self.value_term(probs_BxHxTxS, _shaw_context(relative_BxTxS, self.max_distance))


def _shaw_context(relative_BxTxS: jax.Array, k: int) -> PositionContext:
  return PositionContext(relative=jnp.clip(relative_BxTxS, -k, k) + k)


class PerLayer(PositionScheme):
  """A scheme whose parameters are all in its layers' hooks, built from the config."""

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    del rngs
    self.cfg = cfg


@register('shaw', supports_linear=False, options=('model.shaw_values',))
class Shaw(PerLayer):
  """Relative position representations on keys (and values), clipped at +-k, per layer (Shaw,
  Uszkoreit and Vaswani 2018)."""

  fields = ('shaw_max_distance', 'shaw_values')
  pallas_kernels = ('pallas_flash',)  # the q.a^K term; the a^V term refuses Pallas (config)

  @classmethod
  def check(cls, cfg) -> None:
    if cfg.shaw_max_distance < 1:
      raise ValueError(f'model.shaw_max_distance must be >= 1, got {cfg.shaw_max_distance}.')

  def prepare(self, positions_BxL: jax.Array) -> PositionContext:
    if blockwise(self.cfg):  # the block's distances come from the positions
      return PositionContext()
    return _shaw_context(relative_positions(positions_BxL), self.cfg.shaw_max_distance)

  def layer_hooks(self, *, rngs: nnx.Rngs) -> LayerHooks:
    return ShawHooks(self.cfg, rngs=rngs)


def t5_buckets(relative_BxTxS: jax.Array, num_buckets: int, max_distance: int,
               bidirectional: bool = True) -> jax.Array:
  """T5's relative-position buckets, int32 [batch, length_q, length_k]. Bidirectional: half the
  buckets are for keys after the query. Causal (T5's decoder): all are for keys at or before it
  (later keys share bucket 0; the mask hides them). In each half (or the whole), distances below
  half/2 get a bucket each; larger ones share logarithmically wider buckets up to
  ``max_distance``, beyond which all share the last one."""
  if bidirectional:
    half = num_buckets // 2
    offset_BxTxS = jnp.where(relative_BxTxS > 0, half, 0)
    distance_BxTxS = jnp.abs(relative_BxTxS)
  else:
    half, offset_BxTxS = num_buckets, 0
    distance_BxTxS = jnp.maximum(-relative_BxTxS, 0)
  max_exact = half // 2
  log_ratio = (jnp.log(jnp.maximum(distance_BxTxS, 1).astype(jnp.float32) / max_exact) /
               math.log(max_distance / max_exact))
  large_BxTxS = jnp.minimum(max_exact + (log_ratio * (half - max_exact)).astype(jnp.int32),
                            half - 1)
  return offset_BxTxS + jnp.where(distance_BxTxS < max_exact, distance_BxTxS, large_BxTxS)


def t5_bias(embedding_RxH: jax.Array, relative_BxTxS: jax.Array, num_buckets: int,
            max_distance: int, bidirectional: bool = True) -> jax.Array:
  """float32 [batch, heads, length_q, length_k]: the bucket embeddings of the distances."""
  buckets_BxTxS = t5_buckets(relative_BxTxS, num_buckets, max_distance, bidirectional)
  return jnp.take(embedding_RxH, buckets_BxTxS, axis=0).transpose(0, 3, 1, 2)


def alibi_slopes(num_heads: int) -> np.ndarray:
  """ALiBi's per-head slopes, float32 [heads]: for n a power of two 2^(-8/n), 2^(-16/n), ...,
  2^(-8); otherwise those of the closest smaller power of two, then every other one of twice it."""

  def geometric(n: int) -> list[float]:
    return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

  closest = 2 ** math.floor(math.log2(num_heads))
  slopes = geometric(closest) + geometric(2 * closest)[0::2][:num_heads - closest]
  return np.asarray(slopes, np.float32)


def alibi_bias(slopes_H: jax.Array, relative_BxTxS: jax.Array) -> jax.Array:
  """float32 [batch, heads, length_q, length_k]: -slope_h |j - i|."""
  distance_Bx1xTxS = jnp.abs(relative_BxTxS)[:, None].astype(jnp.float32)
  return -slopes_H[None, :, None, None] * distance_Bx1xTxS


class PairBiasHooks(LayerHooks):
  """The blockwise bias of a ``PairBias`` scheme, from the table the context carries."""

  def __init__(self, bias_fn: Callable[..., jax.Array], args: tuple):
    self.bias_fn, self.args = bias_fn, args

  def block_bias(self, q_BxTxHxD, ctx, relative_BxTxS):
    return self.bias_fn(ctx.pair_table, relative_BxTxS, *self.args)


class PairBias(PositionScheme):
  """A logits bias ``bias_fn(pair_table(), relative, *args)`` from a small table (T5, ALiBi),
  whole or (chunked attention) per block."""

  def __init__(self, cfg, bias_fn: Callable[..., jax.Array], args: tuple = ()):
    self.blockwise = blockwise(cfg)
    self.bias_fn, self.args = bias_fn, args

  def pair_table(self) -> jax.Array:
    """The scheme's table (T5: bucket embeddings, ALiBi: slopes); each subclass gives its own."""
    raise NotImplementedError

  def prepare(self, positions_BxL: jax.Array) -> PositionContext:
    table = self.pair_table()
    if self.blockwise:
      return PositionContext(pair_table=table)
    return PositionContext(bias=self.bias_fn(table, relative_positions(positions_BxL), *self.args))

  def layer_hooks(self, *, rngs: nnx.Rngs) -> LayerHooks:
    del rngs
    return PairBiasHooks(self.bias_fn, self.args)


@register('t5', supports_linear=False)
class T5(PairBias):
  """A learned scalar per (bucketed relative distance, head), shared by all layers (Raffel et
  al. 2020, section 2.1)."""

  fields = ('t5_num_buckets', 't5_max_distance')
  pallas_kernels = ('pallas_flash',)

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    super().__init__(cfg, t5_bias, (cfg.t5_num_buckets, cfg.t5_max_distance, not cfg.causal))
    self.embedding = nnx.Param(
        cfg.relative_initializer(rngs.positions(), (cfg.t5_num_buckets, cfg.num_heads),
                                 jnp.float32),
        **sharding.param_metadata((None, sharding.HEADS)))

  @classmethod
  def check(cls, cfg) -> None:
    if cfg.t5_num_buckets < 4 or cfg.t5_num_buckets % 2:
      raise ValueError('model.t5_num_buckets must be even and >= 4 (half per direction), got '
                       f'{cfg.t5_num_buckets}.')
    exact = cfg.t5_num_buckets // (2 if cfg.causal else 4)  # causal: all buckets look back
    if cfg.t5_max_distance <= exact:
      raise ValueError(f'model.t5_max_distance={cfg.t5_max_distance} must exceed the exactly '
                       f'bucketed distances (model.t5_num_buckets / {4 // (1 + cfg.causal)} = '
                       f'{exact}).')

  def pair_table(self) -> jax.Array:
    return self.embedding[...]


@register('alibi', supports_linear=False)
class ALiBi(PairBias):
  """Fixed linear biases -slope_h |j - i| (Press, Smith and Lewis 2022), in the symmetric form
  for a bidirectional encoder; under the causal mask it is the paper's causal form."""

  pallas_kernels = ('pallas_flash',)

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    del rngs
    super().__init__(cfg, alibi_bias)
    self.num_heads = cfg.num_heads

  def pair_table(self) -> jax.Array:
    return jnp.asarray(alibi_slopes(self.num_heads))


class RotaryHooks(LayerHooks):
  """Rotates queries and keys (and values with ``rope.rotary_value``) with shared tables."""

  def __init__(self, rotary: rope.Rotary):
    self.rotary = rotary

  def rotate(self, x_BxLxHxD: jax.Array, ctx: PositionContext, role: str) -> jax.Array:
    if role == 'value' and not self.rotary.rotary_value:
      return x_BxLxHxD
    return self.rotary.apply(x_BxLxHxD, ctx.rotary_tables, role=role)


@register('rotary', options=('rope.rotary_dim', 'rope.p', 'rope.scaling', 'rope.xpos',
                             'rope.rotary_value'))
class Rotary(PositionScheme):
  """RoPE (Su et al. 2021) with every ``rope`` option; values too with ``rope.rotary_value``."""

  pallas_kernels = ('splash', 'pallas_flash')

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    del rngs
    self.rotary = cfg.rotary

  @classmethod
  def check(cls, cfg) -> None:
    try:
      rotary = cfg.rotary
    except ValueError as e:
      raise ValueError(f'model.position=rotary cannot use these options (head_dim = '
                       f'model.hidden_size / model.num_heads = {cfg.head_dim}): {e}') from e
    if rotary.xpos and not cfg.causal:
      raise ValueError(
          'rope.xpos=True needs causal attention (train.task=clm), and this model is '
          'bidirectional: xPos scales queries by zeta^m and keys by zeta^-m, so q.k decays with '
          'the distance to keys before the query but grows exponentially towards keys after it. '
          'Set rope.xpos=False.')
    if cfg.attention == 'linear' and rotary.attention_factor != 1.0:
      raise ValueError(
          f'rope.scaling={rotary.scaling!r} scales queries and keys by '
          f'{rotary.attention_factor:.4g}, which model.attention=linear would apply to the '
          'numerator of eq. 19 only (its normaliser uses the unrotated features), leaving the '
          'output un-normalised. Use model.attention=softmax, or a scaling without a '
          'temperature (linear, ntk, dynamic_ntk, llama3).')

  def prepare(self, positions_BxL: jax.Array) -> PositionContext:
    return PositionContext(rotary_tables=self.rotary.tables(positions_BxL))

  def layer_hooks(self, *, rngs: nnx.Rngs) -> LayerHooks:
    del rngs
    return RotaryHooks(self.rotary)


# The floor at which KERPLE's authors clamp r1 and r2 after every step (chijames/KERPLE,
# megatron/mpu/layers.py, ``eps``); here it bounds the initial draws only, as their first clamp.
_KERPLE_FLOOR = 0.01


def _replace_leaf(params: dict, path: tuple[str, ...], fn: Callable[[jax.Array], jax.Array]
                  ) -> dict:
  """``params`` (a nested dict) with the leaf at ``path`` replaced by ``fn(leaf)``."""
  head, *rest = path
  inner = _replace_leaf(params[head], tuple(rest), fn) if rest else fn(params[head])
  return {**params, head: inner}


def _distance(relative_BxTxS: jax.Array) -> jax.Array:
  """float32 |j - i|, [batch, 1, length_q, length_k] (broadcast over the heads)."""
  return jnp.abs(relative_BxTxS)[:, None].astype(jnp.float32)


def kerple_log_bias(r_2xH: jax.Array, relative_BxTxS: jax.Array) -> jax.Array:
  """float32 [batch, heads, length_q, length_k]: -r1 log(1 + r2 |j - i|), r1, r2 > 0 per head."""
  r1_Hx1x1, r2_Hx1x1 = r_2xH[..., None, None]
  return -r1_Hx1x1 * jnp.log1p(r2_Hx1x1 * _distance(relative_BxTxS))


def kerple_power_bias(r_2xH: jax.Array, relative_BxTxS: jax.Array) -> jax.Array:
  """float32 [batch, heads, length_q, length_k]: -r1 |j - i|^r2, r1 > 0, 0 < r2 <= 2 per head. 0
  at distance 0, where the gradient in r2 (|j - i|^r2 log |j - i| -> 0) is 0, not NaN."""
  r1_Hx1x1, r2_Hx1x1 = r_2xH[..., None, None]
  distance_Bx1xTxS = _distance(relative_BxTxS)
  apart_Bx1xTxS = distance_Bx1xTxS > 0
  power_BxHxTxS = jnp.where(apart_Bx1xTxS, jnp.where(apart_Bx1xTxS, distance_Bx1xTxS, 1.0)
                            ** r2_Hx1x1, 0.0)
  return -r1_Hx1x1 * power_BxHxTxS


class Kerple(PairBias):
  """KERPLE (Chi, Fan, Ramadge and Rudnicky 2022): a learned kernel of the distance |j - i| as a
  logits bias, r1 and r2 learned per head and shared by all layers (the authors pass one module
  to every layer). As their code (chijames/KERPLE, megatron/mpu/layers.py): r1 ~ U(0, highs[0]),
  r2 ~ U(0, highs[1]), and both clamped into ``bounds`` after every update (``project``), which
  leaves their gradient and Adam's step size untouched near the bounds."""

  highs: ClassVar[tuple[float, float]]  # r1 and r2 start ~ U(0, high)
  bounds: ClassVar[tuple[tuple[float, float], tuple[float, float]]]  # (low, high) of r1, r2

  def __init__(self, cfg, bias_fn: Callable[..., jax.Array], *, rngs: nnx.Rngs):
    super().__init__(cfg, bias_fn)
    draws_2xH = jax.random.uniform(rngs.positions(), (2, cfg.num_heads), jnp.float32)
    # [2, heads]: r1 and r2.
    self.r = nnx.Param(self.clamp(draws_2xH * jnp.asarray(self.highs)[:, None]),
                       **sharding.param_metadata((None, sharding.HEADS)))

  @classmethod
  def clamp(cls, r_Nx2xH: jax.Array) -> jax.Array:
    """r1 and r2 clamped into ``bounds`` (any leading axes)."""
    low_2x1, high_2x1 = (jnp.asarray(side, jnp.float32)[:, None] for side in zip(*cls.bounds))
    return jnp.clip(r_Nx2xH, low_2x1, high_2x1)

  @classmethod
  def project(cls, params: dict) -> dict:
    return _replace_leaf(params, ('positions', 'r'), cls.clamp)

  @classmethod
  def learned(cls, cfg, params: dict) -> dict:
    """r1 and r2 per head, [members][2][heads]."""
    del cfg
    return {'kerple_r': np.asarray(params['positions']['r']).tolist()}

  def pair_table(self) -> jax.Array:
    return self.r[...]


@register('kerple_log', supports_linear=False)
class KerpleLog(Kerple):
  """KERPLE's logarithmic variant, -r1 log(1 + r2 |j - i|): r1 ~ U(0, 2), r2 ~ U(0, 1)."""

  highs = (2.0, 1.0)
  bounds = ((_KERPLE_FLOOR, math.inf), (_KERPLE_FLOOR, math.inf))

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    super().__init__(cfg, kerple_log_bias, rngs=rngs)


@register('kerple_power', supports_linear=False)
class KerplePower(Kerple):
  """KERPLE's power variant, -r1 |j - i|^r2: r1 ~ U(0, 1), r2 ~ U(0, 2), r2 kept in [0.01, 2]."""

  highs = (1.0, 2.0)
  bounds = ((_KERPLE_FLOOR, math.inf), (_KERPLE_FLOOR, 2.0))

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    super().__init__(cfg, kerple_power_bias, rngs=rngs)


_FIRE_EPS = 1e-6  # the guard on the normaliser psi(max(L, i)) of mcleish7/arithmetic's FIRE


def fire_pieces(w_in_W: jax.Array, b_in_W: jax.Array, w_out_WxH: jax.Array, b_out_H: jax.Array
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """FIRE's MLP x -> relu(x w_in + b_in) w_out + b_out on [-1, 1] (its inputs' range) as the
  piecewise-linear function it is: sorted knots [W] (clipped to [-2, 2]) and each segment's
  slope and intercept [W + 1, H]. Which units are active in a segment is read at a point inside
  it; slopes and intercepts stay differentiable in the weights, and the knots need no gradient
  (the function is continuous across them)."""
  safe_W = jnp.where(w_in_W == 0, 1.0, w_in_W)
  knots_W = jnp.clip(jnp.where(w_in_W == 0, 3.0, -b_in_W / safe_W), -2.0, 2.0)
  knots_W = jnp.sort(jax.lax.stop_gradient(knots_W))
  edges = jnp.concatenate([jnp.array([-3.0]), knots_W, jnp.array([3.0])])
  inside_G = (edges[1:] + edges[:-1]) / 2
  active_GxW = jax.lax.stop_gradient((inside_G[:, None] * w_in_W + b_in_W > 0).astype(jnp.float32))
  slope_GxH = (active_GxW * w_in_W) @ w_out_WxH
  intercept_GxH = (active_GxW * b_in_W) @ w_out_WxH + b_out_H
  return knots_W, slope_GxH, intercept_GxH


def fire_inputs(c: jax.Array, threshold: jax.Array, relative_BxTxS: jax.Array,
                query_positions_BxT: jax.Array) -> jax.Array:
  """float32 [batch, length_q, length_k] in [-1, 1]: FIRE's MLP inputs psi(|i - j|) /
  psi(max(L, i, j)), psi(x) = log(c x + 1), i the query's position, j the key's. Causal (j <= i)
  this is the paper's psi(i - j) / psi(max(L, i)). For keys after the query (bidirectional only;
  this project's choice) the input is negated: one MLP over [-1, 1] tells the two sides apart,
  and max(L, i, j) keeps the magnitude at most 1."""
  relative_BxTxS = relative_BxTxS.astype(jnp.float32)
  query_BxTx1 = query_positions_BxT.astype(jnp.float32)[..., None]
  normaliser_BxTxS = jnp.maximum(threshold, query_BxTx1 + jnp.maximum(relative_BxTxS, 0.0))
  psi = lambda x: jnp.log1p(c * x)
  interpolated_BxTxS = psi(jnp.abs(relative_BxTxS)) / (psi(normaliser_BxTxS) + _FIRE_EPS)
  return jnp.where(relative_BxTxS > 0, -interpolated_BxTxS, interpolated_BxTxS)


def fire_bias(table: tuple[jax.Array, ...], relative_BxTxS: jax.Array,
              query_positions_BxT: jax.Array) -> jax.Array:
  """float32 [batch, heads, length_q, length_k]: FIRE's f(``fire_inputs``), f an MLP 1 -> width
  (ReLU) -> heads, applied as its segments (``fire_pieces``): a lookup per pair, not width x
  heads products."""
  c, threshold, w_in_W, b_in_W, w_out_WxH, b_out_H = table
  x_BxTxS = fire_inputs(c, threshold, relative_BxTxS, query_positions_BxT)
  knots_W, slope_GxH, intercept_GxH = fire_pieces(w_in_W, b_in_W, w_out_WxH, b_out_H)
  segment_BxTxS = jnp.searchsorted(knots_W, jax.lax.stop_gradient(x_BxTxS), method='compare_all')
  bias_BxTxSxH = (jnp.take(slope_GxH, segment_BxTxS, axis=0) * x_BxTxS[..., None]
                  + jnp.take(intercept_GxH, segment_BxTxS, axis=0))
  return bias_BxTxSxH.transpose(0, 3, 1, 2)


class FireParams(nnx.Module):
  """One FIRE's parameters, initialised as the listing the paper's code is known by
  (mcleish7/arithmetic's FIRE): c = 0.1, the threshold L = |scale| L0 with the scale learned from
  1, and the MLP's weights and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (torch.nn.Linear's)."""

  def __init__(self, cfg, rngs: nnx.Rngs):
    self.threshold = float(cfg.fire_threshold)
    width, heads = cfg.fire_mlp_width, cfg.num_heads

    def uniform(shape: tuple[int, ...], fan_in: int, names: tuple[str | None, ...]) -> nnx.Param:
      bound = 1.0 / math.sqrt(fan_in)
      return nnx.Param(jax.random.uniform(rngs.positions(), shape, jnp.float32, -bound, bound),
                       **sharding.param_metadata(names))

    self.c = nnx.Param(jnp.asarray(0.1, jnp.float32), **sharding.param_metadata(()))
    self.threshold_scale = nnx.Param(jnp.asarray(1.0, jnp.float32), **sharding.param_metadata(()))
    self.w_in = uniform((width,), 1, (None,))
    self.b_in = uniform((width,), 1, (None,))
    self.w_out = uniform((width, heads), width, (None, sharding.HEADS))
    self.b_out = uniform((heads,), width, (sharding.HEADS,))

  def table(self) -> tuple[jax.Array, ...]:
    """(c, L, the MLP's w_in, b_in, w_out, b_out): ``fire_bias``'s parameters."""
    return (jnp.abs(self.c[...]), jnp.abs(self.threshold_scale[...]) * self.threshold,
            self.w_in[...], self.b_in[...], self.w_out[...], self.b_out[...])


class FireHooks(LayerHooks):
  """One layer's FIRE bias: its own parameters (FIRE), or the shared ones the context carries
  (FIRE-S, ``model.fire_shared``)."""

  def __init__(self, params: FireParams | None):
    self.params = params

  def bias(self, q_BxLxHxD, ctx):
    if self.params is None:
      return ctx.bias
    queries_BxT = ctx.positions if ctx.query_positions is None else ctx.query_positions
    relative_BxTxS = ctx.positions[:, None, :] - queries_BxT[:, :, None]
    return fire_bias(self.params.table(), relative_BxTxS, queries_BxT)

  def block_bias(self, q_BxTxHxD, ctx, relative_BxTxS):
    table = ctx.pair_table if self.params is None else self.params.table()
    return fire_bias(table, relative_BxTxS, ctx.query_positions)


@register('fire', supports_linear=False, options=('model.fire_shared',))
class Fire(PositionScheme):
  """FIRE (Li et al. 2024): a learned MLP of the progressively interpolated log distance, one
  output per head, one per layer as the paper's FIRE; ``model.fire_shared``: one for all layers
  (the paper's FIRE-S). Relative (shift invariant) while the positions stay below L; beyond it
  the normaliser reads the query's position, so longer inputs interpolate into [-1, 1]."""

  fields = ('fire_mlp_width', 'fire_threshold', 'fire_shared')

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    self.blockwise = blockwise(cfg)
    self.shared = FireParams(cfg, rngs) if cfg.fire_shared else None
    self.cfg = cfg

  @classmethod
  def check(cls, cfg) -> None:
    if cfg.fire_mlp_width < 1 or not cfg.fire_threshold > 0:
      raise ValueError(f'model.position=fire needs model.fire_mlp_width >= 1 and '
                       f'model.fire_threshold >= 0 (0: the training length), got '
                       f'{cfg.fire_mlp_width} and {cfg.fire_threshold}.')

  @classmethod
  def learned(cls, cfg, params: dict) -> dict:
    """c and L of each FIRE (one per layer; FIRE-S: one), [members][FIREs] (leading axis N)."""
    flat = traverse_util.flatten_dict(params)
    fires = sorted(path[:-1] for path in flat if path[-1] == 'threshold_scale')
    c_FxN = np.abs([np.asarray(flat[path + ('c',)]) for path in fires])
    scale_FxN = np.abs([np.asarray(flat[path + ('threshold_scale',)]) for path in fires])
    return {'fire_c': c_FxN.T.tolist(),
            'fire_threshold': (scale_FxN * cfg.fire_threshold).T.tolist()}

  def prepare(self, positions_BxL: jax.Array) -> PositionContext:
    if self.shared is None:
      return PositionContext(positions=positions_BxL)
    if self.blockwise:
      return PositionContext(pair_table=self.shared.table())
    return PositionContext(bias=fire_bias(self.shared.table(), relative_positions(positions_BxL),
                                          positions_BxL))

  def layer_hooks(self, *, rngs: nnx.Rngs) -> LayerHooks:
    return FireHooks(None if self.shared is not None else FireParams(self.cfg, rngs))


def cope_bias(q_BxTxHxD: jax.Array, k_BxSxHxD: jax.Array, visible_Bx1xTxS: jax.Array,
              embedding_RxD: jax.Array, max_position: int, causal: bool) -> jax.Array:
  """float32 [batch, heads, T, S]: CoPE's q_i . e[p_ij] / sqrt(head_dim) (Golovneva et al. 2024),
  e interpolated between floor(p_ij) and ceil(p_ij). Gates g_it = sigmoid(q_i . k_t /
  sqrt(head_dim)) on the keys query i sees; for j <= i, p_ij = sum_{t=j..i} g_it, clipped at
  ``max_position`` (the table's rows 0 .. max_position). Bidirectional (this project's): for j > i,
  p_ij = -sum_{t=i+1..j} g_it, clipped at -max_position (the rows -max_position .. max_position)."""
  queries, keys = q_BxTxHxD.shape[1], k_BxSxHxD.shape[1]
  scale = 1.0 / math.sqrt(q_BxTxHxD.shape[-1])
  logits_BxHxTxS = jnp.einsum('BTHD,BSHD->BHTS', q_BxTxHxD, k_BxSxHxD,
                              preferred_element_type=jnp.float32) * scale
  gates_BxHxTxS = jax.nn.sigmoid(logits_BxHxTxS) * visible_Bx1xTxS
  counts_BxHxTxS = jnp.cumsum(gates_BxHxTxS, axis=-1)  # sum_{t <= j} g_it
  own_BxHxTx1 = jnp.diagonal(counts_BxHxTxS, axis1=2, axis2=3)[..., None]  # sum_{t <= i} g_it
  at_or_before_TxS = jnp.arange(keys)[None, :] <= jnp.arange(queries)[:, None]
  position_BxHxTxS = own_BxHxTx1 - counts_BxHxTxS + jnp.where(at_or_before_TxS, gates_BxHxTxS, 0.0)
  lowest = 0 if causal else -max_position
  row_BxHxTxS = jnp.clip(position_BxHxTxS, lowest, max_position) - lowest
  qe_BxHxTxR = jnp.einsum('BTHD,RD->BHTR', q_BxTxHxD, embedding_RxD.astype(q_BxTxHxD.dtype),
                          preferred_element_type=jnp.float32) * scale
  floor_BxHxTxS = jnp.floor(row_BxHxTxS)
  low_BxHxTxS = jnp.take_along_axis(qe_BxHxTxR, floor_BxHxTxS.astype(jnp.int32), axis=-1)
  high_BxHxTxS = jnp.take_along_axis(qe_BxHxTxR, jnp.ceil(row_BxHxTxS).astype(jnp.int32), axis=-1)
  return low_BxHxTxS + (row_BxHxTxS - floor_BxHxTxS) * (high_BxHxTxS - low_BxHxTxS)


class CopeHooks(LayerHooks):
  """One layer's CoPE position embeddings e[p] [rows, head_dim], shared by its heads and zero at
  the start, as in the authors' code (facebookresearch/RAM, projects/cope)."""

  def __init__(self, cfg):
    self.max_position = cfg.cope_npos - 1
    self.causal = cfg.causal
    rows = cfg.cope_npos if cfg.causal else 2 * cfg.cope_npos - 1
    self.embedding = nnx.Param(jnp.zeros((rows, cfg.head_dim), jnp.float32),
                               **sharding.param_metadata((None, sharding.KV)))

  def attention_bias(self, q_BxTxHxD, k_BxSxHxD, visible_Bx1xTxS, ctx):
    del ctx
    return cope_bias(q_BxTxHxD, k_BxSxHxD, visible_Bx1xTxS, self.embedding[...],
                     self.max_position, self.causal)


@register('cope', supports_linear=False)
class Cope(PerLayer):
  """Contextual position encoding (Golovneva, Wang, Weston and Sukhbaatar 2024): positions count
  gated keys, so they depend on the content, never on the position ids; per-layer embeddings."""

  fields = ('cope_npos',)
  reads_positions = False
  supports_chunked = False

  @classmethod
  def check(cls, cfg) -> None:
    if cfg.cope_npos < 2:
      raise ValueError(f'model.cope_npos must be 0 (the training length + 1) or >= 2 '
                       f'(positions 0 .. npos - 1), got {cfg.cope_npos}.')
    if cfg.attention_impl == 'chunked':
      raise ValueError(
          "model.position='cope' cannot run on model.attention_impl=chunked: a contextual "
          'position sums the gates of every key between the query and the key, which one block '
          'of keys does not see. Use model.attention_impl=explicit, xla, cudnn or auto.')

  def layer_hooks(self, *, rngs: nnx.Rngs) -> LayerHooks:
    del rngs  # the embeddings start at zero (no draw)
    return CopeHooks(self.cfg)
