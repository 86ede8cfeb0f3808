"""The ablation grid end to end on a tiny config: runs, resumes, reports."""

import json
import os

import pytest

from projects.extend.configs import probes as extend_config
from configs.ablation import probes
from experiments import ablation
from projects.extend import grid as extend
from experiments import report
from training import trainer
from training.experiment import Experiment


@pytest.fixture
def tiny_ablation(tfds_dir):
  c = probes.get_config()
  c.ablation.positions = 'none,rotary'
  c.ablation.variants = ''
  c.ablation.workers = 1
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
  c.train.test_lengths = ''
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
  variants = [v for v in c.ablation.variants.split(',') if v]
  rows = len(c.ablation.positions.split(',')) + len(variants)
  assert len(cells) == 2 * rows
  assert cells[0].name == 'position_probes-order/none'
  assert cells[rows].name == 'position_probes-order/none-linear'
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


def test_variants_are_rows_with_their_fields_changed():
  c = probes.get_config()
  c.ablation.positions = 'rotary'
  c.ablation.variants = 'p_rope:rotary:rope.p=0.75,irope:rotary:model.nope_interval=2'
  cells = ablation.check_grid(c)
  assert [x.name for x in cells] == ['position_probes-order/rotary',
                                     'position_probes-order/p_rope', 'position_probes-order/irope']
  p_rope, irope = (ablation.cell_config(c, x) for x in cells[1:])
  assert (p_rope.model.position, p_rope.rope.p, p_rope.model.nope_interval) == ('rotary', 0.75, 0)
  assert (irope.model.position, irope.rope.p, irope.model.nope_interval) == ('rotary', 1.0, 2)
  for bad in ('p:rotray:rope.p=0.5', 'p:rotary:rope.p', 'rotary:rotary:rope.p=0.5',
              'p:rotary:p=0.5', 'p:rotary:rop.p=0.5', 'p_rope', 'p:rotary',
              'p:rotary:rope.p=0.5,p:rotary:rope.p=0.25'):
    c.ablation.variants = bad
    with pytest.raises(ValueError, match='ablation.variants'):
      ablation.check_grid(c)


def test_test_lengths_keep_the_training_length_and_refuse_a_length_with_no_split(tiny_ablation):
  cell = ablation.Cell('position_probes/order', 'rotary', 'softmax', None)
  tiny_ablation.train.update(test_lengths='128', eval_max_length=0)
  exp = Experiment(ablation.cell_config(tiny_ablation, cell), '')
  assert exp.final_splits() == [('test', 64), ('test_128_near', 128), ('test_128_far', 128)]
  tiny_ablation.train.test_lengths = '128,121'
  exp = Experiment(ablation.cell_config(tiny_ablation, cell), '')
  with pytest.raises(ValueError, match=r'train.test_lengths names \[121\]'):
    exp.final_splits()


@pytest.mark.slow  # spawns two processes that import everything and compile: ~2 min here
def test_workers_train_runs_in_processes_with_the_serial_results(tmp_path, tiny_ablation):
  tiny_ablation.ablation.workers = 2
  cells = ablation.check_grid(tiny_ablation)
  ablation.run_grid(tiny_ablation, str(tmp_path / 'parallel'), cells)
  tiny_ablation.ablation.workers = 1
  ablation.run_grid(tiny_ablation, str(tmp_path / 'serial'), ablation.select(cells, '*/rotary'))
  runs = [report.load_run(str(tmp_path / kind / 'position_probes-order/rotary'))
          for kind in ('parallel', 'serial')]
  assert runs[0].summary['eval'] == runs[1].summary['eval']
  assert report.load_run(str(tmp_path / 'parallel/position_probes-order/none')).summary


def test_report_marks_split_seeds_and_rates_at_the_grid_edge():
  def run(name, accuracy, rates=(1e-3, 3e-3), chosen=3e-3):
    summary = {'seeds': list(range(len(accuracy))), 'chosen_members': list(range(len(accuracy))),
               'validation_accuracy': accuracy, 'learning_rates': list(rates),
               'learning_rate': chosen}
    return report.Run(name, '', 'd', name, 'softmax', summary=summary)

  runs = [run('a', [1.0, 0.99, 0.96]), run('b', [1.0, 0.5, 0.93]), run('c', [0.5, 0.5, 0.5])]
  # The best mean is a's 0.983: 95% of it is 0.934.
  assert report.solved_seeds(runs) == {'a': (3, 3), 'b': (1, 3), 'c': (0, 3)}
  assert report.split_runs(runs) == {'b'}
  assert report._chosen_rate(run('x', [1.0]).summary) == '0.003 (edge of the grid)'
  assert report._chosen_rate(run('x', [1.0], (1e-3, 3e-3, 1e-2)).summary) == '0.003'
  assert report._chosen_rate(run('x', [1.0], (3e-3,)).summary) == '0.003 (one rate tried)'
  phases = {'setup': 5.2, 'first_step': 12.1, 'train_loop': 60.0, 'validation_eval': 8.0,
            'test_eval': 20.4}
  assert report._seconds({'seconds': phases}) == '5, 12, 40, 8, 20'
  assert report._seconds({'seconds': {'validation_eval': 8.0, 'test_eval': 20.4}}) == (
      'n/a, n/a, n/a, 8, 20')
  # A loop timed shorter than its parts (runs before the timing fix) has no time for its steps.
  assert report._seconds({'seconds': dict(phases, train_loop=9.0)}) == '5, 12, n/a, 8, 20'


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


@pytest.mark.slow  # ~1 min: a project (projects/extend) trained and reported end to end
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
