"""Preemption notices (SIGTERM): every process agrees on one step, saves there and exits 0.

With several processes, JAX's preemption sync manager (the runtime installs the SIGTERM handler)
propagates a notice to all and picks the same step (``reached_preemption_sync_point``); a single
process installs its own SIGTERM handler and stops at the next step.
"""

from __future__ import annotations

import signal
import threading

from absl import logging
import jax
from jax.experimental import multihost_utils


class Preempted(SystemExit):
  """Raised after the checkpoint of a preempted run is saved; exits the program with status 0."""

  def __init__(self, step: int):
    super().__init__(0)
    self.step = step


class Watcher:
  """``reached(step)``, called at every step on every process, is True where all save and stop.
  On leaving the context, the previous SIGTERM handler is restored."""

  def __init__(self):
    self._multihost = jax.process_count() > 1
    self._received = threading.Event()
    self._previous = None

  def __enter__(self) -> 'Watcher':
    if not self._multihost and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._on_signal)
    return self

  def __exit__(self, *exc) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None

  def _on_signal(self, signum, _frame) -> None:
    logging.warning('Received signal %d: saving a checkpoint at the next step.', signum)
    self._received.set()

  def reached(self, step: int) -> bool:
    if self._multihost:
      return multihost_utils.reached_preemption_sync_point(step)
    return self._received.is_set()
