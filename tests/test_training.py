"""End-to-end tests of train_and_evaluate, resume, eval.py and the command line (tiny preset)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data import datasets
from helpers import entry
from training import checkpoints, evaluation, metrics, steps, tasks, trainer, validation
from training.experiment import Experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def params_of(workdir, step):
  exp = Experiment(validation.load_config(workdir), workdir)
  ckpt = checkpoints.Checkpointer(workdir, 5)
  state = ckpt.restore(step, exp.abstract_with_shardings())
  ckpt.close()
  return jax.tree.map(np.asarray, state.params)


def test_train_resume_and_eval(tmp_path, run_config):
  workdir = str(tmp_path / 'run')
  config = run_config()
  summary = trainer.train_and_evaluate(config, workdir)
  records = metrics.read_metrics(workdir)
  train = [r for r in records if 'train/loss' in r]
  # (The probes' loss stays near ln 2 for ~100 steps; loss decrease is tested on ListOps and
  # fortunes below and in the ablation.)
  assert [r['step'] for r in train] == [5, 10, 15, 20]
  assert all(np.isfinite(r['train/loss']) for r in train)
  assert os.path.exists(os.path.join(workdir, 'checkpoints', '20'))
  assert os.path.exists(os.path.join(workdir, 'config.json'))
  assert os.listdir(os.path.join(workdir, 'tb', 'seed_0'))
  # configs/tiny.py evaluates the test splits up to 128 tokens at the end.
  assert set(summary['eval']) == {'test', 'test_96_near', 'test_96_far', 'test_128_near',
                                  'test_128_far'}
  assert 0.0 <= summary['validation_accuracy'][0] <= 1.0
  # The loop's time holds its first step and both validations (the report subtracts them).
  seconds = summary['seconds']
  assert seconds['train_loop'] >= seconds['first_step'] + seconds['validation_eval'] > 0

  # A second invocation with a longer budget resumes at step 20.
  config.train.num_steps = 30
  trainer.train_and_evaluate(config, workdir)
  steps = [r['step'] for r in metrics.read_metrics(workdir) if 'train/loss' in r]
  assert steps == [5, 10, 15, 20, 25, 30]

  # eval.py's library function: best checkpoint, extrapolation lengths. A config.json saved
  # before a field existed takes its default.
  with open(os.path.join(workdir, 'config.json')) as f:
    saved = json.load(f)
  del saved['model']['attention_chunk_size'], saved['train']['init_from']
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    json.dump(saved, f)
  results = evaluation.evaluate_workdir(workdir, eval_lengths=[128, 256])
  assert set(results['eval']) == {'test', 'test_128_near', 'test_128_far', 'test_256_near',
                                  'test_256_far'}
  assert results['eval']['test_256_far']['length'] == 256
  assert 'test_128_near' in evaluation.format_table(results)
  # Length extension at evaluation: RoPE scaling overridden, the same parameters restored.
  overrides = evaluation.parse_overrides(['rope.scaling=linear', 'rope.scaling_factor=4'])
  extended = evaluation.evaluate_workdir(workdir, eval_lengths=[256], overrides=overrides)
  assert extended['overrides'] == {'rope.scaling': 'linear', 'rope.scaling_factor': 4.0}
  assert extended['eval']['test_256_far']['loss'] != results['eval']['test_256_far']['loss']
  assert validation.load_config(workdir).rope.scaling == 'none'  # config.json untouched


def assert_kill_and_resume_is_bitwise(config, tmp_path, monkeypatch, *, kill_at: int,
                                      dataset=datasets.Dataset) -> str:
  """Trains ``config`` straight, then again killed as it reaches step ``kill_at`` and resumed
  from its last checkpoint: metrics.jsonl and the final parameters identical. Returns the
  uninterrupted run's workdir."""
  straight = str(tmp_path / 'straight')
  trainer.train_and_evaluate(config, straight)

  interrupted = str(tmp_path / 'interrupted')
  real_batches = dataset.train_batches

  def dying_batches(self, **kwargs):
    for i, batch in enumerate(real_batches(self, **kwargs)):
      if kwargs['start_step'] + i == kill_at - 1:
        raise KeyboardInterrupt(f'simulated kill at step {kill_at}')
      yield batch

  monkeypatch.setattr(dataset, 'train_batches', dying_batches)
  with pytest.raises(KeyboardInterrupt):
    trainer.train_and_evaluate(config, interrupted)
  monkeypatch.setattr(dataset, 'train_batches', real_batches)
  trainer.train_and_evaluate(config, interrupted)  # resumes from the last checkpoint

  with open(os.path.join(straight, metrics.METRICS_FILE)) as a, \
       open(os.path.join(interrupted, metrics.METRICS_FILE)) as b:
    assert a.read() == b.read()
  last = config.train.num_steps
  jax.tree.map(np.testing.assert_array_equal, params_of(straight, last),
               params_of(interrupted, last))
  return straight


def test_kill_and_resume_gives_identical_metrics_and_params(tmp_path, run_config, monkeypatch):
  config = run_config()
  config.model.dropout_rate = 0.1  # dropout keys must also resume correctly
  assert_kill_and_resume_is_bitwise(config, tmp_path, monkeypatch, kill_at=14)  # resumes at 10


@pytest.fixture(scope='module')
def seed_1_alone(tmp_path_factory, run_config):
  """The summary of a one-member run of seed 1 (10 steps), which both member modes match."""
  return trainer.train_and_evaluate(run_config(**{'train.seed': 1, 'train.num_steps': 10}),
                                    str(tmp_path_factory.mktemp('alone') / 'run'))


@pytest.mark.parametrize('members', ['vmap', 'loop'])
def test_members_in_one_step_match_separate_runs(tmp_path, run_config, members, seed_1_alone):
  together = trainer.train_and_evaluate(
      run_config(**{'train.num_seeds': 2, 'train.num_steps': 10, 'train.members': members}),
      str(tmp_path / 'together'))
  assert together['seeds'] == [0, 1]
  np.testing.assert_allclose(together['validation_loss'][1], seed_1_alone['validation_loss'][0],
                             rtol=1e-4)


# A NaN/Inf loss stops the run (NonFiniteLossError, 'NaN/Inf at step'), also before any
# checkpoint, and train.skip_nonfinite skips the updates instead: test_reliability's
# test_nonfinite_stops_naming_the_step_and_keeps_the_last_good_checkpoint and
# test_a_run_that_failed_before_any_checkpoint_leaves_the_workdir_reusable, and test_cli_errors'
# test_skip_nonfinite_keeps_no_nan_weights (this file's copy of those assertions was merged there).


# listops/small (projects/lra) and manpages/pairs (the two-stage study's) are slow: ~25 s each.
@pytest.mark.parametrize('name', [pytest.param('listops/small', marks=pytest.mark.slow), 'fortunes',
                                  pytest.param('manpages/pairs', marks=pytest.mark.slow)])
def test_embedded_datasets_train(tmp_path, run_config, name):
  if name == 'fortunes' and not os.path.isdir('/usr/share/games/fortunes'):
    pytest.skip('fortunes not installed (apt-get install fortunes)')
  if name == 'manpages/pairs' and not os.path.isdir('/usr/share/man/man2'):
    pytest.skip('man pages not installed (apt-get install manpages manpages-dev)')
  config = run_config(**{'data.name': name, 'data.max_length': 128,
                         'train.num_steps': 30, 'train.eval_every': 30,
                         'model.type_vocab_size': 2 if name == 'manpages/pairs' else 0,
                         'train.projects': 'lra' if name.startswith('listops') else ''})
  summary = trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  if name == 'manpages/pairs':  # a hard two-text task: 30 steps only show it runs end to end
    assert summary['eval']['test']['count'] == 122 and 'f1' in summary['eval']['test']
    return
  train = [r for r in metrics.read_metrics(str(tmp_path / 'run')) if 'train/loss' in r]
  assert train[-1]['train/loss'] < train[0]['train/loss']


def test_sentence_pairs_learn_through_token_types(tmp_path, run_config):
  """Joint pairs: the label is whether the two texts are equal, so only a model that reads both
  halves ([CLS] a [SEP] b [SEP], token types) can learn it."""
  rng = np.random.default_rng(0)
  words = list('abcd')
  rows = []
  for _ in range(400):
    a, b = rng.choice(words, 2)
    b = a if rng.random() < 0.5 else b
    rows.append(json.dumps({'a': a, 'b': b, 'label': int(a == b)}) + '\n')
  path = tmp_path / 'pairs.jsonl'
  path.write_text(''.join(rows))
  config = run_config(**{'data.name': 'files', 'data.train_files': str(path),
                         'data.text_column': 'a', 'data.text_b_column': 'b',
                         'data.max_length': 12, 'model.type_vocab_size': 2,
                         'train.num_steps': 200, 'train.eval_every': 200,
                         'optim.learning_rate': 3e-3, 'model.init_std': 0.1})
  summary = trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert summary['eval']['test']['accuracy'][0] > 0.8


def test_correlations_and_f1_on_known_inputs():
  x = np.array([[1.0, 2.0, 3.0, 4.0, 99.0], [1.0, 8.0, 27.0, 64.0, 0.0]])
  target = np.array([[2.0, 4.0, 6.0, 8.0, 0.0]] * 2)
  weight = np.array([[1.0, 1.0, 1.0, 1.0, 0.0]] * 2)  # the last column is padding
  r = metrics.correlations(x, target, weight)
  np.testing.assert_allclose(r['spearman'], [1.0, 1.0])
  assert r['pearson'][0] == pytest.approx(1.0) and 0.9 < r['pearson'][1] < 0.99
  assert np.isnan(metrics.correlations(np.ones((1, 3)), np.arange(3.)[None], np.ones((1, 3)))[
      'pearson'][0])  # constant predictions: undefined, not 0
  logits = jnp.array([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
  label, weight = jnp.array([1, 0, 1, 0, 1]), jnp.array([1.0, 1, 1, 1, 0])
  sums = tasks.loss_and_metrics(logits, label, weight)[1]  # tp 1, fp 1, fn 1 (the padded row ignored)
  assert [float(sums[f'{k}_sum']) for k in ('true_positive', 'false_positive',
                                            'false_negative')] == [1.0, 1.0, 1.0]


def test_regression_learns_and_predicts_values(tmp_path, run_config):
  """data.regression: a one-output head on real labels (here a text's length / 10), scored by
  Pearson and Spearman; predict.py writes the value."""
  from training import prediction  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, 30, 300)
  path = tmp_path / 'train.csv'
  path.write_text('text,score\n' + ''.join(f'{"x" * n},{n / 10}\n' for n in lengths))
  config = run_config(**{'data.name': 'files', 'data.train_files': str(path),
                         'data.label_column': 'score', 'data.regression': True,
                         'data.max_length': 32, 'model.pooling': 'mean',
                         'train.num_steps': 150, 'train.eval_every': 150,
                         'optim.learning_rate': 3e-3})
  summary = trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert summary['eval']['test']['pearson'][0] > 0.9, summary['eval']
  assert summary['eval']['test']['spearman'][0] > 0.9
  (tmp_path / 'in.txt').write_text('x\n' + 'x' * 25 + '\n')
  low, high = prediction.predict(str(tmp_path / 'run'), str(tmp_path / 'in.txt'))
  assert low['value'] < high['value']


def run_cli(*args, timeout=300):
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout)


def test_command_line_train_eval_and_overrides(tmp_path, tfds_dir):
  workdir = str(tmp_path / 'cli')
  proc = run_cli('train.py', '--config=configs/tiny.py', f'--workdir={workdir}',
                 f'--config.data.data_dir={tfds_dir}', '--config.model.position=alibi',
                 '--config.train.num_steps=10')
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(workdir, 'config.json')) as f:
    assert json.load(f)['model']['position'] == 'alibi'
  proc = run_cli('eval.py', f'--workdir={workdir}', '--eval_lengths=128')
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'test_128_near' in proc.stdout and 'test_128_far' in proc.stdout
  # A misspelt override is an error (lock_config=True), and nothing is written.
  proc = entry.run(['train.py', '--config=configs/tiny.py', f'--workdir={tmp_path / "typo"}',
                    '--config.model.positon=alibi'])
  assert proc.returncode != 0
  assert 'positon' in proc.stderr
  assert not os.path.exists(tmp_path / 'typo')


@pytest.fixture(scope='module')
def source_run(tmp_path_factory, run_config):
  """A finished tiny run of 2 seeds (the source of init_from) and its config."""
  workdir = str(tmp_path_factory.mktemp('source') / 'run')
  config = run_config(**{'train.num_steps': 10, 'train.num_seeds': 2, 'train.eval_every': 10,
                         'train.checkpoint_every': 10, 'train.eval_max_length': 64})
  trainer.train_and_evaluate(config, workdir)
  return workdir, config


def test_init_from_copies_the_encoder_and_resume_wins(tmp_path, source_run):
  """Every parameter but the head comes from the source's best checkpoint, the member of the
  same seed (seed 1: the source's second); init_head copies the head too; a resumed run ignores
  init_from."""
  source, config = source_run
  saved = params_of(source, 10)
  config = config.copy_and_resolve_references()
  config.train.update(init_from=source, num_steps=1, seed=1, num_seeds=1)
  config.optim.warmup_steps = 1  # step 1's learning rate is 0: the parameters stay as loaded
  trainer.train_and_evaluate(config, str(tmp_path / 'a'))
  fresh = params_of(str(tmp_path / 'a'), 1)
  flat = lambda p: {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(p)[0]}
  for key, value in flat(fresh).items():
    if "'head'" in key:
      assert not np.array_equal(value[0], flat(saved)[key][1]), key
    else:
      np.testing.assert_array_equal(value[0], flat(saved)[key][1], err_msg=key)  # seed 1
  config.train.init_head = True
  trainer.train_and_evaluate(config, str(tmp_path / 'b'))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a[0], b[1]),
               params_of(str(tmp_path / 'b'), 1), saved)
  config.train.update(num_steps=2, init_from=str(tmp_path / 'missing'))  # resume: not read
  trainer.train_and_evaluate(config, str(tmp_path / 'b'))


@pytest.mark.parametrize('field, value, phrase', [
    ('model.position', 'alibi', "model.position ('rotary' there, 'alibi' here)"),
    ('model.hidden_size', 32, 'model.hidden_size'),
    ('train.init_from', '/nonexistent/run', 'is not a train.py workdir'),
])
def test_init_from_refuses_what_does_not_fit(tmp_path, source_run, field, value, phrase):
  source, config = source_run
  config = config.copy_and_resolve_references()
  config.train.init_from = source
  config.update_from_flattened_dict({field: value})
  with pytest.raises(ValueError, match=phrase.replace('(', r'\(').replace(')', r'\)')):
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run' / 'checkpoints')


def test_step_memory_is_the_compiled_steps(run_config, tmp_path):
  """Experiment.step_memory (the ablation report's 'step memory'): XLA's bytes for one train
  step, larger for a longer batch."""
  small = Experiment(run_config(), str(tmp_path / 'a')).step_memory()
  long = Experiment(run_config(**{'data.name': 'files', 'data.train_files': _csv(tmp_path),
                                  'data.max_length': 256}), str(tmp_path / 'b')).step_memory()
  assert 0 < small < long


def _csv(tmp_path) -> str:
  path = tmp_path / 'train.csv'
  path.write_text('text,label\n' + ''.join(f'{"word " * 60}{i},{i % 2}\n' for i in range(20)))
  return str(path)


def test_embedded_dataset_versions_are_part_of_the_data_fingerprint(run_config):
  """A run made on another version of an embedded dataset is stale; a fingerprint saved
  before versions were recorded is not."""
  config = run_config(**{'data.name': 'position_probes/order'})
  now = validation.data_fingerprint(config.data)
  assert validation.data_changes(now, now) == []
  assert validation.data_changes({}, now) == []
  older = {key: {'version': '0.0.1'} for key in now}
  assert 'version' in validation.data_changes(older, now)[0]


def test_default_xla_flags_add_the_projects_and_keep_the_users(monkeypatch):
  """The entry points start XLA with the project's flags, but a flag the user set wins."""
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=4')
  trainer.default_xla_flags()
  assert os.environ['XLA_FLAGS'].split() == [
      '--xla_force_host_platform_device_count=4', *trainer.XLA_FLAG_DEFAULTS]
  mine = '--xla_cpu_enable_concurrency_optimized_scheduler=true'
  monkeypatch.setenv('XLA_FLAGS', mine)
  trainer.default_xla_flags()
  assert os.environ['XLA_FLAGS'] == mine
