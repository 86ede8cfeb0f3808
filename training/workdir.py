"""Exclusive use of a workdir: a second run on the same workdir refuses to start."""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Iterator

LOCK_FILE = 'lock'


class WorkdirBusyError(RuntimeError):
  """Another process is training in this workdir."""


@contextlib.contextmanager
def lock(workdir: str, process_index: int = 0) -> Iterator[None]:
  """Holds an exclusive advisory lock on ``workdir/lock[.<process>]`` for the block's duration."""
  name = LOCK_FILE if process_index == 0 else f'{LOCK_FILE}.{process_index}'
  path = os.path.join(workdir, name)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise WorkdirBusyError(
          f'Another run is using the workdir {workdir} (it holds {path}). Wait for it to finish '
          'or stop it, or use a different --workdir.') from None
    yield
  finally:
    os.close(fd)
