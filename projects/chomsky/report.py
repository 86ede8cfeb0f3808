"""The Chomsky-suite section of the ablation report: task by task and scheme by scheme, our
score beside the published one (Ruoss et al. 2023, plain and randomized positions; Delétang et
al. 2023, the Transformer), our budget beside theirs, and where we do not reproduce them.

Our score of a run is the papers': the mean accuracy over the test lengths of each member (seed x
learning rate), the best member's (``summary.json``'s ``chomsky.best``, projects/chomsky/suite.py).
The published numbers are projects/chomsky/published/*.csv (their README gives the sources); an empty
one is a number not transcribed and is compared with nothing.
"""

from __future__ import annotations

import csv
import os
from typing import Any, Iterator, Sequence

import numpy as np

from experiments import ablation
from experiments import report as report_lib
from experiments import stats
import models
from projects.chomsky import tasks as chomsky

PUBLISHED_DIR = os.path.join(os.path.dirname(__file__), 'published')
RUOSS = 'Ruoss et al. 2023, "Randomized Positional Encodings Boost Length Generalization of ' \
    'Transformers" (ACL), Table 1; https://arxiv.org/abs/2305.16843'
DELETANG = 'Delétang et al. 2023, "Neural Networks and the Chomsky Hierarchy" (ICLR), the ' \
    'Transformer column of the main results table; https://arxiv.org/abs/2207.02098'
# Points (of accuracy in %) by which our score may differ from the published one and still
# count as reproduced: the papers give no spread, and a best-of-members score over 460 lengths
# moves by about this much between budgets that both learn a task.
TOLERANCE = 5.0
# The papers' protocol: the authors' model and optimizer (google-deepmind/
# randomized_positional_encodings, experiments/example.py, models/transformer.py,
# experiments/training.py); training, members and score as Delétang et al. state them (ICLR 2023,
# Sec. 4 and App. A.4; projects/chomsky/README.md); N as Ruoss et al.'s code draws it.
PAPER_BUDGET = {
    'tasks': '15', 'model': '5 layers, width 64, 8 heads, MLP 256, dropout 0.1',
    'training': ('1,000,000 steps of batch 128, lengths 1 .. 40 (Delétang et al.; the authors\' '
                 'example.py: 10,000)'),
    'optimizer': 'Adam, constant rate, clip 1.0',
    'members (seeds x rates)': '10 x 3 (1e-4, 3e-4, 5e-4), the best reported (Delétang et al.)',
    'test': 'lengths 41 .. 500, 512 examples each', 'randomized N': '2048'}
WHY_WE_DIFFER = (
    'Where and why we differ from the papers, besides the budget: our encoder is this project\'s '
    '(post-LN, GELU, a classification head read at each query token), theirs a post-LN ReLU '
    'Transformer with one linear layer per output; our examples are other draws of the same '
    'distributions; our randomized draw is one per example shared by all layers, where the '
    'authors draw per batch and, for rotary, relative and ALiBi, per layer; evaluation has '
    'dropout off and fixed draws (docs/randomized_positions.md). `shaw` and `t5` have no '
    'published counterpart; the papers\' `relative` (Transformer-XL) has none here. The fewer '
    'the members (seeds x rates), the lower a best-of-members score in expectation.')


def load_published(directory: str = PUBLISHED_DIR) -> dict[str, dict]:
  """``ruoss``: (task, scheme, randomized) -> accuracy in % or None (not transcribed), for the
  encodings with a counterpart here; ``deletang``: task -> accuracy in % or None."""

  def rows(name: str) -> list[dict[str, str]]:
    with open(os.path.join(directory, name), newline='') as f:
      return list(csv.DictReader(f))

  number = lambda text: float(text) if text.strip() else None
  ruoss = {(r['task'], r['scheme'], bool(int(r['randomized']))): number(r['accuracy'])
           for r in rows('ruoss2023.csv') if r['scheme']}
  deletang = {r['task']: number(r['accuracy']) for r in rows('deletang2023.csv')}
  reprinted = {r['task'] for r in rows('deletang2023.csv') if r['source'] == 'reprint'}
  return {'ruoss': ruoss, 'deletang': deletang, 'deletang_reprinted': reprinted}


def task_of(dataset: str) -> str | None:
  """The task of a ``chomsky/<task>`` dataset name, None for any other dataset."""
  kind, _, task = dataset.partition('/')
  return task if kind == 'chomsky' and task in chomsky.TASKS else None


def _suites(runs: Sequence[Any]) -> Iterator[tuple[tuple[str, str, bool], dict[str, Any]]]:
  """((task, scheme, randomized), the summary's ``chomsky`` part) of each finished Chomsky run
  with softmax attention."""
  for run in runs:
    task = task_of(run.dataset)
    suite = (run.summary or {}).get('chomsky')
    if task is not None and suite and run.attention == 'softmax':
      yield (task, run.position, bool(run.random_positions)), suite


def our_scores(runs: Sequence[Any]) -> dict[tuple[str, str, bool], dict[str, float]]:
  """(task, scheme, randomized) -> ``best`` (the papers' score) and ``mean`` over the members,
  in %, pooling the members of every finished run of that cell (softmax attention only)."""
  pooled = {}
  for key, suite in _suites(runs):
    pooled.setdefault(key, []).extend(s for s in suite['score'] if s is not None)
  return {key: {'best': 100 * max(s), 'mean': 100 * float(np.mean(s)), 'members': len(s)}
          for key, s in pooled.items() if s}


def verdict(ours: dict[bool, float | None], published: dict[bool, float | None] | None,
            tolerance: float = TOLERANCE) -> str:
  """Whether our plain and randomized scores (``ours[randomized]``, %) reproduce the published
  ones (None: the papers have no such scheme): each within ``tolerance`` points, and
  randomized - plain of the same sign."""
  if published is None:
    return 'no published counterpart'
  compared = [r for r in (False, True) if ours.get(r) is not None
              and published.get(r) is not None]
  if not compared:
    return ('not run here' if all(ours.get(r) is None for r in (False, True))
            else 'published number not transcribed')
  problems = [f'{"randomized" if r else "plain"} {ours[r] - published[r]:+.1f} points'
              for r in compared if abs(ours[r] - published[r]) > tolerance]
  if len(compared) == 2:
    gain, published_gain = ours[True] - ours[False], published[True] - published[False]
    if (np.sign(gain) != np.sign(published_gain)
        and max(abs(gain), abs(published_gain)) > tolerance):
      problems.append(f'randomized - plain {gain:+.1f} here, {published_gain:+.1f} published')
  if problems:
    return '**not reproduced**: ' + '; '.join(problems)
  return f'reproduced (within {tolerance:g} points)'


def comparison_rows(runs: Sequence[Any], published: dict[str, dict] | None = None
                    ) -> list[dict[str, Any]]:
  """One row per (task, scheme) of the finished Chomsky runs, tasks in the papers' order: our
  best and mean score plain and randomized, the published ones, and the verdict."""
  published = published or load_published()
  ours = our_scores(runs)
  schemes = list(dict.fromkeys(r.position for r in runs if task_of(r.dataset)))
  tasks = {task_of(r.dataset) for r in runs} - {None}
  rows = []
  for task in (t for t in chomsky.TASKS if t in tasks):
    for scheme in schemes:
      theirs = ({r: published['ruoss'].get((task, scheme, r)) for r in (False, True)}
                if (task, scheme, False) in published['ruoss'] else None)
      row = {'level': chomsky.TASKS[task].level, 'task': task, 'scheme': scheme,
             'verdict': verdict({r: ours.get((task, scheme, r), {}).get('best')
                                 for r in (False, True)}, theirs)}
      row['randomizable'] = models.reads_positions(scheme)
      for randomized, kind in ((False, 'plain'), (True, 'randomized')):
        score = ours.get((task, scheme, randomized), {})
        row.update({f'ours_{kind}': score.get('best'), f'ours_{kind}_mean': score.get('mean'),
                    f'ours_{kind}_members': score.get('members'),
                    f'published_{kind}': theirs and theirs[randomized]})
      rows.append(row)
  return rows


def member_scores(runs: Sequence[Any]) -> dict[tuple[str, str, bool], dict[str, float]]:
  """(task, scheme, randomized) -> {member (its seed and rate, as text): score in %}."""
  scores = {}
  for key, suite in _suites(runs):
    cell = scores.setdefault(key, {})
    for member, score in zip(suite['members'], suite['score']):
      if score is not None:
        cell[str(sorted(member.items()))] = 100 * score
  return scores


def randomized_gains(runs: Sequence[Any]) -> list[dict[str, Any]]:
  """Per scheme that reads positions: randomized − plain of each member's score (the mean over
  the test lengths), paired by task and member (seed i of both shares its data and initial
  parameters), pooled over the tasks run both ways; sign-flip p, Holm-adjusted over the
  schemes."""
  scores = member_scores(runs)
  rows = []
  for scheme in dict.fromkeys(key[1] for key in scores):
    pairs = [(scores[task, scheme, True][m], plain[m])
             for (task, s, randomized), plain in scores.items() if s == scheme and not randomized
             for m in plain if m in scores.get((task, scheme, True), {})]
    if pairs:
      tasks = {t for (t, s, r) in scores if s == scheme and r}
      rows.append({'scheme': scheme, 'tasks': len(tasks),
                   'result': stats.paired(*(np.array(x) for x in zip(*pairs)))})
  for row, p in zip(rows, stats.holm([r['result'].p for r in rows])):
    row['holm_p'] = p
  return rows


def gains_table(rows: Sequence[dict[str, Any]]) -> list[str]:
  """The report's lines for ``randomized_gains``."""
  if not rows:
    return []
  lines = ['Randomized − plain, each member\'s score (the mean over the test lengths) paired by '
           'task and seed, pooled over the tasks run both ways, in accuracy points [95% CI], '
           'sign-flip p Holm-adjusted over the schemes:', '',
           '| scheme | tasks | pairs | randomized − plain | Holm p |', '|---|---|---|---|---|']
  for row in rows:
    r = row['result']
    p = '1 (every difference 0)' if r.zero_variance and r.mean == 0 else f'{row["holm_p"]:.2g}'
    lines.append(f'| {row["scheme"]} | {row["tasks"]} | {r.n} | {r.mean:+.1f} '
                 f'[{r.low:+.1f}, {r.high:+.1f}] | {p} |')
  return lines + ['']


def _cell(value: float | None, mean: float | None = None) -> str:
  if value is None:
    return '—'
  return f'{value:.1f}' + (f' ({mean:.1f})' if mean is not None else '')


def _randomized_cell(row: dict[str, Any]) -> str:
  if not row['randomizable']:
    return 'n/a: reads no positions'
  return _cell(row['ours_randomized'], row['ours_randomized_mean'])


def budget_table(ours: dict[str, str]) -> list[str]:
  """Our budget (``budget``) beside the authors' (``PAPER_BUDGET``)."""
  lines = ['| | this report | the papers |', '|---|---|---|']
  return lines + [f'| {k} | {ours.get(k, "")} | {v} |' for k, v in PAPER_BUDGET.items()]


def budget(run_config: Any, cells: int, tasks: int, random_positions: Sequence[int]
           ) -> dict[str, str]:
  """The budget of one cell's RunConfig (the cells share all of it but the scheme and the
  positions), in PAPER_BUDGET's terms."""
  m, t, d, o = run_config.model, run_config.train, run_config.data, run_config.optim
  sizes = m.sizes()
  rates = ', '.join(f'{r:g}' for r in o.learning_rates or (o.learning_rate,))
  tests = d.chomsky_tests
  return {
      'tasks': f'{tasks} ({cells} runs)',
      'model': (f'{sizes["num_layers"]} layers, width {sizes["hidden_size"]}, '
                f'{sizes["num_heads"]} heads, MLP {sizes["mlp_dim"]}, dropout {m.dropout_rate:g}'),
      'training': (f'{t.num_steps:,} steps of batch {t.batch_size}, lengths 1 .. '
                   f'{d.chomsky_train_length}'),
      'optimizer': (f'AdamW, {rates} {o.schedule}, weight decay {o.weight_decay:g}, '
                    f'clip {o.grad_clip_norm:g}'),
      'members (seeds x rates)': f'{t.num_seeds} x {len(o.learning_rates) or 1}',
      'test': (f'lengths {tests[0]} .. {tests[-1]} ({len(tests)}), '
               f'{d.chomsky_samples_per_length} examples each'),
      'randomized N': ', '.join(str(n) for n in random_positions if n) or 'none'}


def section(runs: Sequence[Any], ours_budget: dict[str, str],
            published: dict[str, dict] | None = None) -> list[str]:
  """The report's lines: budgets, the side-by-side table, the verdicts' tally and Delétang's."""
  published = published or load_published()
  rows = comparison_rows(runs, published)
  if not rows:
    return []
  table = ['| level | task | scheme | ours plain | published plain | ours randomized | '
           'published randomized | verdict |', '|' + '---|' * 8]
  table += [f'| {r["level"]} | {r["task"]} | {r["scheme"]} | '
            f'{_cell(r["ours_plain"], r["ours_plain_mean"])} | {_cell(r["published_plain"])} | '
            f'{_randomized_cell(r)} | '
            f'{_cell(r["published_randomized"])} | {r["verdict"]} |' for r in rows]
  tally = {}
  for r in rows:
    kind = r['verdict'].split(' (')[0].split(':')[0].strip('*')
    tally[kind] = tally.get(kind, 0) + 1
  deletang = ['| task | Delétang et al. 2023, Transformer | ours: best plain score over schemes |',
              '|---|---|---|']
  for task in dict.fromkeys(r['task'] for r in rows):
    best = max((r['ours_plain'] for r in rows if r['task'] == task and r['ours_plain'] is not None),
               default=None)
    mark = ' (reprint)' * (task in published.get('deletang_reprinted', ()))
    deletang.append(f'| {task} | {_cell(published["deletang"].get(task))}{mark} | '
                    f'{_cell(best)} |')
  return [
      '## Chomsky tasks beside the published tables', '',
      'Score: the accuracy averaged over the test lengths, of the best member (seed x rate), in '
      '%, as the papers report it; in parentheses the mean over the members. Published: '
      f'{RUOSS}; {DELETANG}. "—": not run here, or not transcribed '
      '(projects/chomsky/published/README.md). A row is **not reproduced** when a score differs '
      f'from the published one by more than {TOLERANCE:g} points, or when randomized − plain '
      'changes sign (and one of the two gains exceeds that).', '',
      'Budget:', '', *budget_table(ours_budget), '',
      'Verdicts: ' + ', '.join(f'{k}: {v}' for k, v in sorted(tally.items())) + '.', '',
      *table, '', *gains_table(randomized_gains(runs)), *deletang, '', WHY_WE_DIFFER, '']


def ablation_section(config: Any, cells: Sequence[Any], runs: Sequence[Any], out_dir: str
                     ) -> list[str]:
  """The section ``ablation.SECTIONS`` adds where the grid has Chomsky tasks, with
  chomsky_comparison.csv; our budget is the first Chomsky cell's."""
  suite = [c for c in cells if task_of(c.dataset)]
  if not suite:
    return []
  ours = budget(ablation.cell_config(config, suite[0]), len(suite),
                len({c.dataset for c in suite}),
                ablation.grid(config).random_positions or [config.data.random_positions])
  lines = section(runs, ours)
  report_lib.write_csv(os.path.join(out_dir, 'chomsky_comparison.csv'), comparison_rows(runs))
  return lines
