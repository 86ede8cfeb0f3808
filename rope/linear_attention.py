"""Linear attention with RoPE, exactly as RoFormer's eq. 19 (Su et al. 2021, section 3.3).

For a non-negative feature map phi (elu(x) + 1 by default, Katharopoulos et al. 2020):

    out_m = sum_n (R_m phi(q_m))^T (R_n phi(k_n)) v_n  /  sum_n phi(q_m)^T phi(k_n)

The numerator uses rotated features, the normaliser the unrotated (non-negative) ones, so the
denominator never vanishes. Bidirectional (encoder) form: both sums run over all real tokens,
so memory is O(length): the [d, d_v] summary sum_n R_n phi(k_n) v_n^T replaces the
[length, length] attention matrix. Padding keys are masked out of both sums.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rope import rotary as rotary_lib

FEATURE_MAPS = {
    'elu+1': lambda x: jax.nn.elu(x) + 1.0,
    'relu': jax.nn.relu,
}


def linear_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                     mask: jax.Array | None = None,
                     rotary: rotary_lib.Rotary | None = None,
                     tables: rotary_lib.RotaryTables | None = None,
                     feature_map: str = 'elu+1', eps: float = 1e-6) -> jax.Array:
  """Bidirectional linear attention (eq. 19), with RoPE when ``rotary`` and its ``tables`` are
  given: q, k [batch, length, heads, head_dim] (not yet rotated), v [..., value_dim], mask
  [batch, length] true at real tokens (None: all real). Computed in float32, returned in v's
  dtype, [batch, length, heads, value_dim]."""
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
  kv_BxHxDxU = jnp.einsum('BLHD,BLHU->BHDU', rk, v32)
  numerator_BxLxHxU = jnp.einsum('BLHD,BHDU->BLHU', rq, kv_BxHxDxU)
  k_sum_BxHxD = jnp.sum(phi_k, axis=1)
  normaliser_BxLxH = jnp.einsum('BLHD,BHD->BLH', phi_q, k_sum_BxHxD)
  return (numerator_BxLxHxU / (normaliser_BxLxH[..., None] + eps)).astype(v.dtype)
