"""A grid of runs (datasets x position schemes x attention kinds x lengths) that differ only in
the field under study: each cell is one ``train_and_evaluate`` workdir, skipped once finished (a
sweep resumes); ``select`` picks a slice, so machines sharing the workdir can split a sweep."""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import itertools
import multiprocessing
import os
import tempfile
import time
from concurrent import futures
from typing import Any, Callable, Mapping, Sequence

import jax
import ml_collections

import data
import models
import settings
from settings import lists
import storage
from experiments import report as report_lib
from training import tasks
from training import trainer
from training import validation
from training.config import RESULT_FIELDS, RunConfig, run_config
from training.experiment import Experiment
from training.metrics import console, set_console_prefix

R, T = settings.Role.RESULTS, settings.Role.RUNTIME
# Report sections that projects add (register_section): (config, cells, runs, workdir) -> the
# section's lines ([] where the grid has none of the project's runs), after the datasets'.
SECTIONS: list[Callable[..., list[str]]] = []


def register_section(section: Callable[..., list[str]]) -> None:
  if section not in SECTIONS:
    SECTIONS.append(section)


@dataclasses.dataclass(frozen=True)
class Grid:
  """How ablate.py runs one kind of grid config: ``cells(config, workdir, only)`` checks it and
  picks the cells; ``run(config, workdir, cells, command=, fresh=)`` trains and reports;
  ``report(config, workdir, cells, command=)`` only reports (None: --report_only runs the grid)."""

  cells: Callable[[ml_collections.ConfigDict, str, str], Any]
  run: Callable[..., str]
  report: Callable[..., str] | None


# Grid kinds that projects add (register_grid), by the config group that marks their configs.
GRIDS: dict[str, Grid] = {}


def register_grid(groups: Sequence[str], kind: Grid) -> None:
  GRIDS.update(dict.fromkeys(groups, kind))


def grid_kind(config: ml_collections.ConfigDict) -> Grid:
  """The grid kind of an ablation config: a project's, by its group, or this module's."""
  return next((kind for group, kind in GRIDS.items() if group in config),
              Grid(lambda c, workdir, only: select(check_grid(c), only), run_grid, build_report))


@dataclasses.dataclass(frozen=True, kw_only=True)
class AblationConfig:
  """The ``ablation`` group: the grid, datasets outermost, and how it is reported."""

  # The field under study: model.position values (default: every scheme).
  positions: tuple[str, ...] = settings.setting(tuple(models.SCHEMES), R, items=str,
                                                example='rotary,alibi')
  # Rows that are a scheme with other fields changed, each `name:position:field=value[:...]`
  # (e.g. p-RoPE, `p_rope:rotary:rope.p=0.75`); `name` is the row, after the positions.
  variants: tuple[str, ...] = settings.setting((), R, items=str,
                                               example='p_rope:rotary:rope.p=0.75')
  # data.name values, one table each.
  datasets: tuple[str, ...] = settings.setting(('position_probes/order',), R, items=str,
                                               example='position_probes/order,listops')
  # model.attention values (e.g. 'softmax,linear').
  attentions: tuple[str, ...] = settings.setting(('softmax',), R, items=str,
                                                 example='softmax,linear')
  # data.max_length values (empty: data.max_length).
  max_lengths: tuple[int, ...] = settings.setting((), R, items=int, example='64,128')
  # data.random_positions values: 0 plain, N randomized (Ruoss et al. 2023: a sorted sample of
  # 0 .. N - 1); schemes that read no position ids run plain only (empty: data.random_positions).
  random_positions: tuple[int, ...] = settings.setting((), R, items=int, example='0,2048')
  # Peak learning rates per scheme (one member per rate and seed); the best mean validation
  # accuracy's is reported.
  learning_rates: tuple[float, ...] = settings.setting((1e-3,), R, items=float,
                                                       example='1e-3,3e-3')
  # Seeds per run, trained together (paired across schemes).
  num_seeds: int = settings.setting(8, R)
  # Scheme the others are compared with (paired tests, Holm-corrected).
  reference: str = settings.setting(models.positions.Rotary.name, R)
  report_memory: bool = settings.setting(False, T)  # Also report each run's train-step memory.
  # Runs trained at once on a CPU machine, each in its own process (compiling is single-threaded:
  # 2 on 2 cores take 0.6x the time); 1 elsewhere: accelerators are not shared between processes.
  workers: int = settings.setting(1, T)

  def __post_init__(self):
    if self.workers < 1:
      raise ValueError(f'ablation.workers={self.workers}: give 1 (one run at a time) or more.')
    if negative := [n for n in self.random_positions if n < 0]:
      raise ValueError(f'ablation.random_positions has {negative}: each value is 0 (plain '
                       'positions) or N > 0 (randomized positions drawn from 0 .. N - 1), e.g. '
                       '--config.ablation.random_positions=0,2048.')
    for field, valid in (('datasets', tuple(data.DATASETS)), ('positions', tuple(models.SCHEMES)),
                         ('attentions', models.ATTENTION_KINDS)):
      names = getattr(self, field)
      if not names:
        raise ValueError(f'ablation.{field} is empty: list at least one of {", ".join(valid)}.')
      unknown = [n for n in names if n not in valid]
      if unknown:
        raise ValueError(f'ablation.{field} names {", ".join(map(repr, unknown))}, not among '
                         f'the valid {", ".join(valid)}; fix --config.ablation.{field}.')
    self.rows()  # a malformed variant is refused here

  def rows(self) -> list[tuple[str, tuple[tuple[str, Any], ...]]]:
    """Each row's name and its changes: the positions, then the variants."""
    rows, groups = [(p, ()) for p in self.positions], settings.groups(RunConfig)
    for text in self.variants:
      name, position, *fields = text.split(':') + [''] * (':' not in text)
      pairs = [f.partition('=') for f in fields]
      if (position not in models.SCHEMES or not name or name in [r for r, _ in rows]
          or not fields or any(not sep or k.partition('.')[0] not in groups or '.' not in k
                               for k, sep, _ in pairs)):
        raise ValueError(f'ablation.variants has {text!r}: give name:position:group.field=value'
                         '[:...], with a new row name, one of the schemes '
                         f'({", ".join(models.SCHEMES)}) and fields of the groups '
                         f'{", ".join(groups)}, e.g. p_rope:rotary:rope.p=0.75.')
      rows.append((name, (('model.position', position),) +
                   tuple((k, _literal(v)) for k, _, v in pairs)))
    return rows


def _literal(text: str) -> Any:
  """A variant's value as Python reads it (a list as a tuple; true and false as the command
  line's), else the text."""
  if text.lower() in ('true', 'false'):
    return text.lower() == 'true'
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text
  return tuple(value) if isinstance(value, list) else value


def group() -> ml_collections.ConfigDict:
  """The ``ablation`` group's defaults."""
  return settings.group_dict(AblationConfig)


def grid(config: ml_collections.ConfigDict) -> AblationConfig:
  """The checked ``ablation`` group of an ablation config."""
  if 'ablation' not in config:
    raise ValueError('The --config file has no `ablation` group, so it is not an ablation config: '
                     'use one of configs/ablation/*.py (train.py trains a single model).')
  return settings.build_group(AblationConfig, config.ablation, 'ablation')


@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of the grid."""

  dataset: str
  position: str
  attention: str
  max_length: int | None
  random_positions: int | None = None  # None: the base config's data.random_positions
  changes: tuple[tuple[str, Any], ...] = ()  # a variant's fields ('model.position' among them)

  @property
  def name(self) -> str:
    suffix = (f'-{self.attention}' * (self.attention != 'softmax')
              + f'-random{self.random_positions}' * bool(self.random_positions)
              + f'-L{self.max_length}' * bool(self.max_length))
    return f'{self.dataset.replace("/", "-")}/{self.position}{suffix}'


def check_grid(config: ml_collections.ConfigDict) -> list[Cell]:
  """The cells of ``config.ablation``, each cell's run config built (checked): a typo is an
  error, never a 'not applicable' row."""
  a = grid(config)
  cells = [Cell(d, p, at, n, r, changes) for d in a.datasets for at in a.attentions
           for n in a.max_lengths or [None] for p, changes in a.rows()
           for r in a.random_positions or [None]
           if not r or models.reads_positions(dict(changes).get('model.position', p))]
  for cell in cells:
    cell_config(config, cell)
  return cells


def select(cells: list[Cell], only: str) -> list[Cell]:
  """Cells matching ``only``: '' (all), 'i:j' (a slice) or comma-separated glob patterns."""
  if not only:
    return cells
  if ':' in only and all(p.strip().lstrip('-').isdigit() or not p.strip()
                         for p in only.split(':')):
    start, _, stop = only.partition(':')
    chosen = cells[int(start) if start else None:int(stop) if stop else None]
  else:
    patterns = lists.parse(only, '--only', example='rotary*,alibi*')
    chosen = [c for c in cells if any(fnmatch.fnmatch(c.name, p) for p in patterns)]
  if not chosen:
    raise ValueError(f'--only={only!r} matches no run; the {len(cells)} runs (0:{len(cells)}) '
                     f'are: {", ".join(c.name for c in cells)}.')
  return chosen


def cell_config(config: ml_collections.ConfigDict, cell: Cell,
                extra: Mapping[str, Any] | None = None) -> RunConfig:
  """The base config with the cell's fields, the grid's seeds and rates, and the dotted ``extra``
  changes (projects/two_stage/grid.py's pre-trained model)."""
  a = grid(config)
  changes = {'data.name': cell.dataset, 'model.position': cell.position,
             'model.attention': cell.attention, 'train.num_seeds': a.num_seeds,
             'optim.learning_rates': a.learning_rates}
  if cell.max_length:  # also the `learned` table and T5's furthest bucket: the training length
    changes.update({f: cell.max_length for f in (
        'data.max_length', 'model.max_length', 'model.t5_max_distance')})
  if cell.random_positions is not None:
    changes['data.random_positions'] = cell.random_positions
  changes.update(cell.changes)
  changes.update(extra or {})
  base = {g: {**config[g], **{k.partition('.')[2]: v for k, v in changes.items()
                              if k.startswith(g + '.')}} for g in settings.groups(RunConfig)}
  return run_config(base)


def cell_changes(run_dir: str, run_config: RunConfig,
                 fields: Sequence[str] = RESULT_FIELDS) -> list[str]:
  """What differs between a finished cell (config ``fields``, data) and ``run_config``."""
  run = report_lib.load_run(run_dir)
  if run is None:
    return []
  if run.not_applicable:
    try:
      run_config.check_model()
      return [f'was not applicable ({run.not_applicable}) and is now']
    except ValueError:
      return []
  changes = validation.config_differences(validation.load_config(run_dir), run_config, fields)
  fingerprint = os.path.join(run_dir, validation.DATA_FILE)
  if storage.exists(fingerprint):
    changes += validation.data_changes(storage.read_json(fingerprint),
                                        validation.data_fingerprint(run_config.data))
  return changes


def stale_cells(config: ml_collections.ConfigDict, workdir: str,
                cells: list[Cell]) -> dict[Cell, list[str]]:
  """Finished cells whose config or data differ from what the grid gives now: what differs."""
  stale = {c: cell_changes(os.path.join(workdir, c.name), cell_config(config, c)) for c in cells}
  return {c: changes for c, changes in stale.items() if changes}


def set_aside(workdir: str, stale: Mapping[Any, list[str]], fresh: bool) -> None:
  """Refuses ``stale`` cells, or with ``fresh`` moves them aside (never deletes) to retrain."""
  if stale and not fresh:
    details = '; '.join(f'{c.name}: {", ".join(d)}' for c, d in stale.items())
    raise ValueError(f'{len(stale)} finished run(s) in {workdir} were made with another config '
                     f'or data than the grid gives now ({details}). Their results would be '
                     'reported under the new config. Pass --fresh to move them aside '
                     '(<run>.stale-N) and train them again, or restore the config, or use a '
                     'new --workdir.')
  for cell in stale:
    run_dir = os.path.join(workdir, cell.name)
    k = next(k for k in itertools.count(1) if not storage.exists(f'{run_dir}.stale-{k}'))
    if jax.process_index() == 0:
      storage.move(run_dir, f'{run_dir}.stale-{k}')
    console(f'{cell.name}: made with another config or data; moved to {run_dir}.stale-{k}.')


def run_grid(config: ml_collections.ConfigDict, workdir: str, cells: list[Cell], *,
             command: str = '', fresh: bool = False) -> str:
  """Runs the unfinished cells, then writes and returns the report."""
  workdir = validation.check_workdir(workdir)
  set_aside(workdir, stale_cells(config, workdir, cells), fresh)
  storage.makedirs(workdir)
  a = grid(config)
  console(f'Ablation: {len(cells)} runs, {a.num_seeds} seed(s) each, in {workdir}.')
  train_cells(workdir, cells, lambda cell: cell_config(config, cell), workers=a.workers)
  return build_report(config, workdir, cells, command=command)


def train_cells(workdir: str, cells: Sequence[Any], configure: Callable[[Any], RunConfig],
                prepare: Callable[[Any, str], None] = lambda cell, run_dir: None,
                workers: int = 1) -> None:
  """Trains the unfinished ``cells`` with ``configure(cell)`` after ``prepare(cell, run_dir)``
  (``workers`` at once on a single-process CPU run); a model that cannot be built is marked."""
  todo = [c for c in cells if report_lib.load_run(os.path.join(workdir, c.name)) is None]
  console(f'{len(cells) - len(todo)} of {len(cells)} runs already finished.')
  runnable = []
  for cell in todo:
    run_config = configure(cell)
    try:
      run_config.check_model()
    except ValueError as e:  # e.g. a bias scheme with linear attention
      console(f'{cell.name}: not applicable: {e}')
      if jax.process_index() == 0:
        storage.makedirs(run_dir := os.path.join(workdir, cell.name))
        storage.write_json(os.path.join(run_dir, report_lib.NOT_APPLICABLE_FILE), {
            'dataset': cell.dataset, 'position': cell.position, 'attention': cell.attention,
            'reason': str(e)})
      continue
    runnable.append((cell, run_config))
  started, finished = time.perf_counter(), len(cells) - len(runnable)
  if workers > 1 and jax.process_count() == 1 and jax.default_backend() == 'cpu':
    _train_parallel(workdir, runnable, prepare, finished, len(cells), workers)
  else:
    _train_serially(workdir, runnable, prepare, finished, len(cells))
  console(f'Finished in {(time.perf_counter() - started) / 60:.1f} min.')


def _train_serially(workdir: str, runnable: list[tuple[Any, RunConfig]], prepare, finished: int,
                    total: int) -> None:
  durations = []
  for i, (cell, run_config) in enumerate(runnable):
    run_dir, t0 = os.path.join(workdir, cell.name), time.perf_counter()
    console(f'[{finished + i + 1}/{total}] {cell.name}')
    prepare(cell, run_dir)
    trainer.train_and_evaluate(run_config, run_dir)
    durations.append(time.perf_counter() - t0)
    left = len(runnable) - i - 1
    console(f'  done in {durations[-1]:.0f}s; {total - left}/{total} runs finished, '
            f'ETA {left * sum(durations) / len(durations) / 60:.1f} min')


def _train_parallel(workdir: str, runnable: list[tuple[Any, RunConfig]], prepare, finished: int,
                    total: int, workers: int) -> None:
  """In spawned processes (JAX is not fork-safe), the datasets prepared here first: two runs must
  not generate one together. A run's error lets the started ones finish, then is raised."""
  for rc in {(rc.data, rc.train.task): rc for _, rc in runnable}.values():
    with tempfile.TemporaryDirectory() as scratch:
      tasks.of(rc).load(rc.data, scratch, 'joint')
  context = multiprocessing.get_context('spawn')
  with futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
    pending = {}
    try:
      for cell, run_config in runnable:
        prepare(cell, run_dir := os.path.join(workdir, cell.name))
        pending[pool.submit(_train_cell, run_config, run_dir, cell.name)] = cell
      console(f'Training {len(runnable)} runs, {workers} at a time (ablation.workers).')
      for done in futures.as_completed(pending):
        done.result()  # a run's error stops the grid, as in serial order
        finished += 1
        console(f'{pending[done].name}: done; {finished}/{total} runs finished.')
    except BaseException:
      pool.shutdown(cancel_futures=True)
      raise


def _train_cell(run_config: RunConfig, run_dir: str, name: str) -> None:
  trainer.setup_runtime(run_config)
  set_console_prefix(f'[{name}]')
  trainer.train_and_evaluate(run_config, run_dir)


def build_report(config: ml_collections.ConfigDict, workdir: str, cells: list[Cell], *,
                 command: str) -> str:
  """Rebuilds the report from the finished cells (no training)."""
  workdir = validation.check_workdir(workdir)
  set_aside(workdir, stale_cells(config, workdir, cells), fresh=False)
  runs = [r for c in cells
          if (r := report_lib.load_run(os.path.join(workdir, c.name), c.name, c.position))
          is not None]
  missing = len(cells) - len(runs)
  extra = f'**{missing} of {len(cells)} runs have not finished yet.**' if missing else ''
  a = grid(config)
  if a.report_memory:
    by_name = {c.name: c for c in cells}
    for run in runs:
      if run.summary:
        run.step_memory = Experiment(cell_config(config, by_name[run.name]),
                                     run.path).step_memory()
  if jax.process_index() != 0:
    return ''
  return report_lib.write_report(workdir, runs, command=command,
                                 config_json=config.to_json_best_effort(indent=1),
                                 reference=a.reference, extra=extra,
                                 sections=[line for section in SECTIONS
                                           for line in section(config, cells, runs, workdir)])
