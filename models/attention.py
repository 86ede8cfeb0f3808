"""Multi-head self-attention whose position scheme is a set of hooks (``models.positions``).

``model.attention_impl`` picks softmax attention written out (``softmax_attention``: the explicit
probabilities that probability dropout and Shaw's relative values need),
``jax.nn.dot_product_attention`` (XLA, or cuDNN on NVIDIA GPUs), blocks with an online softmax
(``chunked_attention``) or a Pallas TPU kernel (``pallas_attention``); 'auto'
(``ModelConfig.attention_implementation``) is, on CPU, 'explicit' to train, where XLA fuses it
into fewer kernels, and 'chunked' to evaluate where the scheme can (benchmarks/README.md), else
'xla'. Linear attention is
``rope.linear_attention`` (RoFormer eq. 19). Kernels are HF RoFormer's dense layers reshaped:
query/key/value [embed, heads, head_dim], output [heads, head_dim, embed].
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
  """softmax(q k^T / sqrt(head_dim) + bias, masked) v, written out, in the inputs' dtype; dtypes,
  softmax and mask value are those of ``jax.nn.dot_product_attention``'s XLA implementation, so
  the forward values agree. ``bias``: [batch or 1, heads or 1, T, S]; ``mask``: bool [batch or 1,
  heads or 1, T or 1, S], true where attending; ``value_term``: probabilities -> a term added to
  the output (Shaw's relative values)."""
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
  """The float32 softmax over keys, returned in ``dtype``. For a narrower ``dtype`` the backward
  pass reads the narrow probabilities: with ``jax.nn.softmax``'s own rule the step keeps a
  float32 copy of every layer's probabilities for it as well (twice the bytes of the bfloat16
  ones the value product already keeps), which made the bf16 step's peak memory exceed HF's."""
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
  """``x`` padded with ``fill`` along the length (axis 1) to a multiple of ``size``."""
  widths = [(0, 0), (0, -x_BxLx___.shape[1] % size)] + [(0, 0)] * (x_BxLx___.ndim - 2)
  return jnp.pad(x_BxLx___, widths, constant_values=fill)


def _blocks(x_BxLx___: jax.Array, size: int, fill=0) -> jax.Array:
  """[num_blocks, batch, size, ...]: ``x`` padded to whole blocks."""
  x_BxLx___ = _pad_to_blocks(x_BxLx___, size, fill)
  blocks = x_BxLx___.reshape(x_BxLx___.shape[0], -1, size, *x_BxLx___.shape[2:])
  return jnp.moveaxis(blocks, 1, 0)


def _online_block(totals, q_BxCxHxD, q_positions_BxC, query_visibility, block, *, block_bias,
                  block_value_term):
  """One key block of the online softmax: a query block's running (max, sum, unnormalised
  output) updated with the block's keys, values, mask, positions, documents and indices."""
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
  (Rabe and Staats 2021): memory linear in the length, each query block recomputed in the
  backward pass (``jax.checkpoint``). The queries are the first T of the S positions;
  ``block_bias(q_BxCxHxD, relative_BxCxK, q_positions_BxC)`` and
  ``block_value_term(unnormalised_probs_BxHxCxK, relative_BxCxK)``: a block's position terms
  (None: no term)."""
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


# The Pallas TPU kernels (the keys of ``PALLAS_SCHEMES``): 'splash' is splash_attention (segment
# ids and a causal mask, no logits bias); 'pallas_flash' is flash_attention (the same, plus an
# additive bias). _PALLAS_BLOCK: both kernels' default tile, also the lane width their segment-id
# masks need (NUM_LANES); lengths are padded to multiples of it. Untuned: no TPU was available.
_PALLAS_BLOCK = 128
# The key segment id of padding: no query has it, so no query sees a padded key. (The data's
# documents are numbered from 1, padding 0; without documents every query has 0.)
_PAD_SEGMENT = np.iinfo(np.int32).min


def _kernel_segments(visibility: Visibility, num_queries: int) -> tuple[jax.Array, jax.Array]:
  """int32 segment ids of the queries and keys, padded to whole blocks, equal exactly where
  ``visibility.dense`` lets a query see a key (causality aside); padding keys (and those filling
  the kernel's blocks) get ``_PAD_SEGMENT``."""
  mask_BxS = visibility.mask_BxL
  segments_BxS = (jnp.zeros(mask_BxS.shape, jnp.int32) if visibility.segments_BxL is None
                  else visibility.segments_BxL.astype(jnp.int32))
  kv_BxS = jnp.where(mask_BxS, segments_BxS, _PAD_SEGMENT)
  return (_pad_to_blocks(segments_BxS[:, :num_queries], _PALLAS_BLOCK),
          _pad_to_blocks(kv_BxS, _PALLAS_BLOCK, fill=_PAD_SEGMENT))


def _splash_kernel(q_BxHxTxD: jax.Array, k_BxHxSxD: jax.Array, v_BxHxSxD: jax.Array,
                   segments: tuple[jax.Array, jax.Array], *, causal: bool,
                   interpret: bool) -> jax.Array:
  """splash_attention ([heads, length, head_dim]) vmapped over the batch. The causal mask is
  static: the kernel skips the key blocks above the diagonal."""
  heads, q_len, kv_len = q_BxHxTxD.shape[1], q_BxHxTxD.shape[2], k_BxHxSxD.shape[2]
  mask = (splash.CausalMask((q_len, kv_len)) if causal else splash.FullMask((q_len, kv_len)))
  size = _PALLAS_BLOCK
  blocks = splash.BlockSizes(block_q=size, block_kv=size, block_kv_compute=size,
                             block_q_dkv=size, block_kv_dkv=size, block_kv_dkv_compute=size,
                             block_q_dq=size, block_kv_dq=size)
  kernel = splash.make_splash_mha_single_device(
      splash.MultiHeadMask([mask] * heads), block_sizes=blocks, interpret=interpret)
  return jax.vmap(kernel)(q_BxHxTxD, k_BxHxSxD, v_BxHxSxD, splash.SegmentIds(*segments))


def _flash_kernel(q_BxHxTxD: jax.Array, k_BxHxSxD: jax.Array, v_BxHxSxD: jax.Array,
                  bias_BxHxTxS: jax.Array | None, segments: tuple[jax.Array, jax.Array], *,
                  causal: bool, interpret: bool) -> jax.Array:
  """flash_attention on [batch, heads, length, head_dim]; it adds the bias before its sm_scale,
  which stays 1 (the queries come scaled), and its backward pass gives the bias's gradient."""
  size = _PALLAS_BLOCK
  blocks = pallas_flash.BlockSizes(
      block_q=size, block_k_major=size, block_k=size, block_b=1, block_q_major_dkv=size,
      block_k_major_dkv=size, block_k_dkv=size, block_q_dkv=size, block_k_major_dq=size,
      block_k_dq=size, block_q_dq=size)

  def call(q, k, v, bias, q_segments, kv_segments):
    return pallas_flash.flash_attention(
        q, k, v, bias, pallas_flash.SegmentIds(q_segments, kv_segments), causal=causal,
        sm_scale=1.0, block_sizes=blocks)

  call = _interpreted(call) if interpret else call
  return call(q_BxHxTxD, k_BxHxSxD, v_BxHxSxD, bias_BxHxTxS, *segments)


def _interpreted(fn: Callable) -> Callable:
  """``fn`` with every pallas_call it traces, forward and backward, interpreted.

  flash_attention has no ``interpret`` argument, and ``pltpu.force_tpu_interpret_mode`` only
  reaches calls traced inside it; its custom VJP's backward kernels are traced later (by the
  transpose), so the backward pass is traced again under the mode here. The mode is True, not
  ``InterpretParams``: pallas_call ORs it into ``interpret``, giving splash's effect-free
  interpreter, which ``jax.checkpoint`` (``model.remat``) accepts (TPU interpret mode's io
  callbacks it refuses). The last two arguments are integer segment ids (no cotangent)."""

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
  """``softmax_attention`` by a Pallas TPU kernel, 'splash' or 'pallas_flash', in the inputs' dtype.
  Compiled on TPU (one device: not wrapped in shard_map, so ``validation.check_devices`` refuses
  a mesh of several); elsewhere in Pallas interpret mode, slow and only for tests. The queries are
  the first T positions; ``bias`` [batch or 1, heads or 1, T, S] only with 'pallas_flash'; no
  dropout or value term (``models.config`` refuses them). A query that sees no key (padding in
  packed rows) gets an unspecified finite output where 'explicit' averages all values."""
  if bias is not None and kernel != 'pallas_flash':
    raise ValueError(f'attention_impl={kernel!r} takes no logits bias; use pallas_flash.')
  q_len, head_dim = q_BxTxHxD.shape[1], q_BxTxHxD.shape[3]
  segments = _kernel_segments(visibility, q_len)
  q_BxTxHxD = _scaled(q_BxTxHxD)  # as in softmax_attention (same rounding); splash has no scale
  # flash_attention takes a head_dim up to 128 or a multiple of 128: zero features change no
  # logit, and the zero value features are dropped below.
  dim = head_dim if head_dim <= 128 or kernel != 'pallas_flash' else -(-head_dim // 128) * 128
  q_BxHxTxD, k_BxHxSxD, v_BxHxSxD = (_to_kernel(x, dim) for x in (q_BxTxHxD, k_BxSxHxD,
                                                                    v_BxSxHxD))
  interpret = jax.default_backend() != 'tpu'
  if kernel == 'splash':
    out_BxHxTxD = _splash_kernel(q_BxHxTxD, k_BxHxSxD, v_BxHxSxD, segments, causal=causal,
                                 interpret=interpret)
  else:
    bias_BxHxTxS = None if bias is None else _kernel_bias(bias, k_BxSxHxD.shape[1],
                                                          q_BxHxTxD.shape, k_BxHxSxD.shape)
    out_BxHxTxD = _flash_kernel(q_BxHxTxD, k_BxHxSxD, v_BxHxSxD, bias_BxHxTxS, segments,
                                causal=causal, interpret=interpret)
  return jnp.swapaxes(out_BxHxTxD, 1, 2)[:, :q_len, :, :head_dim].astype(v_BxSxHxD.dtype)


def _to_kernel(x_BxLxHxD: jax.Array, dim: int) -> jax.Array:
  """[batch, heads, length, dim]: ``x`` zero-padded to whole blocks and ``dim`` features."""
  x_BxLxHxD = jnp.pad(_pad_to_blocks(x_BxLxHxD, _PALLAS_BLOCK),
                      [(0, 0)] * 3 + [(0, dim - x_BxLxHxD.shape[3])])
  return jnp.swapaxes(x_BxLxHxD, 1, 2)


def _kernel_bias(bias: jax.Array, kv_len: int, q_shape: tuple[int, ...],
                 k_shape: tuple[int, ...]) -> jax.Array:
  """float32 [batch, heads, T, S] of the kernel's (padded) queries and keys: the bias broadcast
  (flash_attention takes no broadcasting) and zero-padded to whole blocks."""
  bias_BxHxTxS = jnp.broadcast_to(bias, (*q_shape[:2], bias.shape[2], kv_len))
  widths = [(0, 0), (0, 0), (0, q_shape[2] - bias.shape[2]), (0, k_shape[2] - kv_len)]
  return jnp.pad(bias_BxHxTxS.astype(jnp.float32), widths)


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
    self.kind = cfg.attention
    self.implementation = cfg.attention_implementation
    self.chunk_size = cfg.attention_chunk_size
    self.feature_map = cfg.linear_feature_map
    self.causal = cfg.causal

  def __call__(self, x_BxLxE: jax.Array, visibility: Visibility, ctx: PositionContext, *,
               rngs: nnx.Rngs | None, num_queries: int | None = None) -> jax.Array:
    """Attends over the visible keys; returns [batch, T, embed]: T = length, or with
    ``num_queries`` (softmax attention only) the first T positions only (all keys attended)."""
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
    hooks = self.positions
    with jax.named_scope('positions'):
      q_BxTxHxD = hooks.rotate(q_BxTxHxD, ctx_q, 'query')
      k_BxLxHxD = hooks.rotate(k_BxLxHxD, ctx, 'key')
    if self.implementation == 'chunked':
      with jax.named_scope('chunked_attention'):
        return chunked_attention(
            q_BxTxHxD, k_BxLxHxD, v_BxLxHxD, visibility, ctx.positions,
            chunk_size=self.chunk_size, causal=self.causal,
            block_bias=lambda q, relative, q_positions: hooks.block_bias(
                q, ctx._replace(query_positions=q_positions), relative),
            block_value_term=lambda probs, relative: hooks.block_value_term(probs, ctx, relative))
    visible_Bx1xTxS = visibility.dense(self.causal, num_queries)
    with jax.named_scope('positions'):
      bias = hooks.attention_bias(q_BxTxHxD, k_BxLxHxD, visible_Bx1xTxS, ctx_q)
    if self.implementation in PALLAS_SCHEMES:  # no dropout or value term (models.config)
      with jax.named_scope('pallas_attention'):
        return pallas_attention(q_BxTxHxD, k_BxLxHxD, v_BxLxHxD, visibility, bias=bias,
                                kernel=self.implementation, causal=self.causal)
    dropout = None
    if self.dropout.rate > 0 and not self.dropout.deterministic:
      dropout = lambda probs: self.dropout(probs, rngs=rngs)
    value_term = None
    if hooks.mixes_values:
      value_term = lambda probs: hooks.value_term(probs, ctx_q)
    with jax.named_scope('softmax_attention'):
      return dot_product_attention(q_BxTxHxD, k_BxLxHxD, v_BxLxHxD, bias, visible_Bx1xTxS,
                                   implementation=self.implementation, dropout=dropout,
                                   value_term=value_term)

