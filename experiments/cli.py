"""The entry points' error handling: ``cli.run(main)`` replaces ``absl.app.run(main)``.

A user error (a flag or config file that does not parse, ``USER_ERRORS`` from ``main``) ends the
program with status 2 and one paragraph, ``<program>: error: <message>``, without a traceback
(``--verbosity=1`` prints it too). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
import threading
import time
import traceback
from typing import Callable, NoReturn

from absl import app
from absl import flags
import ml_collections

import data  # first: its TensorFlow log defaults must precede TensorFlow's import
from training import checkpoints
from training import trainer
from training import workdir

EXIT_STATUS = 2
USER_ERRORS = (ValueError, OSError, app.UsageError, checkpoints.CheckpointError,
               workdir.WorkdirBusyError, trainer.NonFiniteLossError)
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}
_LINGER_S = 10.0  # how long an exit waits for the threads still running


def _program() -> str:
  return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else 'python'


def _print_error(message: object) -> None:
  if isinstance(message, BaseException):
    message = describe(message)
  sys.stdout.flush()
  print(f'{_program()}: error: {" ".join(str(message).split())}', file=sys.stderr, flush=True)


def fail(message: object) -> NoReturn:
  """Prints ``<program>: error: <message>`` (one paragraph) on stderr and exits with status 2."""
  _print_error(message)
  sys.exit(EXIT_STATUS)


def _exit(status: int) -> NoReturn:
  """Exits within _LINGER_S even when a library's threads still run (after a failed save on
  gs://, orbax's wait 5 minutes for a step folder that was never made)."""
  lingering = [t for t in threading.enumerate()
               if t is not threading.current_thread() and not t.daemon]
  deadline = time.monotonic() + _LINGER_S
  # Polled, not joined: orbax's threads raise from join() once its timeout passes.
  while any(t.is_alive() for t in lingering) and time.monotonic() < deadline:
    time.sleep(0.1)
  if any(t.is_alive() for t in lingering):
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # pylint: disable=protected-access
  sys.exit(status)


def _verbose() -> bool:
  return flags.FLAGS['verbosity'].present and flags.FLAGS.verbosity >= 1


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing; any error (the config file's included) is one paragraph."""
  try:
    rest = flags.FLAGS(argv)
    if 'config' in flags.FLAGS:
      flags.FLAGS.config.keys()  # a config file that failed to load raises on first use
      if not isinstance(flags.FLAGS.config, ml_collections.ConfigDict):
        raise TypeError(f'get_config() returned a {type(flags.FLAGS.config).__name__}, not an '
                        'ml_collections.ConfigDict (see configs/default.py)')
    return rest
  except Exception as e:  # pylint: disable=broad-except  (the config file is the user's code)
    fail(f'{type(e).__name__}: {e}. Run {_program()} --helpfull for the flags; a config field '
         'is overridden as --config.<group>.<field>=<value>, with a value of its type (every '
         'field is in configs/default.py).')


def describe(e: BaseException) -> str:
  """The paragraph for a user error; an OS error also names its kind, its path and the fix."""
  if not isinstance(e, OSError) or e.errno is None:
    return str(e) or type(e).__name__
  if e.errno in _DISK_FULL:
    return (f'{type(e).__name__}: {e}. The disk (or quota) is full or read-only: free space and '
            'rerun the same command; a training run resumes from its newest intact checkpoint.')
  advice = _path_advice(e.errno, os.fspath(e.filename)) if e.filename else ''
  if not advice:
    return f'{type(e).__name__}: {e}'
  return f'{advice} ({type(e).__name__}: [Errno {e.errno}] {e.strerror}).'


def _file_in(path: str) -> str | None:
  """The first of ``path`` and its parents that is a file (not a folder), if any."""
  while path and path != os.path.dirname(path):
    if os.path.isfile(path):
      return path
    path = os.path.dirname(path)
  return None


def _path_advice(code: int, path: str) -> str:
  """What an error number means for ``path``, and the fix ('' for the others)."""
  if code == errno.EEXIST:
    if os.path.isfile(path):
      return (f'{path} exists and is a file, where a folder was expected: choose another path, '
              'or move the file away')
    return f'{path} exists already: choose another path, or move it away'
  if code == errno.EISDIR:
    return (f'{path} exists and is a folder, where a file was expected: name a file (not a '
            'folder), or move the folder away')
  if code == errno.ENOTDIR:
    file = _file_in(path) or path
    within = f' (in {path})' if file != path else ''
    return (f'{file} is a file, where a folder was expected{within}: choose another path, or '
            'move the file away')
  if code in (errno.EACCES, errno.EPERM):
    return (f'This user may not access {path}: choose a path it may read (or write), or change '
            'the permissions of the path or its folder')
  if code == errno.ENOENT:
    return f'{path} does not exist: check the path, and that the folders it names exist'
  return ''


def run(main: Callable[[list[str]], object]) -> None:
  """``absl.app.run(main)`` with this module's error handling (and the project's XLA flags)."""
  trainer.default_xla_flags()

  def wrapped(argv: list[str]) -> object:
    checkpoints.quiet_closed_loop_echoes(_verbose)
    try:
      if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
      return main(argv)
    except KeyboardInterrupt:
      print(f'{_program()}: interrupted. Rerun the same command to resume.', file=sys.stderr,
            flush=True)
      _exit(130)
    except USER_ERRORS as e:
      if _verbose():
        traceback.print_exc()
      _print_error(e)
      _exit(EXIT_STATUS)

  app.run(wrapped, flags_parser=_parse_flags)
