"""End-to-end tests of train_and_evaluate, resume, eval.py and the command line (tiny preset)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from data import datasets
from training import checkpoints, evaluation, metrics, trainer, validation
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

  # A second invocation with a longer budget resumes at step 20.
  config.train.num_steps = 30
  trainer.train_and_evaluate(config, workdir)
  steps = [r['step'] for r in metrics.read_metrics(workdir) if 'train/loss' in r]
  assert steps == [5, 10, 15, 20, 25, 30]

  # eval.py's library function: best checkpoint, extrapolation lengths.
  results = evaluation.evaluate_workdir(workdir, eval_lengths=[128, 256])
  assert set(results['eval']) == {'test', 'test_128_near', 'test_128_far', 'test_256_near',
                                  'test_256_far'}
  assert results['eval']['test_256_far']['length'] == 256
  assert 'test_128_near' in evaluation.format_table(results)
  # Length extension at evaluation: RoPE scaling overridden, the same parameters restored.
  overrides = evaluation.parse_overrides(['rope.scaling=linear', 'rope.scaling_factor=4'])
  extended = evaluation.evaluate_workdir(workdir, eval_lengths=[256], overrides=overrides)
  assert extended['overrides'] == {'rope.scaling': 'linear', 'rope.scaling_factor': '4'}
  assert extended['eval']['test_256_far']['loss'] != results['eval']['test_256_far']['loss']
  assert validation.load_config(workdir).rope.scaling == 'none'  # config.json untouched


def test_kill_and_resume_gives_identical_metrics_and_params(tmp_path, run_config, monkeypatch):
  config = run_config()
  config.model.dropout_rate = 0.1  # dropout keys must also resume correctly
  straight = str(tmp_path / 'straight')
  trainer.train_and_evaluate(config, straight)

  interrupted = str(tmp_path / 'interrupted')
  real_batches = datasets.Dataset.train_batches

  def dying_batches(self, **kwargs):
    for i, batch in enumerate(real_batches(self, **kwargs)):
      if kwargs['start_step'] + i == 13:
        raise KeyboardInterrupt('simulated kill at step 14')
      yield batch

  monkeypatch.setattr(datasets.Dataset, 'train_batches', dying_batches)
  with pytest.raises(KeyboardInterrupt):
    trainer.train_and_evaluate(config, interrupted)
  monkeypatch.setattr(datasets.Dataset, 'train_batches', real_batches)
  trainer.train_and_evaluate(config, interrupted)  # resumes from step 10

  with open(os.path.join(straight, metrics.METRICS_FILE)) as a, \
       open(os.path.join(interrupted, metrics.METRICS_FILE)) as b:
    assert a.read() == b.read()
  pa, pb = params_of(straight, 20), params_of(interrupted, 20)
  jax.tree.map(np.testing.assert_array_equal, pa, pb)


@pytest.mark.parametrize('members', ['vmap', 'loop'])
def test_members_in_one_step_match_separate_runs(tmp_path, run_config, members):
  together = trainer.train_and_evaluate(
      run_config(**{'train.num_seeds': 2, 'train.num_steps': 10, 'train.members': members}),
      str(tmp_path / 'together'))
  alone = trainer.train_and_evaluate(
      run_config(**{'train.seed': 1, 'train.num_steps': 10}), str(tmp_path / 'alone'))
  assert together['seeds'] == [0, 1]
  np.testing.assert_allclose(together['validation_loss'][1], alone['validation_loss'][0],
                             rtol=1e-4)


def test_nonfinite_loss_stops_and_keeps_checkpoint(tmp_path, run_config):
  workdir = str(tmp_path / 'nan')
  config = run_config(**{'optim.learning_rate': 1e38, 'optim.grad_clip_norm': 0.0,
                                    'optim.warmup_steps': 0})
  with pytest.raises(trainer.NonFiniteLossError, match='NaN/Inf at step'):
    trainer.train_and_evaluate(config, workdir)
  config.train.skip_nonfinite = True
  summary = trainer.train_and_evaluate(config, str(tmp_path / 'skip'))
  assert summary['skipped_updates'][0] > 0


@pytest.mark.parametrize('name', ['listops/small', 'fortunes'])
def test_embedded_datasets_train(tmp_path, run_config, name):
  if name == 'fortunes' and not os.path.isdir('/usr/share/games/fortunes'):
    pytest.skip('fortunes not installed (apt-get install fortunes)')
  config = run_config(**{'data.name': name, 'data.max_length': 128,
                                    'train.num_steps': 30, 'train.eval_every': 30})
  trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  train = [r for r in metrics.read_metrics(str(tmp_path / 'run')) if 'train/loss' in r]
  assert train[-1]['train/loss'] < train[0]['train/loss']


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
  proc = run_cli('train.py', '--config=configs/tiny.py', f'--workdir={tmp_path / "typo"}',
                 '--config.model.positon=alibi')
  assert proc.returncode != 0
  assert 'positon' in proc.stderr
  assert not os.path.exists(tmp_path / 'typo')
