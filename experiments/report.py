"""The ablation report (report.md, results.csv/json, plots) from run directories: each a
``train_and_evaluate`` workdir or a ``not_applicable.json`` marker. A run trains (learning rate x
seed) members; each scheme is shown at its chosen rate (``Experiment.chosen_members``)."""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import platform
import re
from typing import Any, Sequence

import flax
import jax
import numpy as np
import optax

import models
from models import positions
import storage
from experiments import plots
from experiments import stats
from training import metrics as metrics_lib
from training import tasks
from training.trainer import SUMMARY_FILE

NOT_APPLICABLE_FILE = 'not_applicable.json'
CSV_FIELDS = ('run', 'dataset', 'position', 'attention', 'seed', 'learning_rate', 'chosen',
              'split', 'length', 'accuracy', 'loss', 'perplexity', 'num_params', 'step_time_s',
              'step_memory_bytes', 'note')
THRESHOLDS = (0.9, 0.99)  # of the best validation accuracy any scheme of the dataset reached
SOLVED = 0.95  # a seed whose final validation accuracy reaches this x the best row's mean
SPLIT_MARK = '†'
SPLIT_TEXT = (
    f' {SPLIT_MARK}: the seeds split, some solving the task (final validation accuracy at least '
    f'{SOLVED:.0%} of the best scheme\'s mean) and some not, so the mean ± std says as much '
    'about the budget as about the scheme: no conclusion should rest on that row.')
TEST_TEXT = (
    'Comparisons are paired by seed: seed i of every scheme shares the data order and the '
    'initial shared parameters, so each comparison uses the per-seed differences, with the '
    'exact two-sided sign-flip test (it assumes no distribution, and accuracies near 100% are '
    'far from normal) and a 95% bootstrap interval for the mean difference; p-values are '
    'Holm-adjusted over the comparisons of each column. With n seeds the smallest possible p is '
    '2/2^n, and a difference that is the same on every seed is marked "zero variance" (its p is '
    'that of the sign-flip test, never 0).')


@dataclasses.dataclass
class Run:
  """One grid cell: a scheme on a dataset (all its members)."""

  name: str
  path: str
  dataset: str
  position: str
  attention: str
  summary: dict[str, Any] | None = None
  not_applicable: str | None = None
  step_memory: int | None = None  # bytes of one compiled train step (ablation.report_memory)

  @property
  def language_model(self) -> bool:
    return bool(self.summary) and tasks.KINDS[self.summary.get('task', 'classify')].language_model

  def _chosen(self, split: str, key: str) -> np.ndarray | None:
    """The chosen members' ``key`` on ``split``, or None if not evaluated."""
    if split == 'validation':
      return np.asarray(self.summary[f'validation_{key}'])[self.chosen]
    result = self.summary['eval'].get(split, {})
    return np.asarray(result[key]) if key in result else None

  def loss(self, split: str) -> np.ndarray | None:
    return self._chosen(split, 'loss')

  @property
  def train_length(self) -> int | None:
    """``-L<n>`` in the name, None if the grid has one training length."""
    match = re.search(r'-L(\d+)$', self.name)
    return int(match.group(1)) if match else None

  @property
  def random_positions(self) -> int:
    """``-random<N>`` in the name; 0: plain positions."""
    match = re.search(r'-random(\d+)', self.name)
    return int(match.group(1)) if match else 0

  @property
  def label(self) -> str:
    notes = [self.attention] * (self.attention != 'softmax') + ['randomized'] * bool(
        self.random_positions)
    return f'{self.position} ({", ".join(notes)})' if notes else self.position

  @property
  def chosen(self) -> list[int]:
    """Indices of the members at the chosen learning rate."""
    return self.summary.get('chosen_members', list(range(len(self.summary['seeds']))))

  @property
  def seeds(self) -> list[int]:
    return [self.summary['seeds'][i] for i in self.chosen] if self.summary else []

  def accuracy(self, split: str) -> np.ndarray | None:
    return self._chosen(split, 'accuracy')

  def perplexity(self, split: str) -> np.ndarray | None:
    loss = self.loss(split)
    return None if loss is None else np.exp(loss)


def load_run(path: str, name: str | None = None, row: str | None = None) -> Run | None:
  """Reads a run directory (``row``: its grid row, if not its scheme); None if unfinished."""
  name = name or os.path.basename(os.path.normpath(path))
  for file in (NOT_APPLICABLE_FILE, SUMMARY_FILE):
    if storage.exists(os.path.join(path, file)):
      info = storage.read_json(os.path.join(path, file))
      return Run(name, path, info['dataset'], row or info['position'], info['attention'],
                 summary=info if file == SUMMARY_FILE else None,
                 not_applicable=info.get('reason') if file == NOT_APPLICABLE_FILE else None)
  return None


def columns(runs: Sequence[Run]) -> list[tuple[str, int]]:
  """(split, length) evaluated in any run: validation first, then by length, near before far."""
  cols = {}
  for run in runs:
    if run.summary:
      cols.update({split: r['length'] for split, r in run.summary['eval'].items()})
  ordered = sorted(cols.items(), key=lambda kv: (kv[1], not kv[0].endswith('near'), kv[0]))
  length = next((n for s, n in ordered if s == 'test'), None)
  return [('validation', length)] + ordered


def mean_std(values: np.ndarray | None, scale: float = 100, digits: int = 1) -> str:
  if values is None:
    return 'n/a'
  text = f'{scale * values.mean():.{digits}f}'
  return text + (f' ± {scale * values.std(ddof=1):.{digits}f}' if len(values) > 1 else '')


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
  return (['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
          + ['| ' + ' | '.join(row) + ' |' for row in rows])


def _headers(cols: list[tuple[str, int]]) -> list[str]:
  return [f'{s} (L={n})' for s, n in cols]


def learning_curve(run: Run, key: str = 'validation/accuracy') -> tuple[np.ndarray, np.ndarray]:
  """Steps [T] and the chosen members' ``key`` [seeds, T] from metrics.jsonl."""
  rate = run.summary.get('learning_rate')
  records = [r for r in metrics_lib.read_metrics(run.path) if key in r
             and r.get('peak_learning_rate', rate) == rate]
  steps = sorted({r['step'] for r in records})
  by = {(r['seed'], r['step']): r[key] for r in records}
  return np.asarray(steps), np.array([[by.get((s, t), np.nan) for t in steps]
                                      for s in run.seeds])


def steps_to(curve: tuple[np.ndarray, np.ndarray], target: float, *, below: bool = False) -> str:
  """The first step whose mean reaches ``target`` (``below``: at most it, a loss), or 'never'."""
  steps, values = curve
  reached = [int(t) for t, v in zip(steps, np.nanmean(values, axis=0))
             if (v <= target if below else v >= target)]
  return str(reached[0]) if reached else 'never'


def solved_seeds(runs: Sequence[Run]) -> dict[str, tuple[int, int]]:
  """Per finished run: (seeds reaching ``SOLVED`` x the best run's mean, seeds)."""
  final = {r.name: r.accuracy('validation') for r in runs if r.summary}
  best = max((m for a in final.values() if np.isfinite(m := float(np.mean(a)))),
             default=float('nan'))
  return {name: (int((a >= SOLVED * best).sum()), len(a)) for name, a in final.items()}


def split_runs(runs: Sequence[Run]) -> set[str]:
  """Runs some of whose seeds solve the task (``solved_seeds``) and some not."""
  return {name for name, (k, n) in solved_seeds(runs).items() if 0 < k < n}


def _mean_table(runs: Sequence[Run], cols: list[tuple[str, int]], value, best, scale: float,
                digits: int, marked: set[str] = frozenset()) -> list[str]:
  """Scheme x column: mean ± std of ``value(run, split)``, the ``best`` mean per column bold."""
  done = [r for r in runs if r.summary]
  top = {s: best((value(r, s).mean() for r in done if value(r, s) is not None), default=None)
         for s, _ in cols}
  rows = []
  for run in runs:
    if run.not_applicable:
      rows.append([run.label, 'n/a'] + ['n/a'] * len(cols))
      continue
    cells = []
    for split, _ in cols:
      values = value(run, split)
      text = mean_std(values, scale, digits)
      cells.append(f'**{text}**' if values is not None and np.isclose(values.mean(), top[split])
                   else text)
    label = f'{run.label} {SPLIT_MARK}' if run.name in marked else run.label
    rows.append([label, f'{run.summary["learning_rate"]:g}', *cells])
  return markdown_table(['scheme', 'rate'] + _headers(cols), rows)


def _paired_table(runs: Sequence[Run], ref: Run | None, cols: list[tuple[str, int]],
                  reference: str, value, pair, cell) -> str:
  """Scheme - ``ref`` on every column: ``cell(pair(...))``, Holm p per column."""
  others = [r for r in runs if r.summary and r is not ref]
  if ref is None or not others:
    return f'(no finished `{reference}` run to compare with)'
  cells = {}
  for split, _ in cols:
    results = []
    for run in others:
      a, b = value(run, split), value(ref, split)
      results.append(pair(a, b) if a is not None and b is not None else None)
    adjusted = stats.holm([res.p if res else float('nan') for res in results])
    for run, res, p in zip(others, results, adjusted):
      cells[run.name, split] = 'n/a' if res is None else (
          f'{cell(res)} p={p:.2g}' + (' (zero variance)' if res.zero_variance else ''))
  rows = [[f'{r.label} − {reference}'] + [cells[r.name, s] for s, _ in cols] for r in others]
  return '\n'.join(markdown_table(['scheme'] + _headers(cols), rows))


def _reference_run(runs: Sequence[Run], reference: str, *,
                   any_attention: bool = False) -> Run | None:
  """The finished run of the reference scheme, plain positions, softmax (or any) attention."""
  return next((r for r in runs if r.summary and r.position == reference and not r.random_positions
               and (any_attention or r.attention == 'softmax')), None)


def comparison_table(runs: Sequence[Run], cols: list[tuple[str, int]], reference: str) -> str:
  """Scheme - reference on every column: mean difference in points [95% CI], Holm p."""
  ref = _reference_run(runs, reference)
  return _paired_table(
      runs, ref, cols, reference, Run.accuracy,
      lambda a, b: stats.paired(a, b) if len(a) == len(b) else None,
      lambda res: f'{100 * res.mean:+.1f} [{100 * res.low:+.1f}, {100 * res.high:+.1f}]')


def budget_table(runs: Sequence[Run]) -> str:
  """Steps to 90% / 99% of the best validation accuracy, skipped updates, cost per scheme."""
  done = [r for r in runs if r.summary]
  curves = [learning_curve(r) for r in done]  # each run's metrics.jsonl read once
  best = max((float(np.nanmax(np.nanmean(acc, axis=0))) for _, acc in curves if acc.size),
             default=float('nan'))
  none = next((r.summary['step_time_s'] for r in done  # the scheme without positions
               if r.position in models.SCHEMES and not models.SCHEMES[r.position].adds_positions),
              None)
  solved = solved_seeds(done)
  header = (['scheme', 'rates tried', 'chosen'] + [f'steps to {t:.0%} of {100 * best:.1f}%'
                                                   for t in THRESHOLDS]
            + [f'seeds solved ({SOLVED:.0%} of best)', 'skipped updates', 'params', 'members',
               'step time / none', 'seconds: setup, first step, other steps, validation, test'])
  memory = any(r.step_memory for r in done)
  header += ['step memory (MiB)'] if memory else []
  rows = []
  for run, curve in zip(done, curves):
    s, t = run.summary, run.summary.get('step_time_s')
    k, n = solved[run.name]
    rows.append([
        run.label, ', '.join(f'{x:g}' for x in sorted(set(s['learning_rates']))),
        _chosen_rate(s), *[steps_to(curve, th * best) for th in THRESHOLDS],
        f'{k}/{n}' + f' {SPLIT_MARK}' * (0 < k < n), str(sum(s['skipped_updates'])),
        f'{s["num_params"]:,}',
        f'{len(s["seeds"])} ({s.get("members", "vmap")})',
        f'{t / none:.2f}' if t and none else 'n/a', _seconds(s),
        *([f'{run.step_memory / 2**20:.1f}'] if memory else [])])
  return '\n'.join(markdown_table(header, rows))


def _chosen_rate(summary: dict[str, Any]) -> str:
  """The chosen rate, marked when the grid could not tell whether another would do better."""
  rates, chosen = sorted(set(summary['learning_rates'])), summary['learning_rate']
  if len(rates) == 1:
    return f'{chosen:g} (one rate tried)'
  return f'{chosen:g} (edge of the grid)' if chosen in (rates[0], rates[-1]) else f'{chosen:g}'


def _seconds(summary: dict[str, Any]) -> str:
  """Seconds of setup, the first step (its compile), the other steps, validation and test."""
  s = summary.get('seconds') or {}
  steps = (s['train_loop'] - s['first_step'] - s['validation_eval']
           if {'train_loop', 'first_step', 'validation_eval'} <= s.keys() else None)
  if steps is not None and steps < 0:  # runs before the fix of 3 Dec 2026 timed their loop from
    steps = None                       # the last validation on: no time for the steps
  return ', '.join('n/a' if v is None else f'{v:.0f}' for v in (
      s.get('setup'), s.get('first_step'), steps, s.get('validation_eval'), s.get('test_eval')))


def results_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
  """One row per (run, member, split) for results.csv/json (unchosen members: validation only)."""
  rows = []
  for run in runs:
    base = {'run': run.name, 'dataset': run.dataset, 'position': run.position,
            'attention': run.attention}
    if run.not_applicable:
      rows.append(dict(base, note=run.not_applicable))
      continue
    s = run.summary
    for i, (seed, rate) in enumerate(zip(s['seeds'], s['learning_rates'])):
      member = dict(base, seed=seed, learning_rate=rate, chosen=i in run.chosen,
                    num_params=s['num_params'], step_time_s=s['step_time_s'],
                    step_memory_bytes=run.step_memory)
      lm = {'perplexity': float(np.exp(s['validation_loss'][i]))} if run.language_model else {}
      rows.append(dict(member, split='validation', accuracy=s['validation_accuracy'][i],
                       loss=s['validation_loss'][i], **lm))
      if i in run.chosen:
        k = run.chosen.index(i)
        rows += [dict(member, split=split, length=r['length'], note=r.get('not_applicable', ''),
                      accuracy=r['accuracy'][k] if 'accuracy' in r else None,
                      loss=r['loss'][k] if 'loss' in r else None,
                      **({'perplexity': r['perplexity'][k]} if 'perplexity' in r else {}))
                 for split, r in s['eval'].items()]
  return rows


def environment() -> str:
  dev = jax.devices()[0]
  return (f'{platform.platform()}, {os.cpu_count()} CPU cores, {jax.device_count()} x '
          f'{dev.device_kind}; Python {platform.python_version()}, jax {jax.__version__}, '
          f'flax {flax.__version__}, optax {optax.__version__}')


def by_length(points: list[tuple[int, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
  """(length, values [seeds]) points -> lengths [K] and values [seeds, K], for the plots."""
  return np.array([n for n, _ in points]), np.stack([v for _, v in points], axis=1)


def _dataset_section(out_dir: str, dataset: str, runs: Sequence[Run], reference: str) -> list[str]:
  cols, slug = columns(runs), re.sub(r'\W+', '_', dataset).strip('_')
  done = [r for r in runs if r.summary]
  plots.plot_learning_curves(os.path.join(out_dir, f'curves_{slug}.png'),
                             {r.label: learning_curve(r) for r in done},
                             title=f'{dataset}: validation accuracy at the chosen rate')
  curves = {}
  for run in done:
    for kind in ('near', 'far'):
      points = [(n, run.accuracy(s)) for s, n in cols if s == 'test' or s.endswith(kind)]
      points = [(n, a) for n, a in points if a is not None]
      if len(points) > 1:
        curves[run.label, kind] = by_length(points)
  length = cols[0][1]
  figures = f'![curves](curves_{slug}.png)'
  if curves:
    plots.plot_extrapolation(os.path.join(out_dir, f'extrapolation_{slug}.png'), curves,
                             train_length=length, title=f'{dataset}: accuracy vs length')
    figures += f' ![extrapolation](extrapolation_{slug}.png)'
  probes, split = any(s.endswith(('_near', '_far')) for s, _ in cols), split_runs(runs)
  return [f'## {dataset}', '', 'Test accuracy (%) at the chosen learning rate, mean ± std over '
          f'seeds; trained at L={length}.' + (
              ' `_near`: markers within the training width (longer context, seen distances); '
              '`_far`: markers further apart than in training (unseen distances).' if probes
              else '') + (SPLIT_TEXT if split else ''), '',
          *_mean_table(runs, cols, Run.accuracy, max, 100, 1, split), '',
          f'Paired differences with `{reference}` in accuracy points [95% CI], Holm-adjusted p:',
          '', comparison_table(runs, cols, reference), '', 'Budget and cost:', '',
          budget_table(runs), '', figures, '']


LM_THRESHOLDS = (1.10, 1.02)  # x the lowest final validation loss any scheme reached
LM_TEXT = (
    'Language models: perplexity is exp(mean cross-entropy per predicted token) on the first '
    '`data.eval_tokens` tokens of the split, the same text at every evaluation length (documents '
    'packed, never attending to each other); MLM predicts the masked 15%. Paired differences are '
    'in loss (nats per token; negative: lower perplexity than the reference), tested as the '
    'accuracies are.')


def _steps_to_loss(runs: Sequence[Run]) -> str:
  """Steps until the mean validation loss is within LM_THRESHOLDS of the best final one."""
  done = [r for r in runs if r.summary]
  curves = {r.name: learning_curve(r, 'validation/loss') for r in done}
  best = min(float(np.nanmean(loss, axis=0)[-1]) for _, loss in curves.values() if loss.size)
  header = (['scheme'] + [f'steps to loss ≤ {t:g} x {best:.3f}' for t in LM_THRESHOLDS]
            + ['final validation loss'])
  rows = [[run.label, *[steps_to(curves[run.name], th * best, below=True) for th in LM_THRESHOLDS],
           f'{np.nanmean(curves[run.name][1], axis=0)[-1]:.3f}'] for run in done]
  return '\n'.join(markdown_table(header, rows))


def _language_model_section(out_dir: str, dataset: str, runs: Sequence[Run],
                            reference: str) -> list[str]:
  cols, slug = columns(runs), re.sub(r'\W+', '_', dataset).strip('_')
  done = [r for r in runs if r.summary]
  plots.plot_learning_curves(os.path.join(out_dir, f'loss_{slug}.png'),
                             {r.label: learning_curve(r, 'train/loss') for r in done},
                             title=f'{dataset}: training loss (paper Figure 3)',
                             ylabel='training loss')
  curves = {}
  for run in done:
    points = [(n, run.perplexity(s)) for s, n in cols[1:] if run.loss(s) is not None]
    if len(points) > 1:
      curves[run.label, ''] = by_length(points)
  plots.plot_extrapolation(os.path.join(out_dir, f'perplexity_{slug}.png'), curves,
                           train_length=cols[0][1], title=f'{dataset}: perplexity vs length',
                           ylabel='test perplexity')
  task = done[0].summary['task'] if done else ''
  ref = _reference_run(runs, reference, any_attention=True)
  losses = _paired_table(runs, ref, cols, reference, Run.loss, stats.paired,
                         lambda res: f'{res.mean:+.3f} [{res.low:+.3f}, {res.high:+.3f}]')
  return [f'## {dataset} ({task})', '', f'Perplexity at the chosen rate, mean ± std over seeds; '
          f'trained at L={cols[0][1]}; n/a: the scheme cannot run at that length.', '',
          *_mean_table(done, cols, Run.perplexity, min, 1, 2), '',
          f'Paired differences with `{reference}` in loss [95% CI], Holm-adjusted p:', '',
          losses, '',
          'Convergence (validation loss):', '', _steps_to_loss(runs), '', 'Budget and cost:', '',
          budget_table(runs), '', f'![loss](loss_{slug}.png) ![perplexity](perplexity_{slug}.png)',
          '']


def write_report(out_dir: str, runs: Sequence[Run], *, command: str, config_json: str,
                 reference: str = positions.Rotary.name, extra: str = '',
                 sections: Sequence[str] = ()) -> str:
  """Writes report.md, results.csv/json and the plots, with the projects' ``sections`` after
  the datasets'; returns the md."""
  storage.makedirs(out_dir)
  parts = ['# Position-scheme ablation', '', f'Command: `{command}`', '',
           f'Machine: {environment()}', '', *([extra, ''] if extra else []), TEST_TEXT, '',
           'Step time: each run\'s median train-step time relative to `none`, measured run after '
           'run (benchmarks/ measures side by side). Step memory (where shown): what XLA '
           'allocates for one compiled train step of all the run\'s members (parameters, '
           'optimizer state, batch, temporaries), from its memory analysis.', '',
           *([LM_TEXT, ''] if any(r.language_model for r in runs) else [])]
  # One section per dataset and training length: runs are compared only within one.
  for dataset, length in sorted({(r.dataset, r.train_length or 0) for r in runs}):
    group = [r for r in runs if r.dataset == dataset and (r.train_length or 0) == length]
    title = f'{dataset} (trained at {length})' if length else dataset
    section = (_language_model_section if any(r.language_model for r in group)
               else _dataset_section)
    parts += section(out_dir, title, group, reference)
  parts += sections
  plots.plot_decay(os.path.join(out_dir, 'rope_decay.png'))
  parts += ['RoPE long-term decay (paper Figure 2) and scaling variants:', '',
            '![decay](rope_decay.png)', '', '## Config', '', '```json', config_json, '```', '']
  md = '\n'.join(parts)
  storage.write_atomically(os.path.join(out_dir, 'report.md'), md)
  rows = results_rows(runs)
  storage.write_json(os.path.join(out_dir, 'results.json'), rows)
  write_csv(os.path.join(out_dir, 'results.csv'), rows, CSV_FIELDS)
  return md


def terminal_summary(md: str, path: str, seconds: float | None = None) -> str:
  """What a terminal shows of a report: each section's first table (the results), then where
  the whole report is and the wall time; a user scrolling back finds the results, not the config."""
  out, section, in_table = [], None, False
  for line in md.splitlines():
    if line.startswith('## '):
      section, in_table = (None if line == '## Config' else line), False
    elif section and line.startswith('|'):
      if not in_table:
        out += ['', section, '']
      out.append(line)
      in_table = True
    elif in_table:
      section, in_table = None, False  # only each section's first table
  out += ['', 'Mean ± std over seeds; †: the seeds split (the report says how).',
          f'The whole report (every comparison, CIs, budgets, config): {path}']
  if seconds is not None:
    out.append(f'Wall time: {int(seconds // 60)} min {round(seconds % 60)} s.')
  return '\n'.join(out).lstrip('\n')


def write_csv(path: str, rows: Sequence[dict[str, Any]],
               fields: Sequence[str] | None = None) -> None:
  """``rows`` as CSV, with ``fields`` (default: the first row's keys) as columns."""
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=fields or (list(rows[0]) if rows else []),
                          extrasaction='ignore')
  writer.writeheader()
  writer.writerows(rows)
  storage.write_atomically(path, buf.getvalue())
