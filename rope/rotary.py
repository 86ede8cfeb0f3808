"""The rotary transform of RoFormer (Su et al. 2021) as the paper writes it: R x = x * cos(m theta)
+ rotate(x) * sin(m theta) (eq. 34), rotate mapping each pair (a, b) to (-b, a); no d x d matrix.
``sincos_one`` and ``rotate_one`` are the formulas for one position and one vector, lifted with
``jax.vmap``. Angles are float32 whatever the activation dtype (bfloat16 angles are off by up to
~0.8 rad at a few thousand positions); the rotation is computed in float32 and rounded once.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rope import frequencies
from rope.config import RopeConfig, check_layout, check_rotary_dim

ROLES = ('query', 'key', 'value')


def sincos_one(m: jax.Array, theta_P: jax.Array) -> tuple[jax.Array, jax.Array]:
  """sin and cos of the angles m * theta_i of one position, float32 [d/2] each."""
  angle_P = jnp.asarray(m, jnp.float32) * jnp.asarray(theta_P, jnp.float32)
  return jnp.sin(angle_P), jnp.cos(angle_P)


def rotate_one(x_D: jax.Array, sin_P: jax.Array, cos_P: jax.Array, *,
               layout: str = 'interleaved') -> jax.Array:
  """R^d_{Theta,m} x [d] given sin/cos [d/2]: pairs (a, b) -> (a cos - b sin, b cos + a sin)."""
  x32_D, half = x_D.astype(jnp.float32), x_D.shape[-1] // 2
  if layout == 'interleaved':
    x_Px2 = x32_D.reshape(-1, 2)  # pair swap by reshape, no strided slices
    a_P, b_P = x_Px2[:, 0], x_Px2[:, 1]
  else:
    a_P, b_P = x32_D[:half], x32_D[half:]
  a_P, b_P = a_P * cos_P - b_P * sin_P, b_P * cos_P + a_P * sin_P
  if layout == 'interleaved':
    return jnp.stack([a_P, b_P], axis=-1).reshape(-1).astype(x_D.dtype)
  return jnp.concatenate([a_P, b_P], axis=-1).astype(x_D.dtype)


def apply_rotary_sincos(x: jax.Array, sin: jax.Array, cos: jax.Array, *,
                        layout: str = 'interleaved', rotary_dim: int | None = None) -> jax.Array:
  """Rotates x [..., length, heads, head_dim] with precomputed sin/cos [..., length, rotary_dim/2]:
  only the first ``rotary_dim`` features; the rest pass through bit-identical."""
  check_layout(layout)
  rotary_dim = check_rotary_dim(x.shape[-1], rotary_dim)
  if x.ndim < 3:
    raise ValueError(
        f'RoPE expects x of shape [..., length, heads, head_dim], got shape {x.shape}.')
  if (positions_shape := sin.shape[:-1]) != x.shape[:-2]:
    raise ValueError(f'positions shape {positions_shape} does not match x shape {x.shape}: '
                     f'positions must be [..., length] = {x.shape[:-2]}.')
  if sin.shape[-1] != rotary_dim // 2 or cos.shape != sin.shape:
    raise ValueError(f'sin/cos of shape {sin.shape}/{cos.shape} do not fit rotary_dim='
                     f'{rotary_dim}: expected [..., length, {rotary_dim // 2}].')
  # Lifted over heads (sharing their position's sin/cos), length, then every leading dim.
  rotate = jax.vmap(functools.partial(rotate_one, layout=layout), in_axes=(0, None, None))
  for _ in range(x.ndim - 2):
    rotate = jax.vmap(rotate)
  if rotary_dim == x.shape[-1]:
    return rotate(x, sin, cos)
  rotated = rotate(x[..., :rotary_dim], sin, cos)
  return jnp.concatenate([rotated, x[..., rotary_dim:]], axis=-1)


class RotaryTables(NamedTuple):
  """float32 [..., length, rotary_dim/2] sin, cos and xPos's zeta^(m / scale_base) (or None)."""

  sin: jax.Array
  cos: jax.Array
  xpos: jax.Array | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rotary(RopeConfig):
  """A RoPE variant (the ``RopeConfig`` options) for heads of ``head_dim`` features. xPos scales
  grow exponentially with |m|: keep positions within a few multiples of ``xpos_scale_base``."""

  head_dim: int

  def __post_init__(self):
    super().__post_init__()
    check_rotary_dim(self.head_dim, self.rotary_dim)

  @property
  def dim(self) -> int:
    return self.head_dim if self.rotary_dim is None else self.rotary_dim

  def tables(self, positions: jax.Array) -> RotaryTables:
    """sin/cos (and xPos scales) for positions [..., length] (int or float): float32
    [..., length, dim/2]. ``dynamic_ntk`` takes its frequencies from the static length."""
    positions = jnp.asarray(positions)
    length = positions.shape[-1] if positions.ndim else None
    theta_P = jnp.asarray(frequencies.inv_frequencies(self.dim, self, length))
    sincos = sincos_one
    for _ in range(positions.ndim):
      sincos = jax.vmap(sincos, in_axes=(0, None))
    # Computed once: XLA on CPU would fuse sin/cos into every consumer (each head of each layer).
    # A matmul by the identity at HIGHEST precision is exact and a fusion boundary;
    # ``jax.lax.optimization_barrier`` does not survive CPU compilation.
    sincos_2x___ = jnp.stack(sincos(positions, theta_P))
    eye = jnp.eye(sincos_2x___.shape[-1], dtype=sincos_2x___.dtype)
    sin, cos = jnp.matmul(sincos_2x___, eye, precision=jax.lax.Precision.HIGHEST)
    xpos = None
    if self.xpos:
      zeta_P = (np.arange(0, self.dim, 2) / self.dim + 0.4) / 1.4
      exponent = positions.astype(jnp.float32)[..., None] / self.xpos_scale_base
      xpos = jnp.power(jnp.asarray(zeta_P, jnp.float32), exponent)
    return RotaryTables(sin, cos, xpos)

  def apply(self, x: jax.Array, tables: RotaryTables, role: str = 'query') -> jax.Array:
    """Rotates x [..., length, heads, head_dim] with ``self.tables``: role 'query' or 'key'
    (rotation, xPos scale zeta^m resp. zeta^-m, YaRN temperature) or 'value' (rotation only)."""
    if role not in ROLES:
      raise ValueError(f'Unknown role {role!r}; valid choices: {", ".join(ROLES)}.')
    sin, cos = tables.sin, tables.cos
    factor = 1.0 if role == 'value' else self.attention_factor
    if role != 'value' and tables.xpos is not None:
      scale = tables.xpos if role == 'query' else 1.0 / tables.xpos
      sin, cos = sin * scale, cos * scale
    if factor != 1.0:
      sin, cos = sin * factor, cos * factor
    return apply_rotary_sincos(x, sin, cos, layout=self.layout, rotary_dim=self.rotary_dim)


def apply_rotary(x: jax.Array, positions: jax.Array, **options) -> jax.Array:
  """Applies RoPE to x [..., length, heads, head_dim] at explicit positions [..., length] (int or
  float); ``options`` are ``RopeConfig`` fields. Only the rotation: YaRN's temperature and xPos
  act on queries and keys (``Rotary.apply`` with role='query'/'key')."""
  return _apply_rotary(x, jnp.asarray(positions), Rotary(head_dim=x.shape[-1], **options))


@functools.partial(jax.jit, static_argnums=2)
def _apply_rotary(x: jax.Array, positions: jax.Array, rotary: Rotary) -> jax.Array:
  return rotary.apply(x, rotary.tables(positions), role='value')
