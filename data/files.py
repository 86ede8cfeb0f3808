"""The user's own data (``data.name=files``, and ``predict.py``'s input): CSV, TSV or JSONL files,
optionally gzipped, read as docs/data.md ("Your own files") says. Texts are kept as raw bytes.
The classes come from the training labels and are kept in ``workdir/classes.json``, so their ids
do not change on resume or evaluation.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import functools
import gzip
import io
import itertools
import json
import os
import re
from typing import IO, Iterator

import numpy as np

from settings import lists
import storage
from data.sources import shard_bounds

CLASSES_FILE = 'classes.json'
HOLDOUT_FRACTION = 0.1
_HOLDOUT_SEED = 0
_INTEGER = re.compile(r'-?\d+')
_FORMATS = {'.csv': ',', '.tsv': '\t', '.tab': '\t', '.jsonl': None, '.ndjson': None}
QUOTING = ('auto', 'csv', 'none')  # data.quoting
_SNIFF_BYTES = 4096  # the start of a file that is checked for UTF-16/UTF-32
# UTF-32's little-endian mark starts with UTF-16's, so it comes first.
_WIDE_BOMS = ((codecs.BOM_UTF32_LE, 'UTF-32'), (codecs.BOM_UTF32_BE, 'UTF-32'),
              (codecs.BOM_UTF16_LE, 'UTF-16'), (codecs.BOM_UTF16_BE, 'UTF-16'))
_MAX_CLASSES = 1_000_000  # integer labels beyond this (or far sparser than their range): IDs
csv.field_size_limit(2**31 - 1)  # long documents: the default limit is 128 KiB per field
_FIX_LABEL = ('Fix the label, or add an example of that class to the training files (and delete '
              'classes.json in a workdir that has one).')


@dataclasses.dataclass(frozen=True)
class _Row:
  """One parsed row: where it came from (for error messages), its text and its raw label."""

  where: str
  text: bytes | tuple[bytes, bytes]  # A pair with data.text_b_column.
  label: str


@dataclasses.dataclass(frozen=True)
class Classes:
  """Class names in id order, and whether the files' labels are class ids rather than names."""

  names: tuple[str, ...]
  integer_labels: bool

  def label_id(self, row: _Row) -> int:
    if self.integer_labels:
      if not _INTEGER.fullmatch(row.label):
        raise ValueError(f'{row.where}: label {row.label!r} is not an integer class id, but the '
                         'training labels are class ids 0..n-1. Use class ids in every file, '
                         'or class names in every file.')
      label = int(row.label)
      if not 0 <= label < len(self.names):
        raise ValueError(f'{row.where}: label {label} is outside the class range '
                         f'[0, {len(self.names)}) that the training labels define (the largest '
                         f'training label + 1). {_FIX_LABEL}')
      return label
    if row.label not in self._ids:
      raise ValueError(f'{row.where}: label {row.label!r} is not one of the classes '
                       f'{list(self.names)} that the training labels define. {_FIX_LABEL}')
    return self._ids[row.label]

  @functools.cached_property
  def _ids(self) -> dict[str, int]:
    return {name: i for i, name in enumerate(self.names)}


def _to_bytes(text: str) -> bytes:
  """Text read with errors='surrogateescape' -> its bytes."""
  try:
    return text.encode('utf-8', errors='surrogateescape')
  except UnicodeEncodeError:  # Lone surrogates from JSON escapes such as "\ud800".
    return text.encode('utf-8', errors='replace')


def _refuse_utf16_or_32(path: str, head: bytes) -> None:
  """ValueError if a file starts with a UTF-16/32 byte-order mark, or has NUL bytes."""
  encoding = next((name for mark, name in _WIDE_BOMS if head.startswith(mark)), None)
  if encoding is None and b'\0' not in head:
    return
  found = (f'starts with a {encoding} byte-order mark' if encoding else
           f'holds NUL bytes in its first {_SNIFF_BYTES // 1024} KiB (UTF-16 or UTF-32 without '
           'a byte-order mark, or not text at all)')
  name = os.path.basename(path)
  plain = name[:-3] if name.lower().endswith('.gz') else name
  stem, extension = os.path.splitext(plain)
  iconv = f'iconv -f {encoding or "UTF-16"} -t UTF-8'
  source = f'gunzip -c {name} | {iconv}' if plain != name else f'{iconv} {name}'
  raise ValueError(f'{path} {found}; input files are read as UTF-8. Convert it and pass the '
                   f'converted file, e.g. {source} > {stem}.utf8{extension}')


def _open(path: str, newline: str = '\n') -> IO[str]:
  """The file as text (gunzipped for .gz), without a UTF-8 byte-order mark, invalid UTF-8 kept
  (``_to_bytes``); csv needs ``newline=''``."""
  if not path.lower().endswith('.gz'):
    binary = storage.path(path).open('rb')
  elif storage.is_remote(path):  # gzip would not close a file object it was given
    binary = io.BytesIO(gzip.decompress(storage.read_bytes(path)))
  else:
    binary = gzip.open(storage.canonical(path), 'rb')
  try:
    _refuse_utf16_or_32(path, binary.read(_SNIFF_BYTES))
    binary.seek(0)
  except BaseException:
    binary.close()
    raise
  return io.TextIOWrapper(binary, newline=newline, encoding='utf-8-sig',
                          errors='surrogateescape')


def _lines(f: IO[str]) -> Iterator[str]:
  r"""A file's lines: each ends at '\n' only (not at a lone '\r', which editors do not show as a
  line end); a Windows '\r\n' ends one too."""
  for line in f:
    yield line.removesuffix('\n').removesuffix('\r')


@dataclasses.dataclass(frozen=True)
class Columns:
  """Which columns (JSONL: keys) hold the texts and the label ('': none), a headerless file's
  column ``names``, and ``data.quoting``."""

  text: str
  label: str
  text_b: str = ''
  names: tuple[str, ...] = ()
  quoting: str = 'auto'

  def __post_init__(self):
    if self.quoting not in QUOTING:
      raise ValueError(f'data.quoting={self.quoting!r} is not valid; valid choices: '
                       f'{", ".join(QUOTING)} (auto: .csv files quoted by CSV rules, .tsv/.tab '
                       'files not quoted).')

  @classmethod
  def of(cls, data_config) -> Columns:
    return cls(text=data_config.text_column, label=data_config.label_column,
               text_b=data_config.text_b_column, names=tuple(data_config.columns),
               quoting=data_config.quoting)

  def quoted(self, extension: str) -> bool:
    return self.quoting == 'csv' or (self.quoting == 'auto' and extension == '.csv')

  @property
  def wanted(self) -> tuple[str, ...]:
    return tuple(c for c in (self.text, self.text_b, self.label) if c)

  def row(self, where: str, record: dict) -> _Row:
    text = _to_bytes(record[self.text])
    if self.text_b:
      text = (text, _to_bytes(record[self.text_b]))
    return _Row(where, text, record[self.label].strip() if self.label else '')


_FIX_COLUMNS = ('set data.text_column, data.text_b_column and data.label_column to the names your '
                'file uses')


# csv's QUOTE_NONE still ends a row at a lone \r: test_input_files::test_unquoted_rows_are_lines
class _UnquotedReader:
  """csv.DictReader's fieldnames, line_num and records for unquoted files: a row a line
  (``_lines``), blank lines skipped; a short row's missing fields are None."""

  def __init__(self, f: IO[str], names: tuple[str, ...], delimiter: str):
    self._lines, self._delimiter, self.line_num = _lines(f), delimiter, 0
    self.fieldnames = list(names) or self._next_fields()

  def _next_fields(self) -> list[str] | None:
    for line in self._lines:
      self.line_num += 1
      if line:
        return line.split(self._delimiter)
    return None

  def __iter__(self) -> Iterator[dict[str, str | None]]:
    while (fields := self._next_fields()) is not None:
      yield dict(itertools.zip_longest(self.fieldnames, fields[:len(self.fieldnames)]))


def _read_delimited(f: IO[str], path: str, delimiter: str, columns: Columns,
                    quoted: bool) -> Iterator[_Row]:
  i, start = 0, 1
  try:
    reader = (csv.DictReader(f, fieldnames=list(columns.names) or None, delimiter=delimiter,
                             strict=True) if quoted
              else _UnquotedReader(f, columns.names, delimiter))
    for column in columns.wanted:
      if reader.fieldnames is None or column not in reader.fieldnames:
        where = 'data.columns' if columns.names else 'the header'
        raise ValueError(f'{path}: no column {column!r} in {where} {reader.fieldnames}. The '
                         'first row must name the columns (or data.columns, for files without a '
                         f'header); {_FIX_COLUMNS}.')
    start = reader.line_num + 1
    for i, record in enumerate(reader, start=1):
      where = f'{path}, row {i} (line {reader.line_num})'
      if any(record[column] is None for column in columns.wanted):
        raise ValueError(f'{where}: fewer fields than the header; ' + (
            'quote fields that contain the delimiter or a newline.' if quoted else
            'this file is read without quoting (data.quoting), so every delimiter splits a '
            'field and a row ends at its line.'))
      yield columns.row(where, record)
      start = reader.line_num + 1
  except csv.Error as e:
    raise ValueError(f'{path}, row {i + 1} (from line {start}): not valid CSV ({e}); a quote '
                     'that opens a field must close it (write a quote inside a quoted field '
                     'as ""), or, if this file does not quote its fields (common for TSV), set '
                     '--config.data.quoting=none.') from None


def _read_jsonl(f: IO[str], path: str, columns: Columns) -> Iterator[_Row]:
  for line_number, line in enumerate(f, start=1):
    if not line.strip():
      continue
    where = f'{path}, row {line_number} (line {line_number})'
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f'{where}: invalid JSON ({e}); each line must be one JSON object, '
                       'e.g. {"text": "...", "label": "..."}.') from None
    if not isinstance(record, dict) or any(c not in record for c in columns.wanted):
      raise ValueError(f'{where}: expected an object with keys {list(columns.wanted)}; '
                       f'{_FIX_COLUMNS}.')
    label = record[columns.label] if columns.label else ''
    if label is None or isinstance(label, (dict, list)):
      raise ValueError(f'{where}: the label {json.dumps(label)} is not a class name or id; '
                       'every example needs a label (remove the row or fill it in).')
    as_text = lambda v: '' if v is None else v if isinstance(v, str) else json.dumps(v)
    yield columns.row(where, {k: as_text(record[k]) if k != columns.label else str(label)
                              for k in columns.wanted})


def read_rows(path: str, columns: Columns) -> list[_Row]:
  """All rows of one file, in order."""
  if not storage.is_file(path):
    raise FileNotFoundError(f'Data file {path!r} not found (data.train_files, '
                            'data.validation_files and data.test_files are comma-separated paths, '
                            f'relative to {os.getcwd()}); fix the path.')
  stem, extension = os.path.splitext(path.lower())
  if extension == '.gz':
    stem, extension = os.path.splitext(stem)
  if extension not in _FORMATS:
    raise ValueError(f'{path}: unknown format; the format is taken from the extension: .csv, '
                     '.tsv, .tab, .jsonl or .ndjson, optionally gzipped (.csv.gz). Decompress '
                     'other archives (zip, bz2, xz, zst) first.')
  delimiter = _FORMATS[extension]
  quoted = bool(delimiter) and columns.quoted(extension)
  try:  # csv needs newline='': it ends rows itself, outside quotes only
    with _open(path, newline='' if quoted else '\n') as f:
      rows = list(_read_delimited(f, path, delimiter, columns, quoted) if delimiter
                  else _read_jsonl(f, path, columns))
  except (gzip.BadGzipFile, EOFError) as e:
    raise ValueError(f'{path}: not a complete gzip file ({e}).') from None
  for row in rows:
    if columns.label and not row.label:
      raise ValueError(f'{row.where}: empty label; every example needs a label (remove the row '
                       'or fill it in).')
  return rows


def _read_lines(path: str, columns: Columns) -> list[_Row]:
  """A .txt file's rows: an example a line, a pair's two texts separated by a tab."""
  if not storage.is_file(path):
    raise FileNotFoundError(f'Input file {path!r} not found; fix the path.')
  with _open(path) as f:
    lines = list(_lines(f))
  rows = []
  for i, line in enumerate(lines, start=1):
    text = _to_bytes(line)
    if columns.text_b:
      if b'\t' not in text:
        raise ValueError(f'{path}, line {i}: the model reads pairs; write each example as the '
                         'two texts separated by a tab.')
      text = tuple(text.split(b'\t', 1))
    rows.append(_Row(f'{path}, line {i}', text, ''))
  return rows


def read_inputs(path: str, columns: Columns) -> np.ndarray:
  """The texts of a file to predict on (object [n], or [n, 2] with ``columns.text_b``)."""
  if path.lower().endswith(('.txt', '.txt.gz')):
    rows = _read_lines(path, columns)
  else:
    rows = read_rows(path, dataclasses.replace(columns, label=''))
  if not rows:
    raise ValueError(f'{path} holds no examples: give one example a line (.txt), or rows of '
                     f'{list(columns.wanted)} (.csv, .tsv, .jsonl).')
  return _texts(rows)


REGRESSION = Classes(('value',), integer_labels=False)  # one real-valued output


def _real_label(row: _Row) -> float:
  try:
    value = float(row.label)
  except ValueError:
    value = float('nan')
  if not np.isfinite(value):
    raise ValueError(f'{row.where}: label {row.label!r} is not a finite number, but '
                     'data.regression=True reads real-valued labels.')
  return value


def _texts(rows: list[_Row]) -> np.ndarray:
  texts = np.empty((len(rows), 2) if rows and isinstance(rows[0].text, tuple) else len(rows),
                   object)
  texts[:] = [row.text for row in rows]
  return texts


def _split_fields(train_files: tuple[str, ...], validation_files: tuple[str, ...],
                  test_files: tuple[str, ...], example: str) -> dict[str, list[str]]:
  """Split -> its data.<split>_files; ValueError without training files or for a file named
  twice (a.csv, ./a.csv: its rows would count twice)."""
  paths = {'train': list(train_files), 'validation': list(validation_files),
           'test': list(test_files)}
  for split, value in paths.items():
    lists.parse(','.join(value), f'data.{split}_files', storage.canonical,
                example='train.csv,more.csv')
  if not paths['train']:
    raise ValueError('data.name=files needs data.train_files (comma-separated paths), e.g. '
                     f'--config.data.train_files={example}.')
  return paths


def infer_classes(rows: list[_Row]) -> Classes:
  """Ids 0..max if all training labels are integers, else the sorted names."""
  if not rows:
    raise ValueError('The training files hold no rows, so there are no classes: give '
                     'data.train_files with at least one labelled example.')
  if all(_INTEGER.fullmatch(row.label) for row in rows):
    if negative := next((row for row in rows if int(row.label) < 0), None):
      raise ValueError(f'{negative.where}: negative integer label {negative.label}; integer '
                       'labels are class ids 0..n-1 (or use class names).')
    ids = {int(row.label) for row in rows}
    num_classes, distinct = max(ids) + 1, len(ids)
    if num_classes > _MAX_CLASSES or num_classes > 10 * distinct + 10:
      raise ValueError(f'The training labels are integers up to {num_classes - 1} but only '
                       f'{distinct} distinct values: that looks like an ID column, not class ids '
                       '0..n-1. Set data.label_column to the column that holds the class (or '
                       'use class names).')
    return Classes(tuple(str(i) for i in range(num_classes)), integer_labels=True)
  return Classes(tuple(sorted({row.label for row in rows})), integer_labels=False)


def load_classes(workdir: str | None) -> Classes | None:
  path = os.path.join(workdir, CLASSES_FILE) if workdir else None
  if not path or not storage.exists(path):
    return None
  try:
    saved = storage.read_json(path)
    return Classes(tuple(str(n) for n in saved['class_names']), bool(saved['integer_labels']))
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f'{path} is unreadable ({type(e).__name__}: {e}); it holds the class ids of '
                     'this workdir. Delete it to infer the classes from the training files '
                     'again.') from None


def save_classes(workdir: str | None, classes: Classes) -> None:
  path = os.path.join(workdir, CLASSES_FILE) if workdir else None
  if path and not storage.exists(path):
    storage.makedirs(workdir)
    storage.write_json(path, {'class_names': list(classes.names),
                              'integer_labels': classes.integer_labels})


def _other_splits(paths: dict[str, list[str]], read, train: list,
                  minimum: int = 0) -> tuple[list, list, list]:
  """(train, validation, test): without validation files a fixed HOLDOUT_FRACTION of train (at
  least ``minimum``) is held out; without test files, test is validation."""
  if paths['validation']:
    validation = read('validation')
  else:
    held_out = np.zeros(len(train), bool)
    perm = np.random.default_rng(_HOLDOUT_SEED).permutation(len(train))
    held_out[perm[:max(minimum, int(len(train) * HOLDOUT_FRACTION))]] = True
    train, validation = ([row for row, h in zip(train, held_out) if not h],
                         [row for row, h in zip(train, held_out) if h])
  return train, validation, read('test') if paths['test'] else validation


class _InMemory:
  """Splits parsed into memory: split -> (texts, labels)."""

  splits = ('train', 'validation', 'test')
  _examples: dict[str, tuple[np.ndarray, np.ndarray]]

  def num_examples(self, split: str) -> int:
    return len(self._examples[split][1])

  def read(self, split: str, shard_index: int = 0,
           shard_count: int = 1) -> tuple[np.ndarray, np.ndarray]:
    texts, labels = self._examples[split]
    start, stop = shard_bounds(len(labels), shard_index, shard_count)
    return texts[start:stop], labels[start:stop]


class FilesSource(_InMemory):
  """The splits of ``data.<split>_files``, parsed and checked in memory; ``classes.json`` is
  kept in ``workdir`` (None: inferred, not saved)."""

  def __init__(self, *, train_files: tuple[str, ...], validation_files: tuple[str, ...],
               test_files: tuple[str, ...], columns: Columns, workdir: str | None,
               regression: bool = False):
    paths = _split_fields(train_files, validation_files, test_files, 'train.csv')
    read = lambda split: [row for p in paths[split] for row in read_rows(p, columns)]
    train = read('train')
    # classes.json is written only once every row of every split has a valid label, so bad
    # input leaves nothing behind in the workdir.
    classes = REGRESSION if regression else load_classes(workdir) or infer_classes(train)
    train, validation, test = _other_splits(paths, read, train)
    for split, rows in (('validation', validation), ('test', test)):
      if not rows:
        raise ValueError(f'The {split} split is empty ({len(train)} training rows). Give '
                         f'data.{split}_files with at least one labelled row, or, without '
                         'data.validation_files, at least 10 training rows (a tenth is held '
                         'out for validation).')
    self.class_names = classes.names
    self.pairs = bool(columns.text_b)
    label = _real_label if regression else classes.label_id
    self._examples = {
        split: (_texts(rows), np.array([label(row) for row in rows],
                                       np.float32 if regression else np.int32))
        for split, rows in (('train', train), ('validation', validation), ('test', test))}
    if not regression:
      save_classes(workdir, classes)


def read_documents(path: str, columns: Columns) -> list[bytes]:
  """A file's documents, for pre-training: in .txt files separated by blank lines, else a row's
  ``columns.text``."""
  if path.lower().endswith(('.txt', '.txt.gz')):
    if not storage.is_file(path):
      read_rows(path, columns)  # the not-found message
    with _open(path) as f:
      content = f.read()
    documents = re.split(r'\n[ \t]*\r?\n', content)
    return [_to_bytes(d.strip()) for d in documents if d.strip()]
  return [row.text for row in read_rows(path, columns)]


class DocumentsSource(_InMemory):
  """The documents of ``data.<split>_files``, for language models."""

  class_names = ()
  pairs = False

  def __init__(self, *, train_files: tuple[str, ...], validation_files: tuple[str, ...],
               test_files: tuple[str, ...], text_column: str, quoting: str = 'auto'):
    paths = _split_fields(train_files, validation_files, test_files, 'corpus.txt')
    columns = Columns(text=text_column, label='', quoting=quoting)
    read = lambda split: [d for p in paths[split] for d in read_documents(p, columns)]
    splits = zip(self.splits, _other_splits(paths, read, read('train'), minimum=1))
    self._examples = {}
    for split, documents in splits:
      if not documents:
        raise ValueError(f'The {split} split of data.name=files has no document: give more '
                         f'text (blank lines separate documents in .txt files) or '
                         f'data.{split}_files.')
      self._examples[split] = (np.asarray(documents + [b''], object)[:-1],
                               np.zeros(len(documents), np.int32))
