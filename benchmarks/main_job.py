"""The main job's time outside training steps, before and after a change, paired.

  python benchmarks/main_job.py --before=REV [--schemes=none,rotary,t5] [--rounds=2]

Each cell of the README's main job (``configs/ablation/probes.py``, one scheme, all its seeds) is
run alone with ``ablate.py --only``, from two trees:

- ``before``: git revision ``--before`` of this repository, exported to a temporary directory;
- ``after``: this working tree.

Each run has a fresh, empty persistent compilation cache (a new user's first run) and one data
directory prepared beforehand and shared, so that the two trees differ in nothing else. Rounds
are ABBA per scheme (before, after, after, before, ...), so that a drift of the machine over the
run falls on both alike. The phases are the run's own ``summary.json`` timings (setup, first
step, other steps, validation, test); the figures are the paired ratios after / before of the
time outside the other steps, of the other steps, and of the whole run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import common  # pylint: disable=g-import-not-at-top

flags.DEFINE_string('before', 'HEAD',
                    'Git revision of this repository to compare the working tree with.')
flags.DEFINE_list('schemes', ['none', 'rotary', 't5'], 'Schemes of the main job to run.')
flags.DEFINE_integer('rounds', 2, 'ABBA pairs per scheme (each pair: one run per setting).')
flags.DEFINE_list('overrides', [], 'Extra --config.X=Y overrides for every run (tests: tiny).')
flags.DEFINE_string('json', None, 'Write the figures here (for run_all.py).')
FLAGS = flags.FLAGS

CONFIG = 'configs/ablation/probes.py'
SETTINGS = ('before', 'after')
PHASES = ('setup', 'first step', 'other steps', 'validation', 'test')


def phases(summary: dict) -> dict[str, float]:
  """Seconds per phase of one run, from its summary.json."""
  s = summary['seconds']
  return {'setup': s['setup'], 'first step': s['first_step'],
          'other steps': s['train_loop'] - s['first_step'] - s['validation_eval'],
          'validation': s['validation_eval'], 'test': s['test_eval']}


def export_tree(revision: str, directory: str) -> str:
  """``revision`` of this repository written to ``directory`` (git archive); its commit id.
  RuntimeError with git's message if this clone lacks it (a shallow clone: fetch it first)."""
  rev_parse = subprocess.run(['git', 'rev-parse', '--short', '--verify', f'{revision}^{{commit}}'],
                             cwd=ROOT, capture_output=True, text=True, check=False)
  if rev_parse.returncode:
    raise RuntimeError(f'--before={revision}: not a commit of this clone: {rev_parse.stderr}')
  commit = rev_parse.stdout.strip()
  os.makedirs(directory)
  archive = subprocess.run(['git', 'archive', commit], cwd=ROOT, check=True, capture_output=True)
  subprocess.run(['tar', '-x', '-C', directory], input=archive.stdout, check=True)
  return commit


def run_cell(scheme: str, tree: str, tmp: str, data_dir: str, index: int) -> dict[str, float]:
  """One cell of the main job run from ``tree``: its phases and its process's wall time."""
  workdir = os.path.join(tmp, f'run-{index}')
  args = [sys.executable, 'ablate.py', f'--config={CONFIG}', f'--workdir={workdir}',
          f'--only=*/{scheme}', f'--config.data.data_dir={data_dir}',
          f'--config.train.compilation_cache_dir={os.path.join(tmp, f"cache-{index}")}',
          *(f'--config.{o}' for o in FLAGS.overrides)]
  start = time.perf_counter()
  proc = subprocess.run(args, cwd=tree, capture_output=True, text=True, check=False)
  wall = time.perf_counter() - start
  if proc.returncode:
    raise RuntimeError(f'{" ".join(args)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}')
  [cell] = [d for d in os.listdir(workdir) if os.path.isdir(os.path.join(workdir, d))
            and not d.startswith('.')]
  with open(os.path.join(workdir, cell, scheme, 'summary.json')) as f:
    return {**phases(json.load(f)), 'process': wall}


def measure(trees: dict[str, str], tmp: str, data_dir: str
            ) -> dict[tuple[str, str], list[dict[str, float]]]:
  """(scheme, setting) -> the phases of each of its runs, rounds in ABBA order."""
  results = {(s, k): [] for s in FLAGS.schemes for k in SETTINGS}
  index = 0
  for r in range(FLAGS.rounds):
    for scheme in FLAGS.schemes:
      for setting in (('before', 'after') if r % 2 == 0 else ('after', 'before')):
        results[scheme, setting].append(run_cell(scheme, trees[setting], tmp, data_dir, index))
        index += 1
        print(f'{scheme} {setting}: ' + ', '.join(
            f'{k} {v:.1f} s' for k, v in results[scheme, setting][-1].items()), flush=True)
  return results


def overhead(p: dict[str, float]) -> float:
  """Seconds outside the training steps."""
  return p['process'] - p['other steps']


def _paired(name: str, ratios: list[float]) -> dict:
  value = float(np.median(ratios))
  return common.figure(f'{name}, after / before (paired, median)', value, goal='< 1',
                       met=value < 1, detail=f'{len(ratios)} pairs, range '
                                             f'{min(ratios):.2f}-{max(ratios):.2f}x')


def rows_and_figures(results) -> tuple[list[list[str]], list[dict]]:
  rows, over, steps, whole = [], [], [], []
  for scheme in FLAGS.schemes:
    for setting in SETTINGS:
      runs = results[scheme, setting]
      median = {k: float(np.median([p[k] for p in runs])) for k in (*PHASES, 'process')}
      rows.append([scheme, setting, *(f'{median[k]:.1f}' for k in (*PHASES, 'process')),
                   f'{float(np.median([overhead(p) for p in runs])):.1f}'])
    pairs = list(zip(results[scheme, 'after'], results[scheme, 'before']))
    over += [overhead(a) / overhead(b) for a, b in pairs]
    steps += [a['other steps'] / b['other steps'] for a, b in pairs]
    whole += [a['process'] / b['process'] for a, b in pairs]
  return rows, [_paired('time outside training steps', over),
                _paired('training steps after the first', steps),
                _paired('whole run', whole)]


def prepare_data(data_dir: str) -> None:
  """Generates the probe data once, outside the timed runs (a 1-step run of one scheme)."""
  args = [sys.executable, 'ablate.py', f'--config={CONFIG}',
          f'--workdir={os.path.join(data_dir, "warmup")}', f'--only=*/{FLAGS.schemes[0]}',
          f'--config.data.data_dir={data_dir}', *(f'--config.{o}' for o in FLAGS.overrides),
          '--config.train.num_steps=1', '--config.optim.warmup_steps=0',
          '--config.train.eval_every=1', '--config.train.checkpoint_every=1',
          '--config.ablation.num_seeds=1']
  proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
  if proc.returncode:
    raise RuntimeError(f'{" ".join(args)} failed:\n{proc.stderr[-3000:]}')


def main(_):
  with tempfile.TemporaryDirectory() as tmp:
    before = export_tree(FLAGS.before, os.path.join(tmp, 'before'))
    data_dir = os.path.join(tmp, 'data')
    prepare_data(data_dir)
    results = measure({'before': os.path.join(tmp, 'before'), 'after': ROOT}, tmp, data_dir)
  rows, figures = rows_and_figures(results)
  header = ['scheme', 'tree', *(f'{k} s' for k in PHASES), 'process s', 'outside steps s']
  print(f'machine: {common.machine()}')
  for row in [header, *rows]:
    print(' '.join(f'{c:>13}' for c in row))
  for f in figures:
    print(f'{f["name"]}: {f["value"]:.3f}x ({f["detail"]})')
  common.write_json(FLAGS.json, {
      'title': f"The main job's cells: before ({before}) / after (this tree)",
      'setup': f'{CONFIG}, one cell at a time ({", ".join(FLAGS.schemes)}), each with a fresh '
               'compilation cache and a shared, prepared data directory; before: commit '
               f'{before} (--before={FLAGS.before}); after: this working tree; '
               f'{FLAGS.rounds} ABBA rounds, medians',
      'figures': figures, 'header': header, 'rows': rows})


if __name__ == '__main__':
  app.run(main)
