"""What a run checks and holds before anything heavy, behind one call (``guarded``): the config
and devices (``validation``), resume compatibility, ``train.init_from``'s source, the workdir
lock, and the preemption watcher; a new workdir refused during the setup is left as it was."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

import jax

import storage
from training import init_from
from training import preemption
from training import validation
from training import workdir as workdir_lib
from training.config import RunConfig


@dataclasses.dataclass
class Guard:
  """A run's checked inputs and what it holds while it runs: the canonical workdir, the
  placement and data fingerprint, the fine-tune's source, the lock, the signal watcher, and the
  stack that closes what the setup opens (checkpointer, writers)."""

  workdir: str
  validated: validation.Validated
  source: init_from.Source | None
  held: workdir_lib.Held
  watcher: preemption.Watcher
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
        _empty(self.workdir)
      raise


@contextlib.contextmanager
def guarded(config: RunConfig, workdir: str) -> Iterator[Guard]:
  """Checks the run (ValueError before the workdir is touched), then holds the workdir's lock
  and watches for SIGTERM/SIGINT for the block: a signal while the data is prepared or the step
  compiles is honoured at the first step (saved there, exit 0), not the default kill."""
  config.check_model()
  validated = validation.validate(config, workdir)
  source = init_from.check_source(config) if init_from.needed(config, workdir) else None
  workdir = storage.canonical(workdir)
  new = _is_new(workdir)
  storage.makedirs(workdir)
  with workdir_lib.lock(workdir, jax.process_index()) as held, contextlib.ExitStack() as stack:
    watcher = stack.enter_context(preemption.Watcher())
    guard = Guard(workdir, validated, source, held, watcher, stack, new)
    with guard.refusable():
      if source and jax.process_index() == 0:  # a fine-tune reads its source's tokenizer
        init_from.copy_tokenizer(config, workdir)
    yield guard


def _is_new(workdir: str) -> bool:
  """Whether the workdir holds nothing yet (a lock file left by a refused start aside)."""
  return not storage.exists(workdir) or all(
      name.startswith(workdir_lib.LOCK_FILE) for name in storage.listdir(workdir))


def _empty(workdir: str) -> None:
  """Removes what a refused start wrote into its new workdir, but the lock it still holds."""
  if jax.process_index() == 0:
    for entry in storage.path(workdir).iterdir():
      if not entry.name.startswith(workdir_lib.LOCK_FILE):
        entry.rmtree() if entry.is_dir() else entry.unlink()
