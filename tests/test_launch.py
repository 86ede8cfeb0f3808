"""scripts/tpu.py, the TPU pod recipe, through its command line with --dry_run and no gcloud on
PATH: the gcloud commands each step prints; and the worker side of ``run`` (its detached job
and log) executed by bash here, with python3 and gcloud stubbed."""

import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, 'scripts', 'tpu.py')
NAME = ('--name=rope', '--zone=us-central2-b')
OVERRIDE = '--config.model.size=base'


def _git(repo, *words):
  return subprocess.run(['git', '-C', str(repo), '-c', 'user.name=t', '-c', 'user.email=t@t',
                         *words], check=True, capture_output=True, text=True).stdout.strip()


def _make_repo(path):
  path.mkdir()
  _git(path, 'init', '-q')
  (path / 'train.py').write_text('print("hi")\n')
  _git(path, 'add', '.')
  _git(path, 'commit', '-q', '-m', 'one')
  return path, _git(path, 'rev-parse', 'HEAD')


@pytest.fixture(scope='module')
def repo(tmp_path_factory):
  """A clean repository (this one is edited while the tests run)."""
  return _make_repo(tmp_path_factory.mktemp('launch') / 'repo')


@pytest.fixture(scope='module')
def path_without_gcloud(tmp_path_factory):
  bin_dir = tmp_path_factory.mktemp('bin')
  os.symlink(shutil.which('git'), bin_dir / 'git')
  assert shutil.which('gcloud', path=str(bin_dir)) is None
  return str(bin_dir)


def tpu(path, *argv):
  return subprocess.run([sys.executable, SCRIPT, *argv], env={**os.environ, 'PATH': path},
                        capture_output=True, text=True, timeout=60)


def commands(result):
  assert result.returncode == 0, result.stderr
  return [shlex.split(line, comments=True) for line in result.stdout.splitlines()]


def ssh_lines(cmds):
  return [c for c in cmds if c[:5] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh']]


def test_single_slice_v5e(repo, path_without_gcloud):
  path, sha = repo
  result = tpu(path_without_gcloud, 'all', *NAME, '--accelerator_type=v5litepod-16',
               '--workdir=gs://bucket/run', f'--repo={path}', '--dry_run', '--', OVERRIDE)
  cmds, out = commands(result), result.stdout
  for phrase in ('tpu-vm create rope', '--version=v2-alpha-tpuv5-lite', 'tpu-vm scp',
                 'pip install -r requirements-tpu.txt', 'nohup', 'train.py',
                 '--workdir=gs://bucket/run', OVERRIDE, 'gcloud storage cp'):
    assert phrase in out, phrase
  assert 'queued-resources' not in out
  assert len(ssh_lines(cmds)) == 3  # unpack, install, run
  assert all('--worker=all' in c for c in ssh_lines(cmds))
  archive, scp, unpack = map(' '.join, cmds[1:4])  # after create: the same commit throughout
  assert f'archive --format=tar.gz -o /tmp/roformer-{sha}.tar.gz {sha}' in archive
  assert f'/tmp/roformer-{sha}.tar.gz rope: --worker=all' in scp
  assert f'echo {sha} > ~/roformer-jax/COMMIT' in unpack


def test_queued_v4(repo, path_without_gcloud):
  path, _ = repo
  create = tpu(path_without_gcloud, 'create', *NAME, '--accelerator_type=v4-32', '--queued',
               '--spot', '--dry_run')
  assert commands(create) == [[
      'gcloud', 'compute', 'tpus', 'queued-resources', 'create', 'rope', '--node-id=rope',
      '--accelerator-type=v4-32', '--runtime-version=tpu-ubuntu2204-base', '--spot',
      '--zone=us-central2-b']]
  everything = tpu(path_without_gcloud, 'all', *NAME, '--accelerator_type=v4-32', '--queued',
                   '--workdir=gs://bucket/run', f'--repo={path}', '--dry_run').stdout
  assert 'queued-resources describe rope' in everything  # waits for ACTIVE before copying
  delete = tpu(path_without_gcloud, 'delete', *NAME, '--queued', '--project=p', '--dry_run')
  assert 'queued-resources delete rope --force --quiet' in delete.stdout
  assert '--project=p' in delete.stdout
  single = tpu(path_without_gcloud, 'delete', *NAME, '--dry_run')
  assert 'tpu-vm delete rope --quiet' in single.stdout


def test_multi_slice_v5p(repo, path_without_gcloud):
  path, sha = repo
  result = tpu(path_without_gcloud, 'all', *NAME, '--accelerator_type=v5p-16', '--num_slices=2',
               '--workdir=gs://bucket/run', f'--repo={path}', '--dry_run', '--', OVERRIDE)
  cmds, out = commands(result), result.stdout
  for phrase in ('queued-resources create rope', '--node-count=2', '--node-prefix=rope',
                 '--runtime-version=v2-alpha-tpuv5', 'train.py', '--workdir=gs://bucket/run'):
    assert phrase in out, phrase
  assert '--node-id' not in out
  ssh = ssh_lines(cmds)
  assert all('--worker=all' in c for c in ssh)
  # Every step on every slice's node.
  assert sorted(c[5] for c in ssh) == ['rope-0'] * 3 + ['rope-1'] * 3
  assert sum(f'rope-{i}:' in c for c in cmds for i in (0, 1)) == 2  # scp
  assert out.count(sha) >= 5
  delete = tpu(path_without_gcloud, 'delete', *NAME, '--num_slices=2', '--dry_run')
  assert 'queued-resources delete rope --force' in delete.stdout
  logs = tpu(path_without_gcloud, 'logs', *NAME, '--num_slices=2', '--slice=1', '--worker=3',
             '--workdir=gs://bucket/run', '--dry_run')
  assert 'tpu-vm ssh rope-1 --worker=3' in logs.stdout and 'tail -n +1 -f' in logs.stdout


def test_user_errors(repo, path_without_gcloud):
  path, _ = repo
  cases = [
      (('create', '--accelerator_type=v9-8'), "'v9-8'"),
      (('run', '--workdir=runs/x'), 'relative'),
      (('run',), '--workdir'),
      (('install', '--', OVERRIDE), 'train.py'),
  ]
  for argv, phrase in cases:
    result = tpu(path_without_gcloud, *argv[:1], *NAME, f'--repo={path}', *argv[1:], '--dry_run')
    assert result.returncode == 2, argv
    assert phrase in result.stderr and result.stderr.count('\n') == 1, result.stderr
    assert result.stdout == '', argv  # refused before anything is printed or run


def test_dirty_tree_refused(tmp_path, path_without_gcloud):
  path, sha = _make_repo(tmp_path / 'dirty')
  (path / 'notes.txt').write_text('uncommitted\n')
  refused = tpu(path_without_gcloud, 'copy', *NAME, f'--repo={path}', '--dry_run')
  assert refused.returncode == 2 and 'uncommitted' in refused.stderr
  assert '--allow_dirty' in refused.stderr and refused.stdout == ''
  allowed = tpu(path_without_gcloud, 'copy', *NAME, f'--repo={path}', '--allow_dirty',
                '--dry_run')
  assert allowed.returncode == 0 and sha in allowed.stdout


def _worker_bin(tmp_path):
  """A worker's PATH: the shell tools, python3 that takes 2 s, prints its arguments and fails,
  and gcloud that records its arguments."""
  bin_dir = tmp_path / 'worker-bin'
  bin_dir.mkdir()
  for tool in ('bash', 'mkdir', 'cat', 'hostname', 'nohup', 'sleep'):
    os.symlink(shutil.which(tool), bin_dir / tool)
  (bin_dir / 'python3').write_text('#!/bin/sh\nsleep 2; echo "train $*"; echo oops >&2; exit 3\n')
  (bin_dir / 'gcloud').write_text('#!/bin/sh\necho "$*" >> "$HOME/gcloud.calls"\n')
  for stub in ('python3', 'gcloud'):
    os.chmod(bin_dir / stub, 0o755)
  return str(bin_dir)


def _on_worker(command, home, bin_dir):
  (home / 'roformer-jax').mkdir(parents=True)
  (home / 'roformer-jax' / 'COMMIT').write_text('abc\n')
  return subprocess.run(['bash', '-c', command], env={'HOME': str(home), 'PATH': bin_dir},
                        capture_output=True, text=True, timeout=30)


def _wait_for(path, phrase=''):
  for _ in range(200):
    if path.exists() and phrase in path.read_text() and path.read_text():
      return path.read_text()
    time.sleep(0.1)
  raise AssertionError(f'{path} never written')


@pytest.mark.parametrize('workdir', ['gs://bucket/run', '~/runs/a b'])
def test_run_detaches_and_keeps_the_log(tmp_path, path_without_gcloud, workdir):
  result = tpu(path_without_gcloud, 'run', *NAME, f'--workdir={workdir}', '--dry_run', '--',
               OVERRIDE)
  (ssh,) = ssh_lines(commands(result))
  command = next(a for a in ssh if a.startswith('--command='))[len('--command='):]
  home = tmp_path / 'home'
  start = time.monotonic()
  started = _on_worker(command, home, _worker_bin(tmp_path))
  # Back before train.py ends, holding no pipe of the session: the job outlives it.
  assert time.monotonic() - start < 2
  assert started.returncode == 0 and 'train.py started (COMMIT abc)' in started.stdout
  host = subprocess.run(['hostname'], capture_output=True, text=True).stdout.strip()
  if workdir.startswith('gs://'):
    log = home / 'roformer-jax' / 'logs' / f'worker-{host}.log'
    calls = _wait_for(home / 'gcloud.calls')  # after train.py ended (status 3)
    assert calls.strip() == f'storage cp {log} gs://bucket/run/logs/'
  else:
    log = home / 'runs' / 'a b' / 'logs' / f'worker-{host}.log'
    _wait_for(log, 'oops')
  expected = workdir.replace('~', str(home))
  text = log.read_text()
  assert f'train train.py --config=configs/default.py --workdir={expected} {OVERRIDE}' in text
  assert 'oops' in text  # stderr too
