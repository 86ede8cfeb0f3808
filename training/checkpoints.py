"""Orbax checkpoints: the last N for resume, plus the best by validation accuracy.

Integrity:
  * Orbax writes a checkpoint into a temporary directory and renames it when complete, so a save
    interrupted at any moment (kill -9 included) leaves no step directory behind; such leftovers
    are cleaned up by the next run and are never restored.
  * Once a save is complete, a manifest (``_SHA256_MANIFEST.json`` in the step directory: the size
    and SHA-256 of every file) is written. Before a checkpoint is restored it is checked against
    its manifest, so a truncated or garbled file is detected instead of being read as numbers.
    (A checkpoint whose manifest was not written yet, because the run was killed right after the
    save completed, is checked by restoring it.)
  * ``restore_latest`` resumes from the newest intact checkpoint: newer corrupt ones are reported
    and moved to ``workdir/checkpoints_corrupt/`` (kept, never deleted), so that their steps can
    be saved again. With no intact checkpoint it stops with ``NoIntactCheckpointError`` and
    changes nothing.
  * A checkpoint whose arrays do not have the shapes the current config gives raises
    ``CheckpointMismatchError`` naming the differing arrays, instead of a shape error from inside
    orbax.
  * A save that fails (a full disk, a quota, a read-only filesystem) raises
    ``CheckpointSaveError`` saying so; the earlier checkpoints are untouched.
Nothing here uses pickle: arrays are orbax/tensorstore, metadata and manifests JSON.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging as absl_logging
from orbax.checkpoint import checkpoint_managers as policies

CHECKPOINT_DIR = 'checkpoints'
CORRUPT_DIR = 'checkpoints_corrupt'
MANIFEST_FILE = '_SHA256_MANIFEST.json'
STATE_ITEM = 'state'
METRICS_ITEM = 'metrics'  # orbax's name for the metrics item (ocp.checkpoint_manager)
_SMALL_FILE = 1 << 20  # files up to this size are hashed even by the quick check
_STEP_NAME = re.compile(r'\d+')


class _QuietOrbaxLogs(logging.Filter):
  """Orbax's log noise, in quiet mode (verbosity WARNING, the entry points' default).

  Drops its warning for every checkpoint saved without a validation accuracy (those are simply
  not candidates for the best checkpoint), and strips the tracebacks its background threads log
  when a save fails (the failure is raised as ``CheckpointSaveError`` and reported in one
  paragraph); ``--verbosity=1`` keeps them.
  """

  def filter(self, record: logging.LogRecord) -> bool:
    if 'did not provide metrics' in str(record.msg):
      return False
    if (record.exc_info and '/orbax/' in (record.pathname or '')
        and absl_logging.get_verbosity() < absl_logging.INFO):
      record.exc_info, record.exc_text = None, None
    return True


logging.getLogger('absl').addFilter(_QuietOrbaxLogs())


class CheckpointError(RuntimeError):
  """A checkpoint cannot be used or written; the message says why and what to do."""


class CorruptCheckpointError(CheckpointError):
  """A checkpoint's files do not match its manifest, or orbax cannot read it."""

  def __init__(self, step: int, reason: str, directory: str):
    super().__init__(f'Checkpoint {step} in {directory} is corrupt: {reason}.')
    self.step = step
    self.reason = reason


class NoIntactCheckpointError(CheckpointError):
  """There are checkpoints, but none of them is intact."""


class CheckpointMismatchError(CheckpointError):
  """A checkpoint was written by a config that gives other array shapes."""


class CheckpointSaveError(CheckpointError):
  """Writing a checkpoint failed (e.g. the disk is full)."""


def _say(message: str) -> None:
  """A line on stderr (process 0), visible even when library logging is silenced."""
  if jax.process_index() == 0:
    print(f'{time.strftime("%H:%M:%S")} {message}', file=sys.stderr, flush=True)


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      h.update(block)
  return h.hexdigest()


def _files(step_dir: str) -> list[str]:
  """Paths (relative, sorted) of the files of a step directory, the manifest excluded."""
  out = []
  for root, _, names in os.walk(step_dir):
    for name in names:
      rel = os.path.relpath(os.path.join(root, name), step_dir)
      if rel != MANIFEST_FILE and not rel.startswith(MANIFEST_FILE + '.tmp'):
        out.append(rel)
  return sorted(out)


def write_manifest(step_dir: str) -> None:
  """Writes the size and SHA-256 of every file of a complete step directory (atomically)."""
  files = {rel: {'size': os.path.getsize(os.path.join(step_dir, rel)),
                 'sha256': _sha256(os.path.join(step_dir, rel))} for rel in _files(step_dir)}
  path = os.path.join(step_dir, MANIFEST_FILE)
  tmp = f'{path}.tmp.{os.getpid()}'
  with open(tmp, 'w') as f:
    json.dump({'version': 1, 'files': files}, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def verify(step_dir: str, *, full: bool = True) -> str | None:
  """Why a step directory is not intact, or None if it is (or has no manifest to check against).

  ``full=False`` checks that every file exists with its size and hashes only small files
  (metadata); ``full=True`` hashes every file.
  """
  if not os.path.isdir(step_dir):
    return 'its directory is missing'
  path = os.path.join(step_dir, MANIFEST_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      files = json.load(f)['files']
  except (OSError, ValueError, KeyError, TypeError) as e:
    return f'its manifest {MANIFEST_FILE} is unreadable ({type(e).__name__})'
  for rel, expected in sorted(files.items()):
    file_path = os.path.join(step_dir, rel)
    if not os.path.isfile(file_path):
      return f'the file {rel} is missing'
    size = os.path.getsize(file_path)
    if size != expected['size']:
      return f'the file {rel} has {size} bytes instead of {expected["size"]} (truncated?)'
    if (full or size <= _SMALL_FILE) and _sha256(file_path) != expected['sha256']:
      return f'the file {rel} does not match its SHA-256 checksum (garbled)'
  return None


def _key_name(key: Any) -> str:
  for attr in ('name', 'key', 'idx'):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _shapes(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
  """'params/encoder/.../kernel' -> (shape, dtype) of every array leaf of a pytree."""
  leaves = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: hasattr(x, 'shape') and hasattr(x, 'dtype'))[0]
  return {'/'.join(_key_name(k) for k in path): (tuple(leaf.shape), str(leaf.dtype))
          for path, leaf in leaves if hasattr(leaf, 'shape')}


class Checkpointer:
  """Saves and restores a train state in ``workdir/checkpoints``.

  Args:
    workdir: the run's workdir.
    keep: the most recent checkpoints kept (plus the best by validation accuracy).
    read_only: never change anything on disk (evaluation, possibly of a running workdir).
  """

  def __init__(self, workdir: str, keep: int, *, read_only: bool = False):
    self.workdir = os.path.abspath(workdir)
    self.directory = os.path.join(self.workdir, CHECKPOINT_DIR)
    self.keep = keep
    self.read_only = read_only
    self.skipped: dict[int, str] = {}  # corrupt steps found (and, unless read_only, moved away)
    self._manager: ocp.CheckpointManager | None = None
    self._unverified: list[int] = []  # saved, manifest not written yet
    self._save_error: Exception | None = None

  # ------------------------------------------------------------------ listing
  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def all_steps(self) -> list[int]:
    """Complete checkpoints on disk, ascending (interrupted saves are never listed)."""
    if not os.path.isdir(self.directory):
      return []
    steps = [int(name) for name in os.listdir(self.directory)
             if _STEP_NAME.fullmatch(name) and os.path.isdir(os.path.join(self.directory, name))]
    return sorted(s for s in steps if s not in self.skipped)

  def latest_step(self) -> int | None:
    if self._manager is not None:
      step = self._manager.latest_step()
      if step is not None:
        return step
    steps = self.all_steps()
    return steps[-1] if steps else None

  def accuracy(self, step: int) -> float | None:
    """The validation accuracy a checkpoint was saved with (None if it was not evaluated)."""
    path = os.path.join(self.step_dir(step), METRICS_ITEM, METRICS_ITEM)
    try:
      with open(path) as f:
        return float(json.load(f)['accuracy'])
    except (OSError, ValueError, KeyError, TypeError):
      return None

  def best_step(self) -> int | None:
    """The checkpoint with the best validation accuracy (the latest one among equals)."""
    ranked = [(acc, step) for step in self.all_steps()
              if (acc := self.accuracy(step)) is not None]
    return max(ranked)[1] if ranked else None

  # ------------------------------------------------------------------ saving
  @property
  def manager(self) -> ocp.CheckpointManager:
    if self.read_only:
      raise CheckpointError('This Checkpointer is read-only.')
    if self._manager is None:
      options = ocp.CheckpointManagerOptions(
          preservation_policy=policies.AnyPreservationPolicy([
              policies.LatestN(self.keep),
              policies.BestN(get_metric_fn=lambda m: m['accuracy'], n=1,
                             keep_checkpoints_without_metrics=False),
          ]),
          best_fn=lambda m: m['accuracy'], best_mode='max',
          cleanup_tmp_directories=True)  # leftovers of interrupted saves
      self._manager = ocp.CheckpointManager(self.directory, options=options)
    return self._manager

  def _save_failed(self, step: int | None, e: Exception) -> CheckpointSaveError:
    self._save_error = e
    intact = [s for s in self.all_steps() if s != step and verify(self.step_dir(s), full=False)
              is None]
    what = f'the checkpoint of step {step}' if step is not None else 'a checkpoint'
    return CheckpointSaveError(
        f'Could not write {what} in {self.directory}: {type(e).__name__}: '
        f'{" ".join(str(e).split())[:500]}. This is usually a full disk, a quota or a read-only '
        f'filesystem: free space (or fix the permissions) and rerun the same command, which '
        f'resumes from the newest intact checkpoint ({intact[-1] if intact else "none yet"}). '
        'The earlier checkpoints were not changed.')

  def _write_manifests(self) -> None:
    """Manifests of the saves that have completed (process 0 writes them)."""
    for step in self._unverified:
      step_dir = self.step_dir(step)
      if jax.process_index() == 0 and os.path.isdir(step_dir):  # not garbage-collected since
        write_manifest(step_dir)
    self._unverified = []

  def save(self, step: int, state: Any, accuracy: float | None = None) -> None:
    """Saves asynchronously; ``accuracy`` (mean validation accuracy) ranks the best checkpoint.

    Raises:
      CheckpointSaveError: if this save or the previous (asynchronous) one failed to write.
    """
    metrics = None if accuracy is None else {'accuracy': float(accuracy)}
    self.wait()  # the previous save, then its manifest
    try:
      self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)),
                        metrics=metrics, force=True)
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_failed(step, e) from e
    self._unverified.append(step)

  def wait(self) -> None:
    """Waits for the pending save and writes its manifest (CheckpointSaveError if it failed)."""
    if self._manager is None:
      return
    pending = self._unverified[-1] if self._unverified else None
    try:
      self._manager.wait_until_finished()
      self._write_manifests()
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_failed(pending, e) from e

  def close(self) -> None:
    """Waits for pending saves (unless one already failed) and releases orbax's threads."""
    if self._manager is None:
      return
    try:
      if self._save_error is None:
        self.wait()
    finally:
      try:
        self._manager.close()
      except Exception:  # pylint: disable=broad-except
        if self._save_error is None:
          raise
      self._manager = None

  # ------------------------------------------------------------------ restoring
  def check_compatible(self, step: int, abstract_state: Any) -> None:
    """Raises CheckpointMismatchError naming the arrays whose shapes differ from the config's."""
    try:
      metadata = self._metadata(step)
    except Exception as e:  # pylint: disable=broad-except
      raise CorruptCheckpointError(step, f'its metadata is unreadable ({type(e).__name__}: '
                                   f'{" ".join(str(e).split())[:200]})', self.directory) from e
    saved, wanted = _shapes(metadata), _shapes(abstract_state)
    if not saved:
      raise CorruptCheckpointError(step, 'its metadata lists no arrays', self.directory)
    differing = sorted((k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k)),
                       key=lambda k: (not k.startswith('params/'), k))  # parameters first
    if differing:
      fmt = lambda v: 'absent' if v is None else f'{list(v[0])} {v[1]}'
      details = '; '.join(f'{k}: saved {fmt(saved.get(k))}, now {fmt(wanted.get(k))}'
                          for k in differing[:8])
      more = f' (and {len(differing) - 8} more)' if len(differing) > 8 else ''
      raise CheckpointMismatchError(
          f'Checkpoint {step} in {self.directory} was written by a different model or run '
          f'config: {len(differing)} arrays differ ({details}{more}). Use the config it was '
          'trained with (see config.json in the workdir), or a new --workdir.')

  def _metadata(self, step: int) -> Any:
    """The saved state's tree of array metadata (shapes and dtypes), read without the arrays."""
    from etils import epath  # pylint: disable=g-import-not-at-top
    meta = ocp.StandardCheckpointHandler().metadata(
        epath.Path(os.path.join(self.step_dir(step), STATE_ITEM)))
    return getattr(meta, 'tree', meta)

  def restore(self, step: int, abstract_state: Any) -> Any:
    """Restores onto the shardings given by ``abstract_state`` (jax.ShapeDtypeStruct leaves).

    Raises:
      CheckpointError: there is no checkpoint of this step.
      CorruptCheckpointError: it does not match its manifest, or orbax cannot read it.
      CheckpointMismatchError: it was written by a config with other array shapes.
    """
    step_dir = self.step_dir(step)
    if not os.path.isdir(step_dir):
      raise CheckpointError(f'There is no checkpoint of step {step} in {self.directory}; '
                            f'available: {self.all_steps() or "none"}.')
    reason = verify(step_dir, full=True)
    if reason:
      raise CorruptCheckpointError(step, reason, self.directory)
    self.check_compatible(step, abstract_state)
    try:
      with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
        restored = checkpointer.restore(
            step_dir, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
    except Exception as e:  # pylint: disable=broad-except
      raise CorruptCheckpointError(
          step, f'orbax cannot read it ({type(e).__name__}: {" ".join(str(e).split())[:300]})',
          self.directory) from e
    return restored[STATE_ITEM]

  def _set_aside(self, step: int, reason: str) -> None:
    """Moves a corrupt step directory to workdir/checkpoints_corrupt/ (never deletes it)."""
    self.skipped[step] = reason
    if self.read_only:
      return
    if jax.process_index() == 0:
      target_dir = os.path.join(self.workdir, CORRUPT_DIR)
      os.makedirs(target_dir, exist_ok=True)
      target = os.path.join(target_dir, str(step))
      suffix = 1
      while os.path.exists(target):
        target, suffix = os.path.join(target_dir, f'{step}.{suffix}'), suffix + 1
      os.rename(self.step_dir(step), target)
      _say(f'Moved the corrupt checkpoint {step} to {target}.')

  def restore_latest(self, abstract_state: Any) -> tuple[int, Any]:
    """(step, state) of the newest intact checkpoint, or (0, None) when there is none at all.

    Corrupt checkpoints are reported on stderr and (unless read-only) moved to
    ``workdir/checkpoints_corrupt/``, so their steps can be saved again.

    Raises:
      NoIntactCheckpointError: there are checkpoints, but none is intact (nothing is moved).
      CheckpointMismatchError: the newest checkpoint was written by an incompatible config.
    """
    steps = self.all_steps()
    if not steps:
      return 0, None
    corrupt: dict[int, str] = {}
    found, state = None, None
    for step in reversed(steps):
      try:
        state = self.restore(step, abstract_state)
        found = step
        break
      except CorruptCheckpointError as e:
        corrupt[step] = e.reason
        _say(f'Checkpoint {step} is corrupt ({e.reason}); trying the previous one.')
    if found is None:
      details = '; '.join(f'step {s}: {r}' for s, r in sorted(corrupt.items()))
      raise NoIntactCheckpointError(
          f'No intact checkpoint in {self.directory} ({details}). Nothing was changed. Restore '
          f'the checkpoints from a backup, or move {self.directory} away (or use a new '
          '--workdir) to train from scratch.')
    for step in steps:  # older ones: their metadata is read when saving resumes
      if step < found:
        reason = verify(self.step_dir(step), full=False)
        if reason:
          corrupt[step] = reason
    for step, reason in sorted(corrupt.items()):
      self._set_aside(step, reason)
    if corrupt and jax.process_count() > 1 and not self.read_only:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices('checkpoints_set_aside')
    if corrupt:
      _say(f'Resuming from checkpoint {found}, the newest intact one.')
    return found, state
