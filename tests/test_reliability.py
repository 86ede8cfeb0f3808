"""Faults a run must survive (docs/reliability.md): kill -9 at any moment, corrupt checkpoints, a
full disk, a second run on the same workdir, NaN/Inf, and determinism; plus bad data that must be
handled, metrics files cut short, and what is never loaded with pickle."""

import errno
import fcntl
import glob
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from data import datasets
from experiments import cli
from helpers import entry
from training import checkpoints, metrics, trainer, validation
from training.config import run_config as typed
from training.experiment import Experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def no_network(monkeypatch):
  """Any attempt to open a network connection fails the test."""

  def refuse(*args, **kwargs):
    raise AssertionError(f'network access attempted: {args[:2]}')

  monkeypatch.setattr(socket.socket, 'connect', refuse)
  monkeypatch.setattr(socket, 'create_connection', refuse)


@pytest.fixture(scope='module')
def files_config(run_config, csv_file):
  """``files_config(**overrides)``: the tiny run config on the module's CSV file."""
  return lambda **overrides: run_config(**{'data.name': 'files', 'data.train_files': csv_file,
                                           **overrides})


def state_of(workdir, step):
  exp = Experiment(validation.load_config(workdir), workdir)
  ckpt = checkpoints.Checkpointer(workdir, 5, read_only=True)
  return jax.tree.map(np.asarray, ckpt.restore(step, exp.abstract_with_shardings()))


def assert_states_equal(a, b):
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b)
  for x, y in zip(leaves_a, leaves_b):
    assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def tree_hashes(path):
  out = {}
  for root, _, names in os.walk(path):
    for name in names:
      with open(os.path.join(root, name), 'rb') as f:
        out[os.path.relpath(os.path.join(root, name), path)] = hashlib.sha256(
            f.read()).hexdigest()
  return out


def largest_file(step_dir):
  files = [f for f in glob.glob(os.path.join(step_dir, '**'), recursive=True)
           if os.path.isfile(f) and not f.endswith(checkpoints.MANIFEST_FILE)]
  return max(files, key=os.path.getsize)


# ------------------------------------------------------------------------------------ kill -9
@pytest.mark.slow  # ~90 s; kill -9 and bitwise resume also: test_cli_errors, test_training, GCS
def test_kill9_soak_short(tmp_path):
  """scripts/soak.py with 3 kills (save, training, start-up): bitwise the same end state and
  metrics as an uninterrupted run in another process (so also: determinism across processes),
  with checkpoint, evaluation and log intervals that do not divide each other."""
  proc = subprocess.run(
      [sys.executable, 'scripts/soak.py', '--kills=3', '--steps=24', '--checkpoint_every=5',
       '--eval_every=7', '--log_every=3', f'--root={tmp_path / "soak"}'],
      cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
  with open(tmp_path / 'soak' / 'soak.json') as f:
    summary = json.load(f)
  assert summary['metrics_identical'] and summary['final_state_identical']
  assert summary['kills'] >= 2 and not summary['problems']
  assert summary['resumes'] >= 1


# ------------------------------------------------------------------------ corrupt checkpoints
@pytest.fixture(scope='module')
def two_checkpoints(tmp_path_factory, files_config):
  """A tiny run with checkpoints 10 and 20, its final state and metrics (copied by tests)."""
  workdir = str(tmp_path_factory.mktemp('corrupt') / 'run')
  trainer.train_and_evaluate(files_config(), workdir)
  with open(os.path.join(workdir, metrics.METRICS_FILE)) as f:
    return workdir, state_of(workdir, 20), f.read()


def test_truncated_checkpoint_is_detected_and_run_resumes(files_config, tmp_path, two_checkpoints,
                                                         no_network, capfd):
  original, final_state, metrics_text = two_checkpoints
  workdir = str(tmp_path / 'run')
  shutil.copytree(original, workdir)
  victim = largest_file(os.path.join(workdir, 'checkpoints', '20'))
  with open(victim, 'r+b') as f:
    f.truncate(os.path.getsize(victim) // 2)
  capfd.readouterr()
  trainer.train_and_evaluate(files_config(), workdir)
  err = capfd.readouterr().err
  assert re.search(r'Checkpoint 20 is corrupt \(the file .* has \d+ bytes instead of \d+ '
                   r'\(truncated\?\)\); trying the previous one', err), err
  assert 'Resuming from checkpoint 10, the newest intact one' in err
  assert os.path.isdir(os.path.join(workdir, checkpoints.CORRUPT_DIR, '20'))  # kept, set aside
  # Resumed from 10 and ended exactly where the uninterrupted run ended.
  assert_states_equal(state_of(workdir, 20), final_state)
  with open(os.path.join(workdir, metrics.METRICS_FILE)) as f:
    assert f.read() == metrics_text


def test_garbled_checkpoint_metrics_are_set_aside(files_config, tmp_path, two_checkpoints, capfd):
  """orbax reads every step's metrics when it opens the checkpoints: a garbled metrics file of
  the newest one is set aside by its manifest (was orbax's JSON error), and the run resumes from
  the previous checkpoint and ends exactly as the uninterrupted run."""
  original, final_state, metrics_text = two_checkpoints
  workdir = str(tmp_path / 'run')
  shutil.copytree(original, workdir)
  with open(os.path.join(workdir, 'checkpoints', '20', 'metrics', 'metrics'), 'r+b') as f:
    f.write(b'\x00garbled')
  capfd.readouterr()
  trainer.train_and_evaluate(files_config(), workdir)
  assert 'Moved the corrupt checkpoint 20' in capfd.readouterr().err
  assert os.path.isdir(os.path.join(workdir, checkpoints.CORRUPT_DIR, '20'))
  assert_states_equal(state_of(workdir, 20), final_state)
  with open(os.path.join(workdir, metrics.METRICS_FILE)) as f:
    assert f.read() == metrics_text


def test_garbled_metrics_in_every_checkpoint_move_nothing(files_config, tmp_path,
                                                           two_checkpoints):
  """With every step's metrics garbled there is no intact checkpoint: the start stops and moves
  nothing (it must not set them all aside and train again from step 0)."""
  original, _, _ = two_checkpoints
  workdir = str(tmp_path / 'run')
  shutil.copytree(original, workdir)
  for step in ('10', '20'):
    with open(os.path.join(workdir, 'checkpoints', step, 'metrics', 'metrics'), 'r+b') as f:
      f.write(b'\x00garbled')
  with pytest.raises(checkpoints.NoIntactCheckpointError, match='Nothing was changed'):
    trainer.train_and_evaluate(files_config(), workdir)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['10', '20']
  assert not os.path.exists(os.path.join(workdir, checkpoints.CORRUPT_DIR))


def test_outputs_protect_inputs_and_run_files_only(tmp_path, monkeypatch):
  """training/outputs.check: the input (by name, link or ~), the run's own files and folders and
  existing folders are refused; a user's own new file in the workdir may be written, twice."""
  from training import outputs  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('HOME', str(tmp_path))
  run_dir, source = tmp_path / 'run', tmp_path / 'in.txt'
  (run_dir / 'checkpoints').mkdir(parents=True)
  (run_dir / 'config.json').write_text('{}')
  source.write_text('text\n')
  os.symlink(source, tmp_path / 'link.txt')
  for bad, phrase in ((str(source), 'is the input'), ('~/in.txt', 'is the input'),
                      (str(tmp_path / 'link.txt'), 'is the input'),
                      (str(run_dir / 'config.json'), 'a file of the run'),
                      (str(run_dir / 'summary.json'), 'a file of the run'),
                      (str(run_dir / 'checkpoints' / 'x'), 'inside checkpoints/'),
                      (str(run_dir), 'is a folder')):
    with pytest.raises(ValueError, match=phrase):
      outputs.check([bad], '--output', inputs=[str(source)], workdir=str(run_dir))
  mine = run_dir / 'predictions.jsonl'
  for _ in range(2):
    outputs.check([str(mine)], '--output', inputs=[str(source)], workdir=str(run_dir))
    mine.write_text('{}\n')


def test_garbled_partial_and_unmanifested_checkpoints(files_config, tmp_path, two_checkpoints):
  original, final_state, _ = two_checkpoints
  config = files_config()
  exp = Experiment(config, original)
  abstract = exp.abstract_with_shardings()

  # A garbled file (same size) in the newest checkpoint: found by its checksum.
  workdir = str(tmp_path / 'garbled')
  shutil.copytree(original, workdir)
  victim = largest_file(os.path.join(workdir, 'checkpoints', '20'))
  with open(victim, 'r+b') as f:
    f.seek(os.path.getsize(victim) // 2)
    f.write(b'\x00garbage\xff' * 8)
  step, _ = checkpoints.Checkpointer(workdir, 2).restore_latest(abstract)
  assert step == 10
  assert os.listdir(os.path.join(workdir, checkpoints.CORRUPT_DIR)) == ['20']

  # An interrupted save (orbax's temporary directory) and a half-deleted step are never restored;
  # a checkpoint whose manifest was not written yet (killed right after the save) is.
  workdir = str(tmp_path / 'partial')
  shutil.copytree(original, workdir)
  ckpt_dir = os.path.join(workdir, 'checkpoints')
  shutil.copytree(os.path.join(ckpt_dir, '20'), os.path.join(ckpt_dir, '30.orbax-checkpoint-tmp-1'))
  shutil.copytree(os.path.join(ckpt_dir, '20'), os.path.join(ckpt_dir, '40'))
  os.remove(largest_file(os.path.join(ckpt_dir, '40')))
  os.remove(os.path.join(ckpt_dir, '20', checkpoints.MANIFEST_FILE))
  ckpt = checkpoints.Checkpointer(workdir, 2)
  assert ckpt.all_steps() == [10, 20, 40]
  step, state = ckpt.restore_latest(abstract)
  assert step == 20 and 40 in ckpt.skipped
  assert_states_equal(jax.tree.map(np.asarray, state), final_state)

  # A manifest-less checkpoint that orbax reads but whose floats are NaN/Inf (garbled bytes) is
  # corrupt too; the intact one before it gets its manifest rewritten.
  workdir = str(tmp_path / 'nan_unmanifested')
  shutil.copytree(original, workdir)
  ckpt = checkpoints.Checkpointer(workdir, 5)
  bad = jax.tree.map(lambda x: x * np.nan if np.issubdtype(x.dtype, np.floating) else x,
                     ckpt.restore(20, abstract))
  ckpt.save(30, bad)
  ckpt.close()
  os.remove(os.path.join(workdir, 'checkpoints', '30', checkpoints.MANIFEST_FILE))
  os.remove(os.path.join(workdir, 'checkpoints', '20', checkpoints.MANIFEST_FILE))
  ckpt = checkpoints.Checkpointer(workdir, 5)
  step, _ = ckpt.restore_latest(abstract)
  assert step == 20 and 'NaN/Inf' in ckpt.skipped[30]
  assert os.path.exists(os.path.join(workdir, 'checkpoints', '20', checkpoints.MANIFEST_FILE))
  ckpt.close()

  # None intact: a clear error, and nothing is moved or changed.
  workdir = str(tmp_path / 'none')
  shutil.copytree(original, workdir)
  for step in (10, 20):
    victim = largest_file(os.path.join(workdir, 'checkpoints', str(step)))
    with open(victim, 'r+b') as f:
      f.truncate(10)
  before = tree_hashes(workdir)
  with pytest.raises(checkpoints.NoIntactCheckpointError,
                     match=r'No intact checkpoint in .*step 10: the file .*step 20: .*Nothing was '
                           r'changed'):
    checkpoints.Checkpointer(workdir, 2).restore_latest(abstract)
  assert tree_hashes(workdir) == before

  # A checkpoint of another model: the differing arrays are named, not a shape error.
  other = Experiment(files_config(**{'model.hidden_size': 32}), original)
  with pytest.raises(checkpoints.CheckpointMismatchError,
                     match=r'different model or run config: \d+ arrays differ \(.*params/'):
    checkpoints.Checkpointer(original, 2, read_only=True).restore(
        20, other.abstract_with_shardings())


# ----------------------------------------------------------------------------------- disk full
def test_disk_full_while_saving(files_config, tmp_path, monkeypatch, no_network):
  """Writes fail with a real error (a file-size limit: EFBIG, as ENOSPC would) while checkpoint
  20 is saved: a clear error; checkpoint 10 stays intact and the rerun resumes from it."""
  workdir = str(tmp_path / 'run')
  real_save = checkpoints.Checkpointer.save
  limits = resource.getrlimit(resource.RLIMIT_FSIZE)
  previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

  def save(self, step, state, accuracy=None, train_log=None):
    if step == 20:
      resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, limits[1]))
    return real_save(self, step, state, accuracy, train_log)

  monkeypatch.setattr(checkpoints.Checkpointer, 'save', save)
  try:
    with pytest.raises(checkpoints.CheckpointSaveError,
                       match=r'Could not write the checkpoint of step 20 in .*full disk.*rerun '
                             r'the same command, which resumes from the newest intact '
                             r'checkpoint \(10\). The earlier checkpoints were not changed'):
      trainer.train_and_evaluate(files_config(), workdir)
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    signal.signal(signal.SIGXFSZ, previous_handler)
  monkeypatch.setattr(checkpoints.Checkpointer, 'save', real_save)
  ckpt_dir = os.path.join(workdir, 'checkpoints')
  assert checkpoints.Checkpointer(workdir, 2).all_steps() == [10]
  assert checkpoints.verify(os.path.join(ckpt_dir, '10')) is None
  assert os.path.exists(os.path.join(ckpt_dir, '10', checkpoints.MANIFEST_FILE))
  # With space again, the same command resumes from 10 and finishes.
  summary = trainer.train_and_evaluate(files_config(), workdir)
  assert summary['num_steps'] == 20
  assert checkpoints.Checkpointer(workdir, 2).all_steps() == [10, 20]
  assert not [n for n in os.listdir(ckpt_dir) if 'tmp' in n]  # the failed save's leftovers


ENOSPC_SCRIPT = r"""
set -e
mount -t tmpfs -o size=64m tmpfs "$MNT"
run() { python train.py --config=configs/tiny.py --workdir="$MNT/run" --config.data.name=files \
          --config.data.train_files="$CSV" "$@"; }
run --config.train.num_steps=10 > "$OUT/first.log" 2>&1
avail=$(df --output=avail -k "$MNT" | tail -1)
dd if=/dev/zero of="$MNT/filler" bs=1k count=$((avail - 300)) 2> /dev/null || true
set +e
run > "$OUT/full.log" 2>&1
echo $? > "$OUT/full.status"
set -e
ls "$MNT/run/checkpoints" > "$OUT/after_full.txt"
python -c "from training import checkpoints as c; print(c.verify('$MNT/run/checkpoints/10'))" \
    > "$OUT/verify.txt"
rm "$MNT/filler"
run > "$OUT/again.log" 2>&1
ls "$MNT/run/checkpoints" > "$OUT/after_again.txt"
"""


@pytest.mark.slow
def test_real_enospc_on_a_full_tmpfs(tmp_path, csv_file):
  """A real full disk (a 64 MB tmpfs in a private mount namespace; needs root): train.py
  exits 2 saying so, checkpoint 10 stays intact, and the rerun resumes from it."""
  if shutil.which('unshare') is None or subprocess.run(
      ['unshare', '-m', 'true'], capture_output=True).returncode != 0:
    pytest.skip('needs unshare -m (root) to mount a small tmpfs')
  mnt, out = tmp_path / 'mnt', tmp_path / 'out'
  mnt.mkdir()
  out.mkdir()
  env = dict(os.environ, MNT=str(mnt), OUT=str(out), CSV=csv_file)
  proc = subprocess.run(['unshare', '-m', 'bash', '-c', ENOSPC_SCRIPT], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (out / 'full.status').read_text().strip() == '2'
  full = (out / 'full.log').read_text()
  assert 'Traceback' not in full
  assert re.search(r'train.py: error: Could not write the checkpoint of step 20 .*No space left '
                   r'on device.*resumes from the newest intact checkpoint \(10\)', full), full
  assert (out / 'verify.txt').read_text().strip() == 'None'
  assert (out / 'after_again.txt').read_text().split() == ['10', '20']
  assert 'Resumed from step 10' in (out / 'again.log').read_text()


def test_cli_reports_enospc_as_one_paragraph():
  e = OSError(errno.ENOSPC, 'No space left on device', '/data/run/metrics.jsonl')
  assert isinstance(e, cli.USER_ERRORS)
  message = cli.describe(e)
  assert 'No space left on device' in message and 'free space and rerun' in message
  assert '\n' not in message


# ----------------------------------------------------------------------- one workdir, two runs
def test_second_run_on_a_workdir_refuses(tmp_path, csv_file):
  workdir = str(tmp_path / 'run')
  command = [sys.executable, 'train.py', '--config=configs/tiny.py', f'--workdir={workdir}',
             '--config.data.name=files', f'--config.data.train_files={csv_file}',
             '--config.train.num_steps=100000']
  first = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
  try:
    lock_path = os.path.join(workdir, 'lock')
    deadline = time.monotonic() + 240
    while True:  # until the first run holds the lock
      assert time.monotonic() < deadline and first.poll() is None
      if os.path.exists(lock_path):
        fd = os.open(lock_path, os.O_RDWR)
        try:
          fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
          fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
          break
        finally:
          os.close(fd)
      time.sleep(0.1)
    time.sleep(3)  # let it write config.json etc.
    first.send_signal(signal.SIGSTOP)  # frozen: the workdir cannot change under our feet
    before = tree_hashes(workdir)
    second = entry.run(command[1:])  # in this process: the lock is held by another one
    assert second.returncode == 2, second.stderr[-3000:]
    assert 'Traceback' not in second.stderr
    assert re.search(rf'train.py: error: Another run is using the workdir {re.escape(workdir)} '
                     rf'\(pid {first.pid} on host .*\).*use a different --workdir',
                     second.stderr), second.stderr[-3000:]
    assert tree_hashes(workdir) == before
  finally:
    first.send_signal(signal.SIGKILL)
    first.wait()
  # kill -9 leaves no stale lock: the kernel released it.
  fd = os.open(os.path.join(workdir, 'lock'), os.O_RDWR)
  fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  os.close(fd)


# ------------------------------------------------------------------------------------ NaN/Inf
def test_nonfinite_stops_naming_the_step_and_keeps_the_last_good_checkpoint(files_config, tmp_path,
                                                                           no_network):
  workdir = str(tmp_path / 'nan')
  # Warmup from 0: step 1 changes nothing, then the parameters overflow.
  config = files_config(**{'optim.learning_rate': 1e38, 'optim.grad_clip_norm': 0.0,
                           'optim.warmup_steps': 4, 'train.checkpoint_every': 1,
                           'train.num_steps': 6, 'train.eval_every': 6, 'train.log_every': 2})
  with pytest.raises(trainer.NonFiniteLossError, match=r'NaN/Inf at step (\d+)') as info:
    trainer.train_and_evaluate(config, workdir)
  bad_step = int(re.search(r'at step (\d+)', str(info.value)).group(1))
  ckpt = checkpoints.Checkpointer(workdir, 2, read_only=True)
  steps = ckpt.all_steps()
  assert steps and max(steps) < bad_step  # nothing at or after the bad step was saved
  assert f'(step {max(steps)}) is untouched' in str(info.value)
  for step in steps:
    assert checkpoints.verify(ckpt.step_dir(step)) is None
    assert os.path.exists(os.path.join(ckpt.step_dir(step), checkpoints.MANIFEST_FILE))
  state = state_of(workdir, max(steps))
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(state.params))

  config.train.skip_nonfinite = True  # skipped and counted instead; no NaN weights kept
  summary = trainer.train_and_evaluate(config, str(tmp_path / 'skip'))
  assert summary['skipped_updates'][0] > 0
  assert np.isfinite(summary['validation_loss']).all()
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(state_of(str(tmp_path / 'skip'),
                                                                     6).params))
  logged = [r['train/skipped_updates'] for r in metrics.read_metrics(str(tmp_path / 'skip'))
            if 'train/skipped_updates' in r]
  assert logged[-1] == summary['skipped_updates'][0]


def test_a_run_that_failed_before_any_checkpoint_leaves_the_workdir_reusable(tmp_path, csv_file):
  command = ['train.py', '--config=configs/tiny.py', f'--workdir={tmp_path / "run"}',
             '--config.data.name=files', f'--config.data.train_files={csv_file}']
  failed = entry.run([*command, '--config.optim.learning_rate=1e38',
                      '--config.optim.grad_clip_norm=0', '--config.optim.warmup_steps=0'])
  assert failed.returncode == 2 and 'NaN/Inf at step' in failed.stderr, failed.stderr[-3000:]
  again = entry.run(command)
  assert again.returncode == 0, again.stderr[-3000:]


def test_sigterm_during_start_up_saves_and_exits_0(tmp_path, csv_file):
  """Once the run holds its workdir, a SIGTERM while it prepares is honoured at the first step."""
  workdir = tmp_path / 'run'
  proc = subprocess.Popen([sys.executable, 'train.py', '--config=configs/tiny.py',
                           f'--workdir={workdir}', '--config.data.name=files',
                           f'--config.data.train_files={csv_file}'],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 120
  while not (workdir / 'lock').exists():
    assert time.monotonic() < deadline and proc.poll() is None
    time.sleep(0.05)
  time.sleep(0.3)  # inside the setup (data, model, compilation): several seconds here
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  step = int(re.search(r'Preempted: saved step (\d+)', out).group(1))
  assert checkpoints.Checkpointer(str(workdir), 2, read_only=True).all_steps() == [step]


# ------------------------------------------------------------------------------ bad user data
def test_empty_texts_and_non_utf8_bytes_are_handled(run_config, tmp_path, no_network):
  train = tmp_path / 'train.csv'
  rows = [b'text,label', b'"",a', b'"caf\xe9 \xff\xfe",b', b'plain,a', b'"\x80\x81",b']
  train.write_bytes(b'\n'.join(rows * 5) + b'\n')
  jsonl = tmp_path / 'valid.jsonl'
  jsonl.write_bytes(b'{"text": null, "label": "a"}\n{"text": "", "label": "b"}\n'
                    b'{"text": "\\ud800 lone surrogate", "label": "a"}\n')
  config = run_config(**{'data.name': 'files', 'data.train_files': str(train),
                         'data.validation_files': str(jsonl), 'train.num_steps': 4,
                                'train.eval_every': 4, 'train.checkpoint_every': 4,
                                'train.log_every': 2, 'train.batch_size': 8,
                                'train.eval_batch_size': 8, 'optim.warmup_steps': 1})
  summary = trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert np.isfinite(summary['validation_loss'][0])


def test_bad_labels_leave_no_classes_file(run_config, tmp_path):
  train = tmp_path / 'train.csv'
  train.write_text('text,label\na,0\nb,1\n')
  bad = tmp_path / 'bad.csv'
  bad.write_text('text,label\nc,7\n')
  workdir = tmp_path / 'work'
  config = run_config(**{'data.name': 'files', 'data.train_files': str(train),
                         'data.validation_files': str(bad)})
  with pytest.raises(ValueError, match=r'label 7 is outside the class range \[0, 2\)'):
    datasets.load_classifier(typed(config).data, str(workdir))
  assert not os.path.exists(workdir / 'classes.json')


# ----------------------------------------------------------------------------- metrics file
def test_metrics_with_a_cut_last_line(tmp_path):
  path = tmp_path / metrics.METRICS_FILE
  path.write_text('{"seed": 0, "step": 5, "train/loss": 0.5}\n{"seed": 0, "step": 10, "trai')
  assert [r['step'] for r in metrics.read_metrics(str(tmp_path))] == [5]
  path.write_text('{"seed": 0, "step": 5}\ngarbage\n{"seed": 0, "step": 10}\n')
  with pytest.raises(ValueError, match=r'line 2, is garbled'):
    metrics.read_metrics(str(tmp_path))


# ------------------------------------------------------------------------------------ safety
def test_nothing_is_loaded_with_pickle():
  offenders = []
  for path in glob.glob(os.path.join(ROOT, '**', '*.py'), recursive=True):
    if '/tests/' in path or '/.' in path:
      continue
    with open(path) as f:
      text = f.read()
    for pattern in (r'\bpickle\.loads?\(', r'allow_pickle\s*=\s*True', r'\bdill\b',
                    r'\bcloudpickle\b', r'torch\.load\((?![^)]*weights_only=True)'):
      if re.search(pattern, text):
        offenders.append(f'{os.path.relpath(path, ROOT)}: {pattern}')
  assert not offenders, offenders
