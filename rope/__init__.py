"""rope: Rotary Position Embedding (Su et al. 2021) as pure, jittable JAX functions: one-call
``apply_rotary``; ``Rotary(...).tables`` / ``.apply`` (shared sin/cos); ``linear_attention``
(eq. 19); ``decay_bound`` (Figure 2); layout conversion. Shape suffixes: docs/shapes.md.
"""

from rope.config import (LAYOUTS, SCALING_KINDS, SCALINGS_WITH_LENGTH,
                         RopeConfig, check_rotary_dim)
from rope.frequencies import decay_bound, inv_frequencies
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
