"""Files cached in the workdir (SentencePiece model, class list), written atomically."""

from __future__ import annotations

import os


def write_atomically(path: str, content: bytes) -> None:
  """Writes ``content`` via a temporary file and a rename: readers never see a partial file, and
  hosts that write the same content concurrently do not corrupt it."""
  tmp = f'{path}.tmp.{os.getpid()}'
  with open(tmp, 'wb') as f:
    f.write(content)
  os.replace(tmp, path)
