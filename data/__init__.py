"""Text-classification data for the position-scheme ablations: datasets, tokenizers, pipelines.

``data.name`` picks the dataset (``DATASET_NAMES``):

* embedded, generated or read on this machine and prepared automatically into ``data.data_dir``
  (TFDS's default directory if unset) on first use: ``position_probes/<task>`` (order, distance,
  nearest; see ``data/position_probes.py``), ``listops``, ``listops/small`` and ``fortunes``
  (needs ``apt-get install fortunes``);
* TFDS text datasets, which must be prepared beforehand (no download here; see
  ``python -m data.prepare``): ``imdb_reviews``, ``glue/sst2``, ``ag_news_subset``,
  ``yelp_polarity_reviews`` (splits in ``data/sources.py``);
* ``files``: local CSV/TSV/JSONL files (``data/files.py``).

Every dataset has the splits ``train``, ``validation`` and ``test``; the position probes also
``test_<n>`` at n = 2x and 4x the training length. Tokens: 0 padding, 1 [CLS] (first token of
every example), 2 [SEP] (reserved), 3 unknown; the byte tokenizer maps byte b to b + 4
(vocab_size 260); ``data.tokenizer='sentencepiece'`` trains a model on the training split once and
caches it as ``workdir/spm.model``.

Multi-host: each process reads only its shard of the training data; for evaluation each process
reads the split (evaluation splits are small) and keeps its part, and all processes yield the
same number of batches.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator

import jax
import ml_collections
import tensorflow_datasets as tfds

from data import files as files_lib
from data import fortunes
from data import listops
from data import pipeline
from data import position_probes
from data import sources
from data import tokenizers
from data.pipeline import Batch
from data.tokenizers import BYTE_VOCAB_SIZE, CLS_ID, PAD_ID, SEP_ID, UNK_ID

EMBEDDED_DATASETS = tuple(f'position_probes/{task}' for task in position_probes.TASKS) + (
    'listops', 'listops/small', 'fortunes')
TEXT_DATASETS = tuple(sources.TFDS_TEXT_DATASETS)
DATASET_NAMES = EMBEDDED_DATASETS + TEXT_DATASETS + ('files',)
TOKENIZERS = ('byte', 'sentencepiece')

__all__ = [
    'BYTE_VOCAB_SIZE', 'Batch', 'CLS_ID', 'DATASET_NAMES', 'DatasetInfo', 'EMBEDDED_DATASETS',
    'PAD_ID', 'SEP_ID', 'TEXT_DATASETS', 'TOKENIZERS', 'UNK_ID', 'embedded_builder',
    'eval_iterator', 'eval_split_for_length', 'get_info', 'train_iterator',
]


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What the model and training loop need to know about a dataset.

  Attributes:
    name: ``data.name``.
    num_classes: number of labels.
    class_names: label names, in class-id order.
    vocab_size: token ids are in [0, vocab_size).
    pad_id: the padding id (0).
    train_length: tokens per training example (``data.max_length``, including [CLS]).
    eval_splits: evaluation split -> its natural length in tokens, e.g. ``{'validation': 64,
      'test': 64, 'test_128': 128, 'test_256': 256}`` for the probes; ``data.max_length`` for
      datasets of natural text.
    num_train_examples: training examples (all hosts together).
  """

  name: str
  num_classes: int
  class_names: tuple[str, ...]
  vocab_size: int
  pad_id: int
  train_length: int
  eval_splits: dict[str, int]
  num_train_examples: int


def embedded_builder(name: str, data_dir: str | None) -> tfds.core.GeneratorBasedBuilder:
  """The TFDS builder of an embedded dataset (``EMBEDDED_DATASETS``); not prepared yet."""
  if name.startswith('position_probes/'):
    return position_probes.PositionProbes(config=name.split('/', 1)[1], data_dir=data_dir)
  if name == 'listops':
    return listops.Listops(config='listops', data_dir=data_dir)
  if name == 'listops/small':
    return listops.Listops(config='small', data_dir=data_dir)
  if name == 'fortunes':
    return fortunes.Fortunes(config='topics', data_dir=data_dir)
  raise ValueError(f'{name!r} is not an embedded dataset; valid: {EMBEDDED_DATASETS}')


@dataclasses.dataclass(frozen=True)
class _Dataset:
  info: DatasetInfo
  source: sources.Source
  tokenizer: tokenizers.Tokenizer


def _natural_lengths(builder: tfds.core.DatasetBuilder | None, splits: tuple[str, ...],
                     max_length: int) -> dict[str, int]:
  """Split -> length in tokens that holds its examples: fixed by generated datasets' configs,
  ``max_length`` (truncating) for natural text."""
  config = builder.builder_config if builder else None
  if isinstance(config, position_probes.PositionProbesConfig):
    return config.split_lengths()
  if isinstance(config, listops.ListOpsConfig):
    return {split: config.max_length for split in splits}
  return {split: max_length for split in splits}


def _load(data_config: ml_collections.ConfigDict, workdir: str | None) -> _Dataset:
  """Resolves ``data.name`` to a source, tokenizer and info (preparing embedded datasets)."""
  name = data_config.name
  builder = None
  if name == 'files':
    source = files_lib.FilesSource(
        train_files=data_config.train_files, validation_files=data_config.validation_files,
        test_files=data_config.test_files, text_column=data_config.text_column,
        label_column=data_config.label_column, workdir=workdir)
  elif name in TEXT_DATASETS:
    source = sources.tfds_text_source(name, data_config.data_dir)
  elif name in EMBEDDED_DATASETS:
    builder = embedded_builder(name, data_config.data_dir)
    source = sources.embedded_source(builder)
  else:
    raise ValueError(f'Unknown data.name {name!r}; valid: {DATASET_NAMES}')

  lengths = _natural_lengths(builder, source.splits, data_config.max_length)
  if lengths['train'] > data_config.max_length:
    raise ValueError(f'{name} has training sequences of {lengths["train"]} tokens (with [CLS]); '
                     f'data.max_length={data_config.max_length} would cut them and change labels.')

  if data_config.tokenizer == 'byte':
    tokenizer = tokenizers.ByteTokenizer()
  elif data_config.tokenizer == 'sentencepiece':
    if workdir is None:
      raise ValueError('data.tokenizer=sentencepiece needs a workdir to cache spm.model')
    tokenizer = tokenizers.load_or_train_sentencepiece(
        workdir, name, data_config.sp_vocab_size, lambda: source.read('train')[0])
  else:
    raise ValueError(f'Unknown data.tokenizer {data_config.tokenizer!r}; valid: {TOKENIZERS}')

  info = DatasetInfo(
      name=name,
      num_classes=len(source.class_names),
      class_names=source.class_names,
      vocab_size=tokenizer.vocab_size,
      pad_id=PAD_ID,
      train_length=data_config.max_length,
      eval_splits={split: n for split, n in lengths.items() if split != 'train'},
      num_train_examples=source.num_examples('train'),
  )
  return _Dataset(info, source, tokenizer)


def get_info(data_config: ml_collections.ConfigDict, *, workdir: str | None) -> DatasetInfo:
  """Dataset facts for building the model; prepares embedded data and SentencePiece if needed.

  Raises:
    ValueError: unknown ``data.name`` (the message lists the valid names) or tokenizer, or
      ``data.max_length`` too short for a generated dataset.
    FileNotFoundError: a TFDS text dataset is not prepared in ``data.data_dir`` (says how to).
  """
  return _load(data_config, workdir).info


def _process(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if not 0 <= index < count:
    raise ValueError(f'process_index {index} is not in [0, process_count={count})')
  return index, count


def _local_batch_size(global_batch_size: int, process_count: int) -> int:
  if global_batch_size <= 0 or global_batch_size % process_count:
    raise ValueError(f'Global batch size {global_batch_size} is not a positive multiple of the '
                     f'{process_count} processes')
  return global_batch_size // process_count


def train_iterator(data_config: ml_collections.ConfigDict, *, workdir: str | None, seed: int,
                   global_batch_size: int, start_step: int = 0, process_index: int | None = None,
                   process_count: int | None = None) -> Iterator[Batch]:
  """Infinite training batches (this process's rows of each global batch), reshuffled every
  epoch.

  Global batch i depends only on (data, seed, i): process p of k yields rows
  ``[p * B / k, (p + 1) * B / k)`` of it, so the examples a step trains on do not depend on the
  number of processes (a run resumed on another slice size sees the same data), and
  ``start_step=s`` yields exactly what a fresh iterator yields from its s-th batch on. Each
  process reads the split's texts (not a per-host shard, as the order is global) but tokenizes
  only its rows. Batches hold ``global_batch_size // process_count`` examples of
  ``data.max_length`` tokens (see ``data/pipeline.py`` for the keys); weights are all 1.

  Args:
    data_config: the ``data`` config group.
    workdir: holds spm.model / classes.json (may be None for byte-level TFDS data).
    seed: data-order seed.
    global_batch_size: examples per step over all processes.
    start_step: index of the first batch to yield.
    process_index, process_count: this process's block of rows, and the number of blocks
      (default: JAX's process index and count).

  Raises:
    ValueError: if the global batch size is not a multiple of process_count, or the split is
      empty.
  """
  index, count = _process(process_index, process_count)
  batch_size = _local_batch_size(global_batch_size, count)
  dataset = _load(data_config, workdir)
  texts, labels = dataset.source.read('train')
  if not len(labels):
    raise ValueError(f'The training split of {data_config.name} is empty.')
  return pipeline.train_batches(
      texts, labels, dataset.tokenizer, length=data_config.max_length,
      global_batch_size=global_batch_size, rows=(index * batch_size, batch_size), seed=seed,
      start_step=start_step, prefetch=data_config.prefetch)


def eval_iterator(data_config: ml_collections.ConfigDict, split: str, *, workdir: str | None,
                  global_batch_size: int, max_length: int | None = None,
                  process_index: int | None = None,
                  process_count: int | None = None) -> Iterator[Batch]:
  """All examples of a split once (over all processes), in fixed order, then weight-0 padding.

  Process p of k evaluates the p-th of k contiguous parts of the split; every process yields
  ``ceil(ceil(n / k) / (global_batch_size / k))`` batches, so multi-host evaluation stays in step.

  Args:
    data_config: the ``data`` config group.
    split: a key of ``DatasetInfo.eval_splits``, or ``train``.
    workdir: holds spm.model / classes.json.
    global_batch_size: examples per batch over all processes.
    max_length: tokens per example; None: the split's natural length. Texts longer than this
      are truncated (length-extrapolation evaluation of natural text uses larger values).
    process_index, process_count: this host and the number of hosts (default: JAX's).
  """
  index, count = _process(process_index, process_count)
  batch_size = _local_batch_size(global_batch_size, count)
  dataset = _load(data_config, workdir)
  lengths = {'train': dataset.info.train_length, **dataset.info.eval_splits}
  if split not in lengths:
    raise ValueError(f'{data_config.name} has no split {split!r}; valid: {list(lengths)}')
  texts, labels = dataset.source.read(split)
  start, stop = sources.shard_bounds(len(labels), index, count)
  num_batches = math.ceil(math.ceil(len(labels) / count) / batch_size)
  return pipeline.eval_batches(
      texts[start:stop], labels[start:stop], dataset.tokenizer,
      length=max_length or lengths[split], batch_size=batch_size, num_batches=num_batches,
      prefetch=data_config.prefetch)


def eval_split_for_length(info: DatasetInfo, length: int) -> str:
  """The test split to evaluate at ``length`` tokens.

  Datasets with test splits of several lengths (the probes: ``test``, ``test_128``, ...) map a
  length to the split of exactly that length; other datasets evaluate ``test`` at any length
  (``eval_iterator(..., max_length=length)`` truncates or pads it).

  Raises:
    ValueError: for a dataset with per-length test splits, none of which has this length.
  """
  tests = {split: n for split, n in info.eval_splits.items()
           if split == 'test' or split.startswith('test_')}
  for split, n in tests.items():
    if n == length:
      return split
  if len(tests) == 1:
    return 'test'
  raise ValueError(f'{info.name} has test splits of lengths {tests}, none of {length} tokens')
