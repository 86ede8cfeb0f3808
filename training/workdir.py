"""Exclusive use of a workdir: a second run on the same workdir refuses to start.

The lock is an advisory ``flock`` on ``workdir/lock`` (``lock.<process>`` for the other processes
of a multi-host run). The kernel releases it when the holder exits in any way, kill -9 included,
so a killed run never leaves a stale lock behind. The file records who holds it (host, pid,
since when) for the message the second run prints. Network filesystems that do not support
``flock`` across hosts do not protect against runs started on different hosts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from typing import Iterator

LOCK_FILE = 'lock'


class WorkdirBusyError(RuntimeError):
  """Another process is training in this workdir."""


def holder(path: str) -> str:
  """Who holds the lock file at ``path``, as recorded in it ('' if unknown)."""
  try:
    with open(path) as f:
      return ' '.join(f.read().split())[:200]
  except OSError:
    return ''


@contextlib.contextmanager
def lock(workdir: str, process_index: int = 0) -> Iterator[None]:
  """Holds an exclusive advisory lock on ``workdir/lock[.<process>]`` for the block's duration.

  Raises:
    WorkdirBusyError: another process holds it (the message names that process).
  """
  name = LOCK_FILE if process_index == 0 else f'{LOCK_FILE}.{process_index}'
  path = os.path.join(workdir, name)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      who = holder(path)
      raise WorkdirBusyError(
          f'Another run is using the workdir {workdir}'
          f'{f" ({who})" if who else ""}; two runs on one workdir would overwrite each '
          'other\'s checkpoints and metrics. Wait for it to finish or stop it, or use a '
          'different --workdir.') from None
    os.ftruncate(fd, 0)
    os.write(fd, f'pid {os.getpid()} on host {socket.gethostname()}, since '
                 f'{time.strftime("%Y-%m-%d %H:%M:%S")}\n'.encode())
    yield
  finally:
    os.close(fd)
