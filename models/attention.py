"""Multi-head self-attention whose position scheme is a set of hooks (``models.positions``).

Softmax attention is written out (``softmax_attention``, which also forms the explicit
probabilities that probability dropout and Shaw's relative values need),
``jax.nn.dot_product_attention`` (XLA, or cuDNN flash attention on NVIDIA GPUs), or computed in
blocks with an online softmax (``chunked_attention``, memory linear in the length), chosen by
``model.attention_impl``; 'auto' is 'explicit' on CPU, where XLA fuses it into fewer kernels
(benchmarks/README.md), else 'xla'. Linear attention is ``rope.linear_attention`` (RoFormer
eq. 19), which rotates phi(q), phi(k) itself. Kernels are HF RoFormer's dense layers reshaped:
query/key/value [embed, heads, head_dim], output [heads, head_dim, embed].
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import rope
from models import sharding
from models.config import ModelConfig
from models.positions import LayerHooks, PositionContext

_HEADS = (sharding.BATCH, sharding.LENGTH, sharding.HEADS, sharding.KV)


class Visibility(NamedTuple):
  """Which keys each query attends to: the real ones (``mask_BxL`` true), and with
  ``segments_BxL`` (packed sequences: int32 document id per token) only those of the query's own
  document; a causal model also only the query's own and earlier positions."""

  mask_BxL: jax.Array
  segments_BxL: jax.Array | None = None

  def dense(self, causal: bool, num_queries: int | None = None) -> jax.Array:
    """bool [batch, 1, T or 1, S]: query t may attend to key s (T = ``num_queries`` or S)."""
    mask_Bx1xTxS = self.mask_BxL[:, None, None, :]
    length = self.mask_BxL.shape[1]
    queries = num_queries or length
    if self.segments_BxL is not None:
      segments_BxL = self.segments_BxL
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
  """softmax(q k^T / sqrt(head_dim) + bias, masked) v, written out, in the inputs' dtype.

  Dtypes, softmax and mask value are those of ``jax.nn.dot_product_attention``'s XLA
  implementation, so the forward values agree with the library call. ``bias``: [batch or 1,
  heads or 1, T, S]; ``mask``: bool [batch or 1, heads or 1, T or 1, S], true where attending;
  ``value_term``: probabilities -> a term added to the output (Shaw's relative values).
  """
  logits_dtype = jnp.promote_types(q_BxTxHxD.dtype, jnp.float32)
  precision = {jnp.bfloat16: jax.lax.DotAlgorithmPreset.BF16_BF16_F32,
               jnp.float16: jax.lax.DotAlgorithmPreset.F16_F16_F32}.get(q_BxTxHxD.dtype.type)
  # The scale goes on the queries, as in Flax's and Hugging Face's attention: scaling the logits
  # makes XLA on CPU materialise a logit-sized broadcast of the scale. Exact where sqrt(head_dim)
  # is a power of two.
  q_BxTxHxD = q_BxTxHxD * jnp.asarray(1.0 / np.sqrt(q_BxTxHxD.shape[-1]), q_BxTxHxD.dtype)
  logits_BxHxTxS = jnp.einsum('BTHD,BSHD->BHTS', q_BxTxHxD, k_BxSxHxD, precision=precision,
                              preferred_element_type=logits_dtype)
  if bias is not None:
    logits_BxHxTxS = (logits_BxHxTxS + bias).astype(logits_dtype)
  if mask is not None:
    # Masked logits become large_negative, added rather than selected: the same values (an
    # added 0 is exact, and |logit| is far below half an ulp of large_negative), and XLA on CPU
    # fuses dot, bias, softmax and dot into one kernel.
    large_negative = _large_negative(logits_dtype)
    logits_BxHxTxS = logits_BxHxTxS + jnp.where(mask, jnp.zeros((), logits_dtype),
                                                jnp.asarray(large_negative, logits_dtype))
  probs_BxHxTxS = jax.nn.softmax(logits_BxHxTxS.astype(jnp.float32), axis=-1).astype(
      v_BxSxHxD.dtype)
  if dropout is not None:
    probs_BxHxTxS = dropout(probs_BxHxTxS)
  out_BxTxHxD = jnp.einsum('BHTS,BSHD->BTHD', probs_BxHxTxS, v_BxSxHxD)
  extra_BxTxHxD = None if value_term is None else value_term(probs_BxHxTxS)
  return out_BxTxHxD if extra_BxTxHxD is None else out_BxTxHxD + extra_BxTxHxD


def _large_negative(dtype) -> float:
  return -0.7 * min(jnp.finfo(dtype).max, jnp.finfo(jnp.float32).max)


def _blocks(x_BxLx___: jax.Array, size: int, fill=0) -> jax.Array:
  """[num_blocks, batch, size, ...]: ``x`` padded with ``fill`` along the length to whole
  blocks."""
  pad = -x_BxLx___.shape[1] % size
  widths = [(0, 0), (0, pad)] + [(0, 0)] * (x_BxLx___.ndim - 2)
  x_BxLx___ = jnp.pad(x_BxLx___, widths, constant_values=fill)
  blocks = x_BxLx___.reshape(x_BxLx___.shape[0], -1, size, *x_BxLx___.shape[2:])
  return jnp.moveaxis(blocks, 1, 0)


def _online_block(totals, q_BxCxHxD, q_positions_BxC, query_visibility, block, *, block_bias,
                  block_value_term):
  """One key block of the online softmax: the running (max, sum, unnormalised output) of a
  query block updated with keys k, values v, their mask, positions, documents and indices
  (``query_visibility``: the queries' documents and indices, and whether attention is causal)."""
  max_BxHxC, sum_BxHxC, out_BxCxHxD = totals
  k_BxKxHxD, v_BxKxHxD, mask_BxK, k_positions_BxK, k_segments_BxK, k_index_K = block
  q_segments_BxC, q_index_C, causal = query_visibility
  logits_dtype = jnp.promote_types(q_BxCxHxD.dtype, jnp.float32)
  scale = jnp.asarray(1.0 / np.sqrt(q_BxCxHxD.shape[-1]), q_BxCxHxD.dtype)
  logits_BxHxCxK = jnp.einsum('BCHD,BKHD->BHCK', q_BxCxHxD * scale, k_BxKxHxD,
                              preferred_element_type=logits_dtype)
  relative_BxCxK = (k_positions_BxK[:, None, :] - q_positions_BxC[:, :, None]).astype(jnp.int32)
  if (bias := block_bias(q_BxCxHxD, relative_BxCxK)) is not None:
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
                      block_bias: Callable[[jax.Array, jax.Array], jax.Array | None],
                      block_value_term: Callable[[jax.Array, jax.Array], jax.Array | None],
                      causal: bool = False) -> jax.Array:
  """``softmax_attention`` in blocks of ``chunk_size`` queries x keys with an online softmax
  (Rabe and Staats 2021): memory linear in the length, each query block recomputed in the
  backward pass (``jax.checkpoint``), so only its inputs and output are kept.

  The queries are the first T of the S positions ``positions_BxS``. ``block_bias(q_BxCxHxD,
  relative_BxCxK)`` and ``block_value_term(unnormalised_probs_BxHxCxK, relative_BxCxK)`` give a
  block's position terms from its key-minus-query distances (None: no term).
  """
  length, k_size = q_BxTxHxD.shape[1], min(chunk_size, k_BxSxHxD.shape[1])
  mask_BxS = visibility.mask_BxL
  segments_BxS = (mask_BxS.astype(jnp.int32) if visibility.segments_BxL is None
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


def dot_product_attention(q_BxTxHxD: jax.Array, k_BxSxHxD: jax.Array, v_BxSxHxD: jax.Array,
                          bias: jax.Array | None, mask: jax.Array | None, *,
                          implementation: str, dropout=None, value_term=None) -> jax.Array:
  """Softmax attention by ``implementation`` (``model.attention_impl``); arguments as
  ``softmax_attention``. Dropout on the probabilities or a value term need the written-out form,
  which is then used whatever the implementation."""
  if implementation == 'auto':
    implementation = 'explicit' if jax.default_backend() == 'cpu' else 'xla'
  if implementation == 'explicit' or dropout is not None or value_term is not None:
    return softmax_attention(q_BxTxHxD, k_BxSxHxD, v_BxSxHxD, bias, mask, dropout=dropout,
                             value_term=value_term)
  return jax.nn.dot_product_attention(q_BxTxHxD, k_BxSxHxD, v_BxSxHxD, bias=bias, mask=mask,
                                      implementation=implementation)


class SelfAttention(nnx.Module):
  """Multi-head self-attention, bidirectional or causal (``cfg.causal``); ``positions`` are this
  layer's position hooks."""

  def __init__(self, cfg: ModelConfig, positions: LayerHooks, *, rngs: nnx.Rngs):
    in_kernel = sharding.param_metadata((sharding.EMBED, sharding.HEADS, sharding.KV))
    in_bias = sharding.param_metadata((sharding.HEADS, sharding.KV))

    def projection() -> nnx.LinearGeneral:
      return nnx.LinearGeneral(cfg.hidden_size, (cfg.num_heads, cfg.head_dim),
                               dtype=cfg.compute_dtype, kernel_init=cfg.initializer,
                               kernel_metadata=in_kernel, bias_metadata=in_bias, rngs=rngs)

    self.query = projection()
    self.key = projection()
    self.value = projection()
    self.output = nnx.LinearGeneral(
        (cfg.num_heads, cfg.head_dim), cfg.hidden_size, axis=(-2, -1), dtype=cfg.compute_dtype,
        kernel_init=cfg.initializer,
        kernel_metadata=sharding.param_metadata((sharding.HEADS, sharding.KV, sharding.EMBED)),
        bias_metadata=sharding.param_metadata((sharding.EMBED,)), rngs=rngs)
    self.positions = positions
    self.dropout = nnx.Dropout(cfg.attention_dropout_rate, deterministic=cfg.deterministic)
    self.kind = cfg.attention
    self.implementation = cfg.attention_impl
    self.chunk_size = cfg.attention_chunk_size
    self.feature_map = cfg.linear_feature_map
    self.causal = cfg.causal

  def __call__(self, x_BxLxE: jax.Array, visibility: Visibility, ctx: PositionContext, *,
               rngs: nnx.Rngs | None, num_queries: int | None = None) -> jax.Array:
    """Attends over the visible keys (``visibility``; causal with ``train.task=clm``); returns
    [batch, T, embed].

    T = length, or with ``num_queries`` (softmax attention only) the first T positions only (all
    keys still attended).
    """
    x_BxTxE, ctx_q = x_BxLxE, ctx
    if num_queries is not None:
      x_BxTxE, ctx_q = x_BxLxE[:, :num_queries], ctx.first_queries(num_queries)
    with jax.named_scope('qkv_projection'):
      q_BxTxHxD = sharding.constrain(self.query(x_BxTxE), _HEADS)
      k_BxLxHxD = sharding.constrain(self.key(x_BxLxE), _HEADS)
      v_BxLxHxD = sharding.constrain(self.value(x_BxLxE), _HEADS)
    with jax.named_scope('positions'):
      v_BxLxHxD = self.positions.rotate(v_BxLxHxD, ctx, 'value')
    if self.kind == 'linear':
      with jax.named_scope('linear_attention'):
        out_BxTxHxD = rope.linear_attention(
            q_BxTxHxD, k_BxLxHxD, v_BxLxHxD, mask=visibility.mask_BxL,
            segments=visibility.segments_BxL, causal=self.causal, rotary=self.positions.rotary,
            tables=ctx.rotary_tables, feature_map=self.feature_map)
    else:
      out_BxTxHxD = self._softmax(q_BxTxHxD, k_BxLxHxD, v_BxLxHxD, visibility, ctx, ctx_q, rngs,
                                  num_queries)
    out_BxTxHxD = sharding.constrain(out_BxTxHxD, _HEADS)
    with jax.named_scope('output_projection'):
      return self.output(out_BxTxHxD)

  def _softmax(self, q_BxTxHxD: jax.Array, k_BxLxHxD: jax.Array, v_BxLxHxD: jax.Array,
               visibility: Visibility, ctx: PositionContext, ctx_q: PositionContext,
               rngs: nnx.Rngs | None, num_queries: int | None) -> jax.Array:
    with jax.named_scope('positions'):
      q_BxTxHxD = self.positions.rotate(q_BxTxHxD, ctx_q, 'query')
      k_BxLxHxD = self.positions.rotate(k_BxLxHxD, ctx, 'key')
    if self.implementation == 'chunked':
      with jax.named_scope('chunked_attention'):
        return self._chunked(q_BxTxHxD, k_BxLxHxD, v_BxLxHxD, visibility, ctx)
    with jax.named_scope('positions'):
      bias = self.positions.bias(q_BxTxHxD, ctx_q)
    dropout = None
    if self.dropout.rate > 0 and not self.dropout.deterministic:
      dropout = lambda probs: self.dropout(probs, rngs=rngs)
    value_term = None
    if self.positions.mixes_values:
      value_term = lambda probs: self.positions.value_term(probs, ctx_q)
    with jax.named_scope('softmax_attention'):
      return dot_product_attention(q_BxTxHxD, k_BxLxHxD, v_BxLxHxD, bias,
                                   visibility.dense(self.causal, num_queries),
                                   implementation=self.implementation, dropout=dropout,
                                   value_term=value_term)

  def _chunked(self, q_BxTxHxD: jax.Array, k_BxLxHxD: jax.Array, v_BxLxHxD: jax.Array,
               visibility: Visibility, ctx: PositionContext) -> jax.Array:
    hooks = self.positions
    return chunked_attention(
        q_BxTxHxD, k_BxLxHxD, v_BxLxHxD, visibility, ctx.positions, chunk_size=self.chunk_size,
        block_bias=lambda q, relative: hooks.block_bias(q, ctx, relative),
        block_value_term=lambda probs, relative: hooks.block_value_term(probs, ctx, relative),
        causal=self.causal)
