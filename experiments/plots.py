"""Plots (PNG, matplotlib with the non-interactive Agg backend)."""

from __future__ import annotations

import io

import matplotlib
import numpy as np

import rope
import storage

matplotlib.use('Agg')  # files only, no display
from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position


def _finish(fig, ax, path: str, *, xlabel: str, ylabel: str, title: str) -> None:
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=8)
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=120)
  storage.write_atomically(path, png.getvalue())
  fig.clf()
  plt.close(fig)


def plot_decay(path: str, *, head_dim: int = 128, base: float = 10000.0,
               max_distance: int = 256, factor: float = 4.0,
               original_max_length: int = 64) -> None:
  """RoPE's long-term decay (paper Figure 2) next to the frequency-scaling variants."""
  distances = np.arange(max_distance + 1)
  variants = {'rope (paper)': rope.RopeConfig(base=base)}
  for kind in rope.SCALING_KINDS[1:]:
    variants[f'{kind} x{factor:g}'] = rope.RopeConfig(
        base=base, scaling=kind, scaling_factor=factor, original_max_length=original_max_length)
  fig, ax = plt.subplots(figsize=(7, 4))
  for label, config in variants.items():
    ax.plot(distances, rope.decay_bound(distances, head_dim, config), label=label,
            lw=2 if config.scaling == 'none' else 1)
  _finish(fig, ax, path, xlabel='relative distance m - n',
          ylabel='relative upper bound (1/(d/2)) sum |S_j|',
          title=f'RoPE long-term decay (d={head_dim}, base={base:g})')


def plot_learning_curves(path: str, curves, *, title: str,
                         ylabel: str = 'validation accuracy') -> None:
  """Mean over seeds with a min-max band; ``curves``: label -> (steps [T], values [seeds, T])."""
  fig, ax = plt.subplots(figsize=(7, 4))
  for label, (steps, acc) in curves.items():
    if not len(steps):
      continue
    (line,) = ax.plot(steps, np.nanmean(acc, axis=0), label=label, marker='o', ms=3)
    if acc.shape[0] > 1:
      ax.fill_between(steps, np.nanmin(acc, 0), np.nanmax(acc, 0), color=line.get_color(),
                      alpha=0.15)
  _finish(fig, ax, path, xlabel='train step', ylabel=ylabel, title=title)


def plot_extrapolation(path: str, curves, *, train_length: int, title: str,
                       ylabel: str = 'test accuracy') -> None:
  """Mean ± std over seeds vs length; ``curves``: (label, kind) -> (lengths [K], values [seeds,
  K]), kind 'far' (unseen distances) dashed, 'near' and '' (one kind only) solid."""
  fig, ax = plt.subplots(figsize=(8, 4.5))
  colors = {}
  for (label, kind), (lengths, acc) in curves.items():
    color = colors.setdefault(label, f'C{len(colors)}')
    ax.errorbar(lengths, acc.mean(0), yerr=acc.std(0, ddof=1) if len(acc) > 1 else None,
                color=color, linestyle='--' if kind == 'far' else '-', marker='o', ms=3,
                capsize=2, label=f'{label} ({kind})' if kind else label)
  ax.axvline(train_length, color='grey', lw=0.8)
  ax.set_xscale('log', base=2)
  _finish(fig, ax, path, xlabel='evaluation length (tokens)', ylabel=ylabel, title=title)
