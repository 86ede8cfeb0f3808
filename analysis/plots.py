"""Plots (PNG, matplotlib with the non-interactive Agg backend)."""

from __future__ import annotations

import numpy as np

import rope


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def plot_decay(path: str, *, head_dim: int = 128, base: float = 10000.0,
               max_distance: int = 256, factor: float = 4.0,
               original_max_length: int = 64) -> None:
  """RoPE's long-term decay (paper Figure 2) next to the frequency-scaling variants."""
  plt = _pyplot()
  distances = np.arange(max_distance + 1)
  variants = {'rope (paper)': None}
  for kind in rope.SCALING_KINDS[1:]:
    variants[f'{kind} x{factor:g}'] = rope.Scaling(kind, factor, original_max_length)
  fig, ax = plt.subplots(figsize=(7, 4))
  for label, scaling in variants.items():
    ax.plot(distances, rope.decay_bound(distances, head_dim, base, scaling), label=label,
            lw=2 if scaling is None else 1)
  ax.set_xlabel('relative distance m - n')
  ax.set_ylabel('relative upper bound (1/(d/2)) sum |S_j|')
  ax.set_title(f'RoPE long-term decay (d={head_dim}, base={base:g})')
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
