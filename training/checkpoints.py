"""Orbax checkpoints (the last N plus the best by validation accuracy), checked file by file.

An interrupted save leaves no step (orbax renames it when complete); a manifest (size and SHA-256
of every file) written after the save is checked before a restore, so garbled files are not read
as numbers. Corrupt steps are moved to ``checkpoints_corrupt/``, never deleted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging
from etils import epath
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers as policies

import storage
from training.metrics import console

CHECKPOINT_DIR = 'checkpoints'
CORRUPT_DIR = 'checkpoints_corrupt'
MANIFEST_FILE = '_SHA256_MANIFEST.json'
STATE_ITEM = 'state'
TRAIN_LOG_ITEM = 'train_log'
_SMALL_FILE = 1 << 20  # files up to this size are hashed even by the quick check
# orbax's routine warnings: a save without a validation accuracy, a read-only manager.
_NOISE = ('did not provide metrics', 'read_only=True, setting', 'Given directory is read only')


class _Echoes:
  """Silences what tensorstore's threads print once orbax has failed (hooks, asyncio's "Task
  exception was never retrieved"): while a restore runs and, once one failed, for the rest of the
  run; within a restore no absl records either (the caller reports the outcome in one line)."""
  hooked = active = failed = False
  verbose: Callable[[], bool] | None = None

  @classmethod
  def hook(cls) -> None:
    if not cls.hooked:
      cls.hooked = True
      unraisable, excepthook = sys.unraisablehook, sys.excepthook
      sys.unraisablehook = lambda u: (cls._echo(u.exc_traceback) or cls._closed_loop(
          u.exc_traceback) or unraisable(u))
      sys.excepthook = lambda kind, value, tb: cls._echo(tb) or excepthook(kind, value, tb)
      logging.getLogger('asyncio').addFilter(
          lambda record: not (record.exc_info and cls._echo(record.exc_info[2])))

  @classmethod
  @contextlib.contextmanager
  def watch(cls):
    cls.hook()
    absl = logging.getLogger('absl')
    level, cls.active = absl.level, True
    absl.setLevel(logging.CRITICAL)
    try:
      yield
    except Exception:
      cls.failed = True
      raise
    finally:
      cls.active = False
      absl.setLevel(level)

  @classmethod
  def _echo(cls, tb) -> bool:
    if not (cls.active or cls.failed):
      return False
    files = [frame.filename for frame in traceback.extract_tb(tb)]
    return any('/orbax/' in f for f in files) or any(
        f.endswith('asyncio/base_events.py') for f in files[-2:])

  @classmethod
  def _closed_loop(cls, tb) -> bool:
    if cls.verbose is None or cls.verbose():
      return False
    frames = traceback.extract_tb(tb)
    return bool(frames) and frames[-1].name == '_check_closed' and frames[-1].filename.endswith(
        os.path.join('asyncio', 'base_events.py'))


def quiet_closed_loop_echoes(verbose: Callable[[], bool]) -> None:
  """Unless ``verbose()``, drops the 'Event loop is closed' tracebacks of a failure."""
  _Echoes.verbose = verbose
  _Echoes.hook()


def _quiet_orbax_logs(record: logging.LogRecord) -> bool:
  """Drops ``_NOISE``, and below ``--verbosity=1`` the tracebacks of a failed save."""
  if any(text in str(record.msg) for text in _NOISE):
    return False
  if (record.exc_info and '/orbax/' in (record.pathname or '')
      and absl_logging.get_verbosity() < absl_logging.INFO):
    record.exc_info, record.exc_text = None, None
  return True


logging.getLogger('absl').addFilter(_quiet_orbax_logs)


class CheckpointError(RuntimeError):
  """A checkpoint cannot be used or written; the message says why and what to do."""


class CorruptCheckpointError(CheckpointError):
  """A checkpoint's files do not match its manifest, or orbax cannot read it."""

  def __init__(self, step: int, reason: str, directory: str):
    super().__init__(f'Checkpoint {step} in {directory} is corrupt: {reason}.')
    self.step, self.reason = step, reason


class NoIntactCheckpointError(CheckpointError):
  """There are checkpoints, but none of them is intact."""


class CheckpointMismatchError(CheckpointError):
  """A checkpoint was written by a config that gives other array shapes."""


class CheckpointSaveError(CheckpointError):
  """Writing a checkpoint failed (e.g. the disk is full)."""


def write_manifest(step_dir: str) -> None:
  """Writes the size and SHA-256 of every file of a complete step directory (atomically)."""
  paths = {rel: os.path.join(step_dir, rel) for rel in sorted(storage.files_under(step_dir))
           if rel != MANIFEST_FILE and not rel.startswith(MANIFEST_FILE + '.tmp')}
  files = {rel: {'size': storage.size(p), 'sha256': storage.sha256(p)} for rel, p in paths.items()}
  storage.write_json(os.path.join(step_dir, MANIFEST_FILE), {'version': 1, 'files': files})


def verify(step_dir: str, *, full: bool = True) -> str | None:
  """Why a step directory is not intact, or None if it is or has no manifest (a save killed before
  it). ``full=False`` hashes only small files and checks the others' sizes."""
  if not storage.is_dir(step_dir):
    return 'its directory is missing'
  path = os.path.join(step_dir, MANIFEST_FILE)
  if not storage.exists(path):
    return None
  try:
    files = storage.read_json(path)['files']
  except (OSError, ValueError, KeyError, TypeError) as e:
    return f'its manifest {MANIFEST_FILE} is unreadable ({type(e).__name__})'
  for rel, expected in sorted(files.items()):
    file_path = os.path.join(step_dir, rel)
    if not storage.is_file(file_path):
      return f'the file {rel} is missing'
    size = storage.size(file_path)
    if size != expected['size']:
      return f'the file {rel} has {size} bytes instead of {expected["size"]} (truncated?)'
    if (full or size <= _SMALL_FILE) and storage.sha256(file_path) != expected['sha256']:
      return f'the file {rel} does not match its SHA-256 checksum (garbled)'
  return None


def _listed(reasons: dict[int, str]) -> str:
  return '; '.join(f'step {s}: {r}' for s, r in sorted(reasons.items()))


def _none_intact(directory: str, reasons: dict[int, str]) -> NoIntactCheckpointError:
  return NoIntactCheckpointError(
      f'No intact checkpoint in {directory} ({_listed(reasons)}). Nothing was changed. Restore the '
      f'checkpoints from a backup, or move {directory} away (or use a new --workdir) to train '
      'from scratch.')


def _shapes(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
  leaves = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: hasattr(x, 'shape') and hasattr(x, 'dtype'))[0]
  return {jax.tree_util.keystr(path, simple=True, separator='/'):
          (tuple(leaf.shape), str(leaf.dtype)) for path, leaf in leaves if hasattr(leaf, 'shape')}


class Checkpointer:
  """The latest ``keep`` train states plus the best; ``read_only`` never changes the disk."""

  def __init__(self, workdir: str, keep: int, *, read_only: bool = False):
    self.workdir = storage.canonical(workdir)
    self.directory = os.path.join(self.workdir, CHECKPOINT_DIR)
    self.read_only = read_only
    self.skipped: dict[int, str] = {}  # corrupt steps found (and, unless read_only, moved away)
    self.restored_train_log: dict[str, Any] | None = None  # saved with the last restore's step
    self._unverified: list[int] = []  # saved, manifest not written yet
    self._save_error: Exception | None = None
    best = policies.BestN(get_metric_fn=lambda m: m['accuracy'], n=1,
                          keep_checkpoints_without_metrics=False)
    options = ocp.CheckpointManagerOptions(
        preservation_policy=policies.AnyPreservationPolicy([policies.LatestN(keep), best]),
        best_fn=lambda m: m['accuracy'], best_mode='max', cleanup_tmp_directories=not read_only,
        read_only=read_only, create=not read_only)
    self.manager = self._open(options)

  def _open(self, options: ocp.CheckpointManagerOptions) -> ocp.CheckpointManager:
    """orbax's manager; a step failing the quick check is set aside first, not left to orbax's
    parse error (read-only: CheckpointError naming it)."""
    try:
      return ocp.CheckpointManager(self.directory, options=options)
    except Exception:  # pylint: disable=broad-except
      names = storage.listdir(self.directory)
      corrupt = {int(n): reason for n in names if n.isdigit()
                 if (reason := verify(self.step_dir(int(n)), full=False))}
      if not corrupt:
        raise
      if len(corrupt) == sum(n.isdigit() for n in names):  # as restore_first_intact: none moved
        raise _none_intact(self.directory, corrupt) from None
      if self.read_only:
        raise CheckpointError(
            f'The checkpoints in {self.directory} cannot be opened: {_listed(corrupt)}. Restore '
            'them from a backup; train.py on this workdir sets them aside and resumes from the '
            'newest intact one.') from None
      self.skipped.update(corrupt)
      self._set_aside(reload=False)
      return ocp.CheckpointManager(self.directory, options=options)

  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def all_steps(self) -> list[int]:  # complete checkpoints, ascending
    return sorted(s for s in self.manager.all_steps() if s not in self.skipped)

  def ranked_steps(self, which: str) -> list[int]:
    """The steps in the order 'best' (validation accuracy, then newest) or 'latest' wants them."""
    if which == 'latest':
      return sorted(self.all_steps(), reverse=True)
    steps, accuracy = self.all_steps(), {}  # saved with the steps that were evaluated
    for step in steps:
      with contextlib.suppress(KeyError, TypeError, ValueError, OSError):
        accuracy[step] = float((self.manager.metrics(step) or {})['accuracy'])
    return sorted(steps, key=lambda s: (s in accuracy, accuracy.get(s, 0.0), s), reverse=True)

  def _save_failed(self, step: int | None, e: Exception) -> CheckpointSaveError:
    self._save_error = e
    what = f'the checkpoint of step {step}' if step is not None else 'a checkpoint'
    earlier = [s for s in self.all_steps() if s != step]
    if storage.is_remote(self.directory):
      # Not asked again, nor on the way out: each request would wait out its retries (the
      # resumed run checks the checkpoints against their manifests).
      storage.mark_unreachable(e)
      cause = f'{storage.request_failed(self.directory, e)}, then'
    else:
      earlier = [s for s in earlier if not verify(self.step_dir(s), full=False)]
      cause = (f'{type(e).__name__}: {" ".join(str(e).split())[:500]}. This is usually a full '
               'disk, a quota or a read-only filesystem: free space (or fix the permissions) and')
    return CheckpointSaveError(
        f'Could not write {what} in {self.directory}: {cause} rerun the same command, which '
        f'resumes from the newest intact checkpoint ({earlier[-1] if earlier else "none yet"}). '
        'The earlier checkpoints were not changed.')

  def save(self, step: int, state: Any, accuracy: float | None = None,
           train_log: dict[str, Any] | None = None) -> None:
    """Saves asynchronously; ``accuracy`` ranks the best; ``train_log`` (JSON: the host's metric
    window) is saved beside the state. CheckpointSaveError if this or the previous save failed."""
    metrics = None if accuracy is None else {'accuracy': float(accuracy)}
    items = {STATE_ITEM: ocp.args.StandardSave(state)}
    if train_log is not None:
      items[TRAIN_LOG_ITEM] = ocp.args.JsonSave(train_log)
    self.wait()  # the previous save, then its manifest
    try:
      self.manager.save(step, args=ocp.args.Composite(**items), metrics=metrics, force=True)
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_failed(step, e) from e
    self._unverified.append(step)

  def wait(self) -> None:
    """Waits for the pending save and writes its manifest (CheckpointSaveError if it failed)."""
    pending = self._unverified[-1] if self._unverified else None
    try:
      self.manager.wait_until_finished()
      for step in self._unverified:
        if jax.process_index() == 0 and storage.is_dir(self.step_dir(step)):  # still kept
          write_manifest(self.step_dir(step))
      self._unverified = []
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_failed(pending, e) from e

  def close(self) -> None:
    """Waits for pending saves (unless one already failed) and releases orbax's threads."""
    try:
      if self._save_error is None:
        self.wait()
    finally:
      try:
        self.manager.close()
      except Exception:  # pylint: disable=broad-except
        if self._save_error is None:
          raise

  def _saved_tree(self, step: int) -> Any:
    try:
      metadata = ocp.StandardCheckpointHandler().metadata(
          epath.Path(self.step_dir(step)) / STATE_ITEM)
    except Exception as e:  # pylint: disable=broad-except
      raise CorruptCheckpointError(step, f'its metadata is unreadable ({type(e).__name__}: '
                                   f'{" ".join(str(e).split())[:200]})', self.directory) from e
    return getattr(metadata, 'tree', metadata)

  def _check_intact(self, step: int) -> None:
    if reason := verify(self.step_dir(step), full=True):
      raise CorruptCheckpointError(step, reason, self.directory)

  def check_compatible(self, step: int, abstract_state: Any) -> None:
    saved, wanted = _shapes(self._saved_tree(step)), _shapes(abstract_state)
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

  def restore(self, step: int, abstract_state: Any) -> Any:
    """Restores onto the shardings given by ``abstract_state`` (jax.ShapeDtypeStruct leaves)."""
    if step not in self.all_steps():
      raise CheckpointError(f'There is no checkpoint of step {step} in {self.directory}; '
                            f'available: {self.all_steps() or "none"}.')
    self._check_intact(step)
    self.check_compatible(step, abstract_state)
    restored = self._read(step, abstract_state)
    self.restored_train_log = restored[TRAIN_LOG_ITEM] if TRAIN_LOG_ITEM in restored else None
    if not storage.exists(os.path.join(self.step_dir(step), MANIFEST_FILE)):
      # Nothing to check the bytes against (killed right after the save): orbax read them, and
      # garbled floats show as NaN/Inf; from now on the manifest checks them.
      if not all(np.isfinite(x).all() for x in jax.tree.leaves(restored[STATE_ITEM])
                 if jax.numpy.issubdtype(x.dtype, jax.numpy.floating)):
        raise CorruptCheckpointError(step, 'it has no manifest and holds NaN/Inf values',
                                     self.directory)
      if not self.read_only and jax.process_index() == 0:
        write_manifest(self.step_dir(step))
    return restored[STATE_ITEM]

  def restore_raw(self, step: int) -> Any:
    """The saved state as NumPy arrays on this host, whatever model wrote it (``init_from``)."""
    self._check_intact(step)
    device = jax.sharding.SingleDeviceSharding(jax.devices('cpu')[0])  # host memory
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                          self._saved_tree(step),
                          is_leaf=lambda m: hasattr(m, 'shape') and hasattr(m, 'dtype'))
    return jax.tree.map(np.asarray, self._read(step, target)[STATE_ITEM])

  def _read(self, step: int, target: Any) -> Any:
    """orbax's restore of ``step`` onto ``target``; CorruptCheckpointError if it fails."""
    items = {STATE_ITEM: ocp.args.StandardRestore(target)}
    if storage.is_dir(os.path.join(self.step_dir(step), TRAIN_LOG_ITEM)):
      items[TRAIN_LOG_ITEM] = ocp.args.JsonRestore()
    try:
      with _Echoes.watch():
        return self.manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:  # pylint: disable=broad-except
      raise CorruptCheckpointError(step, f'orbax cannot read it ({type(e).__name__}: '
                                   f'{" ".join(str(e).split())[:300]})', self.directory) from e

  def restore_first_intact(self, steps: list[int], abstract_state: Any) -> tuple[int, Any]:
    """(step, state) of the first of ``steps`` that restores; NoIntactCheckpointError if none."""
    for step in steps:
      try:
        return step, self.restore(step, abstract_state)
      except CorruptCheckpointError as e:
        self.skipped[step] = e.reason
        console(f'Checkpoint {step} is corrupt ({e.reason}); trying the previous one.',
                warning=True)
    raise _none_intact(self.directory, self.skipped)

  def restore_latest(self, abstract_state: Any) -> tuple[int, Any]:
    """(step, state) of the newest intact checkpoint, or (0, None); corrupt ones move."""
    steps = self.all_steps()
    if not steps:
      return 0, None
    found, state = self.restore_first_intact(steps[::-1], abstract_state)
    for step in steps[:steps.index(found)]:  # older ones: read when saving resumes
      if reason := verify(self.step_dir(step), full=False):
        self.skipped[step] = reason
    if self.skipped:
      self._set_aside()
      console(f'Resuming from checkpoint {found}, the newest intact one.', warning=True)
    return found, state

  def _set_aside(self, reload: bool = True) -> None:
    """Moves the corrupt steps to ``CORRUPT_DIR``; ``reload`` tells orbax (not while opening)."""
    if self.read_only:
      return
    if jax.process_count() > 1:  # every process has looked before any step moves
      multihost_utils.sync_global_devices('checkpoints_checked')
    if jax.process_index() == 0:
      target_dir = os.path.join(self.workdir, CORRUPT_DIR)
      storage.makedirs(target_dir)
      for step in sorted(s for s in self.skipped if storage.exists(self.step_dir(s))):
        target, suffix = os.path.join(target_dir, str(step)), 1
        while storage.exists(target):
          target, suffix = os.path.join(target_dir, f'{step}.{suffix}'), suffix + 1
        storage.move(self.step_dir(step), target)
        console(f'Moved the corrupt checkpoint {step} to {target}.', warning=True)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices('checkpoints_set_aside')
    if reload:
      self.manager.reload()
