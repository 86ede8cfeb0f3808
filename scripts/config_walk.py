"""Follows a run's config through the library: every function of the project that receives the
config or one of its groups (the same object, or a ConfigDict holding it) while
``train_and_evaluate`` trains configs/tiny.py for a few steps. Prints the stops (distinct
functions, in the order first reached), the files they are in, and how often the walk returns to
a file it had already left: ``returns`` counts every such stop; ``returns_off_stack`` only those
whose file is not among its callers' (the config coming back to a module that had handed it on,
not to the one that is orchestrating). A group's own methods (``RunConfig.check_model``,
``ModelSettings.sizes``) are the config reading itself, not a stop: only arguments other than
``self`` count.

  python scripts/config_walk.py --workdir=/tmp/walk
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = ('scripts', 'tests', 'benchmarks')


def _watched(config) -> set[int]:
  ids = {id(config)}
  for name in ('model', 'rope', 'optim', 'data', 'train', 'mesh'):
    ids.add(id(getattr(config, name)))
  return ids


def _stack_files(frame) -> frozenset[str]:
  files = set()
  while frame is not None:
    files.add(os.path.relpath(frame.f_code.co_filename, ROOT))
    frame = frame.f_back
  return frozenset(files)


def walk(config, workdir: str) -> list[tuple[str, str, frozenset[str]]]:
  """(file, function, its callers' files) of each call that receives a watched object, in call
  order."""
  from training import trainer  # pylint: disable=import-outside-toplevel
  try:  # before the typed groups, the ConfigDict itself travelled
    from training.config import run_config  # pylint: disable=import-outside-toplevel
  except ImportError:
    run_config = lambda c: c
  calls, watched = [], set()

  def tracer(frame, event, arg):
    if event != 'call':
      return None
    path = frame.f_code.co_filename
    if not path.startswith(ROOT + os.sep):  # most calls: JAX, TensorFlow, the standard library
      return None
    rel = os.path.relpath(path, ROOT)
    if rel.split(os.sep)[0] in SKIP:
      return None
    args = frame.f_code.co_varnames[:frame.f_code.co_argcount + frame.f_code.co_kwonlyargcount]
    values = [frame.f_locals.get(a) for a in args if a != 'self']
    if any(id(v) in watched for v in values):
      calls.append((rel, frame.f_code.co_name, _stack_files(frame.f_back)))
    return None

  typed = run_config(config)
  watched |= _watched(typed) | _watched(config)
  sys.setprofile(None)
  sys.settrace(tracer)
  try:
    trainer.train_and_evaluate(typed, workdir)
  finally:
    sys.settrace(None)
  return calls


def summary(calls: list[tuple[str, str, frozenset[str]]]) -> dict[str, int]:
  first = {}
  for path, name, callers in calls:
    first.setdefault((path, name), callers)
  files, left, returns, off_stack = [], set(), 0, 0
  for (path, _), callers in first.items():
    if files and path != files[-1]:
      left.add(files[-1])
      returns += path in left
      off_stack += path in left and path not in callers
    files.append(path)
  return {'stops': len(first), 'files': len(set(files)), 'returns': returns,
          'returns_off_stack': off_stack}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', default='/tmp/config_walk')
  args = parser.parse_args()
  shutil.rmtree(args.workdir, ignore_errors=True)
  from configs import tiny  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.train.num_steps, config.train.eval_every, config.train.checkpoint_every = 4, 2, 4
  config.train.eval_max_length = 64
  calls = walk(config, args.workdir)
  for path, name in dict.fromkeys((path, name) for path, name, _ in calls):
    print(f'{path}:{name}')
  print(summary(calls))


if __name__ == '__main__':
  main()
