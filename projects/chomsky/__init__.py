"""The Chomsky-hierarchy suite (Delétang et al. 2023; Ruoss et al. 2023's randomized positions):
15 generated tasks (``tasks.py``), their dataset (``dataset.py``), the query-token task kind
registered here, its per-length evaluation (``suite.py``), the report section beside the
published tables (``report.py``), configs (``configs/``) and its page (README.md).

Importing this package registers the datasets ``chomsky/<task>``, the task kind ``queries`` and
the report section; its config files import it and set ``train.projects=chomsky``.
"""

from __future__ import annotations

from typing import Any

import data
from experiments import ablation
from projects.chomsky import dataset
from projects.chomsky import report
from projects.chomsky import suite
from projects.chomsky import tasks
from training import tasks as task_kinds

KIND = 'chomsky'  # the data.DATASETS kind of the tasks


def _forward(model, batch: tasks.Queries, rngs=None):
  """Each output read by the classification head at its query token; the accuracy counts the
  outputs up to a termination token (``scored``)."""
  logits_BxMxC = model(batch.inputs, batch.positions, batch.mask, rngs=rngs, segments_BxL=None,
                       target_positions_BxM=batch.target_positions)
  return (logits_BxMxC.reshape(-1, logits_BxMxC.shape[-1]), batch.targets.reshape(-1),
          batch.target_weights.reshape(-1), batch.scored.reshape(-1))


def _tokens(exp, lengths: list[int]) -> list[int]:
  """Inputs and their query tokens, at every length the run is scored at."""
  return [exp.dataset.tokens(n) for n in (*lengths, *exp.config.data.chomsky_tests)]


def _closing(summary: dict[str, Any]) -> str:
  result = summary['chomsky']
  return (f'; best score over the members (mean accuracy over the test lengths '
          f'{result["lengths"]}) ' + ('n/a' if result['best'] is None
                                      else f'{result["best"]:.4f}'))


for _task in tasks.TASKS:
  data.register(f'chomsky/{_task}', data.Entry(KIND, _task))
task_kinds.register(task_kinds.TaskKind(
    'queries', tasks.Queries, _forward, task_kinds.classifier_metrics,
    dataset.ChomskyDataset.load, dataset_kind=KIND,
    # The papers take the best test score over seeds and rates: every member is scored.
    final=lambda exp, params, workdir: {'chomsky': suite.evaluate(exp, params, workdir)},
    final_splits=lambda exp: [('test', exp.info.train_length)],  # the suite scores the rest
    tokens=_tokens, closing=_closing,
    unpredictable=(
        '{workdir} was trained on the generated task {config.data.name}, whose inputs are token '
        'ids, not texts: predict.py classifies texts. Its per-length accuracy is in the workdir '
        '(chomsky_lengths.json); eval.py --eval_lengths=N evaluates it at test length N (with '
        '--override=data.chomsky_test_lengths=N if N was not one).')))
ablation.register_section(report.ablation_section)
