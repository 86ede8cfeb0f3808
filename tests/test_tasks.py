"""The task-kind registry (training/tasks.py): the run picks its kind from the config, and a new
kind is one registration, made here from the test file alone."""

import dataclasses

import numpy as np
import pytest

import data
from data import datasets
from training import tasks
from training import trainer
from training.config import run_config as typed


@pytest.mark.parametrize('overrides, kind', [
    ({}, 'classify'),
    ({'data.name': 'files', 'data.text_b_column': 'b'}, 'pairs'),
    ({'train.task': 'mlm', 'data.name': 'fortunes'}, 'mlm'),
    ({'train.task': 'clm', 'data.name': 'fortunes'}, 'clm'),
    ({'train.projects': 'chomsky', 'data.name': 'chomsky/parity_check'}, 'queries'),
])
def test_the_config_picks_the_kind(run_config, overrides, kind):
  assert tasks.of(typed(run_config(**overrides))).name == kind


def test_every_kind_declares_its_parts():
  for kind in tasks.KINDS.values():
    assert isinstance(kind.batch, type) and callable(kind.forward) and callable(kind.load)
    assert callable(kind.metrics) and callable(kind.final) and callable(kind.describe)


def _load_order_probe(data_config, workdir, pair_layout):
  """The toy kind's data: the order probe under another name."""
  probe = dataclasses.replace(data_config, name='position_probes/order')
  return datasets.load_classifier(probe, workdir, pair_layout)


def _toy_final(exp, params, workdir):
  del params, workdir
  return {'toy': {'members': len(exp.seeds)}}


def test_a_new_task_kind_is_one_registration(tmp_path, run_config):
  data.register('toy/order', data.Entry('toy', 'order'))
  classify = tasks.KINDS['classify']
  tasks.register(tasks.TaskKind(
      'toy', classify.batch, classify.forward, classify.metrics, _load_order_probe,
      dataset_kind='toy', final=_toy_final, closing=lambda summary: '; toy kind'))
  try:
    config = run_config(**{'data.name': 'toy/order', 'train.num_steps': 2, 'train.eval_every': 2,
                           'train.checkpoint_every': 2, 'train.num_seeds': 2})
    summary = trainer.train_and_evaluate(config, str(tmp_path / 'work'))
  finally:
    del tasks.KINDS['toy'], data.DATASETS['toy/order']
  assert summary['toy'] == {'members': 2} and summary['dataset'] == 'toy/order'
  assert np.asarray(summary['eval']['test']['accuracy']).shape == (2,)
