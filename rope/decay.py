"""RoPE's long-term decay (RoFormer section 3.4.3, Figure 2).

Writing the rotated dot product as a sum over pairs and applying Abel summation, the paper
bounds |q^T R_{n-m} k| by (max_j |h_{j+1} - h_j|) * sum_j |S_j| with
S_j = sum_{k=0}^{j-1} exp(i (m - n) theta_k). The relative upper bound

    (1 / (d/2)) * sum_{j=1}^{d/2} |S_j|

decays (on average) as the relative distance m - n grows. ``decay_bound`` computes it, for
plain RoPE and for every frequency-scaling variant.
"""

from __future__ import annotations

import numpy as np

from rope import frequencies
from rope.config import RopeConfig


def decay_bound(distances, head_dim: int, config: RopeConfig = RopeConfig()) -> np.ndarray:
  """The Figure 2 curve: relative upper bound at each relative distance, float64 [n]."""
  theta = frequencies.inv_frequencies(head_dim, config).astype(np.float64)
  distances = np.asarray(distances, np.float64)
  phases = np.exp(1j * distances[..., None] * theta)  # [..., d/2]
  partial_sums = np.cumsum(phases, axis=-1)  # S_1 .. S_{d/2}
  return np.abs(partial_sums).mean(axis=-1)
