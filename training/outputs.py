"""Where a command may write: never over one of its inputs (by name, symbolic or hard link), nor
over a run's own files (``RUN_FILES``, ``RUN_FOLDERS``), checked before any work is done."""

from __future__ import annotations

import os
from typing import Iterable

from data import datasets
from data import files
import storage
from data import tokenizers
from training import checkpoints
from training import evaluation
from training import metrics
from training import trainer
from training import validation
from training import workdir as workdir_lib

RUN_FILES = (validation.CONFIG_FILE, validation.DATA_FILE, trainer.SUMMARY_FILE,
             metrics.METRICS_FILE, datasets.INFO_FILE, files.CLASSES_FILE, evaluation.EVAL_FILE,
             workdir_lib.LOCK_FILE, tokenizers.SP_MODEL_FILE, tokenizers.SP_META_FILE,
             tokenizers.HF_TOKENIZER_FILE, tokenizers.TRAINED_META_FILE)
RUN_FOLDERS = (checkpoints.CHECKPOINT_DIR, checkpoints.CORRUPT_DIR, 'tb', 'profile', 'wandb')


def _local(path: str) -> str:
  return os.path.realpath(storage.canonical(path))


def _same(a: str, b: str) -> bool:
  if storage.is_remote(a) or storage.is_remote(b):
    return storage.canonical(a) == storage.canonical(b)
  try:
    return _local(a) == _local(b) or os.path.samefile(storage.canonical(a), storage.canonical(b))
  except OSError:  # one of them does not exist yet
    return False


def _inside(path: str, folder: str) -> bool:
  if storage.is_remote(path) or storage.is_remote(folder):
    return storage.canonical(path).startswith(storage.canonical(folder) + '/')
  return _local(path).startswith(_local(folder) + os.sep)


def check(paths: Iterable[str], flag: str, *, inputs: Iterable[str] = (),
          workdir: str | None = None, folder: str | None = None, own: Iterable[str] = ()) -> None:
  """ValueError naming ``flag`` if writing any of ``paths`` would replace an input, a run's file
  but ``own`` (e.g. eval.json), a file of ``folder``, or if one is a folder."""
  protected = [(p, 'the input') for p in inputs]
  if workdir:
    protected += [(os.path.join(workdir, name), f'a file of the run in {workdir}')
                  for name in RUN_FILES if name not in own]
  if folder:  # listdir: [] unless a folder
    protected += [(p, f'a file of {folder}') for name in storage.listdir(folder)
                  if storage.is_file(p := os.path.join(folder, name))]
  for path in paths:
    if storage.is_dir(path):
      raise ValueError(f'{flag}: {path} is a folder; name a file to write (nothing was written).')
    for other, what in protected:
      if _same(path, other):
        named = '' if storage.canonical(path) == storage.canonical(other) else f' ({other})'
        raise ValueError(f'{flag}: {path} is {what}{named}, which writing there would replace: '
                         'choose another path (nothing was written).')
    for name in RUN_FOLDERS if workdir else ():
      if _inside(path, os.path.join(workdir, name)):
        raise ValueError(f'{flag}: {path} is inside {name}/ of the run in {workdir}: choose '
                         'another path (nothing was written).')
