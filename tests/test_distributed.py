"""Scale-out on CPU: meshes over 8 simulated devices, and real multi-process runs on 127.0.0.1.

Each test starts fresh Python processes (the device count is fixed when JAX starts):
  * one process with 8 devices trains on meshes (8,1,1), (2,4,1), (2,2,2), (1,1,8) and on one
    device, with the same losses, and parameters that really are sharded;
  * two processes x 2 devices (``jax.distributed`` over gloo) against one process x 4 devices:
    the same metrics, and the two-process checkpoint restores in this (1-device) process;
  * SIGTERM to one of two processes: both save the same step and exit 0; the next start resumes;
  * a lost process (SIGKILL): the other stops with an error within the heartbeat timeout.
"""

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import settings
from data import datasets
from training import checkpoints, metrics, partitioning, validation
from training.config import MeshConfig, run_config as run_config_of
from training.experiment import Experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def data_dir(tfds_dir, run_config):
  datasets.load_classifier(run_config_of(run_config()).data, None)  # generate before processes race
  return tfds_dir


def _env(num_devices: int) -> dict[str, str]:
  return dict(os.environ, JAX_PLATFORMS='cpu',
              XLA_FLAGS=f'--xla_force_host_platform_device_count={num_devices}')


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _train_command(workdir, data_dir, *overrides):
  return [sys.executable, 'train.py', '--config=configs/tiny.py', f'--workdir={workdir}',
          f'--config.data.data_dir={data_dir}', '--config.mesh.fsdp=2',
          '--config.train.num_steps=6', '--config.train.log_every=2',
          '--config.train.eval_every=6', '--config.train.checkpoint_every=6', *overrides]


def _start(command, num_devices, log_path):
  log = open(log_path, 'w')  # pylint: disable=consider-using-with
  return subprocess.Popen(command, cwd=ROOT, env=_env(num_devices), stdout=log,
                          stderr=subprocess.STDOUT, text=True)


def _start_pair(workdir, data_dir, tmp_path, *overrides, name='pair'):
  port = _free_port()
  return [_start(_train_command(workdir, data_dir, *overrides,
                                f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
                                f'--process_id={i}'), 2, tmp_path / f'{name}{i}.log')
          for i in range(2)]


def _wait(procs, timeout=400):
  deadline = time.time() + timeout
  for p in procs:
    p.wait(timeout=max(1, deadline - time.time()))
  return [p.returncode for p in procs]


def _log(tmp_path, name):
  return (tmp_path / name).read_text()


def _wait_for_step(workdir, step, procs, timeout=300):
  """Until process 0 has logged train metrics of ``step`` (or a process died)."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    records = metrics.read_metrics(workdir) if os.path.exists(workdir) else []
    if any(r['step'] >= step and 'train/loss' in r for r in records):
      return
    assert all(p.poll() is None for p in procs), 'a process exited early'
    time.sleep(0.2)
  raise TimeoutError(f'step {step} not reached')


def _params(workdir, step):
  """Restores ``step`` of a workdir in this process (1 device), whatever mesh wrote it."""
  config = validation.load_config(workdir)
  exp = Experiment(dataclasses.replace(config, mesh=partitioning.fit_to_devices(config.mesh)),
                   workdir)
  ckpt = checkpoints.Checkpointer(workdir, 5)
  state = ckpt.restore(step, exp.abstract_with_shardings())
  ckpt.close()
  return jax.tree.map(np.asarray, state.params)


def _train_records(workdir):
  return [r for r in metrics.read_metrics(workdir) if 'train/loss' in r]


@pytest.mark.slow  # ~80 s on 2 cores: four simulated meshes, each compiled
def test_meshes_match_one_device_and_shard_parameters(tmp_path, data_dir):
  out = tmp_path / 'meshes.json'
  proc = subprocess.run([sys.executable, 'tests/helpers/mesh_worker.py', f'--data_dir={data_dir}',
                         f'--out={out}'], cwd=ROOT, env=_env(8), capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  results = json.loads(out.read_text())
  one = results['1x1x1']
  for mesh in ('8x1x1', '2x4x1', '2x2x2', '1x1x8'):
    np.testing.assert_allclose(results[mesh]['loss'], one['loss'], rtol=2e-5, err_msg=mesh)
    np.testing.assert_allclose(results[mesh]['grad_norm'], one['grad_norm'], rtol=1e-4,
                               err_msg=mesh)
  shard = lambda mesh, name: results[mesh]['params'][name]['shard_shape']
  q, mlp = 'layers/0/attention/query/kernel', 'layers/0/intermediate/kernel'
  mu, emb = 'opt:mu/layers/0/intermediate/kernel', 'embeddings/word_embeddings/embedding'
  # [seeds, embed, heads, kv] and [seeds, embed, mlp]: embed over fsdp, heads/mlp over tensor.
  assert results['8x1x1']['params'][q]['shard_shape'] == results['8x1x1']['params'][q]['shape']
  assert shard('2x4x1', q) == [2, 16, 8, 8] and shard('2x4x1', mlp) == [2, 16, 128]
  assert shard('2x2x2', q) == [2, 32, 4, 8] and shard('2x2x2', mlp) == [2, 32, 64]
  assert shard('1x1x8', q) == [2, 64, 1, 8] and shard('1x1x8', mlp) == [2, 64, 16]
  assert shard('2x2x2', mu) == shard('2x2x2', mlp)  # Adam moments sharded like parameters.
  assert shard('2x2x2', emb) == [2, 130, 32]  # vocab 260 over tensor 2, embed over fsdp 2.
  assert shard('1x1x8', emb) == [2, 260, 64]  # 8 does not divide 260: replicated.


@pytest.mark.slow  # ~2 min: three processes train and compare
def test_two_processes_match_one_process_and_restore_on_one_device(tmp_path, data_dir):
  pair_dir, single_dir = str(tmp_path / 'pair'), str(tmp_path / 'single')
  # The pair builds its mesh as 2 (processes, over DCN) x 2 (devices): the hybrid-mesh path.
  # Two training shards: each process reads only its half of the training split.
  procs = _start_pair(pair_dir, data_dir, tmp_path, '--config.mesh.dcn_data=2',
                      '--config.data.num_shards=2')
  procs.append(_start(_train_command(single_dir, data_dir, '--config.data.num_shards=2'), 4,
                      tmp_path / 'single.log'))
  codes = _wait(procs)
  assert codes == [0, 0, 0], [_log(tmp_path, n)[-3000:]
                              for n in ('pair0.log', 'pair1.log', 'single.log')]
  assert '2 process(es), 4 device(s)' in _log(tmp_path, 'pair0.log')
  assert 'step 2/6' not in _log(tmp_path, 'pair1.log')  # only process 0 logs
  pair, single = _train_records(pair_dir), _train_records(single_dir)
  assert [r['step'] for r in pair] == [r['step'] for r in single] == [2, 4, 6]
  for a, b in zip(pair, single):
    for key in ('train/loss', 'train/accuracy', 'train/grad_norm'):
      np.testing.assert_allclose(a[key], b[key], rtol=2e-5, err_msg=key)
  with open(os.path.join(pair_dir, 'summary.json')) as f, \
       open(os.path.join(single_dir, 'summary.json')) as g:
    np.testing.assert_allclose(json.load(f)['validation_loss'], json.load(g)['validation_loss'],
                               rtol=2e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               _params(pair_dir, 6), _params(single_dir, 6))


@pytest.mark.slow  # ~1 min: two processes, a signal, a resume
def test_sigterm_to_one_process_saves_one_step_and_resumes(tmp_path, data_dir):
  workdir = str(tmp_path / 'preempt')
  long_run = ('--config.train.num_steps=2000', '--config.train.log_every=1',
              '--config.train.checkpoint_every=2000', '--config.train.eval_every=2000')
  procs = _start_pair(workdir, data_dir, tmp_path, *long_run)
  _wait_for_step(workdir, 3, procs)
  procs[1].send_signal(signal.SIGTERM)
  codes = _wait(procs, timeout=120)
  logs = [_log(tmp_path, f'pair{i}.log') for i in range(2)]
  assert codes == [0, 0], [log[-3000:] for log in logs]
  steps = [int(s) for s in os.listdir(os.path.join(workdir, 'checkpoints')) if s.isdigit()]
  assert len(steps) == 1 and 3 <= steps[0] < 2000, steps
  assert f'Preempted: saved step {steps[0]}' in logs[0]
  # The next start (here one process with the same 4 devices) resumes from that step.
  proc = subprocess.run(_train_command(workdir, data_dir, *long_run[1:],
                                       f'--config.train.num_steps={steps[0] + 2}'),
                        cwd=ROOT, env=_env(4), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert f'Resumed from step {steps[0]}' in proc.stdout
  assert _train_records(workdir)[-1]['step'] == steps[0] + 2


# ~35 s. Kept in the default run by test_sigterm_to_one_process_saves_one_step_and_resumes (a
# SIGTERM mid-run: exit 0, one step saved and named, the next start resumes from it) and
# test_reliability's test_sigterm_during_start_up_saves_and_exits_0 (one process).
@pytest.mark.slow
def test_sigterm_single_process_saves_exits_0_and_resumes(tmp_path, data_dir):
  workdir = str(tmp_path / 'term')
  long_run = ('--config.mesh.fsdp=1', '--config.train.log_every=1',
              '--config.train.checkpoint_every=2000', '--config.train.eval_every=2000')
  proc = _start(_train_command(workdir, data_dir, *long_run, '--config.train.num_steps=2000'), 1,
                tmp_path / 'term.log')
  _wait_for_step(workdir, 3, [proc])
  proc.send_signal(signal.SIGTERM)
  assert _wait([proc], timeout=120) == [0], _log(tmp_path, 'term.log')[-3000:]
  steps = [int(s) for s in os.listdir(os.path.join(workdir, 'checkpoints')) if s.isdigit()]
  assert len(steps) == 1 and f'Preempted: saved step {steps[0]}' in _log(tmp_path, 'term.log')
  proc = subprocess.run(_train_command(workdir, data_dir, *long_run,
                                       f'--config.train.num_steps={steps[0] + 2}'),
                        cwd=ROOT, env=_env(1), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert f'Resumed from step {steps[0]}' in proc.stdout


def test_lost_process_stops_the_other_with_an_error(tmp_path, data_dir):
  workdir = str(tmp_path / 'lost')
  procs = _start_pair(workdir, data_dir, tmp_path, '--config.train.num_steps=100000',
                      '--config.train.log_every=1', '--config.train.checkpoint_every=100000',
                      '--config.train.eval_every=100000', '--heartbeat_timeout_s=10')
  _wait_for_step(workdir, 2, procs)
  procs[1].kill()
  start = time.time()
  procs[0].wait(timeout=90)  # TimeoutExpired (a hang) fails the test
  elapsed = time.time() - start
  log = _log(tmp_path, 'pair0.log')
  assert procs[0].returncode != 0, log[-3000:]
  assert 'another task died' in log and 'stopped sending heartbeats' in log, log[-3000:]
  assert elapsed < 90
  print(f'surviving process stopped {elapsed:.1f} s after its peer was killed:\n{log[-1500:]}')


def test_logical_rules_and_mesh_config_errors():
  mesh_config = lambda **fields: settings.build_group(MeshConfig, fields, 'mesh')
  rules = dict(partitioning.logical_rules(mesh_config()))
  assert rules == {'batch': ('data', 'fsdp'), 'length': None, 'embed': 'fsdp', 'heads': 'tensor',
                   'kv': None, 'mlp': 'tensor', 'vocab': 'tensor', 'classes': None}
  rules = dict(partitioning.logical_rules(mesh_config(rules='vocab=, embed=fsdp+tensor')))
  assert rules['vocab'] is None and rules['embed'] == ('fsdp', 'tensor')
  for bad, message in (('vocab', 'must be <logical>=<mesh axes>'),
                       ('vocabulary=tensor', 'must be <logical>=<mesh axes>'),
                       ('vocab=model', 'unknown mesh axes')):
    with pytest.raises(ValueError, match=message):
      partitioning.logical_rules(mesh_config(rules=bad))
  with pytest.raises(ValueError, match='does not divide the 1 devices'):
    partitioning.make_mesh(mesh_config(fsdp=2))
  across = mesh_config(data=1, fsdp=1, tensor=1, dcn_data=2)
  with pytest.raises(ValueError, match='dcn'):
    partitioning.make_mesh(across)
  assert partitioning.fit_to_devices(across).dcn_data == 1  # evaluation on other hardware
  mesh = partitioning.make_mesh(mesh_config(data=1))
  assert partitioning.process_rows(mesh, 16) == (0, 1)


@pytest.mark.slow  # ~75 s: compiles on 256 simulated devices
def test_per_device_batch_size_fits_256_devices(tmp_path, data_dir):
  """The README's pod command on 256 simulated devices: FSDP 4 x data 64, one example per
  device (global batch 256), evaluation batches rounded up to the devices; and the rule that
  exactly one of the two batch sizes is set."""
  workdir = tmp_path / 'pod'
  proc = subprocess.run(
      _train_command(workdir, data_dir, '--config.mesh.fsdp=4', '--config.train.batch_size=0',
                     '--config.train.per_device_batch_size=1', '--config.data.num_shards=64',
                     '--config.train.num_steps=2',
                     '--config.train.log_every=1', '--config.train.eval_every=2',
                     '--config.train.checkpoint_every=2', '--config.train.eval_max_length=64'),
      cwd=ROOT, env=_env(256), capture_output=True, text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "mesh {'data': 64, 'fsdp': 4, 'tensor': 1}" in proc.stdout + proc.stderr
  assert os.path.isfile(workdir / 'summary.json')
  from configs import tiny  # pylint: disable=g-import-not-at-top
  both = tiny.get_config()
  both.train.per_device_batch_size = 2
  with pytest.raises(ValueError, match='exactly one of train.batch_size'):
    run_config_of(both)
