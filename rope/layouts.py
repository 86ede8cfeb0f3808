"""Converting weights between the RoPE pair layouts ``interleaved`` (2i, 2i+1) and ``half``
(i, i + d/2). With P = [0, 2, ..., d-2, 1, 3, ..., d-1], rotate_half(P x) = P rotate_interleaved(x),
so permuting the query/key projections' output features per head gives identical attention
scores; features past ``rotary_dim`` stay in place.
"""

from __future__ import annotations

import numpy as np

from rope.config import check_layout, check_rotary_dim


def layout_permutation(head_dim: int, *, src: str, dst: str,
                       rotary_dim: int | None = None) -> np.ndarray:
  """Index array p of length head_dim with x_dst = x_src[..., p] for one head's features."""
  check_layout(src)
  check_layout(dst)
  dim = check_rotary_dim(head_dim, rotary_dim)
  perm = np.arange(head_dim)
  if src == dst:
    return perm
  to_half = np.concatenate([np.arange(0, dim, 2), np.arange(1, dim, 2)])
  perm[:dim] = to_half if dst == 'half' else np.argsort(to_half)
  return perm


def convert_qk_projection(w: np.ndarray, *, head_dim: int, src: str, dst: str,
                          rotary_dim: int | None = None, axis: int = -1) -> np.ndarray:
  """Permutes a query/key projection kernel or bias from layout ``src`` to ``dst``, so that the
  converted model's attention scores in ``dst`` equal the original's. ``axis`` holds the output
  features: num_heads * head_dim of them (heads outermost, a [embed, heads * head_dim] kernel)
  or head_dim (a [embed, heads, head_dim] kernel)."""
  w = np.asarray(w)
  size = w.shape[axis]
  if size % head_dim:
    raise ValueError(f'Axis {axis} of size {size} is not a multiple of head_dim={head_dim}.')
  perm = layout_permutation(head_dim, src=src, dst=dst, rotary_dim=rotary_dim)
  full = (np.arange(size // head_dim)[:, None] * head_dim + perm[None, :]).reshape(-1)
  return np.take(w, full, axis=axis)
