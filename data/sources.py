"""Where examples come from: TFDS builders, prepared elsewhere or embedded (data/builders.py)."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

import data
from data import builders


class Source(Protocol):
  """Named splits of labelled texts."""

  splits: tuple[str, ...]
  class_names: tuple[str, ...]
  pairs: bool  # Texts are [n, 2] (sentence pairs), not [n].

  def num_examples(self, split: str) -> int:
    """Examples in the whole split."""

  def read(self, split: str, shard_index: int = 0,
           shard_count: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Part ``shard_index`` of ``shard_count`` of a split, reading only that part: texts (object
    [n] of bytes, or [n, 2] for pairs) and labels (int32 [n])."""


def shard_bounds(num: int, index: int, count: int) -> tuple[int, int]:
  """[start, stop) of part ``index`` of ``count`` near-equal contiguous parts of ``num`` items."""
  return num * index // count, num * (index + 1) // count


@dataclasses.dataclass(frozen=True)
class TrainShards:
  """The training split cut into ``count`` contiguous shards (``data.num_shards``): rows [j R,
  (j + 1) R) of every global batch (R = B / count) draw from shard j, in its own shuffle per
  epoch. A process owning ``rows`` (first row, number) reads only the shards they draw from."""

  count: int
  global_batch_size: int
  rows: tuple[int, int]

  def __post_init__(self):
    check_shards(self.count, self.global_batch_size)

  @property
  def rows_per_shard(self) -> int:
    return self.global_batch_size // self.count

  @property
  def needed(self) -> range:
    first, num = self.rows
    return range(first // self.rows_per_shard, (first + num - 1) // self.rows_per_shard + 1)

  def locate(self, step: Any, row: Any) -> tuple[Any, Any]:
    """(shard, slot in the shard) of global-batch ``row`` at ``step``."""
    return row // self.rows_per_shard, step * self.rows_per_shard + row % self.rows_per_shard

  def epoch_key(self, epoch: Any, shard: Any) -> Any:
    return epoch * self.count + shard


def check_shards(count: int, global_batch_size: int) -> None:
  if count < 1 or global_batch_size % count:
    raise ValueError(f'data.num_shards={count} must be >= 1 and divide the global batch size '
                     f'{global_batch_size}: each shard fills an equal part of every batch. Use a '
                     'divisor of the global batch that is a multiple of the number of hosts.')


def read_shards(source: Source, split: str, shards: TrainShards) -> list[tuple[np.ndarray,
                                                                              np.ndarray]]:
  parts = [source.read(split, j, shards.count) for j in shards.needed]
  if any(not len(labels) for _, labels in parts):
    raise ValueError(f'The {split} split has fewer examples than data.num_shards='
                     f'{shards.count} (a shard is empty): lower data.num_shards.')
  return parts


class TfdsSource:
  """Splits of a prepared TFDS builder with a ``label`` ClassLabel feature."""

  def __init__(self, builder: tfds.core.DatasetBuilder, fields: data.TextFields):
    self._builder = builder
    self._fields = fields
    self.splits = tuple(fields.splits)
    self.pairs = fields.pair
    self.class_names = (('value',) if fields.regression else () if fields.corpus
                        else tuple(builder.info.features['label'].names))

  def num_examples(self, split: str) -> int:
    return self._builder.info.splits[self._fields.splits[split]].num_examples

  def read(self, split: str, shard_index: int = 0,
           shard_count: int = 1) -> tuple[np.ndarray, np.ndarray]:
    spec = self._fields.splits[split]
    if shard_count > 1:
      spec = tfds.even_splits(spec, n=shard_count)[shard_index]
    ds = self._builder.as_dataset(split=spec, shuffle_files=False)
    fields = self._fields
    join = ((lambda ex: tf.stack([ex[k] for k in fields.text_keys], -1)) if fields.pair
            else (lambda ex: tf.strings.join([ex[k] for k in fields.text_keys], '\n')))
    dtype = tf.float32 if fields.regression else tf.int32
    ds = ds.map(lambda ex: (join(ex), tf.cast(0 if fields.corpus else ex['label'], dtype)))
    batches = list(tfds.as_numpy(ds.batch(4096)))
    empty = np.zeros([0, 2] if fields.pair else [0], object)
    return (np.concatenate([empty] + [t.astype(object) for t, _ in batches]),
            np.concatenate([np.zeros([0], dtype.as_numpy_dtype)] + [y for _, y in batches]))


def tfds_text_source(name: str, data_dir: str | None) -> TfdsSource:
  """A source for a prepared TFDS dataset (FileNotFoundError, at once, if it is not)."""
  builder = tfds.builder(name, data_dir=data_dir)
  if not builder.is_prepared():
    raise FileNotFoundError(
        f'TFDS dataset {name!r} is not prepared: no data in {builder.data_dir}, and it is not '
        'downloaded automatically. On a machine with internet, run '
        f'`tfds build {name} --data_dir=DIR` (pip install tensorflow-datasets), copy '
        f'DIR/{name.split("/")[0]} into the data_dir here (data.data_dir, default '
        '~/tensorflow_datasets), or set --config.data.data_dir to a copy of DIR.')
  return TfdsSource(builder, data.DATASETS[name].fields)


def embedded_source(builder: builders.EmbeddedBuilder) -> TfdsSource:
  """A source for an embedded builder, generated on first use."""
  prepare(builder)
  return TfdsSource(builder, data.TextFields(builder.TEXTS, {s: s for s in builder.info.splits},
                                             pair=len(builder.TEXTS) == 2))


def prepare(builder: tfds.core.GeneratorBasedBuilder) -> None:
  """Generates an embedded dataset into its data_dir unless it is there (TFDS renames a complete
  one into place); a missing local file raises the builder's FileNotFoundError, not TFDS's."""
  if not builder.is_prepared():
    try:
      builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
          compute_stats=tfds.download.ComputeStatsMode.SKIP))
    except FileNotFoundError as e:
      cause = e
      while isinstance(cause.__cause__, FileNotFoundError):
        cause = cause.__cause__
      raise FileNotFoundError(' '.join(str(cause).split())) from None
