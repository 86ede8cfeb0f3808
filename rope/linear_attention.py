"""Linear attention with RoPE, as RoFormer's eq. 19 (Su et al. 2021, section 3.3):

    out_m = sum_n (R_m phi(q_m))^T (R_n phi(k_n)) v_n  /  sum_n phi(q_m)^T phi(k_n)

with phi non-negative (elu + 1, Katharopoulos et al. 2020); the normaliser uses the unrotated
features so it never vanishes. Memory is O(length): a [d, d_v] summary replaces the attention
matrix; causal or packed (``segments``) keys are a contiguous range per query, so both sums are
differences of prefix sums (Katharopoulos et al. eq. 9-10). Padding keys are masked out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rope import rotary as rotary_lib

FEATURE_MAPS = {'elu+1': lambda x: jax.nn.elu(x) + 1.0, 'relu': jax.nn.relu}


def _key_ranges(segments_BxL: jax.Array | None, causal: bool,
                batch: int, length: int) -> tuple[jax.Array, jax.Array]:
  """int32 [batch, length] each: the first and one-past-last key index query m attends to."""
  index_L = jnp.arange(length, dtype=jnp.int32)
  if segments_BxL is None:  # one document
    segments_BxL = jnp.zeros((batch, length), jnp.int32)
  starts_BxL = jnp.concatenate([jnp.ones((batch, 1), bool),
                                segments_BxL[:, 1:] != segments_BxL[:, :-1]], axis=1)
  first_BxL = jax.lax.cummax(jnp.where(starts_BxL, index_L, 0), axis=1)
  ends_BxL = jnp.concatenate([starts_BxL[:, 1:], jnp.ones((batch, 1), bool)], axis=1)
  end_BxL = jax.lax.cummin(jnp.where(ends_BxL, index_L + 1, length), axis=1, reverse=True)
  if causal:
    end_BxL = jnp.broadcast_to(index_L + 1, (batch, length))
  return first_BxL, end_BxL


def _range_sums(x_BxLx___: jax.Array, first_BxL: jax.Array, end_BxL: jax.Array) -> jax.Array:
  prefix = jnp.cumsum(x_BxLx___, axis=1)
  prefix = jnp.concatenate([jnp.zeros_like(prefix[:, :1]), prefix], axis=1)  # S_0 = 0
  take = lambda index_BxL: jnp.take_along_axis(
      prefix, index_BxL.reshape(index_BxL.shape + (1,) * (prefix.ndim - 2)), axis=1)
  return take(end_BxL) - take(first_BxL)


def linear_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                     mask: jax.Array | None = None,
                     segments: jax.Array | None = None, causal: bool = False,
                     rotary: rotary_lib.Rotary | None = None,
                     tables: rotary_lib.RotaryTables | None = None,
                     feature_map: str = 'elu+1', eps: float = 1e-6) -> jax.Array:
  """Linear attention (eq. 19), with RoPE when ``rotary`` and its ``tables`` are given: q, k
  [batch, length, heads, head_dim] (not yet rotated), v [..., value_dim], mask [batch, length]
  true at real tokens (None: all real); ``segments`` int [batch, length], a document id per token
  (packed sequences; None: one document); ``causal``: keys up to the query only. Computed in
  float32, returned in v's dtype, [batch, length, heads, value_dim]."""
  if feature_map not in FEATURE_MAPS:
    raise ValueError(f'Unknown feature map {feature_map!r}; valid choices: '
                     f'{", ".join(FEATURE_MAPS)}.')
  if rotary is not None and tables is None:
    raise ValueError('linear_attention with rotary needs tables=rotary.tables(positions).')
  if rotary is not None and (rotary.xpos or rotary.attention_factor != 1.0):
    raise ValueError('linear_attention cannot use xPos or a temperature (YaRN): they scale the '
                     'rotated features of the numerator only, not the normaliser, so the output '
                     'would not be normalised.')
  if q.shape != k.shape or q.shape[:3] != v.shape[:3]:
    raise ValueError(f'q, k, v shapes do not fit: {q.shape}, {k.shape}, {v.shape}; expected '
                     '[batch, length, heads, head_dim] (v may differ in the last dim).')
  phi = FEATURE_MAPS[feature_map]
  phi_q = phi(q.astype(jnp.float32))
  phi_k = phi(k.astype(jnp.float32))
  v32 = v.astype(jnp.float32)
  if mask is not None:
    if mask.shape != q.shape[:2]:
      raise ValueError(f'mask shape {mask.shape} does not match [batch, length] = {q.shape[:2]}.')
    phi_k = phi_k * mask.astype(jnp.float32)[:, :, None, None]
  rq, rk = phi_q, phi_k
  if rotary is not None:
    rq = rotary.apply(phi_q, tables, role='query')
    rk = rotary.apply(phi_k, tables, role='key')
  if causal or segments is not None:
    first_BxL, end_BxL = _key_ranges(segments, causal, *q.shape[:2])
    kv_BxLxHxDxU = _range_sums(jnp.einsum('BLHD,BLHU->BLHDU', rk, v32), first_BxL, end_BxL)
    numerator_BxLxHxU = jnp.einsum('BLHD,BLHDU->BLHU', rq, kv_BxLxHxDxU)
    k_sum_BxLxHxD = _range_sums(phi_k, first_BxL, end_BxL)
    normaliser_BxLxH = jnp.einsum('BLHD,BLHD->BLH', phi_q, k_sum_BxLxHxD)
  else:
    kv_BxHxDxU = jnp.einsum('BLHD,BLHU->BHDU', rk, v32)
    numerator_BxLxHxU = jnp.einsum('BLHD,BHDU->BLHU', rq, kv_BxHxDxU)
    normaliser_BxLxH = jnp.einsum('BLHD,BHD->BLH', phi_q, jnp.sum(phi_k, axis=1))
  return (numerator_BxLxHxU / (normaliser_BxLxH[..., None] + eps)).astype(v.dtype)
