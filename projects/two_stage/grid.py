"""The paper's regime as one grid: pre-train every scheme (MLM, or CLM), fine-tune each
pre-trained encoder on the grid's classification datasets, and train the same models from
scratch as the control (projects/two_stage/configs/manpages.py).

A two-stage config is an ablation config (the ``ablation`` group: schemes, fine-tuning datasets,
lengths, rates, seeds) with a ``pretrain`` group, a whole run config for the pre-training, and a
``two_stage`` group. Its runs, under the workdir:

* ``pretrain/<corpus>/<scheme>``: one pre-training per scheme (and attention kind), with the
  grid's seeds and the fine-tuning's ``train.seed``;
* ``finetune/<dataset>/<scheme>[-L<n>]``: ``train.init_from`` its scheme's pre-training, whose
  model (training/carry.py) and vocabulary it takes. Seed i starts from pre-training member i
  (``init_from.member_map``): seeds are independent end to end;
* ``scratch/<dataset>/<scheme>[-L<n>]``: the same config from random weights, with the
  pre-training's vocabulary.

A fine-tuning or from-scratch run records (``pretrained.json``) a digest of its pre-training's
config and data and a digest of its summary: when either differs now (the pre-training's config
changed, or it was trained again, or is gone) the run is stale, as a run whose own config
changed is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np

import models
from models import positions
import settings
import storage
from experiments import ablation
from experiments import report as report_lib
from experiments import stats
from training import carry
from training import init_from
from training import validation
from training.config import RESULT_FIELDS, RunConfig
from training.metrics import console
from training.trainer import SUMMARY_FILE

R = settings.Role.RESULTS
PRETRAIN, FINETUNE, SCRATCH = 'pretrain', 'finetune', 'scratch'
SOURCE_FILE = 'pretrained.json'
# A dependent run's own config is compared without the paths into the workdir (its source's
# folder): pretrained.json stands for the source, so a moved workdir is not stale.
_DEPENDENT_FIELDS = tuple(f for f in RESULT_FIELDS
                          if f not in ('train.init_from', 'data.tokenizer_path'))


@dataclasses.dataclass(frozen=True, kw_only=True)
class TwoStageConfig:
  """The ``two_stage`` group (its presence makes an ablation config two-stage)."""

  # Claim (d), RoFormer at 1024 tokens against BERT at 512: with several ablation.max_lengths,
  # each pre-trained scheme at each longer length is compared with this scheme at the shortest.
  length_baseline: str = settings.setting(positions.Learned.name, R)

  def __post_init__(self):
    if self.length_baseline not in models.SCHEMES:
      raise ValueError(f'two_stage.length_baseline={self.length_baseline!r} is not a scheme; '
                       f'valid: {", ".join(models.SCHEMES)}.')


def group() -> ml_collections.ConfigDict:
  """The ``two_stage`` group's defaults, for a config file to change."""
  return settings.group_dict(TwoStageConfig)


def is_two_stage(config: ml_collections.ConfigDict) -> bool:
  """Whether an ablation config is two-stage (it has a ``two_stage`` or ``pretrain`` group)."""
  return 'two_stage' in config or 'pretrain' in config


def options(config: ml_collections.ConfigDict) -> TwoStageConfig:
  """The checked ``two_stage`` group (its defaults where the config has none)."""
  return settings.build_group(TwoStageConfig, config.get('two_stage') or {}, 'two_stage')


@dataclasses.dataclass(frozen=True)
class StageCell:
  """One run of a two-stage grid: a pre-training, a fine-tuning or a from-scratch run."""

  stage: str
  cell: ablation.Cell

  @property
  def name(self) -> str:
    return f'{self.stage}/{self.cell.name}'

  @property
  def dataset(self) -> str:
    return self.cell.dataset

  @property
  def position(self) -> str:
    return self.cell.position

  @property
  def attention(self) -> str:
    return self.cell.attention

  @property
  def max_length(self) -> int | None:
    return self.cell.max_length


def _pretrain_base(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The pre-training's groups as an ablation config: the grid's schemes and seeds, the
  fine-tuning's train.seed (seed i of both stages is one chain) and, unless set, data.data_dir,
  the pre-training's own rates; a ``files`` corpus without files of its own reads the
  fine-tuning's (its texts only)."""
  if 'pretrain' not in config:
    raise ValueError('A two-stage config needs a `pretrain` group: the run config of the '
                     'pre-training (see projects/two_stage/configs/manpages.py).')
  p = config.pretrain
  base = {g: p[g].to_dict() for g in settings.groups(RunConfig)}
  base['train']['seed'] = config.train.seed
  if base['data']['data_dir'] is None:  # where the datasets are: one place for both stages
    base['data']['data_dir'] = config.data.data_dir
  if base['data']['name'] == 'files' and not base['data']['train_files']:
    base['data'].update({f: config.data[f] for f in (
        'train_files', 'validation_files', 'test_files', 'text_column', 'quoting', 'columns')})
  rates = p.optim.learning_rates or str(p.optim.learning_rate)
  base['ablation'] = {**config.ablation.to_dict(), 'learning_rates': rates, 'max_lengths': '',
                      'datasets': p.data.name}
  return ml_collections.ConfigDict(base)


def source(cell: StageCell, corpus: str) -> StageCell:
  """The pre-training run a fine-tuning or from-scratch run depends on."""
  return StageCell(PRETRAIN, ablation.Cell(corpus, cell.position, cell.attention, None,
                                           changes=cell.cell.changes))


def configure(config: ml_collections.ConfigDict, workdir: str, cell: StageCell) -> RunConfig:
  """The run config of one cell: a pre-training as an ablation cell of the ``pretrain`` group;
  a fine-tuning as an ablation cell with its source's model and vocabulary (training/carry.py)
  and ``train.init_from`` its source; from scratch, the same without init_from."""
  pretrain = _pretrain_base(config)
  if cell.stage == PRETRAIN:
    return ablation.cell_config(pretrain, cell.cell)
  pre = source(cell, pretrain.data.name)
  start = os.path.join(storage.canonical(workdir), pre.name) if cell.stage == FINETUNE else ''
  extra = {**carry.carried(ablation.cell_config(pretrain, pre.cell)), 'train.init_from': start}
  return ablation.cell_config(config, cell.cell, extra)


def check_grid(config: ml_collections.ConfigDict, workdir: str) -> list[StageCell]:
  """Every run of the two stages, pre-training first, each run config built (so checked)."""
  workdir = validation.check_workdir(workdir)
  options(config)
  grid = ablation.grid(config)
  if positions.NoPositions.name not in grid.positions:
    raise ValueError('ablation.positions of a two-stage grid must include none: the control '
                     'that every scheme is measured against, pre-trained and from scratch. Add it '
                     f'(--config.ablation.positions={",".join(grid.positions)},none).')
  pretrain = _pretrain_base(config)
  if pretrain.train.task not in ('mlm', 'clm'):
    raise ValueError(f'pretrain.train.task={pretrain.train.task!r}: the pre-training is language '
                     'modelling, mlm (BERT\'s) or clm; fix --config.pretrain.train.task.')
  corpus = pretrain.data.name
  if pretrain.data.tokenizer == 'sentencepiece' and set(grid.datasets) != {corpus}:
    raise ValueError('A SentencePiece vocabulary is tied to its dataset: with '
                     'pretrain.data.tokenizer=sentencepiece the fine-tuning datasets must be the '
                     f'corpus, data.name={corpus!r}; use wordpiece or bpe for another corpus.')
  tuned = ablation.check_grid(config)
  cells = list(dict.fromkeys(source(StageCell(FINETUNE, c), corpus) for c in tuned))
  cells += [StageCell(stage, c) for stage in (FINETUNE, SCRATCH) for c in tuned]
  for cell in cells:
    configure(config, workdir, cell)
  return cells


def select(cells: list[StageCell], only: str) -> list[StageCell]:
  """``ablation.select``, with the pre-training runs the chosen ones start from."""
  chosen = set(ablation.select(cells, only))
  corpus = next(c.dataset for c in cells if c.stage == PRETRAIN)
  chosen |= {source(c, corpus) for c in chosen if c.stage != PRETRAIN}
  return [c for c in cells if c in chosen]


def digest(run_config: RunConfig) -> str:
  """SHA-256 of what makes a run's results: its result fields and its data's fingerprint."""
  values = validation.flatten(settings.to_dict(run_config))
  text = json.dumps([{f: values[f] for f in RESULT_FIELDS},
                     validation.data_fingerprint(run_config.data)], sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()


def _record(config: ml_collections.ConfigDict, workdir: str, cell: StageCell,
            digests: dict[str, str] | None = None) -> dict[str, Any]:
  """What a dependent run starts from now: its source's name, config digest (memoized in
  ``digests``: a corpus's files are hashed once) and summary's."""
  pre, digests = source(cell, config.pretrain.data.name), {} if digests is None else digests
  if pre.name not in digests:
    digests[pre.name] = digest(configure(config, workdir, pre))
  summary = os.path.join(workdir, pre.name, SUMMARY_FILE)
  return {'source': pre.name, 'config': digests[pre.name],
          'summary': storage.sha256(summary) if storage.exists(summary) else None}


def _source_changes(config: ml_collections.ConfigDict, workdir: str, cell: StageCell,
                    digests: dict[str, str]) -> list[str]:
  """Why a dependent run no longer follows from its pre-training run ([] if it does);
  ``digests``: the pre-training runs' config digests now, filled as they are computed."""
  run_dir = os.path.join(workdir, cell.name)
  path = os.path.join(run_dir, SOURCE_FILE)
  if not storage.exists(path):
    run = report_lib.load_run(run_dir)
    return ['no record of the pre-training it started from'] if run and run.summary else []
  saved, now = storage.read_json(path), _record(config, workdir, cell, digests)
  if saved['config'] != now['config']:
    return [f'its pre-training {now["source"]} has another config or data now']
  if saved['summary'] != now['summary']:
    return [f'its pre-training {now["source"]} ' + (
        'was trained again since' if now['summary'] else 'is gone')]
  return []


def stale_cells(config: ml_collections.ConfigDict, workdir: str,
                cells: Sequence[StageCell]) -> dict[StageCell, list[str]]:
  """Runs made with another config or data than the grid gives now, pre-training runs' changes
  carried to the runs that depend on them, with what differs."""
  stale, digests = {}, {}
  for cell in cells:
    run_dir, run_config = os.path.join(workdir, cell.name), configure(config, workdir, cell)
    if cell.stage == PRETRAIN:
      changes = ablation.cell_changes(run_dir, run_config)
    else:
      changes = (ablation.cell_changes(run_dir, run_config, _DEPENDENT_FIELDS)
                 + _source_changes(config, workdir, cell, digests))
    if changes:
      stale[cell] = changes
  return stale


def _prepare(config: ml_collections.ConfigDict, workdir: str, cell: StageCell,
             run_dir: str) -> None:
  """Before a dependent run trains: its record, and from scratch, the pre-training's vocabulary
  (its pre-training has finished: the cells train in order)."""
  if cell.stage == PRETRAIN or jax.process_index() != 0:
    return
  storage.makedirs(run_dir)
  storage.write_json(os.path.join(run_dir, SOURCE_FILE), _record(config, workdir, cell))
  if cell.stage == SCRATCH:
    init_from.copy_tokenizer(configure(config, workdir, StageCell(FINETUNE, cell.cell)), run_dir)


def run_grid(config: ml_collections.ConfigDict, workdir: str, cells: list[StageCell], *,
             command: str = '', fresh: bool = False) -> str:
  """Trains (or skips, if finished) every run, pre-training first; writes and returns the
  report."""
  workdir = validation.check_workdir(workdir)
  ablation.set_aside(workdir, stale_cells(config, workdir, cells), fresh)
  storage.makedirs(workdir)
  console(f'Two-stage ablation: {len(cells)} runs, {ablation.grid(config).num_seeds} seed(s) '
          f'each, in {workdir}.')
  ablation.train_cells(workdir, cells, lambda cell: configure(config, workdir, cell),
                       lambda cell, run_dir: _prepare(config, workdir, cell, run_dir))
  return build_report(config, workdir, cells, command=command)


def _label(cell: StageCell) -> str:
  """The report's section title of a run's stage."""
  if cell.stage == PRETRAIN:
    return f'pre-training on {cell.dataset}'  # the section adds the task
  return f'{cell.dataset}, {"pre-trained" if cell.stage == FINETUNE else "from scratch"}'


def build_report(config: ml_collections.ConfigDict, workdir: str, cells: list[StageCell], *,
                 command: str) -> str:
  """Rebuilds report.md, results.csv/json and plots from the finished runs (no training): the
  two stages side by side, then ``report.write_report``'s section for each stage and dataset."""
  workdir = validation.check_workdir(workdir)
  ablation.set_aside(workdir, stale_cells(config, workdir, cells), fresh=False)
  runs = {}
  for cell in cells:
    run = report_lib.load_run(os.path.join(workdir, cell.name), cell.name, cell.position)
    if run is not None:
      runs[cell] = dataclasses.replace(run, dataset=_label(cell))
  if jax.process_index() != 0:
    return ''
  missing = len(cells) - len(runs)
  extra = [f'**{missing} of {len(cells)} runs have not finished yet.**'] if missing else []
  extra += overview(config, runs)
  return report_lib.write_report(workdir, list(runs.values()), command=command,
                                 config_json=config.to_json_best_effort(indent=1),
                                 reference=ablation.grid(config).reference,
                                 extra='\n'.join(extra))


PAIRING_TEXT = (
    'Two stages: every scheme is pre-trained ({task}, {steps} steps on {corpus}), then '
    'fine-tuned from its pre-trained encoder; fine-tuning seed i starts from pre-training seed i, '
    'so the seeds are independent end to end. From scratch: the same model, vocabulary and '
    'fine-tuning from random weights. Pre-trained and from-scratch runs are paired by seed.')


def overview(config: ml_collections.ConfigDict, runs: dict[StageCell, report_lib.Run]
             ) -> list[str]:
  """The two stages side by side per dataset and length: test accuracy pre-trained and from
  scratch, their paired difference (Holm over the schemes), and with several lengths each
  longer one against ``two_stage.length_baseline`` at the shortest."""
  p = config.pretrain
  lines = [PAIRING_TEXT.format(task=p.train.task, steps=p.train.num_steps, corpus=p.data.name), '']
  tuned = {(c.dataset, c.position, c.attention, c.max_length): r for c, r in runs.items()
           if c.stage == FINETUNE and r.summary}
  scratch = {(c.dataset, c.position, c.attention, c.max_length): r for c, r in runs.items()
             if c.stage == SCRATCH and r.summary}
  for dataset, length in dict.fromkeys((k[0], k[3]) for k in tuned):
    keys = [k for k in tuned if (k[0], k[3]) == (dataset, length)]
    results = [_paired(tuned[k], scratch.get(k)) for k in keys]
    adjusted = stats.holm([r.p if r else float('nan') for r in results])
    rows = [[tuned[k].label, _mean_std(tuned[k]), _mean_std(scratch.get(k)),
             _difference(res, p_holm)] for k, res, p_holm in zip(keys, results, adjusted)]
    title = f'{dataset}' + (f' at {length} tokens' if length else '')
    lines += [f'## {title}: pre-trained against from scratch', '',
              'Test accuracy (%), mean ± std over seeds; the difference in points [95% CI], '
              'Holm-adjusted p over the schemes:', '',
              *report_lib.markdown_table(
                  ['scheme', 'pre-trained', 'from scratch', 'pre-trained − from scratch'], rows),
              '']
  lines += _length_comparisons(config, tuned)
  return lines


def _paired(a: report_lib.Run | None, b: report_lib.Run | None) -> stats.Paired | None:
  x, y = (r.accuracy('test') if r is not None and r.summary else None for r in (a, b))
  return stats.paired(x, y) if x is not None and y is not None and len(x) == len(y) else None


def _mean_std(run: report_lib.Run | None) -> str:
  """Test accuracy in %, mean ± std over seeds ('n/a' if not finished)."""
  return report_lib.mean_std(run.accuracy('test') if run is not None and run.summary else None)


def _difference(res: stats.Paired | None, p: float) -> str:
  if res is None:
    return 'n/a'
  return (f'{100 * res.mean:+.1f} [{100 * res.low:+.1f}, {100 * res.high:+.1f}] p={p:.2g}'
          + (' (zero variance)' if res.zero_variance else ''))


def _length_comparisons(config: ml_collections.ConfigDict,
                        tuned: dict[tuple, report_lib.Run]) -> list[str]:
  """Each pre-trained scheme at each longer length against the baseline scheme at the shortest
  (the paper's claim (d): RoFormer at 1024 beats BERT at 512), Holm over the rows."""
  baseline = options(config).length_baseline
  lines = []
  for dataset, attention in dict.fromkeys((k[0], k[2]) for k in tuned):
    mine = [k for k in tuned if (k[0], k[2]) == (dataset, attention) and k[3]]
    lengths = sorted({k[3] for k in mine})
    base = tuned.get((dataset, baseline, attention, lengths[0])) if len(lengths) > 1 else None
    if base is None:
      continue
    keys = [k for k in mine if k[3] != lengths[0]]
    results = [_paired(tuned[k], base) for k in keys]
    adjusted = stats.holm([r.p if r else float('nan') for r in results])
    rows = [[f'{tuned[k].label} at {k[3]}', _mean_std(tuned[k]), _difference(res, p)]
            for k, res, p in zip(keys, results, adjusted)]
    lines += [f'## {dataset}: longer context against {baseline} at {lengths[0]} tokens', '',
              f'Pre-trained, test accuracy (%); the paired difference with {baseline} at '
              f'{lengths[0]} ({_mean_std(base)}) in points [95% CI], Holm-adjusted p:', '',
              *report_lib.markdown_table(
                  ['scheme at length', 'accuracy', f'− {baseline} at {lengths[0]}'], rows), '']
  return lines
