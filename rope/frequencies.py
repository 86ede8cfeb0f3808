"""Rotary frequencies theta_i, and the frequency variants used for length extrapolation.

RoFormer (Su et al. 2021, eq. 15) rotates feature pair i by the angle m * theta_i, with

    theta_i = base^(-2i/d),  i = 0 .. d/2 - 1,  base = 10000.

The variants below change theta (and, for YaRN, the attention temperature) so that a model
trained with context length L can be run at s * L. All are computed once, in float64 NumPy at
trace time, and handed to JAX as float32 constants: they depend only on static arguments.

* ``linear``: position interpolation (Chen et al. 2023, "Extending Context Window of Large
  Language Models via Positional Interpolation"): theta_i / s, i.e. position m acts as m / s.
* ``ntk``: NTK-aware base scaling (bloc97 2023, analysed in the YaRN paper): the base becomes
  base * s^(d / (d - 2)), so the lowest frequency is interpolated by s and the highest kept.
* ``yarn``: YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language
  Models"): "NTK-by-parts" interpolation, dimensions that turn more than ``beta_fast`` times over
  the original context keep theta_i, those that turn fewer than ``beta_slow`` times use
  theta_i / s, a linear ramp in between; plus the attention temperature
  sqrt(1/t) = 0.1 ln(s) + 1 that multiplies queries and keys.
* ``llama3``: Llama 3.1's frequency scaling (Meta 2024, "The Llama 3 Herd of Models"): wavelengths
  shorter than L / high_freq_factor are kept, longer than L / low_freq_factor divided by s, a
  smooth interpolation in between.

Every variant is exactly plain RoPE at factor 1.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

SCALING_KINDS = ('none', 'linear', 'ntk', 'yarn', 'llama3')


@dataclasses.dataclass(frozen=True)
class Scaling:
  """A frequency-scaling variant (hashable, so it can be a static jit argument).

  Attributes:
    kind: one of ``SCALING_KINDS``.
    factor: the context-extension factor s (>= 1 extends; 1 is plain RoPE).
    original_max_length: the training context length L (yarn, llama3).
    beta_fast: YaRN: rotations over L above which a dimension is not interpolated.
    beta_slow: YaRN: rotations over L below which a dimension is fully interpolated.
    low_freq_factor: Llama 3.1: wavelengths above L / low_freq_factor are divided by s.
    high_freq_factor: Llama 3.1: wavelengths below L / high_freq_factor are kept.
  """

  kind: str = 'none'
  factor: float = 1.0
  original_max_length: int = 512
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0

  def __post_init__(self):
    if self.kind not in SCALING_KINDS:
      raise ValueError(
          f'Unknown RoPE scaling {self.kind!r}; valid choices: {", ".join(SCALING_KINDS)}.')
    if not self.factor > 0:
      raise ValueError(f'RoPE scaling factor must be > 0, got {self.factor}.')
    if self.original_max_length <= 0:
      raise ValueError(
          f'RoPE original_max_length must be > 0, got {self.original_max_length}.')
    if self.kind == 'yarn' and not self.beta_fast > self.beta_slow:
      raise ValueError(
          f'YaRN needs beta_fast > beta_slow, got {self.beta_fast} <= {self.beta_slow}.')
    if self.kind == 'llama3' and not self.high_freq_factor > self.low_freq_factor:
      raise ValueError('Llama-3.1 scaling needs high_freq_factor > low_freq_factor, got '
                       f'{self.high_freq_factor} <= {self.low_freq_factor}.')

  @property
  def attention_factor(self) -> float:
    """Multiplier on queries and keys (YaRN's sqrt(1/t) = 0.1 ln s + 1; else 1)."""
    if self.kind == 'yarn' and self.factor > 1.0:
      return 0.1 * math.log(self.factor) + 1.0
    return 1.0


def check_rotary_dim(head_dim: int, rotary_dim: int | None) -> int:
  """Returns the number of rotated features, validating it against ``head_dim``."""
  if head_dim <= 0 or head_dim % 2:
    raise ValueError(f'RoPE needs an even head_dim > 0, got head_dim={head_dim}.')
  rotary_dim = head_dim if rotary_dim is None else rotary_dim
  if rotary_dim <= 0 or rotary_dim % 2:
    raise ValueError(f'RoPE needs an even rotary_dim > 0, got rotary_dim={rotary_dim}.')
  if rotary_dim > head_dim:
    raise ValueError(
        f'rotary_dim={rotary_dim} is larger than head_dim={head_dim}; use rotary_dim <= head_dim.')
  return rotary_dim


def inv_frequencies(rotary_dim: int, base: float = 10000.0,
                    scaling: Scaling | None = None) -> np.ndarray:
  """The frequencies theta_i, i = 0 .. rotary_dim/2 - 1, as float32 [rotary_dim // 2]."""
  check_rotary_dim(rotary_dim, rotary_dim)
  if not base > 1.0:
    raise ValueError(f'RoPE base must be > 1, got {base}.')
  scaling = scaling or Scaling()
  d, s = rotary_dim, float(scaling.factor)
  exponents = np.arange(0, d, 2, dtype=np.float64) / d  # 2i/d
  if scaling.kind == 'ntk' and d > 2:
    base = base * s ** (d / (d - 2))
  theta = base ** -exponents
  if scaling.kind == 'linear':
    theta = theta / s
  elif scaling.kind == 'yarn':
    rotations = scaling.original_max_length * theta / (2 * math.pi)  # turns over the context
    ramp = np.clip((rotations - scaling.beta_slow) / (scaling.beta_fast - scaling.beta_slow),
                   0.0, 1.0)  # 0: interpolate fully, 1: keep
    theta = (1.0 - ramp) * theta / s + ramp * theta
  elif scaling.kind == 'llama3':
    wavelength = 2 * math.pi / theta
    low_wavelength = scaling.original_max_length / scaling.low_freq_factor
    high_wavelength = scaling.original_max_length / scaling.high_freq_factor
    smooth = ((scaling.original_max_length / wavelength - scaling.low_freq_factor) /
              (scaling.high_freq_factor - scaling.low_freq_factor))
    blended = (1.0 - smooth) * theta / s + smooth * theta
    theta = np.where(wavelength < high_wavelength, theta,
                     np.where(wavelength > low_wavelength, theta / s, blended))
  return theta.astype(np.float32)
