"""rope: Rotary Position Embedding (Su et al. 2021) as pure, jittable JAX functions.

Main entry points:
  apply_rotary(x, positions, *, base, layout, rotary_dim, scaling)  one-call RoPE
  Rotary(head_dim, ...).tables(positions) / .apply(x, tables, role)  shared sin/cos
  linear_attention(q, k, v, *, mask, rotary, tables)                 eq. 19
  decay_bound(distances, head_dim, base)                              Figure 2
  convert_qk_projection / layout_permutation                          interleaved <-> half
"""

from rope.decay import decay_bound
from rope.frequencies import SCALING_KINDS, Scaling, check_rotary_dim, inv_frequencies
from rope.layouts import convert_qk_projection, layout_permutation
from rope.linear_attention import FEATURE_MAPS, linear_attention
from rope.rotary import (LAYOUTS, ROLES, Rotary, RotaryTables, apply_rotary,
                         apply_rotary_sincos, rotate_one, sincos_one)

__all__ = [
    'FEATURE_MAPS', 'LAYOUTS', 'ROLES', 'Rotary', 'RotaryTables', 'SCALING_KINDS', 'Scaling',
    'apply_rotary', 'apply_rotary_sincos', 'check_rotary_dim', 'convert_qk_projection',
    'decay_bound', 'inv_frequencies', 'layout_permutation', 'linear_attention', 'rotate_one',
    'sincos_one',
]
