"""Classification batches from in-memory examples, tokenized by tf. Sentence pairs are laid out
as ``pair_layout`` says: 'joint' ([CLS] a [SEP] b [SEP] and ``token_types``) or 'dual' (a row
for each text, [b, 2, L]: LRA Retrieval's two towers).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from data import batches
from data import tokenizers


def _features(tokenizer: tokenizers.Tokenizer, texts: np.ndarray, labels: np.ndarray,
              weights: np.ndarray, length: int, pair_layout: str) -> batches.Classification:
  texts = tf.constant(texts, tf.string)
  token_types = None
  if texts.shape.rank == 1:
    inputs = tokenizer.encode_batch(texts, length)
  elif pair_layout == 'dual':
    inputs = tf.reshape(tokenizer.encode_batch(tf.reshape(texts, [-1]), length), [-1, 2, length])
  else:
    inputs, token_types = tokenizer.encode_pairs(texts, length)
    token_types = token_types.numpy()
  mask = inputs != tokenizer.specials.pad
  positions = tf.where(mask, tf.range(length), 0)
  return batches.Classification(inputs.numpy(), positions.numpy(), mask.numpy(), labels,
                                weights, token_types)


def maker(texts: np.ndarray, labels: np.ndarray, tokenizer: tokenizers.Tokenizer, *,
          length: int, pair_layout: str = 'joint') -> batches.Make:
  """Batches of ``length`` tokens of the examples; past them, padding (empty text, weight 0)."""
  num = len(labels)
  texts = np.concatenate([texts, np.full((1,) + texts.shape[1:], b'', object)])
  labels = np.concatenate([labels, np.zeros([1], labels.dtype)])

  def make(examples: np.ndarray, slots: np.ndarray) -> batches.Classification:
    del slots  # classification draws nothing at random
    examples = np.minimum(examples, num)
    with batches.TF_LOCK:
      return _features(tokenizer, texts[examples], labels[examples],
                       (examples < num).astype(np.float32), length, pair_layout)
  return make
