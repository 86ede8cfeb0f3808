"""Rotary frequencies theta_i, and the frequency variants used for length extrapolation.

RoFormer (Su et al. 2021, eq. 15) rotates feature pair i by the angle m * theta_i, with

    theta_i = base^(-2i/d),  i = 0 .. d/2 - 1,  base = 10000.

The variants below (``rope.RopeConfig`` fields; each exactly plain RoPE at factor 1) change
theta (YaRN also the attention temperature) so that a model trained with context length L runs
at s * L. Computed in float64 NumPy at trace time (static arguments only), then float32.

* ``linear``: position interpolation (Chen et al. 2023, "Extending Context Window of Large
  Language Models via Positional Interpolation"): theta_i / s, i.e. position m acts as m / s.
* ``ntk``: NTK-aware base scaling (bloc97 2023, analysed in the YaRN paper): the base becomes
  base * s^(d / (d - 2)), so the lowest frequency is interpolated by s and the highest kept.
* ``dynamic_ntk``: dynamic NTK (emozilla 2023; Hugging Face's ``dynamic``): plain RoPE up to the
  original length L; at n > L tokens the NTK base with factor s n / L - (s - 1).
* ``yarn``: YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language
  Models"): "NTK-by-parts", dimensions that turn more than ``beta_fast`` times over the original
  context keep theta_i, fewer than ``beta_slow`` times use theta_i / s, a linear ramp between (by
  default over the pair index between the rounded correction dims, as the authors' code;
  ``yarn_ramp='paper'``: over the number of turns, as the paper's formula reads); plus the
  temperature sqrt(1/t) = 0.1 ln(s) + 1 on queries and keys.
* ``llama3``: Llama 3.1's frequency scaling (Meta 2024, "The Llama 3 Herd of Models"): wavelengths
  shorter than L / high_freq_factor kept, longer than L / low_freq_factor divided by s, a smooth
  interpolation between.

p-RoPE (Barbero et al. 2025, "Round and Round We Go! What makes Rotary Positional Encodings
useful?", ICLR 2025; ``rope.p``) is applied after the scaling: of the d/2 pairs, the first
floor(p * d / 2) (the highest frequencies) keep theta_i, the rest get theta_i = 0 and are never
rotated. The count is the paper's ``int(p * d // 2)`` (its appendix code, and Gemma's
``apply_rope(rope_proportion=p)``); 0 and 1 are NoPE and RoPE exactly.
"""

from __future__ import annotations

import math

import numpy as np

from rope.config import RopeConfig, check_rotary_dim


def _yarn_keep(theta: np.ndarray, d: int, base: float, config: RopeConfig) -> np.ndarray:
  """YaRN's share of the original frequency per pair (1: kept, 0: divided by s)."""
  length, fast, slow = config.original_max_length, config.yarn_beta_fast, config.yarn_beta_slow
  if config.yarn_ramp == 'paper':
    rotations = length * theta / (2 * math.pi)  # turns over the context
    return np.clip((rotations - slow) / (fast - slow), 0.0, 1.0)
  # The pair index at which a frequency turns r times over the context, floored / ceiled.
  index = lambda r: d * math.log(length / (2 * math.pi * r)) / (2 * math.log(base))
  low, high = max(math.floor(index(fast)), 0), min(math.ceil(index(slow)), d - 1)
  high = high if high > low else low + 1e-3
  return 1.0 - np.clip((np.arange(d // 2) - low) / (high - low), 0.0, 1.0)


def rotated_pairs(rotary_dim: int, p: float) -> int:
  """The number of pairs p-RoPE rotates: the first floor(p * rotary_dim / 2)."""
  return int(p * rotary_dim // 2)


def inv_frequencies(rotary_dim: int, config: RopeConfig = RopeConfig(),
                    length: int | None = None) -> np.ndarray:
  """The frequencies theta_i, i = 0 .. rotary_dim/2 - 1, as float32 [rotary_dim // 2]; ``length``
  is the sequence length run (only ``dynamic_ntk`` depends on it; None: the original)."""
  check_rotary_dim(rotary_dim, rotary_dim)
  d, s, base = rotary_dim, float(config.scaling_factor), config.base
  exponents = np.arange(0, d, 2, dtype=np.float64) / d  # 2i/d
  if config.scaling == 'dynamic_ntk':
    n = max(length or config.original_max_length, config.original_max_length)
    s = s * n / config.original_max_length - (s - 1)
  if config.scaling in ('ntk', 'dynamic_ntk') and d > 2:
    base = base * s ** (d / (d - 2))
  theta = base ** -exponents
  if config.scaling == 'linear':
    theta = theta / s
  elif config.scaling == 'yarn':
    keep = _yarn_keep(theta, d, base, config)
    theta = (1.0 - keep) * theta / s + keep * theta
  elif config.scaling == 'llama3':
    context = config.original_max_length
    low, high = config.llama3_low_freq_factor, config.llama3_high_freq_factor
    wavelength = 2 * math.pi / theta
    smooth = (context / wavelength - low) / (high - low)
    blended = (1.0 - smooth) * theta / s + smooth * theta
    theta = np.where(wavelength < context / high, theta,
                     np.where(wavelength > context / low, theta / s, blended))
  theta[rotated_pairs(d, config.p):] = 0.0
  return theta.astype(np.float32)
