"""Tokenizers: UTF-8 bytes (default) and SentencePiece trained offline on the training split.

Both share the special ids below and produce, for a batch of texts, [CLS] followed by the text's
tokens, truncated and right-padded with 0 to a fixed length, inside a tf.data pipeline.
"""

from __future__ import annotations

import io
import json
import os
from typing import Callable, Iterable, Protocol

import numpy as np
import sentencepiece as spm
import tensorflow as tf

from data import storage

PAD_ID = 0
CLS_ID = 1
SEP_ID = 2  # End of sequence; reserved, not added by the tokenizers.
UNK_ID = 3
NUM_SPECIAL = 4  # Byte b has id b + NUM_SPECIAL.
BYTE_VOCAB_SIZE = 256 + NUM_SPECIAL

SP_MODEL_FILE = 'spm.model'
SP_META_FILE = 'spm.json'


class Tokenizer(Protocol):
  """What the pipeline needs from a tokenizer."""

  vocab_size: int

  def encode_batch(self, texts: tf.Tensor, length: int) -> tf.Tensor:
    """Texts (tf.string [b]) -> int32 [b, length]: [CLS], tokens truncated, 0-padded."""

  def decode(self, ids: Iterable[int]) -> bytes:
    """Token ids -> text as UTF-8 bytes; special ids are dropped."""


def _check_length(length: int) -> None:
  if length < 2:
    raise ValueError(f'Sequence length {length} must be >= 2 ([CLS] and one token)')


class ByteTokenizer:
  """UTF-8 bytes as tokens (id = byte + 4), no vocabulary; any byte string is valid input."""

  vocab_size = BYTE_VOCAB_SIZE

  def encode_batch(self, texts: tf.Tensor, length: int) -> tf.Tensor:
    """Texts (tf.string [b]) -> int32 [b, length]: [CLS], the first length-1 bytes, 0-padded."""
    _check_length(length)
    body = tf.strings.substr(texts, 0, length - 1)  # Bytes, so a cut may split a character.
    raw = tf.io.decode_raw(body, tf.uint8, fixed_length=length - 1)  # Zero-padded: [b, length-1].
    is_byte = tf.range(length - 1)[tf.newaxis, :] < tf.strings.length(body)[:, tf.newaxis]
    ids = tf.where(is_byte, tf.cast(raw, tf.int32) + NUM_SPECIAL, PAD_ID)
    return tf.concat([tf.fill([tf.shape(texts)[0], 1], CLS_ID), ids], axis=1)

  def decode(self, ids: Iterable[int]) -> bytes:
    return bytes(int(i) - NUM_SPECIAL for i in ids if int(i) >= NUM_SPECIAL)


class SentencePieceTokenizer:
  """A SentencePiece model whose ids 0-3 are [PAD], [CLS], [SEP], [UNK]; non-UTF-8 bytes are
  decoded as U+FFFD before encoding."""

  def __init__(self, model_proto: bytes):
    self._processor = spm.SentencePieceProcessor(model_proto=model_proto)
    self.vocab_size = self._processor.get_piece_size()

  def _encode_numpy(self, texts: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Bytes [b] -> int32 [b, length] (runs in tf.numpy_function)."""
    pieces = self._processor.encode([t.decode('utf-8', errors='replace') for t in texts])
    ids = np.full((len(texts), int(length)), PAD_ID, np.int32)
    ids[:, 0] = CLS_ID
    for row, p in zip(ids, pieces):
      body = p[:int(length) - 1]
      row[1:1 + len(body)] = body
    return ids

  def encode_batch(self, texts: tf.Tensor, length: int) -> tf.Tensor:
    """Texts (tf.string [b]) -> int32 [b, length]: [CLS], the first length-1 pieces, 0-padded."""
    _check_length(length)
    ids = tf.numpy_function(self._encode_numpy, [texts, length], tf.int32, stateful=False)
    return tf.ensure_shape(ids, [None, length])

  def decode(self, ids: Iterable[int]) -> bytes:
    return self._processor.decode([int(i) for i in ids if int(i) >= NUM_SPECIAL]).encode('utf-8')


def train_sentencepiece(texts: Iterable[bytes], vocab_size: int, *, seed: int = 0) -> bytes:
  """Trains a unigram SentencePiece model offline and returns the serialized model.

  ``vocab_size`` counts the 4 special pieces and is an upper bound (smaller corpora give fewer);
  ``seed`` seeds SentencePiece's sampling of sentences, for a reproducible model.
  """
  spm.set_random_generator_seed(seed)
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=(t.decode('utf-8', errors='replace') for t in texts), model_writer=model,
      vocab_size=vocab_size, hard_vocab_limit=False, model_type='unigram',
      pad_id=PAD_ID, bos_id=CLS_ID, eos_id=SEP_ID, unk_id=UNK_ID,
      pad_piece='[PAD]', bos_piece='[CLS]', eos_piece='[SEP]', unk_piece='[UNK]',
      input_sentence_size=1_000_000, shuffle_input_sentence=True, max_sentence_length=1 << 16,
      minloglevel=2)
  return model.getvalue()


def load_or_train_sentencepiece(
    workdir: str, dataset: str, vocab_size: int,
    read_training_texts: Callable[[], Iterable[bytes]]) -> SentencePieceTokenizer:
  """Loads ``workdir/spm.model``, or trains it on ``read_training_texts()`` and saves it there.

  ``workdir/spm.json`` records the dataset and vocabulary size the model was trained for, so a
  workdir reused with other settings fails (ValueError) instead of silently using the wrong
  vocabulary.
  """
  model_path = os.path.join(workdir, SP_MODEL_FILE)
  meta_path = os.path.join(workdir, SP_META_FILE)
  meta = {'dataset': dataset, 'sp_vocab_size': vocab_size}
  if os.path.exists(model_path):
    try:
      with open(meta_path) as f:
        cached = json.load(f)
    except (OSError, ValueError) as e:
      raise ValueError(f'{meta_path}, which records what {model_path} was trained for, is '
                       f'missing or unreadable ({type(e).__name__}); delete spm.model and '
                       'spm.json to retrain the tokenizer, or use another workdir.') from None
    if cached != meta:
      raise ValueError(f'{model_path} was trained for {cached}, not {meta}: use another workdir '
                       'or delete spm.model and spm.json to retrain.')
    with open(model_path, 'rb') as f:
      proto = f.read()
    try:
      return SentencePieceTokenizer(proto)
    except Exception as e:  # pylint: disable=broad-except  (sentencepiece raises RuntimeError)
      raise ValueError(f'{model_path} is not a valid SentencePiece model ({type(e).__name__}); '
                       'delete spm.model and spm.json to retrain the tokenizer.') from None
  proto = train_sentencepiece(read_training_texts(), vocab_size)
  os.makedirs(workdir, exist_ok=True)
  storage.write_json(meta_path, meta)
  storage.write_atomically(model_path, proto)
  return SentencePieceTokenizer(proto)

