"""Loading a dataset by name (``data.DATASETS``): its info, training and evaluation batches.

``load_classifier`` and ``load_language_model`` (called by a run's task kind) resolve
``data.name`` to a source, a tokenizer and a ``DatasetInfo``, preparing embedded datasets and
training a tokenizer on first use. The data a step sees does not depend on the number of
processes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Callable, Iterable, Iterator

import jax
import numpy as np

import data
from data import batches
from data.config import DataConfig
from data import builders
# pylint: disable=unused-import  (the embedded builders register themselves: builders.BUILDERS)
from data import corpus
from data import fortunes
from data import manpages
from data import position_probes
# pylint: enable=unused-import
from data import files as files_lib
from data import lm
from data import pipeline
from data import sources
import storage
from data import tokenizers


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What the model and training loop need to know about a dataset: ``train_length`` is
  ``data.max_length`` (with [CLS]); ``eval_splits``: evaluation split -> its length in tokens;
  ``num_train_examples`` counts all hosts."""

  name: str
  num_classes: int
  class_names: tuple[str, ...]
  vocab_size: int
  train_length: int
  eval_splits: dict[str, int]
  num_train_examples: int
  pairs: bool = False  # Each example is two texts (data.text_b_column).
  task: str = 'classify'  # train.task: language models count rows of packed tokens as examples


INFO_FILE = 'dataset.json'  # a run's DatasetInfo, for predict.py without the training data


def save_info(info: DatasetInfo, workdir: str) -> None:
  storage.write_json(os.path.join(workdir, INFO_FILE), dataclasses.asdict(info))


def saved_info(workdir: str) -> DatasetInfo | None:
  """The DatasetInfo a run saved (None for a workdir written before it was saved)."""
  path = os.path.join(workdir, INFO_FILE)
  if not storage.is_file(path):
    return None
  fields = storage.read_json(path)
  return DatasetInfo(**dict(fields, class_names=tuple(fields['class_names'])))


def embedded_builder(name: str, data_dir: str | None) -> builders.EmbeddedBuilder:
  """The TFDS builder (not prepared yet) of an embedded dataset."""
  entry = data.DATASETS.get(name)
  if entry is None or entry.kind != 'embedded':
    embedded = [n for n, e in data.DATASETS.items() if e.kind == 'embedded']
    raise ValueError(f'{name!r} is not an embedded dataset; valid: {embedded}')
  builder, config = entry.builder.split('/')
  return builders.BUILDERS[builder](config=config, data_dir=data_dir)


def load_tokenizer(data_config: DataConfig, workdir: str | None,
                   read_training_texts: Callable[[], Iterable[bytes]] | None = None
                   ) -> tokenizers.Tokenizer:
  """``data.tokenizer``: bytes, the workdir's trained model (trained on
  ``read_training_texts()`` if it has none yet) or a Hugging Face tokenizer."""
  kind = data_config.tokenizer  # one of data.TOKENIZERS: DataConfig checked it
  if kind == 'byte':
    return tokenizers.ByteTokenizer()
  if kind == 'huggingface':
    return tokenizers.load_huggingface(workdir, data_config.tokenizer_path)
  if workdir is None:
    cached = tokenizers.SP_MODEL_FILE if kind == 'sentencepiece' else 'it'
    raise ValueError(f'data.tokenizer={kind} needs a workdir to cache {cached}')
  if kind == 'sentencepiece':
    return tokenizers.load_or_train_sentencepiece(
        workdir, data_config.name, data_config.sp_vocab_size, read_training_texts)
  return tokenizers.load_or_train_huggingface(workdir, kind, data_config.name,
                                              data_config.sp_vocab_size, read_training_texts)


def _source(data_config: DataConfig, workdir: str | None, documents: bool
            ) -> tuple[sources.Source, builders.EmbeddedBuilder | None]:
  """The source of ``data.name``, prepared (and its builder if embedded); ``documents``: a
  language model's."""
  name, entry = data_config.name, data.DATASETS[data_config.name]  # DataConfig checked it
  if entry.kind == 'embedded':
    builder = embedded_builder(name, data_config.data_dir)
    return sources.embedded_source(builder), builder
  if entry.kind == 'tfds':
    if entry.fields.corpus and not documents:
      raise ValueError(f'data.name={name!r} is an unlabelled corpus: pre-train on it with '
                       'train.task=mlm or clm.')
    return sources.tfds_text_source(name, data_config.data_dir), None
  if entry.kind != 'files':  # a project's, whose task kind loads it (training/tasks.py)
    raise ValueError(f'data.name={name!r} is a generated task with its own outputs, not a '
                     'corpus: train it with train.task=classify.')
  paths = {f'{split}_files': getattr(data_config, f'{split}_files')
           for split in ('train', 'validation', 'test')}
  if documents:
    return files_lib.DocumentsSource(**paths, text_column=data_config.text_column,
                                     quoting=data_config.quoting), None
  return files_lib.FilesSource(**paths, columns=files_lib.Columns.of(data_config),
                               workdir=workdir, regression=data_config.regression), None


def load_language_model(data_config: DataConfig, workdir: str | None, task: str,
                        masked: bool) -> LanguageModelDataset:
  """``data.name``'s texts as documents for the language model ``task``: ``masked`` (MLM) or
  next-token (CLM) targets."""
  source, _ = _source(data_config, workdir, documents=True)
  return LanguageModelDataset.load(data_config, workdir, source, task, masked)


def load_classifier(data_config: DataConfig, workdir: str | None,
                    pair_layout: str = 'joint') -> Dataset:
  """``data.name`` for a classifier; ``pair_layout``: 'joint' or 'dual' (``data/pipeline.py``)."""
  name = data_config.name
  source, builder = _source(data_config, workdir, documents=False)
  lengths = (builder.split_lengths(data_config.max_length) if builder
             else dict.fromkeys(source.splits, data_config.max_length))
  if lengths['train'] > data_config.max_length:
    raise ValueError(f'{name} has training sequences of {lengths["train"]} tokens (with [CLS]); '
                     f'data.max_length={data_config.max_length} would cut them and change labels.')
  tokenizer = load_tokenizer(data_config, workdir, lambda: source.read('train')[0].reshape(-1))
  info = DatasetInfo(
      name=name, num_classes=len(source.class_names), class_names=source.class_names,
      vocab_size=tokenizer.vocab_size, train_length=data_config.max_length,
      eval_splits={split: n for split, n in lengths.items() if split != 'train'},
      num_train_examples=source.num_examples('train'), pairs=source.pairs)
  return Dataset(info, source, tokenizer, data_config.prefetch, pair_layout,
                 data_config.num_shards)


def _shards(num_shards: int, process_index: int | None, process_count: int | None,
            global_batch_size: int) -> sources.TrainShards:
  index, _, batch_size = local_share(process_index, process_count, global_batch_size)
  return sources.TrainShards(num_shards, global_batch_size, (index * batch_size, batch_size))


def local_share(process_index: int | None, process_count: int | None,
             global_batch_size: int) -> tuple[int, int, int]:
  """(index, count, local batch size) of this process (default: JAX's index and count)."""
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if not 0 <= index < count:
    raise ValueError(f'process_index {index} is not in [0, process_count={count})')
  if global_batch_size <= 0 or global_batch_size % count:
    raise ValueError(f'Global batch size {global_batch_size} is not a positive multiple of the '
                     f'{count} processes')
  return index, count, global_batch_size // count


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A resolved ``data.name``: its info, source and tokenizer, and its batches."""

  info: DatasetInfo
  source: sources.Source
  tokenizer: tokenizers.Tokenizer
  prefetch: int
  pair_layout: str = 'joint'
  num_shards: int = 1  # data.num_shards: see sources.TrainShards

  def num_examples(self, split: str, length: int | None = None) -> int:
    del length
    return self.source.num_examples(split)

  def train_batches(self, *, seed: int, global_batch_size: int, start_step: int = 0,
                    process_index: int | None = None,
                    process_count: int | None = None) -> Iterator[batches.Classification]:
    """Infinite training batches: process p of k (default: JAX's) yields rows [p B / k,
    (p + 1) B / k) of global batch i, which depends only on (data, seed, i); ``start_step=s``
    yields what a fresh iterator yields from its s-th batch on (``data/batches.py``)."""
    if not self.source.num_examples('train'):
      raise ValueError(f'The training split of {self.info.name} is empty.')
    shards = _shards(self.num_shards, process_index, process_count, global_batch_size)
    parts = sources.read_shards(self.source, 'train', shards)
    make = pipeline.maker(*(np.concatenate(p) for p in zip(*parts)), self.tokenizer,
                          length=self.info.train_length, pair_layout=self.pair_layout)
    return batches.train(make, [len(labels) for _, labels in parts], shards,
                         shuffle=batches.index_shuffle(seed), start_step=start_step,
                         prefetch=self.prefetch)

  def eval_batches(self, split: str, *, global_batch_size: int, max_length: int | None = None,
                   process_index: int | None = None,
                   process_count: int | None = None) -> Iterator[batches.Classification]:
    """A split's examples once, in order, then weight-0 padding: process p of k reads the p-th
    of k contiguous parts, in the same number of batches as every process. ``max_length``:
    tokens per example (None: the split's own)."""
    index, count, batch_size = local_share(process_index, process_count, global_batch_size)
    lengths = {'train': self.info.train_length, **self.info.eval_splits}
    if split not in lengths:
      raise ValueError(f'{self.info.name} has no split {split!r}; valid: {list(lengths)}')
    texts, labels = self.source.read(split, index, count)
    num_batches = math.ceil(math.ceil(self.source.num_examples(split) / count) / batch_size)
    make = pipeline.maker(texts, labels, self.tokenizer, length=max_length or lengths[split],
                          pair_layout=self.pair_layout)
    return batches.evaluate(make, batch_size=batch_size, num_batches=num_batches,
                            prefetch=self.prefetch)


def eval_splits_for_length(info: DatasetInfo, length: int, any_length: bool = False
                           ) -> list[str]:
  """The test splits to evaluate at ``length`` tokens: those of exactly that length where a
  dataset has several (the probes), else ``test`` (also with ``any_length``: a corpus packs it
  at any length)."""
  tests = {split: n for split, n in info.eval_splits.items()
           if split == 'test' or split.startswith('test_')}
  if len(tests) == 1 or any_length:
    return ['test']
  if chosen := [split for split, n in tests.items() if n == length]:
    return chosen
  raise ValueError(f'{info.name} has test splits of lengths {sorted(set(tests.values()))}, none '
                   f'of {length} tokens')


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: the caches below
class LanguageModelDataset:
  """A corpus for a language model (``data/lm.py``), with ``Dataset``'s methods; ``test_<n>`` is
  the test split packed at n tokens."""

  info: DatasetInfo
  source: sources.Source
  tokenizer: tokenizers.Tokenizer
  targets: lm.Targets
  eval_tokens: int
  prefetch: int
  num_shards: int = 1  # data.num_shards: see sources.TrainShards

  @classmethod
  def load(cls, data_config: DataConfig, workdir: str | None,
           source: sources.Source, task: str, masked: bool) -> LanguageModelDataset:
    tokenizer = load_tokenizer(data_config, workdir,
                               lambda: lm.corpus_texts(source.read('train')[0]))
    if masked and tokenizer.specials.mask is None:
      raise ValueError(f'data.tokenizer={data_config.tokenizer} has no [MASK] token, which '
                       'train.task=mlm needs: use a tokenizer that has one (byte, wordpiece, '
                       'bpe, or a SentencePiece model trained by this version).')
    length = data_config.max_length
    masking = lm.Masking(tokenizer, tokenizer.vocab_size, data_config.mask_rate,
                         data_config.whole_word_masking) if masked else None
    info = DatasetInfo(
        name=data_config.name, num_classes=tokenizer.vocab_size, class_names=(),
        vocab_size=tokenizer.vocab_size, train_length=length,
        eval_splits={'validation': length, 'test': length,
                     **{f'test_{n}': n for n in data_config.eval_lengths if n != length}},
        num_train_examples=source.num_examples('train'), task=task)
    return cls(info, source, tokenizer, lm.Targets(masking, data_config.seed),
               data_config.eval_tokens, data_config.prefetch, data_config.num_shards)

  def stream(self, split: str) -> lm.Stream:
    """A split's documents tokenized (cached)."""
    return _stream(self, split.split('_')[0])

  def num_examples(self, split: str, length: int | None = None) -> int:
    """Rows of ``split`` packed at ``length`` (default: its length)."""
    return len(_rows(self, split.split('_')[0], length or self._length(split))['inputs'])

  def _length(self, split: str) -> int:
    return {'train': self.info.train_length, **self.info.eval_splits}[split]

  def train_rows(self, shards: sources.TrainShards | None = None) -> list[dict]:
    """The packed rows of each shard in ``shards.needed`` (default: this process's)."""
    shards = shards or _shards(self.num_shards, None, None, self.num_shards * jax.process_count())
    return list(_train_rows(self, shards.count, shards.needed, self.info.train_length))

  def packing_efficiency(self) -> float:
    """Real tokens / slots of this process's training rows."""
    rows = self.train_rows()
    return sum(int(r['mask'].sum()) for r in rows) / sum(r['mask'].size for r in rows)

  def train_batches(self, *, seed: int, global_batch_size: int, start_step: int = 0,
                    process_index: int | None = None,
                    process_count: int | None = None) -> Iterator[batches.LanguageModel]:
    shards = _shards(self.num_shards, process_index, process_count, global_batch_size)
    parts = self.train_rows(shards)
    make = lm.maker({k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, self.targets,
                    stream_id=0)
    return batches.train(make, [len(p['inputs']) for p in parts], shards,
                         shuffle=batches.permutations(seed, len(parts)), start_step=start_step,
                         prefetch=self.prefetch)

  def eval_batches(self, split: str, *, global_batch_size: int, max_length: int | None = None,
                   process_index: int | None = None,
                   process_count: int | None = None) -> Iterator[batches.LanguageModel]:
    """As ``Dataset.eval_batches``, of the split's first ``data.eval_tokens`` tokens."""
    index, count, batch_size = local_share(process_index, process_count, global_batch_size)
    if split not in self.info.eval_splits and split != 'train':
      raise ValueError(f'{self.info.name} has no split {split!r}; valid: '
                       f'{list(self.info.eval_splits)}')
    packed = _rows(self, split.split('_')[0], max_length or self._length(split))
    num = len(packed['inputs'])
    start, stop = sources.shard_bounds(num, index, count)
    make = lm.maker({k: v[start:stop] for k, v in packed.items()}, self.targets, stream_id=1)
    return batches.evaluate(make, batch_size=batch_size, first_slot=start,
                            num_batches=math.ceil(math.ceil(num / count) / batch_size),
                            prefetch=self.prefetch)


@functools.lru_cache(maxsize=8)
def _stream(dataset: LanguageModelDataset, split: str) -> lm.Stream:
  return lm.tokenize(dataset.tokenizer, lm.corpus_texts(dataset.source.read(split)[0]))


@functools.lru_cache(maxsize=4)
def _train_rows(dataset: LanguageModelDataset, count: int, needed: range,
                length: int) -> tuple[dict, ...]:
  """Shards ``needed`` of ``count`` of train, each packed at ``length`` (cached: packed once)."""
  rows = []
  for shard in needed:
    texts = lm.corpus_texts(dataset.source.read('train', shard, count)[0])
    if not texts:
      raise ValueError(f'The training split has fewer documents than data.num_shards={count} '
                       '(a shard is empty): lower data.num_shards.')
    rows.append(lm.pack(lm.tokenize(dataset.tokenizer, texts), length))
  return tuple(rows)


@functools.lru_cache(maxsize=8)
def _rows(dataset: LanguageModelDataset, split: str, length: int) -> dict:
  """A split packed at ``length`` (cached): all of train, an evaluation split's first
  ``eval_tokens`` tokens."""
  stream = dataset.stream(split)
  if split != 'train':
    stream = lm.Stream(stream.ids[:dataset.eval_tokens], stream.documents[:dataset.eval_tokens])
  return lm.pack(stream, length)
