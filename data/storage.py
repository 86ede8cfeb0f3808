"""Writing files so that readers never see a partial one: one helper for every file this project
writes whole (JSON records, cached tokenizers, class lists, manifests, reports)."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any


def write_atomically(path: str, content: bytes | str) -> None:
  """Writes ``content`` via a temporary file, fsync and a rename: a reader (or a run killed at any
  moment) sees the old file or the new one, never a mix; hosts writing the same content
  concurrently do not corrupt it."""
  tmp = f'{path}.tmp.{os.getpid()}'
  try:
    with open(tmp, 'wb') as f:
      f.write(content.encode() if isinstance(content, str) else content)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_json(path: str, obj: Any) -> None:
  """``obj`` as indented, key-sorted JSON, written atomically."""
  write_atomically(path, json.dumps(obj, indent=2, sort_keys=True) + '\n')


def sha256(path: str) -> str:
  """The SHA-256 of a file's content, hex."""
  with open(path, 'rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest()
