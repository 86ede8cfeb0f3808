"""The ablation report: tables per dataset, CSV/JSON of every run, plots.

Input: run directories, each a ``train_and_evaluate`` workdir (``summary.json``,
``metrics.jsonl``) or a ``not_applicable.json`` marker written by ``ablate.py``.
Uncertainty: mean +- sample std over seeds, and for each scheme the difference to the
reference scheme (``rotary``) with a Welch t-test p-value and 95% confidence interval.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import platform
from typing import Any, Sequence

import flax
import jax
import numpy as np
import optax
from scipy import stats

from data import storage
from experiments import plots
from training import metrics as metrics_lib
from training.trainer import SUMMARY_FILE

NOT_APPLICABLE_FILE = 'not_applicable.json'
CSV_FIELDS = ('run', 'dataset', 'position', 'attention', 'seed', 'split', 'length', 'accuracy',
              'num_params', 'step_time_s', 'note')


@dataclasses.dataclass
class Run:
  """One grid cell: a scheme on a dataset (all its seeds)."""
  name: str
  path: str
  dataset: str
  position: str
  attention: str
  summary: dict[str, Any] | None = None
  not_applicable: str | None = None

  @property
  def seeds(self) -> list[int]:
    return self.summary['seeds'] if self.summary else []


def load_run(path: str, name: str | None = None) -> Run | None:
  """Reads a run directory; None if it has not finished."""
  name = name or os.path.basename(os.path.normpath(path))
  for file in (NOT_APPLICABLE_FILE, SUMMARY_FILE):
    if os.path.exists(os.path.join(path, file)):
      with open(os.path.join(path, file)) as f:
        info = json.load(f)
      return Run(name, path, info['dataset'], info['position'], info['attention'],
                 summary=info if file == SUMMARY_FILE else None,
                 not_applicable=info.get('reason') if file == NOT_APPLICABLE_FILE else None)
  return None


def welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
  """Mean difference a - b, its 95% CI half-width and the two-sided Welch t-test p-value."""
  a, b = np.asarray(a, float), np.asarray(b, float)
  diff = a.mean() - b.mean()
  if len(a) < 2 or len(b) < 2:
    return diff, math.nan, math.nan
  va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
  se = math.sqrt(va + vb)
  if se == 0:
    return diff, 0.0, 1.0 if diff == 0 else 0.0
  dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
  p = 2 * stats.t.sf(abs(diff) / se, dof)
  return diff, stats.t.ppf(0.975, dof) * se, p


def _mean_std(values: Sequence[float]) -> str:
  v = np.asarray(values, float)
  if v.size > 1:
    return f'{100 * v.mean():.1f} ± {100 * v.std(ddof=1):.1f}'
  return f'{100 * v.mean():.1f}'


def eval_columns(runs: Sequence[Run]) -> list[tuple[str, int]]:
  """(split, length) columns present in any run, sorted by length."""
  cols = {}
  for run in runs:
    if run.summary:
      for split, r in run.summary['eval'].items():
        cols[split] = r['length']
  return sorted(cols.items(), key=lambda kv: (kv[1], kv[0]))


def dataset_table(runs: Sequence[Run], reference: str = 'rotary') -> str:
  """Markdown table for one dataset: one row per scheme; best value per column in bold."""
  cols = eval_columns(runs)
  done = [r for r in runs if r.summary]
  ref = next((r for r in done if r.position == reference), None)
  none_time = next((r.summary['step_time_s'] for r in done
                    if r.position == 'none' and r.summary.get('step_time_s')), None)

  def acc(run, split):
    r = run.summary['eval'].get(split) if split != 'validation' else \
        {'accuracy': run.summary['validation_accuracy']}
    return None if r is None or 'accuracy' not in r else r['accuracy']

  columns = [('validation', None)] + cols
  best = {}
  for split, _ in columns:
    means = [np.mean(acc(r, split)) for r in done if acc(r, split) is not None]
    best[split] = max(means) if means else None
  header = (['scheme', 'seeds'] + [f'{s} acc % (L={n})' if n else 'val acc %' for s, n in columns]
            + ['params', 'step time / none', f'test Δ vs {reference} (95% CI, p)', 'note'])
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for run in runs:
    name = run.position if run.attention == 'softmax' else f'{run.position} ({run.attention})'
    if run.not_applicable:
      lines.append('| ' + ' | '.join([name, '0'] + ['n/a'] * (len(columns) + 3) +
                                     [run.not_applicable.replace('|', '/')]) + ' |')
      continue
    cells, notes = [name, str(len(run.seeds))], []
    for split, _ in columns:
      a = acc(run, split)
      if a is None:
        reason = run.summary['eval'].get(split, {}).get('not_applicable', 'missing')
        cells.append('n/a')
        notes.append(f'{split}: {reason.split(";")[0]}')
        continue
      text = _mean_std(a)
      cells.append(f'**{text}**' if np.isclose(np.mean(a), best[split]) else text)
    cells.append(f'{run.summary["num_params"]:,}')
    t = run.summary.get('step_time_s')
    cells.append(f'{t / none_time:.2f}' if t and none_time else 'n/a')
    if ref is not None and run is not ref and acc(run, 'test') and acc(ref, 'test'):
      d, ci, p = welch(acc(run, 'test'), acc(ref, 'test'))
      cells.append(f'{100 * d:+.1f} (± {100 * ci:.1f}, p={p:.2g})' if not math.isnan(ci)
                   else f'{100 * d:+.1f}')
    else:
      cells.append('—')
    cells.append('; '.join(notes).replace('|', '/'))
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def results_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
  """One row per (run, seed, split) for results.csv/json."""
  rows = []
  for run in runs:
    base = {'run': run.name, 'dataset': run.dataset, 'position': run.position,
            'attention': run.attention}
    if run.not_applicable:
      rows.append(dict(base, seed=None, split=None, length=None, accuracy=None,
                       note=run.not_applicable))
      continue
    s = run.summary
    for i, seed in enumerate(s['seeds']):
      common = dict(base, seed=seed, num_params=s['num_params'], step_time_s=s['step_time_s'])
      rows.append(dict(common, split='validation', length=None,
                       accuracy=s['validation_accuracy'][i], note=''))
      for split, r in s['eval'].items():
        rows.append(dict(common, split=split, length=r['length'],
                         accuracy=r['accuracy'][i] if 'accuracy' in r else None,
                         note=r.get('not_applicable', '')))
  return rows


def environment() -> str:
  dev = jax.devices()[0]
  return (f'{platform.platform()}, {os.cpu_count()} CPU cores, {jax.device_count()} x '
          f'{dev.device_kind}; Python {platform.python_version()}, jax {jax.__version__}, '
          f'flax {flax.__version__}, optax {optax.__version__}')


def write_report(out_dir: str, runs: Sequence[Run], *, command: str, config_json: str,
                 reference: str = 'rotary', extra: str = '') -> str:
  """Writes report.md, results.csv, results.json and the plots into out_dir; returns the md."""
  os.makedirs(out_dir, exist_ok=True)
  datasets = sorted({r.dataset for r in runs})
  parts = ['# Position-scheme ablation', '',
           f'Command: `{command}`', '', f'Machine: {environment()}', '']
  if extra:
    parts += [extra, '']
  parts += ['Accuracy in %, mean ± sample std over seeds; best per column in bold. '
            f'Δ vs {reference}: difference of mean test accuracy, 95% confidence interval '
            '(Welch) and two-sided Welch t-test p-value. Step time: each run\'s steady-state '
            'train-step time relative to `none`, measured run after run on the same machine '
            '(on a shared machine, differences within ~15% are noise; benchmarks/ measures '
            'side by side).', '']
  for ds in datasets:
    ds_runs = [r for r in runs if r.dataset == ds]
    parts += [f'## {ds}', '', dataset_table(ds_runs, reference), '']
    slug = ds.replace('/', '_')
    curves = {r.position: learning_curve(r) for r in ds_runs if r.summary}
    plots.plot_learning_curves(os.path.join(out_dir, f'curves_{slug}.png'), curves,
                               title=f'{ds}: validation accuracy')
    plots.plot_extrapolation(os.path.join(out_dir, f'extrapolation_{slug}.png'), ds_runs,
                             title=f'{ds}: accuracy vs evaluation length')
    parts += [f'![curves](curves_{slug}.png) ![extrapolation](extrapolation_{slug}.png)', '']
  plots.plot_decay(os.path.join(out_dir, 'rope_decay.png'))
  parts += ['RoPE long-term decay (paper Figure 2) and scaling variants:', '',
            '![decay](rope_decay.png)', '', '## Config', '', '```json', config_json, '```', '']
  md = '\n'.join(parts)
  storage.write_atomically(os.path.join(out_dir, 'report.md'), md)
  rows = results_rows(runs)
  storage.write_json(os.path.join(out_dir, 'results.json'), rows)
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction='ignore')
  writer.writeheader()
  writer.writerows(rows)
  storage.write_atomically(os.path.join(out_dir, 'results.csv'), buf.getvalue())
  return md


def learning_curve(run: Run) -> tuple[np.ndarray, np.ndarray]:
  """Steps [T] and validation accuracy [seeds, T] from the run's metrics.jsonl."""
  records = [r for r in metrics_lib.read_metrics(run.path) if 'validation/accuracy' in r]
  steps = sorted({r['step'] for r in records})
  by = {(r['seed'], r['step']): r['validation/accuracy'] for r in records}
  acc = np.array([[by.get((s, t), np.nan) for t in steps] for s in run.seeds])
  return np.asarray(steps), acc
