"""Where a command may write: never over one of its inputs, nor over a run's own files.

``check(paths, flag, inputs=..., folder=...)`` runs before any work is done: each output path
must not be an input file (the same file by name, through a symbolic link, or a hard link), nor a
file of the input folder (a run's workdir, its checkpoints included) other than ``own`` (names
the command itself writes there, such as eval.json), nor an existing folder.
"""

from __future__ import annotations

import os
from typing import Iterable

from data import storage
from training import checkpoints


def _same(a: str, b: str) -> bool:
  """Whether two paths name one file (local: by resolved path, or inode for hard links)."""
  if storage.is_remote(a) or storage.is_remote(b):
    return storage.canonical(a) == storage.canonical(b)
  if os.path.realpath(a) == os.path.realpath(b):
    return True
  try:
    return os.path.samefile(a, b)
  except OSError:  # one of them does not exist yet
    return False


def _inside(path: str, folder: str) -> bool:
  if storage.is_remote(path) or storage.is_remote(folder):
    return storage.canonical(path).startswith(storage.canonical(folder) + '/')
  folder = os.path.realpath(folder)
  return os.path.realpath(path).startswith(folder + os.sep)


def _folder_files(folder: str, own: Iterable[str]) -> list[str]:
  """The files of an input folder (a run's workdir, a checkpoint) a command must leave alone:
  its top-level files but ``own``."""
  if not storage.is_dir(folder):
    return []
  return [os.path.join(folder, name) for name in storage.listdir(folder)
          if name not in own and storage.is_file(os.path.join(folder, name))]


def check(paths: Iterable[str], flag: str, *, inputs: Iterable[str] = (),
          folder: str | None = None, own: Iterable[str] = ()) -> None:
  """ValueError naming ``flag`` if writing any of ``paths`` would replace an input or a file of
  ``folder`` (the run's workdir, or an input checkpoint), or if one is an existing folder."""
  protected = [(p, 'the input') for p in inputs]
  if folder:
    protected += [(p, f'a file of {folder}') for p in _folder_files(folder, own)]
  for path in paths:
    if storage.is_dir(path):
      raise ValueError(f'{flag}: {path} is a folder; name a file to write (nothing was written).')
    for other, what in protected:
      if _same(path, other):
        named = '' if storage.canonical(path) == storage.canonical(other) else f' ({other})'
        raise ValueError(f'{flag}: {path} is {what}{named}, which writing there would replace: '
                         'choose another path (nothing was written).')
    if folder and _inside(path, os.path.join(folder, checkpoints.CHECKPOINT_DIR)):
      raise ValueError(f'{flag}: {path} is inside the checkpoints of {folder}: choose another '
                       'path (nothing was written).')
