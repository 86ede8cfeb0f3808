"""rope: Rotary Position Embedding (Su et al. 2021) as pure, jittable JAX functions.

Main entry points:
  RopeConfig(...)                                       every RoPE option, declared once
  apply_rotary(x, positions, **options)                 one-call RoPE
  Rotary(head_dim=..., **options).tables(positions) / .apply(x, tables, role)   shared sin/cos
  linear_attention(q, k, v, *, mask, rotary, tables)    eq. 19
  decay_bound(distances, head_dim, config)              Figure 2
  convert_qk_projection / layout_permutation            interleaved <-> half

Shape suffixes (``x_BxLxHxD``) follow the legend in docs/shapes.md.
"""

from rope.config import (LAYOUTS, SCALING_KINDS, SCALINGS_WITH_LENGTH,
                         RopeConfig, check_rotary_dim)
from rope.decay import decay_bound
from rope.frequencies import inv_frequencies
from rope.layouts import convert_qk_projection, layout_permutation
from rope.linear_attention import FEATURE_MAPS, linear_attention
from rope.rotary import (ROLES, Rotary, RotaryTables, apply_rotary, apply_rotary_sincos,
                         rotate_one, sincos_one)

__all__ = [
    'FEATURE_MAPS', 'LAYOUTS', 'ROLES', 'RopeConfig', 'Rotary', 'RotaryTables', 'SCALING_KINDS',
    'apply_rotary', 'apply_rotary_sincos', 'check_rotary_dim', 'convert_qk_projection',
    'decay_bound', 'inv_frequencies', 'layout_permutation', 'linear_attention', 'rotate_one',
    'sincos_one',
]
