"""What a run checks and holds before anything heavy, behind one call (``guarded``): the config
and devices (``validation``), resume compatibility, ``train.init_from``'s source, the workdir
lock, and the preemption watcher; a new workdir refused during the setup is left as it was."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
from typing import Iterator

from absl import logging
import jax
from jax.experimental import multihost_utils

import storage
from training import init_from
from training import validation
from training import workdir as workdir_lib
from training.config import RunConfig


class Preempted(SystemExit):
  """Raised after the checkpoint of a preempted run is saved; exits the program with status 0."""

  def __init__(self, step: int):
    super().__init__(0)
    self.step = step


class Watcher:
  """SIGTERM: ``reached(step)``, called at every step on every process, is True where all save
  and stop. Several processes agree on the step through JAX's preemption sync manager (the
  runtime installs the handler); a single process installs its own until the context ends."""

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

  def _on_signal(self, signum, _frame) -> None:
    logging.warning('Received signal %d: saving a checkpoint at the next step.', signum)
    self._received.set()

  def reached(self, step: int) -> bool:
    if self._multihost:
      return multihost_utils.reached_preemption_sync_point(step)
    return self._received.is_set()


@dataclasses.dataclass
class Guard:
  """A run's checked inputs and what it holds; ``stack`` closes what the setup opens."""

  workdir: str  # canonical
  validated: validation.Validated
  source: init_from.Source | None
  held: workdir_lib.Held
  watcher: Watcher
  stack: contextlib.ExitStack
  new: bool  # the workdir held nothing before this start

  @contextlib.contextmanager
  def refusable(self) -> Iterator[None]:
    """The setup: if it fails, a new workdir is emptied again (but the lock it holds)."""
    try:
      yield
    except BaseException:
      if self.new:
        self.stack.close()  # the checkpointer and writers first: closing them may still write
        if jax.process_index() == 0:
          for entry in storage.path(self.workdir).iterdir():
            if not entry.name.startswith(workdir_lib.LOCK_FILE):
              entry.rmtree() if entry.is_dir() else entry.unlink()
      raise


@contextlib.contextmanager
def guarded(config: RunConfig, workdir: str) -> Iterator[Guard]:
  """Checks the run (ValueError before the workdir is touched), then holds the workdir's lock
  and watches for SIGTERM for the block: a signal while the data is prepared or the step
  compiles is honoured at the first step (saved there, exit 0), not the default kill."""
  config.check_model()
  validated = validation.validate(config, workdir)
  source = init_from.check_source(config) if init_from.needed(config, workdir) else None
  workdir = storage.canonical(workdir)
  new = not storage.exists(workdir) or all(  # a lock file left by a refused start aside
      name.startswith(workdir_lib.LOCK_FILE) for name in storage.listdir(workdir))
  storage.makedirs(workdir)
  with workdir_lib.lock(workdir, jax.process_index()) as held, contextlib.ExitStack() as stack:
    guard = Guard(workdir, validated, source, held, stack.enter_context(Watcher()), stack, new)
    with guard.refusable():
      if source and jax.process_index() == 0:  # a fine-tune reads its source's tokenizer
        init_from.copy_tokenizer(config, workdir)
    yield guard
