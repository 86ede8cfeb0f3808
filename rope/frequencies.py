"""Rotary frequencies theta_i = base^(-2i/d) (RoFormer eq. 15) and the length-extrapolation
variants (``RopeConfig.scaling``; each is plain RoPE at factor s = 1), in float64 NumPy at trace
time, then float32: ``linear`` (position interpolation, Chen et al. 2023: theta_i / s); ``ntk``
(bloc97 2023: base * s^(d / (d - 2))); ``dynamic_ntk`` (emozilla 2023: plain up to the original
length L, then NTK with factor s n / L - (s - 1)); ``yarn`` (Peng et al. 2023: NTK-by-parts between
beta_fast and beta_slow turns over L, plus the temperature 0.1 ln(s) + 1 on queries and keys);
``llama3`` (Llama 3.1: wavelengths between L / high_freq_factor and L / low_freq_factor blended).
p-RoPE (Barbero et al. 2025, ``rope.p``) then zeroes all but the first int(p * d // 2) pairs.
``decay_bound``: RoPE's long-term decay (RoFormer section 3.4.3, Figure 2).
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
  theta[int(config.p * d // 2):] = 0.0  # p-RoPE: the paper's count, as Gemma's
  return theta.astype(np.float32)


def decay_bound(distances, head_dim: int, config: RopeConfig = RopeConfig()) -> np.ndarray:
  """The Figure 2 curve, float64 [n]: mean_j |S_j|, S_j = sum_{k<j} exp(i (m - n) theta_k), the
  relative bound (by Abel summation) on |q^T R_{n-m} k| at each relative distance m - n."""
  theta = inv_frequencies(head_dim, config).astype(np.float64)
  distances = np.asarray(distances, np.float64)
  phases = np.exp(1j * distances[..., None] * theta)  # [..., d/2]
  partial_sums = np.cumsum(phases, axis=-1)  # S_1 .. S_{d/2}
  return np.abs(partial_sums).mean(axis=-1)
