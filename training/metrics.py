"""Metrics: per-step sums reduced on the host, written by process 0 only.

Three sinks:
  * ``metrics.jsonl`` in the workdir: one JSON record per (step, seed). It holds only
    deterministic numbers (losses, accuracies, learning rate, gradient norm), so a run that was
    killed and resumed writes exactly the same file as one that was not.
  * TensorBoard scalars under ``workdir/tb/seed_<seed>`` (plus throughput: steps/s, examples/s).
  * Console lines with progress, rate and ETA (stdout).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping, Sequence

import jax
import numpy as np

METRICS_FILE = 'metrics.jsonl'


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  """All records of a workdir's metrics.jsonl (empty if none).

  A last line cut short (a run killed while appending) is ignored: its step is after the
  checkpoint the run resumes from, so it is written again. A garbled line elsewhere raises
  ValueError naming it.
  """
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path, 'rb') as f:
    lines = f.read().split(b'\n')
  records = []
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
      if not isinstance(record, dict) or 'step' not in record:
        raise ValueError('not a metrics record')
    except ValueError as e:
      if number == len(lines):  # no newline after it: an interrupted append
        break
      raise ValueError(f'{path}, line {number}, is garbled ({e}). Delete that line (or the file, '
                       'losing the metrics history) and rerun.') from None
    records.append(record)
  return records


class MetricWriter:
  """Writes per-seed scalars to JSONL and TensorBoard; a no-op on processes other than 0."""

  def __init__(self, workdir: str, seeds: Sequence[int], *, resume_step: int):
    self.workdir = workdir
    self.seeds = list(seeds)
    self.active = jax.process_index() == 0
    self._tb = {}
    if not self.active:
      return
    self._truncate(resume_step)
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self._tf = tf
    for seed in self.seeds:
      self._tb[seed] = tf.summary.create_file_writer(os.path.join(workdir, 'tb', f'seed_{seed}'))

  def _truncate(self, resume_step: int) -> None:
    """Drops records after the step we resume from (they are about to be written again)."""
    records = [r for r in read_metrics(self.workdir) if r['step'] <= resume_step]
    path = os.path.join(self.workdir, METRICS_FILE)
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
      for r in records:
        f.write(json.dumps(r, sort_keys=True) + '\n')
    os.replace(tmp, path)

  def write(self, step: int, per_seed: Mapping[str, np.ndarray],
            extra: Mapping[str, float] | None = None) -> None:
    """Writes per_seed[name][i] for seed i (JSONL + TB) and ``extra`` (TB only: timings)."""
    if not self.active:
      return
    with open(os.path.join(self.workdir, METRICS_FILE), 'a') as f:
      for i, seed in enumerate(self.seeds):
        record = {'step': int(step), 'seed': int(seed)}
        record.update({k: float(np.asarray(v)[i]) for k, v in per_seed.items()})
        f.write(json.dumps(record, sort_keys=True) + '\n')
        with self._tb[seed].as_default(step=step):
          for k, v in record.items():
            if k not in ('step', 'seed'):
              self._tf.summary.scalar(k, v)
          for k, v in (extra or {}).items():
            self._tf.summary.scalar(k, v)
    for w in self._tb.values():
      w.flush()

  def close(self) -> None:
    for w in self._tb.values():
      w.close()


def console(message: str) -> None:
  """A timestamped progress line on stdout (process 0 only)."""
  if jax.process_index() == 0:
    print(f'{time.strftime("%H:%M:%S")} {message}', flush=True)
