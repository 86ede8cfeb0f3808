"""The Chomsky tasks' length evaluation (``data.name=chomsky/<task>``, projects/chomsky/README.md): the
accuracy at every test length, computed as the authors' ``range_evaluation`` does, and the score
the papers report for a run, the mean of those accuracies over the test lengths.

At a test length, the accuracy of a batch of ``data.chomsky_eval_batch_size`` examples is the
fraction of its scored output tokens predicted right (per token; a termination task scores its
outputs up to the termination token), and the length's accuracy is the mean over its batches.
The results go to ``chomsky_lengths.json`` and ``chomsky_lengths.csv`` in the workdir, with a
plot, ``chomsky_lengths.png``.
"""

from __future__ import annotations

import io
import os
from typing import Any

import jax
import matplotlib
import numpy as np

import models
import storage
from training.experiment import Experiment

matplotlib.use('Agg')  # files only, no display
from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

RESULTS_FILE = 'chomsky_lengths.json'


def length_accuracy(exp: Experiment, params, length: int) -> np.ndarray:
  """Each member's accuracy at one test length: the mean of its batches' accuracies."""
  size = exp.config.data.chomsky_eval_batch_size
  return np.mean([exp.evaluate(params, [local])['accuracy']
                  for local in exp.eval_batches(f'test_{length}', batch_size=size)], axis=0)


def evaluate(exp: Experiment, params, workdir: str) -> dict[str, Any]:
  """Every test length's accuracy for every member of the run (each seed at each learning
  rate), written to the workdir; returns each member's score (the mean over the test lengths),
  the best of them (the papers' tables take the best over seeds and learning rates) and where
  the rest is. A length the position scheme cannot run at (``models.LengthError``) has no
  accuracy and leaves the score undefined (null)."""
  lengths, accuracy, refused = list(exp.config.data.chomsky_tests), [], {}
  for n in lengths:
    try:
      accuracy.append(length_accuracy(exp, params, n))
    except models.LengthError as e:
      accuracy.append(np.full(len(exp.seeds), np.nan))
      refused[n] = str(e)
  per_length_NxK = np.asarray(accuracy).T  # members x lengths
  score = _listed(per_length_NxK.mean(axis=1))
  defined = [s for s in score if s is not None]
  summary = {'members': exp.members, 'score': score, 'best': max(defined, default=None),
             'lengths': f'{lengths[0]}..{lengths[-1]} ({len(lengths)})',
             'per_length': RESULTS_FILE}
  if jax.process_index() == 0:
    _write({'task': exp.info.name, 'train_lengths': [1, exp.info.train_length],
            'samples_per_length': exp.config.data.chomsky_samples_per_length,
            'members': exp.members, 'lengths': lengths, 'score': score,
            'accuracy': [_listed(row) for row in per_length_NxK], 'not_applicable': refused},
           workdir, per_length_NxK)
  return summary


def _listed(values: np.ndarray) -> list[float | None]:
  """JSON has no NaN: a length that could not run is null."""
  return [None if np.isnan(v) else float(v) for v in values]


def _write(results: dict[str, Any], workdir: str, accuracy_NxK: np.ndarray) -> None:
  """The JSON, a CSV (length, then one accuracy column per member) and the plot."""
  storage.write_json(os.path.join(workdir, RESULTS_FILE), results)
  names = ['_'.join(f'{k}_{v:g}' for k, v in member.items()) for member in results['members']]
  rows = ['length,' + ','.join(names)]
  rows += [f'{n},' + ','.join(f'{a:.6f}' for a in accuracy_NxK[:, k])
           for k, n in enumerate(results['lengths'])]
  storage.write_atomically(os.path.join(workdir, 'chomsky_lengths.csv'), '\n'.join(rows) + '\n')
  fig, ax = plt.subplots(figsize=(7, 4))
  for name, accuracy_K in zip(names, accuracy_NxK):
    ax.plot(results['lengths'], accuracy_K, lw=1,
            label=f'{name}: score {np.mean(accuracy_K):.3f}')
  ax.axvline(results['train_lengths'][1], color='gray', ls=':', lw=1,
             label='longest training length')
  ax.set_ylim(0, 1.02)
  ax.set_xlabel('input length')
  ax.set_ylabel('accuracy')
  ax.set_title(results['task'])
  ax.legend(fontsize=8)
  fig.tight_layout()
  png = io.BytesIO()  # storage writes bytes (local or gs://); it knows no plotting library
  fig.savefig(png, format='png', dpi=120)
  storage.write_atomically(os.path.join(workdir, 'chomsky_lengths.png'), png.getvalue())
  plt.close(fig)
