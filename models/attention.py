"""Multi-head self-attention whose position scheme is a set of hooks (``models.positions``).

``model.attention_impl`` picks the softmax written out (``softmax_attention``; probability dropout
and Shaw's relative values need it), ``jax.nn.dot_product_attention`` (XLA or cuDNN), blocks with
an online softmax (``chunked_attention``) or a Pallas TPU kernel (``pallas_attention``); see
``ModelConfig.attention_implementation`` for 'auto'. Kernels are HF RoFormer's dense layers
reshaped: query/key/value [embed, heads, head_dim], output [heads, head_dim, embed].
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash
from jax.experimental.pallas.ops.tpu import splash_attention as splash

import rope
from models import sharding
from models.config import PALLAS_SCHEMES, ModelConfig
from models.positions import LayerHooks, PositionContext

_HEADS = (sharding.BATCH, sharding.LENGTH, sharding.HEADS, sharding.KV)


class Visibility(NamedTuple):
  """The keys a query sees: real ones (``mask_BxL``), of its own document (``segments_BxL``,
  packed sequences) and, if causal, at its own or earlier positions."""

  mask_BxL: jax.Array
  segments_BxL: jax.Array | None = None

  def dense(self, causal: bool, num_queries: int | None = None) -> jax.Array:
    """bool [batch, 1, T or 1, S]: query t may attend to key s (T = ``num_queries`` or S)."""
    mask_Bx1xTxS = self.mask_BxL[:, None, None, :]
    length = self.mask_BxL.shape[1]
    queries = num_queries or length
    if (segments_BxL := self.segments_BxL) is not None:
      mask_Bx1xTxS = mask_Bx1xTxS & (segments_BxL[:, None, :queries, None]
                                     == segments_BxL[:, None, None, :])
    if causal:
      mask_Bx1xTxS = mask_Bx1xTxS & (jnp.arange(queries)[:, None] >= jnp.arange(length))
    return mask_Bx1xTxS


def softmax_attention(q_BxTxHxD: jax.Array, k_BxSxHxD: jax.Array, v_BxSxHxD: jax.Array,
                      bias: jax.Array | None, mask: jax.Array | None, *,
                      dropout: Callable[[jax.Array], jax.Array] | None = None,
                      value_term: Callable[[jax.Array], jax.Array | None] | None = None
                      ) -> jax.Array:
  """softmax(q k^T / sqrt(head_dim) + bias, masked) v in the inputs' dtype, with the dtypes and
  mask value of ``jax.nn.dot_product_attention``'s XLA form (the same forward values).
  ``value_term``: probabilities -> a term added to the output (Shaw's relative values)."""
  logits_dtype = jnp.promote_types(q_BxTxHxD.dtype, jnp.float32)
  precision = {jnp.bfloat16: jax.lax.DotAlgorithmPreset.BF16_BF16_F32,
               jnp.float16: jax.lax.DotAlgorithmPreset.F16_F16_F32}.get(q_BxTxHxD.dtype.type)
  logits_BxHxTxS = jnp.einsum('BTHD,BSHD->BHTS', _scaled(q_BxTxHxD), k_BxSxHxD,
                              precision=precision, preferred_element_type=logits_dtype)
  if bias is not None:
    logits_BxHxTxS = (logits_BxHxTxS + bias).astype(logits_dtype)
  if mask is not None:
    # Masked logits become large_negative, added rather than selected: the same values (an
    # added 0 is exact, and |logit| is far below half an ulp of large_negative), and XLA on CPU
    # fuses dot, bias, softmax and dot into one kernel.
    large_negative = _large_negative(logits_dtype)
    logits_BxHxTxS = logits_BxHxTxS + jnp.where(mask, jnp.zeros((), logits_dtype),
                                                jnp.asarray(large_negative, logits_dtype))
  probs_BxHxTxS = _softmax_as(logits_BxHxTxS.astype(jnp.float32), v_BxSxHxD.dtype)
  if dropout is not None:
    probs_BxHxTxS = dropout(probs_BxHxTxS)
  out_BxTxHxD = jnp.einsum('BHTS,BSHD->BTHD', probs_BxHxTxS, v_BxSxHxD)
  extra_BxTxHxD = None if value_term is None else value_term(probs_BxHxTxS)
  return out_BxTxHxD if extra_BxTxHxD is None else out_BxTxHxD + extra_BxTxHxD


def _softmax_as(logits_BxHxTxS: jax.Array, dtype) -> jax.Array:
  """The float32 softmax over keys in ``dtype``. A narrower ``dtype``'s backward pass reads the
  narrow probabilities: ``jax.nn.softmax``'s rule kept a float32 copy of every layer's as well,
  which made the bf16 step's peak memory exceed HF's."""
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float32:
    return jax.nn.softmax(logits_BxHxTxS, axis=-1)
  return _narrow_softmax(logits_BxHxTxS, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _narrow_softmax(logits_BxHxTxS: jax.Array, dtype) -> jax.Array:
  return jax.nn.softmax(logits_BxHxTxS, axis=-1).astype(dtype)


def _narrow_softmax_fwd(logits_BxHxTxS: jax.Array, dtype):
  probs_BxHxTxS = _narrow_softmax(logits_BxHxTxS, dtype)
  return probs_BxHxTxS, probs_BxHxTxS  # the output is the only residual


def _narrow_softmax_bwd(dtype, probs_BxHxTxS: jax.Array, grad_BxHxTxS: jax.Array):
  del dtype
  p_BxHxTxS = probs_BxHxTxS.astype(jnp.float32)
  g_BxHxTxS = grad_BxHxTxS.astype(jnp.float32)
  return (p_BxHxTxS * (g_BxHxTxS - jnp.sum(g_BxHxTxS * p_BxHxTxS, axis=-1, keepdims=True)),)


_narrow_softmax.defvjp(_narrow_softmax_fwd, _narrow_softmax_bwd)


def _scaled(q_BxTxHxD: jax.Array) -> jax.Array:
  # The scale goes on the queries, as in Flax's and Hugging Face's attention: scaling the logits
  # makes XLA on CPU materialise a logit-sized broadcast of the scale. Exact where sqrt(head_dim)
  # is a power of two.
  return q_BxTxHxD * jnp.asarray(1.0 / np.sqrt(q_BxTxHxD.shape[-1]), q_BxTxHxD.dtype)


def _large_negative(dtype) -> float:
  return -0.7 * min(jnp.finfo(dtype).max, jnp.finfo(jnp.float32).max)


def _pad_to_blocks(x_BxLx___: jax.Array, size: int, fill=0) -> jax.Array:
  widths = [(0, 0), (0, -x_BxLx___.shape[1] % size)] + [(0, 0)] * (x_BxLx___.ndim - 2)
  return jnp.pad(x_BxLx___, widths, constant_values=fill)


def _blocks(x_BxLx___: jax.Array, size: int, fill=0) -> jax.Array:
  """[num_blocks, batch, size, ...]: ``x`` padded to whole blocks."""
  x_BxLx___ = _pad_to_blocks(x_BxLx___, size, fill)
  blocks = x_BxLx___.reshape(x_BxLx___.shape[0], -1, size, *x_BxLx___.shape[2:])
  return jnp.moveaxis(blocks, 1, 0)


def _online_block(totals, q_BxCxHxD, q_positions_BxC, query_visibility, block, *, block_bias,
                  block_value_term):
  """A query block's running (max, sum, unnormalised output) updated by one key block."""
  max_BxHxC, sum_BxHxC, out_BxCxHxD = totals
  k_BxKxHxD, v_BxKxHxD, mask_BxK, k_positions_BxK, k_segments_BxK, k_index_K = block
  q_segments_BxC, q_index_C, causal = query_visibility
  logits_dtype = jnp.promote_types(q_BxCxHxD.dtype, jnp.float32)
  logits_BxHxCxK = jnp.einsum('BCHD,BKHD->BHCK', _scaled(q_BxCxHxD), k_BxKxHxD,
                              preferred_element_type=logits_dtype)
  relative_BxCxK = (k_positions_BxK[:, None, :] - q_positions_BxC[:, :, None]).astype(jnp.int32)
  if (bias := block_bias(q_BxCxHxD, relative_BxCxK, q_positions_BxC)) is not None:
    logits_BxHxCxK = logits_BxHxCxK + bias
  visible_BxCxK = mask_BxK[:, None, :] & (q_segments_BxC[:, :, None] == k_segments_BxK[:, None, :])
  if causal:
    visible_BxCxK = visible_BxCxK & (q_index_C[:, None] >= k_index_K[None, :])
  masked = jnp.where(visible_BxCxK[:, None], 0.0, _large_negative(logits_dtype))
  logits_BxHxCxK = (logits_BxHxCxK + masked).astype(jnp.float32)
  # The running max only shifts the exponents (softmax is invariant to it): no gradient.
  new_max_BxHxC = jax.lax.stop_gradient(jnp.maximum(max_BxHxC, logits_BxHxCxK.max(-1)))
  probs_BxHxCxK = jnp.exp(logits_BxHxCxK - new_max_BxHxC[..., None])
  rescale_BxHxC = jnp.exp(max_BxHxC - new_max_BxHxC)
  block_BxCxHxD = jnp.einsum('BHCK,BKHD->BCHD', probs_BxHxCxK.astype(v_BxKxHxD.dtype), v_BxKxHxD,
                             preferred_element_type=jnp.float32)
  if (term := block_value_term(probs_BxHxCxK, relative_BxCxK)) is not None:
    block_BxCxHxD = block_BxCxHxD + term
  out_BxCxHxD = out_BxCxHxD * jnp.swapaxes(rescale_BxHxC, 1, 2)[..., None] + block_BxCxHxD
  return new_max_BxHxC, sum_BxHxC * rescale_BxHxC + probs_BxHxCxK.sum(-1), out_BxCxHxD


def chunked_attention(q_BxTxHxD: jax.Array, k_BxSxHxD: jax.Array, v_BxSxHxD: jax.Array,
                      visibility: Visibility, positions_BxS: jax.Array, *, chunk_size: int,
                      block_bias: Callable[[jax.Array, jax.Array, jax.Array], jax.Array | None],
                      block_value_term: Callable[[jax.Array, jax.Array], jax.Array | None],
                      causal: bool = False) -> jax.Array:
  """``softmax_attention`` in blocks of ``chunk_size`` queries x keys with an online softmax
  (Rabe and Staats 2021), each query block recomputed in the backward pass: memory linear in the
  length. The queries are the first T positions; ``block_bias`` and ``block_value_term``: a
  block's position terms (None: none)."""
  length, k_size = q_BxTxHxD.shape[1], min(chunk_size, k_BxSxHxD.shape[1])
  mask_BxS = visibility.mask_BxL
  # Without documents every query matches every key (the mask drops padding), as ``dense``: a
  # padded query attends to the real keys, as in the written-out form and HF's.
  segments_BxS = (jnp.zeros(mask_BxS.shape, jnp.int32) if visibility.segments_BxL is None
                  else visibility.segments_BxL)
  index_1xS = jnp.arange(mask_BxS.shape[1])[None]
  keys = (_blocks(k_BxSxHxD, k_size), _blocks(v_BxSxHxD, k_size),
          _blocks(mask_BxS, k_size, fill=False), _blocks(positions_BxS, k_size),
          _blocks(segments_BxS, k_size), _blocks(index_1xS, k_size)[:, 0])

  @jax.checkpoint
  def query_block(block):
    q_BxCxHxD, q_positions_BxC, q_segments_BxC, q_index_C = block
    query_visibility = (q_segments_BxC, q_index_C, causal)
    batch, size, heads, _ = q_BxCxHxD.shape
    totals = (jnp.full((batch, heads, size), -jnp.inf, jnp.float32),
              jnp.zeros((batch, heads, size), jnp.float32),
              jnp.zeros((batch, size, heads, v_BxSxHxD.shape[-1]), jnp.float32))
    step = lambda totals, block: (_online_block(
        totals, q_BxCxHxD, q_positions_BxC, query_visibility, block, block_bias=block_bias,
        block_value_term=block_value_term), None)
    (_, sum_BxHxC, out_BxCxHxD), _ = jax.lax.scan(jax.checkpoint(step), totals, keys)
    return out_BxCxHxD / jnp.swapaxes(sum_BxHxC, 1, 2)[..., None]

  q_size = min(chunk_size, length)
  out_NxBxCxHxD = jax.lax.map(query_block, (
      _blocks(q_BxTxHxD, q_size), _blocks(positions_BxS[:, :length], q_size),
      _blocks(segments_BxS[:, :length], q_size), _blocks(index_1xS[:, :length], q_size)[:, 0]))
  out_BxTxHxD = jnp.moveaxis(out_NxBxCxHxD, 0, 1).reshape(
      q_BxTxHxD.shape[0], -1, *out_NxBxCxHxD.shape[-2:])[:, :length]
  return out_BxTxHxD.astype(v_BxSxHxD.dtype)


# The Pallas kernels' tile, also the lane width (NUM_LANES) their segment-id masks need; lengths
# are padded to multiples of it. Untuned: no TPU was available.
_PALLAS_BLOCK = 128
# The segment id of padding keys, which no query has (documents are numbered from 1, else 0).
_PAD_SEGMENT = np.iinfo(np.int32).min


def _kernel_segments(visibility: Visibility, num_queries: int) -> tuple[jax.Array, jax.Array]:
  """int32 segment ids of queries and keys, padded to whole blocks, equal exactly where
  ``visibility.dense`` lets a query see a key (causality aside)."""
  mask_BxS = visibility.mask_BxL
  segments_BxS = (jnp.zeros(mask_BxS.shape, jnp.int32) if visibility.segments_BxL is None
                  else visibility.segments_BxL.astype(jnp.int32))
  kv_BxS = jnp.where(mask_BxS, segments_BxS, _PAD_SEGMENT)
  return (_pad_to_blocks(segments_BxS[:, :num_queries], _PALLAS_BLOCK),
          _pad_to_blocks(kv_BxS, _PALLAS_BLOCK, fill=_PAD_SEGMENT))


def _interpreted(fn: Callable) -> Callable:
  """``fn`` with every pallas_call it traces, forward and backward, interpreted: flash_attention
  has no ``interpret`` argument and its backward kernels are traced later (by the transpose),
  outside ``force_tpu_interpret_mode``. True, not ``InterpretParams``, gives the effect-free
  interpreter ``jax.checkpoint`` accepts. The last two arguments are integer segment ids."""

  @jax.custom_vjp
  def interpreted(*args):
    with pltpu.force_tpu_interpret_mode(True):
      return fn(*args)

  def forward(*args):
    with pltpu.force_tpu_interpret_mode(True):
      out, backward = jax.vjp(lambda *floats: fn(*floats, *args[-2:]), *args[:-2])
    return out, backward

  def backward(vjp, cotangent):
    with pltpu.force_tpu_interpret_mode(True):
      return (*vjp(cotangent), None, None)

  interpreted.defvjp(forward, backward)
  return interpreted


def pallas_attention(q_BxTxHxD: jax.Array, k_BxSxHxD: jax.Array, v_BxSxHxD: jax.Array,
                     visibility: Visibility, *, kernel: str, causal: bool,
                     bias: jax.Array | None = None) -> jax.Array:
  """``softmax_attention`` by a Pallas kernel, 'splash' or 'pallas_flash' (with ``bias``), on one
  TPU, elsewhere interpreted (slow: tests). The queries are the first T positions. A query that
  sees no key (padding in packed rows) gets an unspecified finite output."""
  if bias is not None and kernel != 'pallas_flash':
    raise ValueError(f'attention_impl={kernel!r} takes no logits bias; use pallas_flash.')
  q_len, kv_len, head_dim = q_BxTxHxD.shape[1], k_BxSxHxD.shape[1], q_BxTxHxD.shape[3]
  segments = _kernel_segments(visibility, q_len)
  q_BxTxHxD = _scaled(q_BxTxHxD)  # as in softmax_attention (same rounding); splash has no scale
  # flash_attention takes a head_dim up to 128 or a multiple of 128: zero features change no
  # logit, and the zero value features are dropped below.
  dim = head_dim if head_dim <= 128 or kernel != 'pallas_flash' else -(-head_dim // 128) * 128
  q_BxHxTxD, k_BxHxSxD, v_BxHxSxD = (  # [batch, heads, length, dim], zero-padded
      jnp.swapaxes(jnp.pad(_pad_to_blocks(x_BxLxHxD, _PALLAS_BLOCK),
                           [(0, 0)] * 3 + [(0, dim - x_BxLxHxD.shape[3])]), 1, 2)
      for x_BxLxHxD in (q_BxTxHxD, k_BxSxHxD, v_BxSxHxD))
  interpret, size = jax.default_backend() != 'tpu', _PALLAS_BLOCK
  if kernel == 'splash':  # vmapped over the batch; the static causal mask skips key blocks
    shape = (q_BxHxTxD.shape[2], k_BxHxSxD.shape[2])
    mask = splash.CausalMask(shape) if causal else splash.FullMask(shape)
    blocks = splash.BlockSizes(block_q=size, block_kv=size, block_kv_compute=size,
                               block_q_dkv=size, block_kv_dkv=size, block_kv_dkv_compute=size,
                               block_q_dq=size, block_kv_dq=size)
    call = splash.make_splash_mha_single_device(splash.MultiHeadMask(
        [mask] * q_BxHxTxD.shape[1]), block_sizes=blocks, interpret=interpret)
    out_BxHxTxD = jax.vmap(call)(q_BxHxTxD, k_BxHxSxD, v_BxHxSxD, splash.SegmentIds(*segments))
  else:  # flash_attention adds the bias before its sm_scale, 1 here (the queries come scaled)
    if bias is not None:  # float32, broadcast (flash_attention does not) and padded to blocks
      t_pad, s_pad = q_BxHxTxD.shape[2] - bias.shape[2], k_BxHxSxD.shape[2] - kv_len
      bias_BxHxTxS = jnp.broadcast_to(bias, (*q_BxHxTxD.shape[:2], bias.shape[2], kv_len))
      bias = jnp.pad(bias_BxHxTxS.astype(jnp.float32), [(0, 0), (0, 0), (0, t_pad), (0, s_pad)])
    blocks = pallas_flash.BlockSizes(
        block_q=size, block_k_major=size, block_k=size, block_b=1, block_q_major_dkv=size,
        block_k_major_dkv=size, block_k_dkv=size, block_q_dkv=size, block_k_major_dq=size,
        block_k_dq=size, block_q_dq=size)
    call = lambda q, k, v, bias, q_segments, kv_segments: pallas_flash.flash_attention(
        q, k, v, bias, pallas_flash.SegmentIds(q_segments, kv_segments), causal=causal,
        sm_scale=1.0, block_sizes=blocks)
    call = _interpreted(call) if interpret else call
    out_BxHxTxD = call(q_BxHxTxD, k_BxHxSxD, v_BxHxSxD, bias, *segments)
  return jnp.swapaxes(out_BxHxTxD, 1, 2)[:, :q_len, :, :head_dim].astype(v_BxSxHxD.dtype)


class SelfAttention(nnx.Module):
  """Multi-head self-attention, bidirectional or causal; ``positions``: this layer's hooks."""

  def __init__(self, cfg: ModelConfig, positions: LayerHooks, *, rngs: nnx.Rngs):
    in_kernel = sharding.param_metadata((sharding.EMBED, sharding.HEADS, sharding.KV))
    in_bias = sharding.param_metadata((sharding.HEADS, sharding.KV))

    def projection() -> nnx.LinearGeneral:
      return nnx.LinearGeneral(cfg.hidden_size, (cfg.num_heads, cfg.head_dim),
                               dtype=cfg.compute_dtype, kernel_init=cfg.initializer,
                               kernel_metadata=in_kernel, bias_metadata=in_bias, rngs=rngs)

    self.query, self.key, self.value = projection(), projection(), projection()
    self.output = nnx.LinearGeneral(
        (cfg.num_heads, cfg.head_dim), cfg.hidden_size, axis=(-2, -1), dtype=cfg.compute_dtype,
        kernel_init=cfg.initializer,
        kernel_metadata=sharding.param_metadata((sharding.HEADS, sharding.KV, sharding.EMBED)),
        bias_metadata=sharding.param_metadata((sharding.EMBED,)), rngs=rngs)
    self.positions = positions
    self.dropout = nnx.Dropout(cfg.attention_dropout_rate, deterministic=cfg.deterministic)
    self.cfg = cfg

  def __call__(self, x_BxLxE: jax.Array, visibility: Visibility, ctx: PositionContext, *,
               rngs: nnx.Rngs | None, num_queries: int | None = None) -> jax.Array:
    """[batch, T, embed]: T = length, or the first ``num_queries`` (softmax attention only)."""
    x_BxTxE, ctx_q = x_BxLxE, ctx
    if num_queries is not None:
      x_BxTxE, ctx_q = x_BxLxE[:, :num_queries], ctx.first_queries(num_queries)
    with jax.named_scope('qkv_projection'):
      q_BxTxHxD = sharding.constrain(self.query(x_BxTxE), _HEADS)
      k_BxLxHxD = sharding.constrain(self.key(x_BxLxE), _HEADS)
      v_BxLxHxD = sharding.constrain(self.value(x_BxLxE), _HEADS)
    with jax.named_scope('positions'):
      v_BxLxHxD = self.positions.rotate(v_BxLxHxD, ctx, 'value')
    if self.cfg.attention == 'linear':
      with jax.named_scope('linear_attention'):
        out_BxTxHxD = rope.linear_attention(
            q_BxTxHxD, k_BxLxHxD, v_BxLxHxD, mask=visibility.mask_BxL,
            segments=visibility.segments_BxL, causal=self.cfg.causal, rotary=self.positions.rotary,
            tables=ctx.rotary_tables, feature_map=self.cfg.linear_feature_map)
    else:
      out_BxTxHxD = self._softmax(q_BxTxHxD, k_BxLxHxD, v_BxLxHxD, visibility, ctx, ctx_q, rngs,
                                  num_queries)
    out_BxTxHxD = sharding.constrain(out_BxTxHxD, _HEADS)
    with jax.named_scope('output_projection'):
      return self.output(out_BxTxHxD)

  def _softmax(self, q_BxTxHxD: jax.Array, k_BxLxHxD: jax.Array, v_BxLxHxD: jax.Array,
               visibility: Visibility, ctx: PositionContext, ctx_q: PositionContext,
               rngs: nnx.Rngs | None, num_queries: int | None) -> jax.Array:
    hooks, causal = self.positions, self.cfg.causal
    implementation = self.cfg.attention_implementation
    with jax.named_scope('positions'):
      q_BxTxHxD = hooks.rotate(q_BxTxHxD, ctx_q, 'query')
      k_BxLxHxD = hooks.rotate(k_BxLxHxD, ctx, 'key')
    if implementation == 'chunked':
      with jax.named_scope('chunked_attention'):
        return chunked_attention(
            q_BxTxHxD, k_BxLxHxD, v_BxLxHxD, visibility, ctx.positions,
            chunk_size=self.cfg.attention_chunk_size, causal=causal,
            block_bias=lambda q, relative, q_positions: hooks.block_bias(
                q, ctx._replace(query_positions=q_positions), relative),
            block_value_term=lambda probs, relative: hooks.block_value_term(probs, ctx, relative))
    visible_Bx1xTxS = visibility.dense(causal, num_queries)
    with jax.named_scope('positions'):
      bias = hooks.attention_bias(q_BxTxHxD, k_BxLxHxD, visible_Bx1xTxS, ctx_q)
    if implementation in PALLAS_SCHEMES:  # no dropout or value term (models.config)
      with jax.named_scope('pallas_attention'):
        return pallas_attention(q_BxTxHxD, k_BxLxHxD, v_BxLxHxD, visibility, bias=bias,
                                kernel=implementation, causal=causal)
    dropout = value_term = None
    if self.dropout.rate > 0 and not self.dropout.deterministic:
      dropout = lambda probs: self.dropout(probs, rngs=rngs)
    if hooks.mixes_values:
      value_term = lambda probs: hooks.value_term(probs, ctx_q)
    with jax.named_scope('softmax_attention'):
      # Dropout on the probabilities or a value term need the written-out form.
      if implementation == 'explicit' or dropout is not None or value_term is not None:
        return softmax_attention(q_BxTxHxD, k_BxLxHxD, v_BxLxHxD, bias, visible_Bx1xTxS,
                                 dropout=dropout, value_term=value_term)
      return jax.nn.dot_product_attention(q_BxTxHxD, k_BxLxHxD, v_BxLxHxD, bias=bias,
                                          mask=visible_Bx1xTxS, implementation=implementation)

