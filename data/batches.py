"""Batches: their two core types (``flax.struct`` pytrees), and the one sampler that orders every
task's examples.

Training order (with one shard, ``sources.TrainShards``): the example at row j of global batch s
(G rows) is the ``(s G + j) mod n``-th entry of a permutation of the split's n examples that
depends only on (seed, epoch = (s G + j) // n, n), so starting at step s costs nothing and
yields what a fresh iterator yields from step s on. A grain ``MapDataset`` maps steps to batches
and prepares ``prefetch`` of them ahead in threads (grain's own shuffle and sharding give other
orders: benchmarks/README.md, "Input pipeline").
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
import zlib
from typing import Callable, Iterator, Sequence, Union

import flax.struct
import grain
import numpy as np
import tensorflow as tf

from data import sources


class Classification(flax.struct.PyTreeNode):
  """A classifier's examples: ``inputs``, ``positions`` int32 and ``mask`` bool [B, L] ([B, 2, L]
  for two-tower pairs), joint pairs' ``token_types``, ``label`` [B] (float32 for regression),
  ``weight`` float32 [B] (0 for evaluation padding)."""

  inputs: np.ndarray
  positions: np.ndarray
  mask: np.ndarray
  label: np.ndarray
  weight: np.ndarray
  token_types: np.ndarray | None = None


class LanguageModel(flax.struct.PyTreeNode):
  """A language model's packed rows [B, L] (``segments``: documents from 1, 0 at padding);
  ``targets`` and ``target_weights`` are [B, M] for MLM (at ``target_positions``), [B, L] for
  CLM."""

  inputs: np.ndarray
  positions: np.ndarray
  segments: np.ndarray
  mask: np.ndarray
  targets: np.ndarray
  target_weights: np.ndarray
  target_positions: np.ndarray | None = None


Batch = Union[Classification, LanguageModel]  # and the batch types projects add
# (example numbers [b], their slots [b], for masking) -> a batch; a number past the examples is
# padding (weight 0).
Make = Callable[[np.ndarray, np.ndarray], Batch]
# (slots in their epoch [b], epoch keys [b], shard sizes [b]) -> example numbers in the shards.
Shuffle = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

_TF_SEED_PAD = 498247692  # what tf.random.experimental.index_shuffle puts before a seed pair
# TensorFlow's eager ops, called from grain's prefetch threads at once, crashed a test process
# (a segmentation fault in two threads' tf.shape): every eager call of the batch makers holds it.
TF_LOCK = threading.Lock()


def index_shuffle(seed: int) -> Shuffle:
  """TF's stateless index shuffle keyed (seed, epoch key): the classifiers' order."""

  def shuffle(slots, keys, nums):
    # The raw op takes one seed per slot where the public wrapper takes one for all.
    seeds = np.stack([np.full_like(keys, _TF_SEED_PAD), np.full_like(keys, seed), keys], 1)
    with TF_LOCK:
      return tf.raw_ops.RandomIndexShuffle(index=slots, seed=seeds, max_index=nums - 1,
                                           rounds=4).numpy()
  return shuffle


def permutations(seed: int, num_shards: int) -> Shuffle:
  """NumPy's permutation seeded (seed, epoch key): the language models' order."""
  permutation = functools.lru_cache(maxsize=2 * num_shards)(
      lambda key, num: np.random.default_rng([seed, key]).permutation(num))
  return lambda slots, keys, nums: np.asarray(
      [permutation(int(k), int(n))[s] for s, k, n in zip(slots, keys, nums)], np.int64)


def train(make: Make, sizes: list[int], shards: sources.TrainShards, *, shuffle: Shuffle,
          start_step: int, prefetch: int) -> Iterator[Batch]:
  """Infinite training batches from ``start_step`` on: this process's ``shards.rows`` of each
  global batch, from the shards ``shards.needed`` (``sizes`` examples each, numbered in turn)."""
  first_row, batch_size = shards.rows
  rows = first_row + np.arange(batch_size)
  offsets, sizes = np.cumsum([0] + sizes[:-1]), np.asarray(sizes)

  def at(step: int) -> Batch:
    shard, slot = shards.locate(step, rows)
    part, num = shard - shards.needed.start, sizes[shard - shards.needed.start]
    examples = offsets[part] + shuffle(slot % num, shards.epoch_key(slot // num, shard), num)
    return make(examples, step * shards.global_batch_size + rows)

  return by_step(at, start_step=start_step, prefetch=prefetch)


def evaluate(make: Make, *, batch_size: int, num_batches: int, first_slot: int = 0,
             prefetch: int) -> Iterator[Batch]:
  """Exactly ``num_batches`` batches of the examples in order, then padding."""

  def at(i: int) -> Batch:
    examples = np.arange(i * batch_size, (i + 1) * batch_size)
    return make(examples, first_slot + examples)

  return _iterate(grain.MapDataset.range(num_batches).map(at), prefetch)


def by_step(at: Callable[[int], Batch], *, start_step: int, prefetch: int) -> Iterator[Batch]:
  """Infinite batches ``at(step)`` from ``start_step`` on (data computed from the step alone)."""
  return _iterate(grain.MapDataset.range(start_step, sys.maxsize).map(at), prefetch)


def _iterate(batches: grain.MapDataset, prefetch: int) -> Iterator[Batch]:
  return iter(batches.to_iter_dataset(grain.ReadOptions(num_threads=prefetch,
                                                        prefetch_buffer_size=prefetch)))


def randomized_positions(batch: Batch, size: int, keys: Sequence[Sequence[int]]) -> Batch:
  """``batch`` whose every document (a row's real tokens, a two-tower text, or a packed row's
  segment) has a sorted sample without repetition of 0 .. ``size`` - 1 as positions, drawn from
  ``default_rng(keys[i])`` for row i; padding keeps 0."""
  segments = getattr(batch, 'segments', None)
  documents = np.asarray(batch.mask, np.int32) if segments is None else np.where(
      batch.mask, segments, 0)
  length = documents.shape[-1]
  positions = np.zeros(documents.shape, np.int32)
  for row, key in enumerate(keys):
    rng = np.random.default_rng(key)
    for documents_L, positions_L in zip(documents[row].reshape(-1, length),
                                        positions[row].reshape(-1, length)):
      for document in np.unique(documents_L[documents_L > 0]):
        at_L = documents_L == document
        positions_L[at_L] = np.sort(rng.choice(size, int(at_L.sum()), replace=False))
  return batch.replace(positions=positions.astype(np.asarray(batch.positions).dtype))


@dataclasses.dataclass(frozen=True)
class RandomPositions:
  """Randomized positional encodings (Ruoss et al. 2023, docs/randomized_positions.md), drawn
  from 0 .. ``size`` - 1: a training row's from (seed, step, its row of the global batch), an
  evaluation row's from (seed, split, its example's number), never the batch size."""

  size: int
  seed: int

  def training(self, batch: Batch, step: int, rows: Sequence[int]) -> Batch:
    return randomized_positions(batch, self.size, [(self.seed, 0, step, int(r)) for r in rows])

  def evaluation(self, batch: Batch, split: str, examples: Sequence[int]) -> Batch:
    tag = zlib.crc32(split.encode())
    return randomized_positions(batch, self.size,
                                [(self.seed, 1, tag, int(e)) for e in examples])
