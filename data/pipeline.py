"""tf.data pipelines from in-memory examples to NumPy batches.

A batch is a dict of NumPy arrays:

* ``inputs``: int32 [b, L] token ids: [CLS], the text's tokens, then 0 (padding);
* ``positions``: int32 [b, L] position of each token counted from [CLS] = 0 (0 at padding);
* ``mask``: bool [b, L], true at real tokens (false at padding);
* sentence pairs (texts [n, 2]), as ``pair_layout`` says: 'joint' gives [CLS] a [SEP] b [SEP]
  (the longer text cut first to fit L) and ``token_types`` int32 [b, L] (1 from b's first token
  to its [SEP], else 0); 'dual' gives each text its own row: ``inputs``, ``positions`` and
  ``mask`` are [b, 2, L] (LRA Retrieval's two towers);
* ``label``: int32 [b] class ids (float32 targets for regression);
* ``weight``: float32 [b]: 1 for a real example, 0 for padding added to fill the last eval batch.

Training order (``sources.TrainShards``; with one shard): the example used at row j of global
batch s (global batch size G) is the ``(s * G + j) mod n``-th entry of a permutation of the
split's n examples that depends only on (seed, epoch = (s * G + j) // n, n); a process yields its
rows of each global batch. With ``data.num_shards`` = S, rows of a global batch draw in the same
way from S contiguous shards of the split (G / S rows each). Each example index is computed from
its slot alone (``tf.random.experimental.index_shuffle``), so starting at step s costs nothing and
yields exactly the batches a fresh iterator yields from step s on; every epoch is reshuffled.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from data import sources
from data import tokenizers

Batch = dict[str, np.ndarray]


def _features(tokenizer: tokenizers.Tokenizer, texts: tf.Tensor, labels: tf.Tensor,
              weights: tf.Tensor, length: int, pair_layout: str) -> dict[str, tf.Tensor]:
  """Tokenized batch: texts tf.string [b] (pairs: [b, 2]), labels int32 [b], weights float32
  [b] -> Batch."""
  features = {}
  if texts.shape.rank == 1:
    inputs = tokenizer.encode_batch(texts, length)
  elif pair_layout == 'dual':
    inputs = tf.reshape(tokenizer.encode_batch(tf.reshape(texts, [-1]), length), [-1, 2, length])
  else:
    inputs, features['token_types'] = tokenizer.encode_pairs(texts, length)
  mask = inputs != tokenizer.specials.pad
  positions = tf.where(mask, tf.range(length), 0)
  return {'inputs': inputs, 'positions': positions, 'mask': mask, **features, 'label': labels,
          'weight': weights}


def train_batches(parts: list[tuple[np.ndarray, np.ndarray]], tokenizer: tokenizers.Tokenizer,
                  *, shards: sources.TrainShards, length: int, seed: int, start_step: int,
                  prefetch: int, pair_layout: str = 'joint') -> Iterator[Batch]:
  """Infinite shuffled batches of ``length`` tokens from ``start_step`` on: this process's
  ``shards.rows`` (first row, number b) of each global batch, from ``parts``, the (texts object
  [n] of bytes or [n, 2] pairs, labels int32 [n], n >= 1) of the shards ``shards.needed``;
  tf.data prepares ``prefetch`` batches ahead."""
  first_row, batch_size = shards.rows
  sizes = tf.constant([len(labels) for _, labels in parts], tf.int64)
  offsets = tf.constant(np.cumsum([0] + [len(labels) for _, labels in parts[:-1]]), tf.int64)
  all_texts = tf.constant(np.concatenate([texts for texts, _ in parts]), tf.string)
  all_labels = tf.constant(np.concatenate([labels for _, labels in parts]))  # ids or targets

  def example_index(local_slot: tf.Tensor) -> tf.Tensor:
    """This process's slot -> (shard, slot in the shard) -> index of the example there: its
    place in its shard's permutation of that epoch."""
    shard, slot = shards.locate(local_slot // batch_size, first_row + local_slot % batch_size)
    part = shard - shards.needed.start
    num = tf.gather(sizes, part)
    seed_pair = tf.stack([tf.constant(seed, tf.int64), shards.epoch_key(slot // num, shard)])
    return tf.gather(offsets, part) + tf.random.experimental.index_shuffle(
        slot % num, seed_pair, num - 1)

  def batch(indices: tf.Tensor) -> dict[str, tf.Tensor]:
    return _features(tokenizer, tf.gather(all_texts, indices), tf.gather(all_labels, indices),
                     tf.ones([batch_size], tf.float32), length, pair_layout)

  ds = tf.data.Dataset.counter(start=start_step * batch_size)
  ds = ds.map(example_index, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  ds = ds.batch(batch_size).map(batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return iter(tfds.as_numpy(ds.prefetch(prefetch)))


def eval_batches(texts: np.ndarray, labels: np.ndarray, tokenizer: tokenizers.Tokenizer, *,
                 length: int, batch_size: int, num_batches: int, prefetch: int,
                 pair_layout: str = 'joint') -> Iterator[Batch]:
  """Exactly ``num_batches`` batches (the same number on every host) of the n given examples
  (n <= num_batches * batch_size) in order, then weight-0 padding."""
  num_padding = num_batches * batch_size - len(labels)
  if num_padding < 0:
    raise ValueError(f'{len(labels)} examples do not fit {num_batches} batches of {batch_size}')
  texts = np.concatenate([texts, np.full((num_padding,) + texts.shape[1:], b'', object)])
  labels = np.concatenate([labels, np.zeros([num_padding], labels.dtype)])
  weights = np.concatenate([np.ones([len(labels) - num_padding], np.float32),
                            np.zeros([num_padding], np.float32)])
  ds = tf.data.Dataset.from_tensor_slices((tf.constant(texts, tf.string), labels, weights))
  ds = ds.batch(batch_size).map(
      lambda t, y, w: _features(tokenizer, t, y, w, length, pair_layout),
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return iter(tfds.as_numpy(ds.prefetch(prefetch)))
