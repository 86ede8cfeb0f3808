"""Batches: their two core types, and the one sampler that orders every task's examples.

A ``Classification`` batch (classification and sentence pairs, ``data/pipeline.py``) or a
``LanguageModel`` batch (MLM and CLM, ``data/lm.py``), or a project's own batch type, holds
NumPy arrays of this process's rows, then ``jax.Array`` s of the global batch (``flax.struct``
pytrees: a field left None is no leaf).

Training order (``sources.TrainShards``; with one shard): the example at row j of global batch s
(G rows) is the ``(s G + j) mod n``-th entry of a permutation of the split's n examples (packed
rows for a language model) that depends only on (seed, epoch = (s G + j) // n, n); a process
yields its rows of each global batch. With ``data.num_shards`` = S, the rows of a global batch
draw in the same way from S contiguous shards of the split (G / S rows each). Each example is
computed from its slot alone, so starting at step s costs nothing and yields exactly the batches
a fresh iterator yields from step s on; every epoch is reshuffled. A grain ``MapDataset`` maps
step numbers to batches and prepares ``prefetch`` of them ahead in threads; grain's own shuffle
and sharding give other orders (benchmarks/README.md, "Input pipeline").

``RandomPositions`` (``data.random_positions``) replaces the positions of any batch type that has
``positions`` and ``mask`` (and optionally ``segments``) by randomized ones (Ruoss et al. 2023,
docs/randomized_positions.md); the run applies it to every batch it reads (``training.experiment``).
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
  """Examples of a classifier: ``inputs`` int32 [B, L] token ids ([CLS], the text's tokens, then
  0), ``positions`` int32 [B, L] (from [CLS] = 0; 0 at padding), ``mask`` bool [B, L] (true at
  real tokens); two-tower pairs ('dual') have [B, 2, L] of these, joint pairs ``token_types``
  int32 [B, L] (1 from the second text to its [SEP]). ``label`` int32 [B] class ids (float32
  for regression), ``weight`` float32 [B]: 1 for a real example, 0 for evaluation padding."""

  inputs: np.ndarray
  positions: np.ndarray
  mask: np.ndarray
  label: np.ndarray
  weight: np.ndarray
  token_types: np.ndarray | None = None


class LanguageModel(flax.struct.PyTreeNode):
  """Packed rows of a language model: ``inputs``, ``positions``, ``segments`` (documents
  numbered from 1, 0 at padding) int32 [B, L], ``mask`` bool [B, L]; ``targets`` int32 and
  ``target_weights`` float32, [B, M] for MLM (the masked tokens, at ``target_positions`` int32
  [B, M]) or [B, L] for CLM (the next tokens, ``target_positions`` None)."""

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
  """NumPy's permutation seeded (seed, epoch key): the language models' order (a batch spans at
  most two epochs of each shard, whose permutations are kept)."""
  permutation = functools.lru_cache(maxsize=2 * num_shards)(
      lambda key, num: np.random.default_rng([seed, key]).permutation(num))
  return lambda slots, keys, nums: np.asarray(
      [permutation(int(k), int(n))[s] for s, k, n in zip(slots, keys, nums)], np.int64)


def train(make: Make, sizes: list[int], shards: sources.TrainShards, *, shuffle: Shuffle,
          start_step: int, prefetch: int) -> Iterator[Batch]:
  """Infinite training batches from ``start_step`` on: this process's ``shards.rows`` of each
  global batch, from the examples of the shards ``shards.needed`` (``sizes`` of them each,
  numbered one shard after another)."""
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
  """Exactly ``num_batches`` batches of the examples in order (slots from ``first_slot``), then
  padding."""

  def at(i: int) -> Batch:
    examples = np.arange(i * batch_size, (i + 1) * batch_size)
    return make(examples, first_slot + examples)

  return _iterate(grain.MapDataset.range(num_batches).map(at), prefetch)


def by_step(at: Callable[[int], Batch], *, start_step: int, prefetch: int) -> Iterator[Batch]:
  """Infinite batches ``at(step)`` from ``start_step`` on, for data computed from the step alone
  (generated tasks): resuming at step s yields what a fresh iterator yields from s on."""
  return _iterate(grain.MapDataset.range(start_step, sys.maxsize).map(at), prefetch)


def _iterate(batches: grain.MapDataset, prefetch: int) -> Iterator[Batch]:
  return iter(batches.to_iter_dataset(grain.ReadOptions(num_threads=prefetch,
                                                        prefetch_buffer_size=prefetch)))


def randomized_positions(batch: Batch, size: int, keys: Sequence[Sequence[int]]) -> Batch:
  """``batch`` whose every document's positions are a sorted sample without repetition of
  0 .. ``size`` - 1, placed in order at its real tokens; padding keeps 0. A document is a row's
  real tokens (each text of a two-tower pair on its own), or, where the batch has ``segments``,
  each numbered document of a packed row. Row i draws its documents one after another from
  ``np.random.default_rng(keys[i])``, so a row's positions depend on its key alone."""
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
  """``data.random_positions`` = ``size`` (N) with ``data.seed``: randomized positional
  encodings (Ruoss et al. 2023), positions drawn from 0 .. N - 1 in training and evaluation, as
  the authors' code does. A training row's draw depends only on (seed, step, its row of the
  global batch); an evaluation row's on (seed, split, its example's number in the split), never
  on the evaluation batch size or on when it is evaluated."""

  size: int
  seed: int

  def training(self, batch: Batch, step: int, rows: Sequence[int]) -> Batch:
    """This process's ``rows`` of global batch ``step``."""
    return randomized_positions(batch, self.size, [(self.seed, 0, step, int(r)) for r in rows])

  def evaluation(self, batch: Batch, split: str, examples: Sequence[int]) -> Batch:
    """The rows holding ``examples`` (their numbers in ``split``; past its end: padding)."""
    tag = zlib.crc32(split.encode())
    return randomized_positions(batch, self.size,
                                [(self.seed, 1, tag, int(e)) for e in examples])
