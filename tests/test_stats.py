"""experiments/stats.py on inputs whose answers are known."""

import numpy as np
import pytest

from experiments import stats


def test_paired_difference_of_known_sign_and_size():
  rng = np.random.default_rng(0)
  b = rng.uniform(0.6, 0.8, size=8)
  a = b + 0.1 + rng.normal(0, 0.005, size=8)
  result = stats.paired(a, b)
  assert result.n == 8 and not result.zero_variance
  assert result.mean == pytest.approx(np.mean(a - b))
  assert 0.08 < result.low < result.mean < result.high < 0.12
  assert result.p == pytest.approx(2 / 2 ** 8)  # every flip but the two extremes is smaller
  reverse = stats.paired(b, a)
  assert reverse.mean == pytest.approx(-result.mean) and reverse.p == result.p


def test_sign_flip_counts_every_assignment():
  # Sign flips of (1, 2, 3): |mean| >= 2 only for all + and all -: p = 2 / 8.
  assert stats.sign_flip_p(np.array([1.0, 2.0, 3.0])) == pytest.approx(0.25)
  # (1, -1): the flips give |mean| 0, 1, 1, 0; the observed 0 is reached by all of them.
  assert stats.sign_flip_p(np.array([1.0, -1.0])) == pytest.approx(1.0)


def test_zero_variance_is_reported_not_p_zero():
  same = stats.paired([0.5, 0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5, 0.5])
  assert same.zero_variance and same.p == 1.0 and same.mean == same.low == same.high == 0.0
  shifted = stats.paired([1.0] * 5, [0.5] * 5)  # every seed differs by exactly +0.5
  assert shifted.zero_variance and shifted.low == shifted.high == pytest.approx(0.5)
  assert shifted.p == pytest.approx(2 / 2 ** 5) and shifted.p > 0


def test_holm_adjustment():
  # Sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 -> kept monotone 0.06.
  np.testing.assert_allclose(stats.holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
  assert stats.holm([0.5, 0.9]) == [1.0, 1.0]  # capped at 1
  adjusted = stats.holm([0.01, float('nan'), 0.02])
  assert np.isnan(adjusted[1]) and adjusted[0] == pytest.approx(0.02)


def test_paired_rejects_unpaired_samples():
  with pytest.raises(ValueError, match='equally long'):
    stats.paired([1.0, 2.0], [1.0])
