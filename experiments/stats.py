"""Paired statistics for comparing position schemes over seeds (Dror et al. 2018): seed i of every
scheme shares the data order and initial parameters, so a comparison works on the per-seed
differences d_i = a_i - b_i, with a percentile-bootstrap interval and the exact sign-flip test (no
distribution assumed: accuracies at a ceiling are far from normal); ``holm`` adjusts a family.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Sequence

import numpy as np

_EXACT_UP_TO = 16  # seeds; beyond this the sign flips are sampled
_RESAMPLES = 10_000


@dataclasses.dataclass(frozen=True)
class Paired:
  """A paired comparison a - b over n seeds (pairs)."""

  n: int
  mean: float  # of the differences
  low: float  # low, high: the 95% bootstrap confidence interval of the mean difference
  high: float
  p: float  # two-sided sign-flip p-value (1.0 when every difference is 0)
  zero_variance: bool  # every difference is the same (the interval is that one value)


# scipy.stats.permutation_test misses rounded ties: (.94,.97,.82,.85)-(.93,.98,.81,.86) p .75, not 1
def sign_flip_p(d: np.ndarray, *, seed: int = 0) -> float:
  """Two-sided p of the sign-flip test of mean(d) = 0: the share of the 2^n sign assignments
  (sampled beyond 16 values) whose |mean| reaches the observed one."""
  d = np.asarray(d, np.float64)
  observed = abs(d.mean())
  if len(d) <= _EXACT_UP_TO:
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))
  else:
    signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(_RESAMPLES, len(d)))
  means = np.abs(signs @ d) / len(d)
  return float(np.mean(means >= observed - 1e-12 * max(1.0, observed)))


def paired(a: Sequence[float], b: Sequence[float], *, seed: int = 0) -> Paired:
  """The paired comparison of ``a`` and ``b`` (same length, pair i = seed i)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if a.shape != b.shape or a.ndim != 1 or not len(a):
    raise ValueError(f'paired needs two equally long, non-empty 1-D samples, got {a.shape} and '
                     f'{b.shape}.')
  d = a - b
  mean = float(d.mean())
  if np.all(d == d[0]):
    p = 1.0 if d[0] == 0 else sign_flip_p(d, seed=seed)
    return Paired(len(d), mean, mean, mean, p, zero_variance=True)
  # scipy.stats.bootstrap (2.500000000000002th percentile) moves 13/80 docs/extend*/extend.json lows
  resampled = np.random.default_rng(seed).choice(d, size=(_RESAMPLES, len(d))).mean(axis=1)
  low, high = np.percentile(resampled, [2.5, 97.5])
  return Paired(len(d), mean, float(low), float(high), sign_flip_p(d, seed=seed), False)


# scipy.stats has Benjamini-Hochberg, not Holm: test_stats::test_holm_adjustment
def holm(p_values: Sequence[float]) -> list[float]:
  """Holm-Bonferroni adjusted p-values, in the input order (NaN entries stay NaN, uncounted)."""
  p = np.asarray(p_values, np.float64)
  valid = np.flatnonzero(~np.isnan(p))
  adjusted = np.full(len(p), math.nan)
  running = 0.0
  for rank, i in enumerate(valid[np.argsort(p[valid], kind='stable')]):
    running = max(running, min(1.0, (len(valid) - rank) * p[i]))
    adjusted[i] = running
  return adjusted.tolist()
