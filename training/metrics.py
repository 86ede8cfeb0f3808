"""A run's metrics, written by process 0: ``metrics.jsonl`` (one record per step and member,
deterministic numbers only, so a resumed run writes the file an uninterrupted one does),
TensorBoard under ``workdir/tb/<member>``, optionally Weights & Biases, and progress lines."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import Any, Mapping, Sequence

import jax
import numpy as np
import scipy.stats
from clu import metric_writers
from clu import periodic_actions

import storage

METRICS_FILE = 'metrics.jsonl'
RATE = 'steps_per_sec'  # what clu's ReportProgress writes
_PREFIX = ['']  # what this process's lines start with (a grid's run trained in a worker)


def set_console_prefix(prefix: str) -> None:
  _PREFIX[0] = f'{prefix} ' if prefix else ''


def console(message: str, *, warning: bool = False) -> None:
  """A timestamped line from process 0: progress on stdout, a ``warning`` on stderr."""
  if jax.process_index() == 0:
    print(f'{time.strftime("%H:%M:%S")} {_PREFIX[0]}{message}',
          file=sys.stderr if warning else sys.stdout, flush=True)


def correlations(prediction_NxB: np.ndarray, target_NxB: np.ndarray,
                 weight_NxB: np.ndarray) -> dict[str, np.ndarray]:
  """Per-member Pearson's and Spearman's r over the examples of weight > 0."""
  out = {'pearson': [], 'spearman': []}
  for prediction, target, weight in zip(prediction_NxB, target_NxB, weight_NxB):
    x, y = prediction[weight > 0], target[weight > 0]
    constant = len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0
    for name, fn in (('pearson', scipy.stats.pearsonr), ('spearman', scipy.stats.spearmanr)):
      out[name].append(np.nan if constant else fn(x, y).statistic)
  return {k: np.asarray(v) for k, v in out.items()}


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  """All records of a workdir's metrics.jsonl. A last line cut short (killed while appending) is
  ignored: the resumed run writes it again; a garbled line elsewhere is a ValueError."""
  path = os.path.join(workdir, METRICS_FILE)
  if not storage.exists(path):
    return []
  lines = storage.read_bytes(path).split(b'\n')
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


class ConsoleWriter(metric_writers.LoggingWriter):
  """Prints each write as one progress line (the mean over members) with the ETA."""

  def __init__(self, num_steps: int):
    super().__init__()
    self.num_steps = num_steps
    self.rates: list[float] = []

  def write_scalars(self, step: int, scalars: Mapping[str, Any]):
    if RATE in scalars:
      self.rates.append(float(scalars[RATE]))
    if not any(k.startswith(('train/', 'validation/')) for k in scalars):
      return  # clu's steps/s and uptime: shown with the next train line
    text = '  '.join(f'{k} {np.mean(v):.4g}' for k, v in scalars.items())
    if self.rates and any(k.startswith('train/') for k in scalars):
      eta = int((self.num_steps - step) / max(self.rates[-1], 1e-9))
      text += (f'  {self.rates[-1]:.2f} steps/s  '
               f'ETA {eta // 3600}:{eta % 3600 // 60:02d}:{eta % 60:02d}')
    console(f'step {step}/{self.num_steps}  {text}')


class RunWriter:
  """Per-member scalars to metrics.jsonl and TensorBoard, their means to the console."""

  def __init__(self, workdir: str, members: Sequence[Mapping[str, Any]], *, num_steps: int,
               resume_step: int, log_every: int, hparams: Mapping[str, Any] | None = None,
               wandb_project: str = ''):
    self.path = os.path.join(workdir, METRICS_FILE)
    self.members = [dict(m) for m in members]
    self.active = jax.process_index() == 0
    self.console = ConsoleWriter(num_steps)
    self.tb, self.lines, self.wandb, self.wandb_dir = [], [], None, None
    if self.active:
      if resume_step and not storage.exists(self.path):
        console(f'{self.path} is missing: the metrics restart at step {resume_step + 1}; the '
                'records of the earlier steps are lost.', warning=True)
      self.lines = [_line(r) for r in read_metrics(workdir) if r['step'] <= resume_step]
      storage.write_atomically(self.path, ''.join(self.lines))
      self.tb_dir = storage.LocalMirror(os.path.join(workdir, 'tb'))
      self.tb = [metric_writers.SummaryWriter(os.path.join(self.tb_dir.local, _name(m)))
                 for m in self.members]
      for writer in self.tb:
        writer.write_hparams(hparams or {})
      self.wandb, self.wandb_dir = _wandb_run(workdir, wandb_project, hparams or {}, resume_step)
    self.progress = periodic_actions.ReportProgress(
        num_train_steps=num_steps, every_steps=log_every, every_secs=None,
        writer=metric_writers.MultiWriter([self.console, *self.tb]))

  def write(self, step: int, per_member: Mapping[str, np.ndarray]) -> None:
    self.console.write_scalars(step, per_member)
    if not self.active:
      return
    scalars = [{k: float(np.asarray(v)[i]) for k, v in per_member.items()}
               for i in range(len(self.members))]
    lines = [_line(dict(s, **m, step=int(step))) for s, m in zip(scalars, self.members)]
    self.lines.extend(lines)
    if storage.is_remote(self.path):  # object storage cannot append: the whole (small) file
      storage.write_atomically(self.path, ''.join(self.lines))
    else:
      with open(self.path, 'a') as f:
        f.writelines(lines)
    for writer, values in zip(self.tb, scalars):
      writer.write_scalars(step, values)
      writer.flush()
    self.tb_dir.sync()
    if self.wandb is not None:
      self.wandb.log({**{k: float(np.mean(v)) for k, v in per_member.items()},
                      **{f'{_name(m)}/{k}': v for m, values in zip(self.members, scalars)
                         for k, v in values.items()}}, step=int(step))

  def step_time(self) -> float | None:
    """Median seconds per step over the reported windows (the first, with compilation, aside)."""
    rates = self.console.rates[1:] or self.console.rates
    return float(1.0 / np.median(rates)) if rates else None

  def close(self) -> None:
    for writer in self.tb:
      writer.close()
    if self.active:
      self.tb_dir.close()
    if self.wandb is not None:
      self.wandb.finish()
      self.wandb_dir.close()


def _name(member: Mapping[str, Any]) -> str:
  """'seed_0', or 'peak_learning_rate_0.001_seed_0' in a sweep."""
  return '_'.join(f'{k}_{v:g}' if k != 'seed' else f'seed_{v}' for k, v in sorted(member.items()))


def _wandb_run(workdir: str, project: str, hparams: Mapping[str, Any], resume_step: int):
  """A Weights & Biases run (None if no project) and its mirror of ``workdir``."""
  if not project:
    return None, None
  import wandb  # pylint: disable=g-import-not-at-top  (optional: only with wandb_project)
  mirror = storage.LocalMirror(workdir)  # wandb writes into <dir>/wandb
  run_id = hashlib.sha256(storage.canonical(workdir).encode()).hexdigest()[:16]
  run = wandb.init(project=project, dir=mirror.local, config=dict(hparams), id=run_id,
                   resume='allow' if resume_step else None, name=os.path.basename(workdir),
                   settings=wandb.Settings(silent=True))  # our progress lines are the console's
  return run, mirror


class Profiler:
  """A ``jax.profiler`` trace of the steps ``train.profile_steps`` into ``workdir/profile``."""

  def __init__(self, spec: str, workdir: str):
    self.first, self.last = parse_step_window(spec) if spec else (0, -1)
    self.directory = storage.LocalMirror(os.path.join(workdir, 'profile')) if spec else None
    self.tracing = False

  def before(self, step: int) -> None:
    if step == self.first:
      jax.profiler.start_trace(self.directory.local)
      self.tracing = True

  def after(self, step: int, state: Any) -> None:
    if self.tracing and step == self.last:
      jax.block_until_ready(state)  # the window's steps whole in the trace
      self.close()

  def close(self) -> None:
    if self.tracing:
      jax.profiler.stop_trace()
      self.tracing = False
    if self.directory is not None:
      self.directory.close()
      self.directory = None


def parse_step_window(spec: str) -> tuple[int, int]:
  try:
    first, last = (int(x) for x in spec.split(':'))
  except ValueError:
    raise ValueError(f"train.profile_steps={spec!r} is not 'first:last' (steps, e.g. '10:15', "
                     "or '' for no trace).") from None
  if not 1 <= first <= last:
    raise ValueError(f'train.profile_steps={spec!r}: need 1 <= first <= last.')
  return first, last


def _line(record: Mapping[str, Any]) -> str:
  return json.dumps(record, sort_keys=True) + '\n'
