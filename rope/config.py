"""``RopeConfig``: every RoPE option, declared once (the configs' ``rope`` group); hashable."""

from __future__ import annotations

import dataclasses
import math

import settings

LAYOUTS = ('interleaved', 'half')
SCALING_KINDS = ('none', 'linear', 'ntk', 'dynamic_ntk', 'yarn', 'llama3')
YARN_RAMPS = ('reference', 'paper')


def _choice(field: str, value, choices) -> None:
  if value not in choices:
    raise ValueError(f'Unknown RoPE {field} {value!r}; valid choices: {", ".join(choices)}.')


def _setting(default, *, at_evaluation: bool):
  # Only the frequency scaling may change at evaluation (it extends a trained context); the
  # others decide how the trained weights are read.
  return settings.setting(default, settings.Role.RESULTS, evaluation=at_evaluation)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeConfig:
  """A RoPE variant, independent of the head size (``Rotary`` adds it)."""

  # theta_i = base^(-2i/d) (paper: 10000); to stretch a trained model use rope.scaling=ntk.
  base: float = _setting(10000.0, at_evaluation=False)
  # 'interleaved' rotates pairs (2i, 2i+1) as the paper and Hugging Face RoFormer; 'half' pairs
  # (i, i + d/2) as GPT-NeoX, LLaMA and MaxText (rope.layouts converts weights between them).
  layout: str = _setting('interleaved', at_evaluation=False)
  # rotate only the first rotary_dim features of a head (None: all)
  rotary_dim: int | None = _setting(None, at_evaluation=False)
  # p-RoPE (Barbero et al. 2025): only the floor(p * d / 2) highest-frequency pairs keep theta_i,
  # the others get 0 (position-free). 1: RoPE; 0: NoPE. Unlike rotary_dim, theta_i is unchanged.
  p: float = _setting(1.0, at_evaluation=False)
  # frequency scaling for length extrapolation (rope.frequencies)
  scaling: str = _setting('none', at_evaluation=True)
  scaling_factor: float = _setting(1.0, at_evaluation=True)  # the extension factor s (1: plain)
  # the training context L (dynamic_ntk, yarn, llama3); eval.py defaults it to the run's length
  original_max_length: int = _setting(512, at_evaluation=True)
  # YaRN: dimensions turning more often than this over L are kept
  yarn_beta_fast: float = _setting(32.0, at_evaluation=True)
  # YaRN: ... less often than this are interpolated by s
  yarn_beta_slow: float = _setting(1.0, at_evaluation=True)
  # YaRN's ramp between them: 'reference' linear in the pair index between the rounded correction
  # dims (the authors' code and Hugging Face); 'paper' linear in the number of turns (its formula).
  yarn_ramp: str = _setting('reference', at_evaluation=True)
  # Llama 3.1: wavelengths above L / this are divided by s
  llama3_low_freq_factor: float = _setting(1.0, at_evaluation=True)
  # Llama 3.1: wavelengths below L / this are kept
  llama3_high_freq_factor: float = _setting(4.0, at_evaluation=True)
  # xPos (Sun et al. 2022): queries at position m times zeta_i^(m / xpos_scale_base) per pair,
  # keys times zeta_i^(-m / xpos_scale_base), zeta_i = (2i/d + 0.4) / 1.4: q.k decays with m - n.
  xpos: bool = _setting(False, at_evaluation=False)
  xpos_scale_base: float = _setting(512.0, at_evaluation=False)
  # also rotate the values (Hugging Face RoFormer's rotary_value)
  rotary_value: bool = _setting(False, at_evaluation=False)

  def __post_init__(self):
    check_layout(self.layout)
    _choice('scaling', self.scaling, SCALING_KINDS)
    _choice('yarn_ramp', self.yarn_ramp, YARN_RAMPS)
    if not self.base > 1.0:
      raise ValueError(f'RoPE base must be > 1, got {self.base}.')
    if not 0.0 <= self.p <= 1.0:
      raise ValueError('rope.p must be in [0, 1] (the fraction of rotated pairs p-RoPE keeps; '
                       f'1: RoPE, 0: no rotation), got {self.p}.')
    if self.xpos and self.p < 1.0:
      raise ValueError('rope.xpos=True scales every pair by zeta_i^(+-m), so the pairs '
                       f'rope.p={self.p} leaves unrotated would still decay with distance and '
                       'not be position-free; set rope.p=1.0 or rope.xpos=False.')
    for name in ('scaling_factor', 'original_max_length', 'xpos_scale_base'):
      if not getattr(self, name) > 0:
        raise ValueError(f'RoPE {name} must be > 0, got {getattr(self, name)}.')
    if self.scaling == 'yarn' and not self.yarn_beta_fast > self.yarn_beta_slow:
      raise ValueError(f'YaRN needs yarn_beta_fast > yarn_beta_slow, got '
                       f'{self.yarn_beta_fast} <= {self.yarn_beta_slow}.')
    if self.scaling == 'llama3' and not self.llama3_high_freq_factor > self.llama3_low_freq_factor:
      raise ValueError('Llama-3.1 scaling needs llama3_high_freq_factor > '
                       f'llama3_low_freq_factor, got {self.llama3_high_freq_factor} <= '
                       f'{self.llama3_low_freq_factor}.')

  @property
  def attention_factor(self) -> float:
    """Multiplier on queries and keys: YaRN's sqrt(1/t) = 0.1 ln s + 1; 1 for the others."""
    if self.scaling == 'yarn' and self.scaling_factor > 1.0:
      return 0.1 * math.log(self.scaling_factor) + 1.0
    return 1.0

  def non_default_fields(self) -> list[str]:
    """Config paths of the switches that change what RoPE computes, set away from defaults (to
    refuse them for position schemes that would silently ignore them)."""
    default = RopeConfig()
    return [f'rope.{name}' for name in ('rotary_dim', 'p', 'scaling', 'xpos', 'rotary_value')
            if getattr(self, name) != getattr(default, name)]


# Scalings that read rope.original_max_length.
SCALINGS_WITH_LENGTH = ('dynamic_ntk', 'yarn', 'llama3')


def check_layout(layout: str) -> None:
  _choice('layout', layout, LAYOUTS)


def check_rotary_dim(head_dim: int, rotary_dim: int | None) -> int:
  """The number of rotated features, validated against ``head_dim``."""
  if head_dim <= 0 or head_dim % 2:
    raise ValueError(f'RoPE needs an even head_dim > 0, got head_dim={head_dim}.')
  rotary_dim = head_dim if rotary_dim is None else rotary_dim
  if rotary_dim <= 0 or rotary_dim % 2:
    raise ValueError(f'RoPE needs an even rotary_dim > 0, got rotary_dim={rotary_dim}.')
  if rotary_dim > head_dim:
    raise ValueError(
        f'rotary_dim={rotary_dim} is larger than head_dim={head_dim}; use rotary_dim <= head_dim.')
  return rotary_dim
