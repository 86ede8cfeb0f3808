"""Exclusive use of a workdir: a second run on the same workdir refuses to start.

Local disks: an advisory ``flock`` on ``workdir/lock[.<process>]``, released by the kernel however
the holder exits. Object storage has no locks: a lease object (host, pid, token, heartbeat renewed
every ``LEASE_S / 4`` s), taken when absent, expired or held by a dead process of this host; a
run writes it, waits ``SETTLE_S`` and reads it back (the last writer wins). Not a consensus
protocol: it guards against a second command on a running workdir.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import socket
import threading
import time
from typing import Any, Iterator

import storage

LOCK_FILE = 'lock'
LEASE_S = 120.0
SETTLE_S = 1.0


class WorkdirBusyError(RuntimeError):
  """Another process is training in this workdir."""


def holder(path: str) -> str:
  """Who holds the lock file at ``path``, as recorded in it ('' if unknown)."""
  with contextlib.suppress(OSError, ValueError):
    return ' '.join(storage.read_text(path).split())[:200]
  return ''


def _busy(workdir: str, who: str) -> WorkdirBusyError:
  return WorkdirBusyError(
      f'Another run is using the workdir {workdir}{f" ({who})" if who else ""}; two runs on '
      "one workdir would overwrite each other's checkpoints and metrics. Wait for it to "
      'finish or stop it, or use a different --workdir.')


class Held:
  """The lock while held: ``check()`` raises WorkdirBusyError once a lease is lost (taken over
  by another run, or not renewed for ``LEASE_S``); a ``flock`` is never lost."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.lost = threading.Event()

  def check(self) -> None:
    if self.lost.is_set():
      raise WorkdirBusyError(
          f'The lease on the workdir {self.workdir} was lost (another run took it over, or it '
          f'could not be renewed for {LEASE_S:.0f} s); stopping so that two runs do not write '
          'one workdir. Rerun the command to resume once the other run has finished.')


@contextlib.contextmanager
def lock(workdir: str, process_index: int = 0) -> Iterator[Held]:
  """Holds the lock during the block; WorkdirBusyError naming the holder if another has it."""
  path = os.path.join(workdir, LOCK_FILE if process_index == 0 else f'{LOCK_FILE}.{process_index}')
  held = Held(workdir)
  with (_lease if storage.is_remote(workdir) else _flock)(workdir, path, held):
    yield held


def _record(**extra: Any) -> dict[str, Any]:
  return dict(pid=os.getpid(), host=socket.gethostname(),
              since=time.strftime('%Y-%m-%d %H:%M:%S'), **extra)


@contextlib.contextmanager
def _flock(workdir: str, path: str, held: Held) -> Iterator[None]:
  del held  # never lost
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise _busy(workdir, holder(path)) from None
    os.ftruncate(fd, 0)
    os.write(fd, f'{_describe(_record())}\n'.encode())
    yield
  finally:
    os.close(fd)


def _read_lease(path: str) -> dict[str, Any] | None:
  with contextlib.suppress(OSError, ValueError):
    record = storage.read_json(path)
    return record if isinstance(record, dict) else None
  return None


def _stale(record: dict[str, Any]) -> bool:
  if time.time() - float(record.get('heartbeat', 0)) > LEASE_S:
    return True
  if record.get('host') != socket.gethostname():
    return False
  try:
    os.kill(int(record.get('pid', -1)), 0)
  except ProcessLookupError:
    return True
  except (PermissionError, ValueError, OverflowError):
    return False
  return False


def _describe(record: dict[str, Any]) -> str:
  return f'pid {record.get("pid")} on host {record.get("host")}, since {record.get("since")}'


def _renew(path: str, mine: dict[str, Any], held: Held, stop: threading.Event) -> None:
  """The heartbeat: marks the lease lost once another run holds it or no renewal succeeded for
  LEASE_S (storage errors are retried at the next beat)."""
  renewed = time.time()
  while not stop.wait(LEASE_S / 4):
    try:
      current = _read_lease(path)
      if current is not None and current.get('token') != mine['token']:
        break
      storage.write_json(path, dict(mine, heartbeat=time.time()))
      renewed = time.time()
    except Exception:  # pylint: disable=broad-except  (gcsfs raises HttpError after retries)
      if time.time() - renewed > LEASE_S:
        break
  else:
    return
  held.lost.set()


@contextlib.contextmanager
def _lease(workdir: str, path: str, held: Held) -> Iterator[None]:
  current = _read_lease(path)
  if current is not None and not _stale(current):
    raise _busy(workdir, _describe(current))
  mine = _record(token=secrets.token_hex(8), heartbeat=time.time())
  storage.write_json(path, mine)
  time.sleep(SETTLE_S)
  current = _read_lease(path)
  if current is None or current.get('token') != mine['token']:
    raise _busy(workdir, _describe(current or {}))
  stop = threading.Event()
  thread = threading.Thread(target=_renew, args=(path, mine, held, stop), name='workdir-lease',
                            daemon=True)
  thread.start()
  try:
    yield
  finally:
    stop.set()
    # On the way out from a storage failure, neither the heartbeat (perhaps mid-request) is
    # waited for nor the lease released: each would wait out the client's retries, in vain. A
    # holder that is gone frees the lease at once on this host (after LEASE_S on another).
    if not storage.unreachable():
      thread.join()
      with contextlib.suppress(Exception):  # never hide the block's own exception
        if (_read_lease(path) or {}).get('token') == mine['token']:
          storage.path(path).unlink()
