"""Exclusive use of a workdir: a second run on the same workdir refuses to start.

An advisory ``flock`` on ``workdir/lock[.<process>]``, released by the kernel when the holder
exits in any way (kill -9 included), so never stale; the file names the holder for the second
run's message. Network filesystems without cross-host ``flock`` do not protect across hosts.
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
  with contextlib.suppress(OSError), open(path) as f:
    return ' '.join(f.read().split())[:200]
  return ''


@contextlib.contextmanager
def lock(workdir: str, process_index: int = 0) -> Iterator[None]:
  """Holds the lock during the block; WorkdirBusyError naming the holder if another has it."""
  path = os.path.join(workdir, LOCK_FILE if process_index == 0 else f'{LOCK_FILE}.{process_index}')
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      who = holder(path)
      raise WorkdirBusyError(
          f'Another run is using the workdir {workdir}{f" ({who})" if who else ""}; two runs on '
          "one workdir would overwrite each other's checkpoints and metrics. Wait for it to "
          'finish or stop it, or use a different --workdir.') from None
    os.ftruncate(fd, 0)
    os.write(fd, f'pid {os.getpid()} on host {socket.gethostname()}, since '
                 f'{time.strftime("%Y-%m-%d %H:%M:%S")}\n'.encode())
    yield
  finally:
    os.close(fd)
