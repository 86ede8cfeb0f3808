"""Kill -9 soak: SIGKILL a training run at random moments, resume it each time, and check that it
ends exactly where an uninterrupted run of the same seed ends.

  python scripts/soak.py --kills=20                     # the full soak (a few minutes on 2 cores)
  python scripts/soak.py --kills=3 --steps=40           # the short version the test suite runs

The default intervals (checkpoint every 5 steps, evaluation every 7, train records every 3) do
not divide each other, so most resumes start between two log steps, inside an averaging window
(``unaligned_resumes`` in the summary counts them).

It trains the tiny preset (``configs/tiny.py``, dropout on so that the dropout keys must resume
too) through the real command line, ``train.py``:

1. a reference run, start to end without interruption (workdir ``<root>/reference``);
2. the soak run (``<root>/soak``), started again after every kill. Kills cycle through three
   moments: ``save`` (as soon as a checkpoint is being written: orbax's temporary directory or
   a checkpoint without its manifest is on disk), ``training`` (a random time after the first
   step line) and ``startup`` (a random time before the first step: imports, restore, cutting
   the metrics back, compilation). A run that finishes before its kill ends the kills;
3. a last start that runs to the end.

Before every start it lists the intact checkpoints (complete and matching their manifests); the
step the start says it resumed from must be the newest of them, so a partially written
checkpoint is never restored. At the end, ``metrics.jsonl`` of both runs must be byte-identical,
and the final checkpoints' states (parameters, optimizer state, step, dropout key) bitwise equal.
Prints a JSON summary (also ``<root>/soak.json``); the exit status is 0 only if all checks pass.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODES = ('save', 'training', 'startup')
_RESUMED = re.compile(r'Resumed from step (\d+)')
_STEP = re.compile(r'step (\d+)/(\d+)')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
  parser.add_argument('--kills', type=int, default=20, help='SIGKILLs to deliver.')
  parser.add_argument('--steps', type=int, default=200, help='train.num_steps.')
  parser.add_argument('--checkpoint_every', type=int, default=5, help='train.checkpoint_every.')
  parser.add_argument('--eval_every', type=int, default=7, help='train.eval_every.')
  parser.add_argument('--log_every', type=int, default=3, help='train.log_every.')
  parser.add_argument('--seed', type=int, default=0, help='Seed of the kill moments.')
  parser.add_argument('--root', default=None, help='Directory for both workdirs (default: a '
                      'new temporary directory, deleted at the end unless --keep).')
  parser.add_argument('--dataset', default='files',
                      help="data.name: 'files' (a generated CSV) or an embedded dataset.")
  parser.add_argument('--data_dir', default=None,
                      help='TFDS data_dir (default: <root>/tfds; embedded data is generated there).')
  parser.add_argument('--keep', action='store_true', help='Keep --root at the end.')
  parser.add_argument('--timeout', type=float, default=600, help='Seconds allowed per start.')
  return parser.parse_args(argv)


def write_dataset(path: str, num: int = 1200) -> None:
  """A small text-classification CSV: random words, 3 classes (learnability is irrelevant)."""
  rng = random.Random(0)
  words = ['alpha', 'beta', 'gamma', 'delta', 'kappa', 'sigma', 'omega', 'zeta']
  with open(path, 'w') as f:
    f.write('text,label\n')
    for _ in range(num):
      text = ' '.join(rng.choice(words) for _ in range(rng.randint(3, 12)))
      f.write(f'{text},{text.count("a") % 3}\n')


def train_command(args: argparse.Namespace, workdir: str) -> list[str]:
  data = [f'--config.data.name={args.dataset}']
  if args.dataset == 'files':
    data.append(f'--config.data.train_files={os.path.join(args.root, "train.csv")}')
  return [sys.executable, os.path.join(ROOT, 'train.py'), '--config=configs/tiny.py',
          f'--workdir={workdir}', f'--config.data.data_dir={args.data_dir}', *data,
          f'--config.train.num_steps={args.steps}',
          f'--config.train.checkpoint_every={args.checkpoint_every}',
          f'--config.train.eval_every={args.eval_every}', f'--config.train.log_every={args.log_every}',
          '--config.train.keep_checkpoints=2', '--config.model.dropout_rate=0.1',
          f'--config.train.compilation_cache_dir={os.path.join(args.root, "xla_cache")}']


def intact_steps(workdir: str) -> list[int]:
  """Complete checkpoints that match their manifests (or have none yet), ascending."""
  from training import checkpoints  # pylint: disable=g-import-not-at-top
  directory = os.path.join(workdir, checkpoints.CHECKPOINT_DIR)
  if not os.path.isdir(directory):
    return []
  steps = sorted(int(n) for n in os.listdir(directory) if n.isdigit())
  return [s for s in steps if checkpoints.verify(os.path.join(directory, str(s))) is None]


def checkpoint_entries(workdir: str) -> set[str]:
  """Names in the checkpoints directory that show a save in progress: orbax's temporary
  directories, and complete checkpoints whose manifest is not written yet."""
  from training import checkpoints  # pylint: disable=g-import-not-at-top
  directory = os.path.join(workdir, checkpoints.CHECKPOINT_DIR)
  try:
    names = os.listdir(directory)
  except FileNotFoundError:
    return set()
  return {name for name in names if 'tmp' in name or (name.isdigit() and not os.path.exists(
      os.path.join(directory, name, checkpoints.MANIFEST_FILE)))}


def _read(path: str) -> str:
  with open(path, errors='replace') as f:
    return f.read()


class Start:
  """One start of train.py, its output in a log file."""

  def __init__(self, args: argparse.Namespace, workdir: str, log: str):
    self.log = log
    self.t0 = time.monotonic()
    self.first_step_s = None  # when the first step line appeared (seconds after the start)
    with open(log, 'w') as out:
      self.proc = subprocess.Popen(train_command(args, workdir), cwd=ROOT, stdout=out,
                                   stderr=subprocess.STDOUT)

  def output(self) -> str:
    return _read(self.log)

  def last_step(self) -> int | None:
    steps = _STEP.findall(self.output())
    return int(steps[-1][0]) if steps else None

  def resumed_from(self) -> int:
    m = _RESUMED.search(self.output())
    return int(m.group(1)) if m else 0

  def kill(self) -> None:
    self.proc.send_signal(signal.SIGKILL)
    self.proc.wait()


def wait_for(start: Start, condition, timeout: float) -> bool:
  """Polls ``condition`` every 2 ms until it holds (True) or the process ends (False); notes
  when the first step line appears."""
  deadline = time.monotonic() + timeout
  polls = 0
  while time.monotonic() < deadline:
    if start.first_step_s is None and polls % 25 == 0 and start.last_step() is not None:
      start.first_step_s = time.monotonic() - start.t0
    polls += 1
    if condition():
      return True
    if start.proc.poll() is not None:
      return False
    time.sleep(0.002)
  raise TimeoutError(f'train.py did not reach the kill point in {timeout:.0f}s; see {start.log}')


def final_states_equal(reference: str, soak: str, step: int) -> tuple[bool, int]:
  """Restores both workdirs' checkpoint ``step`` (as saved, no model needed) and compares every
  array bitwise: parameters, optimizer state, step counter, dropout keys."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from training import checkpoints  # pylint: disable=g-import-not-at-top
  states = []
  for workdir in (reference, soak):
    step_dir = os.path.join(workdir, checkpoints.CHECKPOINT_DIR, str(step))
    assert checkpoints.verify(step_dir) is None, step_dir
    with ocp.StandardCheckpointer() as checkpointer:
      states.append(jax.tree.map(np.asarray, checkpointer.restore(
          os.path.join(step_dir, checkpoints.STATE_ITEM))))
  (paths_a, leaves_a), (paths_b, leaves_b) = (
      zip(*jax.tree_util.tree_flatten_with_path(s)[0]) for s in states)
  same = paths_a == paths_b and all(
      a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
      for a, b in zip(leaves_a, leaves_b))
  return same, len(leaves_a)


def run(args: argparse.Namespace) -> dict:
  rng = random.Random(args.seed)
  os.makedirs(args.root, exist_ok=True)
  args.data_dir = args.data_dir or os.path.join(args.root, 'tfds')
  reference, soak = os.path.join(args.root, 'reference'), os.path.join(args.root, 'soak')
  logs = os.path.join(args.root, 'logs')
  for path in (reference, soak, logs):
    shutil.rmtree(path, ignore_errors=True)
  os.makedirs(logs)
  t_start = time.monotonic()

  write_dataset(os.path.join(args.root, 'train.csv'))

  # 1. The reference run (also prepares the data and fills the compilation cache).
  ref = Start(args, reference, os.path.join(logs, 'reference.log'))
  wait_for(ref, lambda: ref.last_step() is not None, args.timeout)
  first_step_s = time.monotonic() - ref.t0
  wait_for(ref, lambda: ref.last_step() == args.steps, args.timeout)
  training_s = time.monotonic() - ref.t0 - first_step_s
  if ref.proc.wait(timeout=args.timeout) != 0:
    raise RuntimeError(f'The reference run failed; see {ref.log}:\n{ref.output()[-3000:]}')
  reference_s = time.monotonic() - ref.t0
  # Kills after the first step line wait up to 2/kills of the training time, so that the run
  # advances about 1/kills of the way per kill and is still running at the last one.
  training_window_s = max(training_s, 0.1) * 2 / max(args.kills, 1)
  startup_s = [first_step_s]  # times to the first step line; later starts hit the XLA cache

  # 2. Kills.
  events, problems = [], []
  finished = False
  for i in range(args.kills):
    mode = MODES[i % len(MODES)]
    before = intact_steps(soak)
    leftovers = checkpoint_entries(soak)  # from the previous kill, not this start's saves
    save_in_progress = lambda: bool(checkpoint_entries(soak) - leftovers)  # pylint: disable=cell-var-from-loop
    start = Start(args, soak, os.path.join(logs, f'start_{i:02d}.log'))
    if mode == 'save':
      reached = wait_for(start, save_in_progress, args.timeout)
      if reached:
        time.sleep(rng.uniform(0, 0.05))
    elif mode == 'training':
      reached = wait_for(start, lambda: start.last_step() is not None, args.timeout)
      if reached:
        time.sleep(rng.uniform(0, training_window_s))
    else:  # before the first step: the start-up of the previous starts (compilation cached)
      delay = rng.uniform(0, min(startup_s))
      reached = wait_for(start, lambda: time.monotonic() - start.t0 >= delay, args.timeout)
    during_save = save_in_progress()
    if start.proc.poll() is None:
      start.kill()
      killed = True
    else:
      killed = False
    event = {'start': i, 'mode': mode, 'killed': killed,
             'at_s': round(time.monotonic() - start.t0, 2), 'intact_before': before,
             'resumed_from': start.resumed_from(), 'last_step_printed': start.last_step(),
             'checkpoint_being_written': during_save, 'intact_after': intact_steps(soak)}
    if 'Resumed from step' in start.output() and event['resumed_from'] != (before or [0])[-1]:
      problems.append(f'start {i} resumed from {event["resumed_from"]}, not from the newest '
                      f'intact checkpoint ({before[-1] if before else "none"})')
    if 'corrupt' in start.output():
      problems.append(f'start {i} reported a corrupt checkpoint after a kill: see {start.log}')
    events.append(event)
    if start.first_step_s is not None:
      startup_s.append(start.first_step_s)
    if not killed:
      if start.proc.returncode != 0:
        problems.append(f'start {i} failed with status {start.proc.returncode}; see {start.log}')
      finished = True
      break

  # 3. The last start runs to the end.
  before = intact_steps(soak)
  last = Start(args, soak, os.path.join(logs, 'final.log'))
  status = last.proc.wait(timeout=args.timeout)
  if status != 0:
    problems.append(f'the final start failed with status {status}; see {last.log}:\n'
                    f'{last.output()[-2000:]}')
  if before and last.resumed_from() != before[-1]:
    problems.append(f'the final start resumed from {last.resumed_from()}, not {before[-1]}')

  metrics_identical = (_read(os.path.join(reference, 'metrics.jsonl'))
                       == _read(os.path.join(soak, 'metrics.jsonl')))
  states_identical, num_arrays = (final_states_equal(reference, soak, args.steps)
                                  if status == 0 else (False, 0))
  kills = sum(e['killed'] for e in events)
  summary = {
      'kills': kills,
      'kills_during_checkpoint_writes': sum(e['killed'] and e['checkpoint_being_written']
                                            for e in events),
      'kills_by_mode': {m: sum(e['killed'] and e['mode'] == m for e in events) for m in MODES},
      'resumes': sum('Resumed from step' in _read(os.path.join(logs, f'start_{e["start"]:02d}.log'))
                     for e in events) + ('Resumed from step' in last.output()),
      'resumed_from_steps': [e['resumed_from'] for e in events] + [last.resumed_from()],
      'unaligned_resumes': sum(bool(s % args.log_every) for s in
                               [e['resumed_from'] for e in events] + [last.resumed_from()]),
      'finished_before_all_kills': finished,
      'metrics_identical': metrics_identical,
      'final_state_identical': states_identical,
      'arrays_compared': num_arrays,
      'problems': problems,
      'num_steps': args.steps,
      'reference_run_s': round(reference_s, 1),
      'reference_training_s': round(training_s, 1),
      'wall_s': round(time.monotonic() - t_start, 1),
      'events': events,
  }
  summary['ok'] = metrics_identical and states_identical and not problems
  with open(os.path.join(args.root, 'soak.json'), 'w') as f:
    json.dump(summary, f, indent=1)
  return summary


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  temporary = args.root is None
  args.root = args.root or tempfile.mkdtemp(prefix='soak_')
  try:
    summary = run(args)
  finally:
    if temporary and not args.keep:
      shutil.rmtree(args.root, ignore_errors=True)
  brief = {k: v for k, v in summary.items() if k != 'events'}
  print(json.dumps(brief, indent=1))
  for e in summary['events']:
    print(f"start {e['start']:2d}  {e['mode']:<8s} killed={e['killed']!s:<5s} "
          f"at {e['at_s']:6.2f}s  resumed from {e['resumed_from']:4d}  "
          f"last step printed {e['last_step_printed']}  writing a checkpoint: "
          f"{e['checkpoint_being_written']}  intact after: {e['intact_after']}")
  print('OK: identical to the uninterrupted run' if summary['ok'] else 'FAILED')
  return 0 if summary['ok'] else 1


if __name__ == '__main__':
  sys.exit(main())
