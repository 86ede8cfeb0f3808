"""Follows a run's config through the library: every function of the project that receives the
config or one of its groups (the same object, or a ConfigDict holding it) while
``train_and_evaluate`` trains configs/tiny.py for a few steps. Prints the stops (distinct
functions, in the order first reached), the files they are in, and how often the walk returns to
a file it had already left.

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


def walk(config, workdir: str) -> list[tuple[str, str]]:
  """(file, function) of each call that receives a watched object, in call order."""
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
    rel = os.path.relpath(path, ROOT)
    if rel.startswith('..') or rel.split(os.sep)[0] in SKIP:
      return None
    args = frame.f_code.co_varnames[:frame.f_code.co_argcount + frame.f_code.co_kwonlyargcount]
    values = [frame.f_locals.get(a) for a in args]
    if any(id(v) in watched for v in values):
      calls.append((rel, frame.f_code.co_name))
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


def summary(calls: list[tuple[str, str]]) -> dict[str, int]:
  stops = list(dict.fromkeys(calls))
  files, returns, left = [], 0, set()
  for path, _ in stops:
    if files and path != files[-1]:
      left.add(files[-1])
      returns += path in left
    files.append(path)
  return {'stops': len(stops), 'files': len(set(files)), 'returns': returns}


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
  for path, name in dict.fromkeys(calls):
    print(f'{path}:{name}')
  print(summary(calls))


if __name__ == '__main__':
  main()
