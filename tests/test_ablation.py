"""The ablation grid end to end on a tiny config: runs, resumes, reports."""

import json
import os

import pytest

from configs.ablation import extend as extend_config
from configs.ablation import probes
from experiments import ablation
from experiments import extend
from experiments import report
from training import trainer


@pytest.fixture
def tiny_ablation(tfds_dir):
  c = probes.get_config()
  c.ablation.positions = 'none,rotary'
  c.ablation.attentions = 'softmax'
  c.ablation.num_seeds = 2
  c.ablation.learning_rates = '1e-3,3e-3'
  c.data.data_dir = tfds_dir
  c.train.num_steps = 8
  c.train.eval_every = 4
  c.train.checkpoint_every = 8
  c.train.log_every = 4
  c.optim.warmup_steps = 1
  c.train.compilation_cache_dir = ''
  c.train.eval_max_length = 128
  return c


@pytest.fixture
def trained(monkeypatch):
  """The run directories the ablation trains, in order."""
  calls = []
  real = trainer.train_and_evaluate

  def counting(config, run_dir):
    calls.append(run_dir)
    return real(config, run_dir)

  monkeypatch.setattr(trainer, 'train_and_evaluate', counting)
  return calls


def test_grid_select_and_names():
  c = probes.get_config()
  c.ablation.attentions = 'softmax,linear'
  cells = ablation.check_grid(c)
  assert len(cells) == 14
  assert cells[0].name == 'position_probes-order/none'
  assert cells[7].name == 'position_probes-order/none-linear'
  assert [x.position for x in ablation.select(cells, '0:2')] == ['none', 'sinusoidal']
  assert len(ablation.select(cells, '*/rotary*')) == 2
  with pytest.raises(ValueError, match='matches no run'):
    ablation.select(cells, '*/nope')
  c.ablation.positions = 'rotary,rotray'
  with pytest.raises(ValueError, match="ablation.positions names 'rotray'"):
    ablation.check_grid(c)


def test_tiny_ablation_runs_resumes_and_reports(tmp_path, tiny_ablation, trained):
  workdir = str(tmp_path / 'ablation')
  cells = ablation.check_grid(tiny_ablation)
  # An "interrupted" sweep: only the first cell ran.
  ablation.run_grid(tiny_ablation, workdir, ablation.select(cells, '*/none'))
  assert len(trained) == 1
  md = ablation.run_grid(tiny_ablation, workdir, cells, command='python ablate.py ...')
  assert len(trained) == 2 and trained[1].endswith('rotary')  # the finished run was skipped
  for name in ('report.md', 'results.csv', 'results.json', 'rope_decay.png',
               'curves_position_probes_order.png', 'extrapolation_position_probes_order.png'):
    assert os.path.exists(os.path.join(workdir, name)), name
  assert '| none | ' in md and '| rotary | ' in md and 'none − rotary' in md
  assert 'test_128_far (L=128)' in md and 'p=' in md and 'sign-flip' in md
  with open(os.path.join(workdir, 'results.csv')) as f:
    lines = f.read().splitlines()
  # 2 runs x 4 members (2 rates x 2 seeds): validation each, and for the 2 chosen members the
  # test split and the 4 extrapolation splits up to 128 tokens; plus the header.
  assert len(lines) == 1 + 2 * (4 + 2 * 5)
  # Rebuilding the report needs no training.
  assert ablation.build_report(tiny_ablation, workdir, cells, command='x').startswith('# Position')
  assert len(trained) == 2


def test_not_applicable_cell_is_reported(tmp_path, tiny_ablation, trained):
  tiny_ablation.ablation.positions = 'shaw'
  tiny_ablation.ablation.attentions = 'linear'
  workdir = str(tmp_path / 'na')
  md = ablation.run_grid(tiny_ablation, workdir, ablation.check_grid(tiny_ablation))
  assert not trained
  run = report.load_run(os.path.join(workdir, 'position_probes-order/shaw-linear'))
  assert run.not_applicable and 'linear' in run.not_applicable
  assert 'shaw (linear)' in md




# ---------------------------------------------------------------- length extension


@pytest.fixture
def tiny_extend(tfds_dir):
  c = extend_config.get_config()
  c.extend.num_seeds = 2
  c.extend.learning_rates = '3e-3'
  c.extend.variants = 'none,yarn,dynamic_ntk'
  c.extend.lengths = '128'
  c.data.data_dir = tfds_dir
  c.train.num_steps = c.train.eval_every = c.train.checkpoint_every = c.train.log_every = 4
  c.optim.warmup_steps = 1
  c.train.compilation_cache_dir = ''
  return c


def test_extension_overrides_per_variant():
  assert extend.overrides_for('none', 256, 64) == {}
  assert extend.overrides_for('yarn', 256, 64) == {
      'rope.scaling': 'yarn', 'rope.scaling_factor': 4.0, 'rope.original_max_length': 64}
  assert extend.overrides_for('dynamic_ntk', 256, 64)['rope.scaling_factor'] == 1.0


@pytest.mark.parametrize('field, value, phrase', [
    ('extend.variants', 'none,rope2', 'rope.scaling kinds'),
    ('extend.lengths', '32,128', 'above the training length'),
    ('model.position', 'alibi', 'needs model.position=rotary'),
])
def test_extension_config_errors(tiny_extend, field, value, phrase):
  tiny_extend.update_from_flattened_dict({field: value})
  with pytest.raises(ValueError, match=phrase):
    extend.check(tiny_extend)


def test_tiny_extension_trains_once_and_reports(tmp_path, tiny_extend, trained):
  """One training run; every variant evaluated on its seeds; a rerun only evaluates."""
  extend.run(tiny_extend, str(tmp_path), command='test')
  extend.run(tiny_extend, str(tmp_path), command='test')
  assert trained == [str(tmp_path / 'train')]
  with open(tmp_path / extend.RESULTS_FILE) as f:
    results = json.load(f)
  assert set(results['results']) == {'none', 'yarn', 'dynamic_ntk'}
  assert set(results['results']['yarn']) == {'test_128_near', 'test_128_far'}
  assert all(len(r['accuracy']) == 2 for v in results['results'].values() for r in v.values())
  assert len(results['comparisons']) == 4 and (tmp_path / extend.PLOT_FILE).is_file()


def test_extension_comparisons_on_known_inputs():
  """Paired against none; identical accuracies are 'all equal', never p = 0."""
  results = {'none': {'t': {'length': 128, 'accuracy': [0.5, 0.5, 0.5, 0.5]}},
             'linear': {'t': {'length': 128, 'accuracy': [0.6, 0.7, 0.8, 0.9]}},
             'ntk': {'t': {'length': 128, 'accuracy': [0.5, 0.5, 0.5, 0.5]}}}
  rows = extend.comparisons(results)
  assert [r['variant'] for r in rows] == ['linear', 'ntk']
  assert rows[0]['mean'] == pytest.approx(0.25) and rows[0]['p'] == pytest.approx(0.125)
  assert rows[1]['zero_variance'] and rows[1]['p'] == 1.0


def test_report_compares_within_a_training_length_with_softmax_reference():
  def run(name, position, attention, accuracy):
    summary = {'seeds': [0, 1], 'chosen_members': [0, 1], 'validation_accuracy': accuracy,
               'eval': {'test': {'length': 512, 'accuracy': accuracy}}}
    return report.Run(name, '', 'manpages', position, attention, summary=summary)

  runs = [run('manpages/rotary-linear-L512', 'rotary', 'linear', [0.5, 0.6]),
          run('manpages/rotary-L512', 'rotary', 'softmax', [0.7, 0.9]),
          run('manpages/none-L512', 'none', 'softmax', [0.5, 0.5])]
  assert [r.train_length for r in runs] == [512, 512, 512]
  assert report.Run('d/none', '', 'd', 'none', 'softmax').train_length is None
  table = report.comparison_table(runs, [('test', 512)], 'rotary')
  assert 'rotary (linear) − rotary | -25.0' in table and 'none − rotary | -30.0' in table
