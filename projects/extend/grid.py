"""Length extension without fine-tuning: one rotary model trained at length L (seeds and a
learning-rate sweep, as an ablation cell), evaluated at up to 16L under each RoPE scaling variant
set at evaluation time (``eval.py``'s overrides), the same trained weights for every variant.

Static variants (linear, ntk, yarn, llama3) use the factor s = n / L of each evaluation length n,
as when a model is extended to a known length; ``dynamic_ntk`` takes s = 1 and adapts to the
length run; ``none`` is plain RoPE. Every variant is compared with ``none`` on the same seeds
(paired), Holm-corrected over all its comparisons. Writes ``extend.json``, ``report.md`` and
``extend.png`` into the workdir; the trained run is ``<workdir>/train`` (kept, so a rerun only
evaluates).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import ml_collections
import numpy as np

from models import positions
import rope
import settings
import storage
from experiments import plots
from experiments import report as report_lib
from experiments import stats
from training import evaluation
from training import trainer
from training import validation
from training.config import RunConfig, run_config
from training.metrics import console

REPORT_FILE, RESULTS_FILE, PLOT_FILE = 'report.md', 'extend.json', 'extend.png'


R = settings.Role.RESULTS


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExtendConfig:
  """The ``extend`` group: the scaling variants and lengths, and the trained run's members."""

  # rope.scaling kinds, set at evaluation.
  variants: tuple[str, ...] = settings.setting(rope.SCALING_KINDS, R, items=str,
                                               example='linear,yarn')
  # Evaluation lengths (the probe's test splits), above data.max_length.
  lengths: tuple[int, ...] = settings.setting((128, 256, 512, 1024), R, items=int,
                                              example='128,256')
  # Peak learning rates of the trained run; the rate is chosen on validation.
  learning_rates: tuple[float, ...] = settings.setting((1e-3,), R, items=float,
                                                       example='1e-3,3e-3')
  num_seeds: int = settings.setting(8, R)  # Seeds, trained together; every variant sees all.

  def __post_init__(self):
    unknown = [v for v in self.variants if v not in rope.SCALING_KINDS]
    if not self.variants or unknown:
      raise ValueError(f'extend.variants={",".join(self.variants)!r}: give comma-separated '
                       f'rope.scaling kinds among {", ".join(rope.SCALING_KINDS)}.')


def group() -> ml_collections.ConfigDict:
  """The ``extend`` group's defaults, for a config file to change."""
  return settings.group_dict(ExtendConfig)


def check(config: ml_collections.ConfigDict) -> tuple[tuple[str, ...], tuple[int, ...]]:
  """(variants, lengths) of ``config.extend``, checked before anything is trained."""
  e = settings.build_group(ExtendConfig, config.extend, 'extend')
  train = train_config(config)
  if not e.lengths or any(n <= train.data.max_length for n in e.lengths):
    raise ValueError(f'extend.lengths={",".join(map(str, e.lengths))!r}: give comma-separated '
                     'evaluation lengths above the training length '
                     f'data.max_length={train.data.max_length}.')
  if train.model.position != positions.Rotary.name:
    raise ValueError(f'model.position={train.model.position!r}: the extension study varies '
                     "RoPE's scaling, so it needs model.position=rotary.")
  return e.variants, e.lengths


def train_config(config: ml_collections.ConfigDict) -> RunConfig:
  """The trained run's config: the base config with the study's seeds and rates."""
  e = settings.build_group(ExtendConfig, config.extend, 'extend')
  return settings.replace(run_config(config), {'train.num_seeds': e.num_seeds,
                                               'optim.learning_rates': e.learning_rates})


def overrides_for(variant: str, length: int, train_length: int) -> dict[str, Any]:
  """eval.py's overrides of one variant at one evaluation length."""
  if variant == 'none':
    return {}
  factor = 1.0 if variant == 'dynamic_ntk' else length / train_length
  return {'rope.scaling': variant, 'rope.scaling_factor': factor,
          'rope.original_max_length': train_length}


def evaluate(train_dir: str, variants: list[str], lengths: list[int],
             train_length: int) -> dict[str, dict[str, Any]]:
  """variant -> split -> {length, accuracy (per seed)} over every length, all of the members
  that training chose (a sweep's rate is chosen once, on validation with plain RoPE)."""
  members = evaluation.evaluate_workdir(train_dir, split='validation')['members']
  results = {}
  for variant in variants:
    results[variant] = {}
    for length in lengths:
      console(f'  {variant} at {length}')
      r = evaluation.evaluate_workdir(train_dir, eval_lengths=[length], members=members,
                                      overrides=overrides_for(variant, length, train_length))
      results[variant].update({k: v for k, v in r['eval'].items() if v['length'] == length})
  return results


def run(config: ml_collections.ConfigDict, workdir: str, *, command: str) -> str:
  """Trains (unless finished), evaluates every variant and length, writes the report."""
  variants, lengths = check(config)
  workdir = validation.check_workdir(workdir)
  train_dir = os.path.join(workdir, 'train')
  if report_lib.load_run(train_dir) is None:
    console(f'Extension: training the rotary model in {train_dir}.')
    trainer.train_and_evaluate(train_config(config), train_dir)
  console(f'Extension: {len(variants)} variants x {len(lengths)} lengths.')
  results = evaluate(train_dir, variants, lengths, config.data.max_length)
  if jax.process_index() != 0:
    return ''
  return write_report(workdir, results, train_length=config.data.max_length, command=command)


def comparisons(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
  """Each variant against none on every split, paired by seed, Holm-corrected together."""
  rows = []
  for variant, splits in results.items():
    if variant == 'none' or 'none' not in results:
      continue
    for split, r in splits.items():
      c = stats.paired(r['accuracy'], results['none'][split]['accuracy'])
      rows.append({'variant': variant, 'split': split, 'length': r['length'], 'mean': c.mean,
                   'low': c.low, 'high': c.high, 'p': c.p, 'zero_variance': c.zero_variance})
  for row, adjusted in zip(rows, stats.holm([r['p'] for r in rows])):
    row['p_holm'] = adjusted
  return rows


def _table(results: dict[str, dict[str, Any]]) -> list[str]:
  first = next(iter(results.values()))
  return report_lib.markdown_table(
      ['variant'] + [f'{s} ({r["length"]})' for s, r in first.items()],
      [[variant] + [report_lib.mean_std(np.asarray(r['accuracy']), 1, 3) for r in by_split.values()]
       for variant, by_split in results.items()])


def _comparison_lines(rows: list[dict[str, Any]]) -> list[str]:
  return report_lib.markdown_table(
      ['variant', 'split', 'mean difference', '95% CI', 'p', 'p (Holm)'],
      [[r['variant'], r['split'], f'{r["mean"]:+.3f}', f'[{r["low"]:+.3f}, {r["high"]:+.3f}]',
        'all differences equal' if r['zero_variance'] and r['mean'] == 0 else f'{r["p"]:.3g}',
        f'{r["p_holm"]:.3g}'] for r in rows])


def write_report(workdir: str, results: dict[str, dict[str, Any]], *, train_length: int,
                 command: str) -> str:
  """report.md, extend.json and extend.png; returns the report's text."""
  rows = comparisons(results)
  storage.write_json(os.path.join(workdir, RESULTS_FILE),
                     {'train_length': train_length, 'results': results, 'comparisons': rows})
  curves = {}
  for variant, by_split in results.items():
    for kind in ('near', 'far'):
      points = sorted((r['length'], r['accuracy']) for s, r in by_split.items()
                      if s.endswith(kind))
      if points:
        curves[variant, kind] = report_lib.by_length(points)
  plots.plot_extrapolation(os.path.join(workdir, PLOT_FILE), curves, train_length=train_length,
                           title=f'RoPE scaling at evaluation, trained at {train_length}')
  note = []
  if {'ntk', 'dynamic_ntk'} <= set(results):
    note = ['`dynamic_ntk` run at n tokens is `ntk` with s = n / L, and every example of a split '
            'runs at the split\'s length, so the two rows coincide by construction.', '']
  text = '\n'.join([
      '# Length extension without fine-tuning', '', f'Command: `{command}`', '',
      f'Trained at {train_length} tokens; test accuracy (mean ± std over seeds):', '',
      *_table(results), '', *note, f'Against `none` (paired by seed; Holm over all {len(rows)}):', '',
      *_comparison_lines(rows), '', f'![accuracy against length]({PLOT_FILE})', '',
      report_lib.environment(), ''])
  storage.write_atomically(os.path.join(workdir, REPORT_FILE), text)
  return text
