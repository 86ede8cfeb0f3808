"""Where runs are written: local disks and ``gs://`` through ``etils.epath`` (as orbax and TFDS),
and one atomic writer for every file this project writes whole.

``gs://`` goes through fsspec/gcsfs, not ``tf.io.gfile``: gcsfs and tensorstore can be pointed at a
GCS emulator (``STORAGE_EMULATOR_HOST`` alone), so the tests exercise the code that runs on a pod.
A missing bucket, or a request that fails once the client's retries are spent (about 30 s), is an
``ObjectStorageError`` whose message names the URL and the fix.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from typing import Any, Callable

# Read by etils on every gs:// call; a user's explicit setting wins.
os.environ.setdefault('EPATH_USE_TF', 'false')


# The GCS emulator's URL from STORAGE_EMULATOR_HOST (read as gcsfs reads it), or ''.
_HOST = os.environ.get('STORAGE_EMULATOR_HOST', '')
EMULATOR = ('' if _HOST in ('', 'default') else
            _HOST if _HOST.startswith(('http://', 'https://')) else f'http://{_HOST}')
if EMULATOR:
  # Set before gcsfs is imported (at the first gs:// call); a user's explicit setting wins. gcsfs
  # would ask Google's storage-control API for each bucket's type (60 s timeouts); tensorstore
  # ignores STORAGE_EMULATOR_HOST, and without a token it looks for credentials (the GCE
  # metadata server) that an emulator does not check.
  os.environ.setdefault('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'false')
  os.environ.setdefault('TENSORSTORE_GCS_HTTP_URL', EMULATOR)
  os.environ.setdefault('GOOGLE_AUTH_TOKEN_FOR_TESTING', 'emulator')

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging as absl_logging
import aiohttp
from etils import epath
import fsspec
# pylint: enable=g-import-not-at-top,wrong-import-position

if EMULATOR:  # no credentials to look for (FSSPEC_GS_TOKEN, read when fsspec is imported, wins)
  fsspec.config.conf.setdefault('gs', {}).setdefault('token', 'anon')

# tensorstore (orbax's arrays) retries a GCS request 32 times, up to 32 s apart: a quarter of an
# hour before a save to an unreachable bucket fails. 5 tries take about 30 s, as gcsfs's 6 do.
TENSORSTORE_GCS_RETRIES = {'max_retries': 5, 'initial_delay': '1s', 'max_delay': '32s'}


class ObjectStorageError(OSError):
  """A request to object storage failed once the client's retries were spent."""


def _one_line(record: logging.LogRecord) -> bool:
  """Below ``--verbosity=1`` a client's failed request is one line: the error itself reaches the
  caller (one paragraph), so its traceback from the IO thread only repeats it."""
  if record.exc_info and absl_logging.get_verbosity() < absl_logging.INFO:
    record.exc_info, record.exc_text = None, None
  return True


# The loggers through which gcsfs and fsspec report each failed request from their IO thread.
for _name in ('gcsfs', 'gcsfs.credentials', 'fsspec.asyn', 'fsspec.caching', 'fsspec.prefetcher'):
  logging.getLogger(_name).addFilter(_one_line)


def is_remote(path: str | os.PathLike) -> bool:
  return str(path).startswith('gs://')


def canonical(path: str | os.PathLike) -> str:
  """An absolute local path (``~`` expanded), or a ``gs://`` URL as given (no trailing slash)."""
  path = os.fspath(path)
  if is_remote(path):
    return path.rstrip('/')
  return os.path.abspath(os.path.expanduser(path))


def bucket(url: str | os.PathLike) -> str:
  return os.fspath(url).split('://', 1)[1].split('/', 1)[0]


def request_failed(url: str, e: BaseException) -> str:
  """The sentence for a request to object storage (for ``url``) that failed with ``e``."""
  if isinstance(e, ObjectStorageError) and e.__cause__ is not None:
    e = e.__cause__  # the client's error, not our sentence about it
  where = (f'Check that the emulator at {EMULATOR} (STORAGE_EMULATOR_HOST) is running' if EMULATOR
           else f'Check the network, and that these credentials may read and write gs://'
           f'{bucket(url)} (gcloud storage ls gs://{bucket(url)})')
  return (f'Object storage could not be reached, or refused the request, for {url}: '
          f'{type(e).__name__}: {" ".join(str(e).split())[:300]}. {where}')


@functools.cache
def _limit_tensorstore_retries() -> None:
  # orbax builds a fresh tensorstore context from these defaults for every save and restore.
  # pylint: disable-next=g-import-not-at-top  (2 s; loaded by then wherever orbax is used)
  from orbax.checkpoint._src.serialization import tensorstore_utils
  for context in (tensorstore_utils._BASE_TS_CONTEXT,  # pylint: disable=protected-access
                  tensorstore_utils._DEFAULT_OCDBT_TS_CONTEXT):  # pylint: disable=protected-access
    context.setdefault('gcs_request_retries', dict(TENSORSTORE_GCS_RETRIES))


def _missing_bucket(name: str) -> str:
  if EMULATOR:
    return (f'The bucket gs://{name} does not exist on the emulator at {EMULATOR} '
            f'(STORAGE_EMULATOR_HOST). Create it there (a POST of {{"name": "{name}"}} to '
            f'{EMULATOR}/storage/v1/b; on Google Cloud: gcloud storage buckets create '
            f'gs://{name}), or check the bucket name in the path, then rerun the same command.')
  return (f'The bucket gs://{name} does not exist, or is not accessible with these credentials. '
          f'Create it (gcloud storage buckets create gs://{name}), or check the bucket name in '
          'the path and the credentials (gcloud auth application-default login, or '
          'GOOGLE_APPLICATION_CREDENTIALS), then rerun the same command.')


@functools.cache
def _check_bucket(name: str) -> None:
  """Once per bucket and process: a missing one is named, not a missing file at the first write."""
  try:
    fsspec.filesystem('gs').ls(name, max_results=1, refresh=True)
  except FileNotFoundError:
    raise ObjectStorageError(_missing_bucket(name)) from None
  except Exception as e:  # pylint: disable=broad-except
    _raise_named(e, f'gs://{name}')


def path(name: str | os.PathLike) -> epath.Path:
  """The epath of a local path or a ``gs://`` URL (``canonical``), its bucket checked."""
  name = canonical(name)
  if is_remote(name):
    _limit_tensorstore_retries()
    _check_bucket(bucket(name))
  return epath.Path(name)


class _NotSent(ObjectStorageError):
  """A request the breaker failed at once (an OSError: gcsfs does not retry it)."""


# not in gcsfs: test_gcs_errors::test_the_emulator_killed_during_training_ends_it_within_a_minute
class _Breaker:
  """gcsfs retries a request that cannot connect for about 30 s, and a failing save or exit makes
  many in a row: once nothing has connected for OPEN_S, requests fail at once, but for a probe
  every PROBE_S. Its hooks (aiohttp's request tracing) run on fsspec's IO thread."""
  OPEN_S, PROBE_S = 30.0, 10.0

  def __init__(self):
    self.failing_since: float | None = None  # the first failure to connect since an answer
    self.error: BaseException | None = None
    self.last_try = -math.inf

  def is_open(self) -> bool:
    return self.failing_since is not None and time.monotonic() - self.failing_since >= self.OPEN_S

  def trip(self, e: BaseException) -> None:
    now = time.monotonic()
    self.failing_since, self.error, self.last_try = now - self.OPEN_S, e, now

  async def _start(self, session, context, params) -> None:
    del session, context
    if self.is_open() and time.monotonic() - self.last_try < self.PROBE_S:
      raise _NotSent(f'{params.method} {params.url} not sent: object storage has not answered '
                     f'for {time.monotonic() - self.failing_since:.0f} s') from self.error
    self.last_try = time.monotonic()

  async def _failed(self, session, context, params) -> None:
    del session, context
    if isinstance(params.exception, aiohttp.ClientConnectionError) and self.failing_since is None:
      self.failing_since, self.error = time.monotonic(), params.exception

  async def _answered(self, session, context, params) -> None:
    del session, context, params
    self.failing_since = None

  def tracing(self) -> aiohttp.TraceConfig:
    config = aiohttp.TraceConfig()
    config.on_request_start.append(self._start)
    config.on_request_exception.append(self._failed)
    config.on_request_end.append(self._answered)
    return config


_breaker = _Breaker()
fsspec.config.conf.setdefault('gs', {}).setdefault('session_kwargs', {}).setdefault(
    'trace_configs', []).append(_breaker.tracing())


def mark_unreachable(e: BaseException) -> None:
  """Object storage failed with ``e`` where the breaker could not see it (tensorstore)."""
  _breaker.trip(e)


def unreachable() -> bool:
  """Whether nothing has connected to object storage for OPEN_S (requests fail at once)."""
  return _breaker.is_open()


# gcsfs names no gs:// URL: test_gcs_errors::test_a_storage_error_names_the_url_not_an_http_endpoint
def _raise_named(e: Exception, url: str) -> None:
  """Raises a client's error on ``url`` as ObjectStorageError; anything else (FileNotFoundError
  included: callers test for it) as it is."""
  # pylint: disable=g-import-not-at-top  (gcsfs is loaded by then: it made the request)
  from gcsfs.retry import HttpError
  from google.auth.exceptions import GoogleAuthError
  # pylint: enable=g-import-not-at-top
  if isinstance(e, FileNotFoundError) or (isinstance(e, ObjectStorageError) and not isinstance(
      e, _NotSent)) or not isinstance(e, (OSError, HttpError, GoogleAuthError)):
    raise e
  raise ObjectStorageError(f'{request_failed(url, e)}, then rerun the same command.') from e


def _named_on_failure(paths: int = 1) -> Callable[[Callable], Callable]:
  """Client errors on the first gs:// URL among the ``paths`` leading arguments, named."""

  def decorate(func: Callable) -> Callable:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
      try:
        return func(*args, **kwargs)
      except Exception as e:  # pylint: disable=broad-except
        url = next((a for a in args[:paths] if is_remote(a)), None)
        if url is None:
          raise
        _raise_named(e, canonical(url))

    return wrapper

  return decorate


@_named_on_failure()
def exists(name: str | os.PathLike) -> bool:
  return path(name).exists()


@_named_on_failure()
def is_dir(name: str | os.PathLike) -> bool:
  return path(name).is_dir()


@_named_on_failure()
def is_file(name: str | os.PathLike) -> bool:
  p = path(name)
  return p.exists() and not p.is_dir()


@_named_on_failure()
def makedirs(name: str | os.PathLike) -> None:
  """Creates a directory and its parents (on object storage: nothing to create)."""
  path(name).mkdir(parents=True, exist_ok=True)


@_named_on_failure()
def listdir(name: str | os.PathLike) -> list[str]:
  """The names in a directory ([] if it does not exist)."""
  p = path(name)
  return sorted(child.name for child in p.iterdir()) if p.is_dir() else []


@_named_on_failure()
def size(name: str | os.PathLike) -> int:
  return path(name).stat().length


@_named_on_failure()
def read_bytes(name: str | os.PathLike) -> bytes:
  return path(name).read_bytes()


@_named_on_failure()
def read_text(name: str | os.PathLike) -> str:
  return path(name).read_text()


def read_json(name: str | os.PathLike) -> Any:
  return json.loads(read_text(name))


@_named_on_failure()
def files_under(name: str | os.PathLike) -> list[str]:
  """Paths (relative to ``name``) of every file below a directory."""
  root = path(name)
  # Walking gs:// yields 'bucket/dir' strings, without the scheme.
  strip = lambda p: os.fspath(p).split('://', 1)[-1].rstrip('/')
  return [os.path.normpath(os.path.join(os.path.relpath(strip(directory), strip(root)), file))
          for directory, _, files in root.walk() for file in files]


@_named_on_failure(paths=2)
def move(source: str | os.PathLike, target: str | os.PathLike) -> None:
  """Moves a file or a directory tree (on object storage: copies, then deletes the source)."""
  if not is_remote(source) and not is_remote(target):
    os.rename(canonical(source), canonical(target))
    return
  src, dst = path(source), path(target)
  for rel in files_under(src) if src.is_dir() else ['']:
    (src / rel if rel else src).copy(dst / rel if rel else dst, overwrite=True)
  src.rmtree() if src.is_dir() else src.unlink()


@_named_on_failure(paths=2)
def copy_file(source: str | os.PathLike, target: str | os.PathLike) -> None:
  path(source).copy(path(target), overwrite=True)


@_named_on_failure()
def write_atomically(name: str | os.PathLike, content: bytes | str) -> None:
  """A reader (or a run killed at any moment) sees the old file or the new one, never a mix:
  locally a temporary file, fsync and a rename; on object storage an upload is whole."""
  data = content.encode() if isinstance(content, str) else content
  if is_remote(name):
    path(name).write_bytes(data)
    return
  target = canonical(name)
  tmp = f'{target}.tmp.{os.getpid()}'
  try:
    with open(tmp, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, target)
  except BaseException as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    if isinstance(e, OSError) and e.errno is not None:  # about the target, not our temporary
      raise OSError(e.errno, e.strerror, target) from e
    raise


def write_json(name: str | os.PathLike, obj: Any) -> None:
  write_atomically(name, json.dumps(obj, indent=2, sort_keys=True) + '\n')


@_named_on_failure()
def sha256(name: str | os.PathLike) -> str:
  with path(name).open('rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest()


class LocalMirror:
  """A local directory that ``sync`` copies to ``target``, for writers that ignore the GCS
  emulator (TensorBoard, the profiler); a local ``target`` itself."""

  def __init__(self, target: str):
    self.target = canonical(target)
    self.local = tempfile.mkdtemp(prefix='roformer-') if is_remote(target) else self.target
    self._copied: dict[str, tuple[int, int]] = {}  # file -> (size, mtime) when last copied

  def sync(self) -> None:
    """Copies the files that are new or changed since the last sync."""
    if self.local == self.target or not os.path.isdir(self.local):
      return
    for rel in files_under(self.local):
      stat = os.stat(os.path.join(self.local, rel))
      if self._copied.get(rel) != (stat.st_size, stat.st_mtime_ns):
        write_atomically(os.path.join(self.target, rel),
                         path(os.path.join(self.local, rel)).read_bytes())
        self._copied[rel] = (stat.st_size, stat.st_mtime_ns)

  def close(self) -> None:
    self.sync()
    if self.local != self.target:
      shutil.rmtree(self.local, ignore_errors=True)
