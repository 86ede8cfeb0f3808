"""Tokenizers: UTF-8 bytes (default), SentencePiece, WordPiece and byte-level BPE trained offline
on the training split (cached in the workdir), and a Hugging Face tokenizer.

Bytes and SentencePiece share the ids below: [CLS] then the text's tokens, pairs [CLS] a [SEP] b
[SEP] (``join_pairs``); a Hugging Face tokenizer assembles inputs as its post-processor does, as
``transformers`` feeds them. Every tokenizer carries its special ids (``specials``).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
from typing import Callable, Iterable, Protocol

import numpy as np
import sentencepiece as spm
import tensorflow as tf
import tokenizers as hf_tokenizers

import storage

PAD_ID = 0
CLS_ID = 1
SEP_ID = 2  # Between the texts of a pair, and ends each document of a language model's rows.
UNK_ID = 3  # Bytes have no unknown token: for them this id is [MASK] (MLM).
NUM_SPECIAL = 4  # Byte b has id b + NUM_SPECIAL.
BYTE_VOCAB_SIZE = 256 + NUM_SPECIAL

SP_MODEL_FILE = 'spm.model'
SP_META_FILE = 'spm.json'


@dataclasses.dataclass(frozen=True)
class Specials:
  """A tokenizer's special token ids (``mask`` None: it has no [MASK])."""

  pad: int
  cls: int
  sep: int
  unk: int
  mask: int | None = None


OWN_SPECIALS = Specials(pad=PAD_ID, cls=CLS_ID, sep=SEP_ID, unk=UNK_ID)
MASK_PIECE = '[MASK]'  # SentencePiece models trained here have it (id 4)


class Tokenizer(Protocol):
  """What the pipeline needs from a tokenizer."""

  vocab_size: int
  specials: Specials

  def encode_batch(self, texts: tf.Tensor, length: int) -> tf.Tensor:
    """Texts (tf.string [b]) -> int32 [b, length]: [CLS], tokens truncated, padded."""

  def encode_pairs(self, texts_Bx2: tf.Tensor, length: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Pairs (tf.string [b, 2]) -> (ids, token types), int32 [b, length] each."""

  def decode(self, ids: Iterable[int]) -> bytes:
    """Token ids -> text as UTF-8 bytes; special ids are dropped."""

  def tokenize(self, texts: list[bytes]) -> list[np.ndarray]:
    """Whole texts -> their token ids (int32, no special tokens, no truncation)."""

  def word_starts(self, ids: np.ndarray) -> np.ndarray:
    """bool, the shape of ``ids``: the token begins a word (whole-word masking)."""


def _starts_from_table(tokenizer, ids: np.ndarray) -> np.ndarray:
  """Word starts: tokens that do not continue a word (``tokenizer._continues_V``), and the first."""
  starts = ~tokenizer._continues_V[ids]  # pylint: disable=protected-access
  starts[..., 0] = True
  return starts


def _check_length(length: int) -> None:
  if length < 2:
    raise ValueError(f'Sequence length {length} must be >= 2 ([CLS] and one token)')


def join_pairs(tokenizer: Tokenizer, texts_Bx2: tf.Tensor,
               length: int) -> tuple[tf.Tensor, tf.Tensor]:
  """Pairs -> (ids, token types) int32 [b, length]: [CLS] a [SEP] b [SEP], cut longest first (as
  BERT), padded; types are 1 from b's first token to its [SEP]."""
  if length < 3:
    raise ValueError(f'Sequence length {length} must be >= 3 for pairs ([CLS] and two [SEP])')
  ids_of = tokenizer.specials
  budget = length - 3
  encode = lambda t: tokenizer.encode_batch(t, length)[:, 1:]  # tokens only, >= budget of them
  a_BxK, b_BxK = encode(texts_Bx2[:, 0]), encode(texts_Bx2[:, 1])
  count = lambda ids: tf.reduce_sum(tf.cast(ids != ids_of.pad, tf.int32), 1, keepdims=True)
  len_a, len_b = count(a_BxK), count(b_BxK)
  keep_b = tf.minimum(len_b, tf.maximum(budget - len_a, budget // 2))
  keep_a = tf.minimum(len_a, budget - keep_b)
  j_BxL = tf.broadcast_to(tf.range(length)[tf.newaxis, :], [tf.shape(texts_Bx2)[0], length])
  start_b = keep_a + 2
  take = lambda ids, offset: tf.gather(ids, tf.clip_by_value(j_BxL - offset, 0, length - 2),
                                       batch_dims=1)
  ids = tf.where(j_BxL == 0, ids_of.cls, ids_of.pad)
  ids = tf.where((j_BxL == keep_a + 1) | (j_BxL == start_b + keep_b), ids_of.sep, ids)
  ids = tf.where((j_BxL >= 1) & (j_BxL <= keep_a), take(a_BxK, 1), ids)
  ids = tf.where((j_BxL >= start_b) & (j_BxL < start_b + keep_b), take(b_BxK, start_b), ids)
  types = tf.cast((j_BxL >= start_b) & (j_BxL <= start_b + keep_b), tf.int32)
  return ids, types


_BYTE_WORDLIKE_V = np.zeros(BYTE_VOCAB_SIZE, bool)  # letters, digits and non-ASCII bytes
_BYTE_WORDLIKE_V[[b + NUM_SPECIAL for b in range(256)
                  if chr(b).isalnum() and b < 128 or b >= 128]] = True


class ByteTokenizer:
  """UTF-8 bytes as tokens (id = byte + 4): no byte is unknown, so the [UNK] id is [MASK]."""

  vocab_size = BYTE_VOCAB_SIZE
  specials = dataclasses.replace(OWN_SPECIALS, mask=UNK_ID)
  encode_pairs = join_pairs

  def encode_batch(self, texts: tf.Tensor, length: int) -> tf.Tensor:
    _check_length(length)
    body = tf.strings.substr(texts, 0, length - 1)  # Bytes, so a cut may split a character.
    raw = tf.io.decode_raw(body, tf.uint8, fixed_length=length - 1)  # Zero-padded: [b, length-1].
    is_byte = tf.range(length - 1)[tf.newaxis, :] < tf.strings.length(body)[:, tf.newaxis]
    ids = tf.where(is_byte, tf.cast(raw, tf.int32) + NUM_SPECIAL, PAD_ID)
    return tf.concat([tf.fill([tf.shape(texts)[0], 1], CLS_ID), ids], axis=1)

  def decode(self, ids: Iterable[int]) -> bytes:
    return bytes(int(i) - NUM_SPECIAL for i in ids if int(i) >= NUM_SPECIAL)

  def tokenize(self, texts: list[bytes]) -> list[np.ndarray]:
    return [np.frombuffer(t, np.uint8).astype(np.int32) + NUM_SPECIAL for t in texts]

  def word_starts(self, ids: np.ndarray) -> np.ndarray:
    """A word is a run of letters, digits and non-ASCII bytes; every other byte is its own."""
    wordlike = _BYTE_WORDLIKE_V[ids]
    previous = np.concatenate([np.zeros_like(wordlike[..., :1]), wordlike[..., :-1]], axis=-1)
    return ~(wordlike & previous)


class SentencePieceTokenizer:
  """A SentencePiece model whose ids 0-3 are [PAD], [CLS], [SEP], [UNK]; invalid UTF-8 is read as
  U+FFFD."""

  def __init__(self, model_proto: bytes):
    self._processor = spm.SentencePieceProcessor(model_proto=model_proto)
    self.vocab_size = self._processor.get_piece_size()
    mask = self._processor.piece_to_id(MASK_PIECE)
    self.specials = dataclasses.replace(OWN_SPECIALS,
                                        mask=None if mask == self._processor.unk_id() else mask)

  encode_pairs = join_pairs

  def _encode_numpy(self, texts: np.ndarray, length: np.ndarray) -> np.ndarray:
    ids = np.full((len(texts), int(length)), PAD_ID, np.int32)
    ids[:, 0] = CLS_ID
    for row, p in zip(ids, self.tokenize(texts)):
      body = p[:int(length) - 1]
      row[1:1 + len(body)] = body
    return ids

  def encode_batch(self, texts: tf.Tensor, length: int) -> tf.Tensor:
    _check_length(length)
    ids = tf.numpy_function(self._encode_numpy, [texts, length], tf.int32, stateful=False)
    return tf.ensure_shape(ids, [None, length])

  def decode(self, ids: Iterable[int]) -> bytes:
    return self._processor.decode([int(i) for i in ids if int(i) >= NUM_SPECIAL]).encode('utf-8')

  def tokenize(self, texts: list[bytes]) -> list[np.ndarray]:
    pieces = self._processor.encode([t.decode('utf-8', errors='replace') for t in texts])
    return [np.asarray(p, np.int32) for p in pieces]

  @functools.cached_property
  def _continues_V(self) -> np.ndarray:
    return np.array([i >= NUM_SPECIAL and not self._processor.id_to_piece(i).startswith('\u2581')
                     for i in range(self.vocab_size)])

  word_starts = _starts_from_table


def train_sentencepiece(texts: Iterable[bytes], vocab_size: int, *, seed: int = 0) -> bytes:
  """A unigram SentencePiece model, serialized; ``vocab_size`` (with the special pieces) is an
  upper bound."""
  spm.set_random_generator_seed(seed)
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=(t.decode('utf-8', errors='replace') for t in texts), model_writer=model,
      vocab_size=vocab_size, hard_vocab_limit=False, model_type='unigram',
      pad_id=PAD_ID, bos_id=CLS_ID, eos_id=SEP_ID, unk_id=UNK_ID,
      pad_piece='[PAD]', bos_piece='[CLS]', eos_piece='[SEP]', unk_piece='[UNK]',
      user_defined_symbols=[MASK_PIECE],
      input_sentence_size=1_000_000, shuffle_input_sentence=True, max_sentence_length=1 << 16,
      minloglevel=2)
  return model.getvalue()


def load_or_train_sentencepiece(
    workdir: str, dataset: str, vocab_size: int,
    read_training_texts: Callable[[], Iterable[bytes]] | None) -> SentencePieceTokenizer:
  """``workdir/spm.model``, or one trained on ``read_training_texts()`` and saved there with
  ``spm.json`` (what it was trained for: a workdir reused with other settings is an error)."""
  model_path = os.path.join(workdir, SP_MODEL_FILE)
  meta_path = os.path.join(workdir, SP_META_FILE)
  meta = {'dataset': dataset, 'sp_vocab_size': vocab_size}
  if storage.exists(model_path):
    try:
      cached = storage.read_json(meta_path)
    except (OSError, ValueError) as e:
      raise ValueError(f'{meta_path}, which records what {model_path} was trained for, is '
                       f'missing or unreadable ({type(e).__name__}); delete spm.model and '
                       'spm.json to retrain the tokenizer, or use another workdir.') from None
    if cached != meta:
      raise ValueError(f'{model_path} was trained for {cached}, not {meta}: use another workdir '
                       'or delete spm.model and spm.json to retrain.')
    proto = storage.read_bytes(model_path)
    try:
      return SentencePieceTokenizer(proto)
    except Exception as e:  # pylint: disable=broad-except  (sentencepiece raises RuntimeError)
      raise ValueError(f'{model_path} is not a valid SentencePiece model ({type(e).__name__}); '
                       'delete spm.model and spm.json to retrain the tokenizer.') from None
  if read_training_texts is None:
    raise FileNotFoundError(f'{workdir} has no {SP_MODEL_FILE}: it was not trained with '
                            'data.tokenizer=sentencepiece, or the file was removed.')
  proto = train_sentencepiece(read_training_texts(), vocab_size)
  storage.makedirs(workdir)
  storage.write_json(meta_path, meta)
  storage.write_atomically(model_path, proto)
  return SentencePieceTokenizer(proto)


# Special tokens by role: BERT/RoFormer WordPiece names first, then RoBERTa/GPT-2 style BPE names.
_SPECIAL_TOKENS = {'pad': ('[PAD]', '<pad>'), 'cls': ('[CLS]', '<s>', '<|endoftext|>'),
                   'sep': ('[SEP]', '</s>', '<|endoftext|>'), 'unk': ('[UNK]', '<unk>'),
                   'mask': ('[MASK]', '<mask>')}
HF_TOKENIZER_FILE = 'tokenizer.json'
HF_VOCAB_FILE = 'vocab.txt'
HF_TOKENIZER_CONFIG = 'tokenizer_config.json'


class HuggingFaceTokenizer:
  """A ``tokenizers`` library tokenizer: inputs assembled by its post-processor, truncated
  longest first and padded with its [PAD], as ``transformers`` does."""

  def __init__(self, serialized: str):
    self.serialized = serialized  # tokenizer.json content
    tokenizer = hf_tokenizers.Tokenizer.from_str(serialized)
    self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    found = {role: next((i for i in map(tokenizer.token_to_id, names) if i is not None), None)
             for role, names in _SPECIAL_TOKENS.items()}
    missing = [role for role, i in found.items() if i is None and role != 'mask']
    if missing:
      raise ValueError(f'The Hugging Face tokenizer has no {", ".join(missing)} token (looked '
                       f'for {", ".join(n for r in missing for n in _SPECIAL_TOKENS[r])}); this '
                       'pipeline needs [PAD], [CLS], [SEP] and [UNK] (or <pad>, <s>, </s>, '
                       '<unk>).')
    self.specials = Specials(**found)
    self._decoder = tokenizer
    self._by_length: dict[int, hf_tokenizers.Tokenizer] = {}

  def _at(self, length: int) -> hf_tokenizers.Tokenizer:
    """A copy truncating and padding to ``length`` (one per length: the settings are state)."""
    if length not in self._by_length:
      tokenizer = hf_tokenizers.Tokenizer.from_str(self.serialized)
      tokenizer.enable_truncation(length, strategy='longest_first')
      tokenizer.enable_padding(length=length, pad_id=self.specials.pad,
                               pad_token=tokenizer.id_to_token(self.specials.pad))
      self._by_length[length] = tokenizer
    return self._by_length[length]

  def _encode_numpy(self, texts: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    text = lambda t: t.decode('utf-8', errors='replace')
    inputs = [text(t) if texts.ndim == 1 else (text(t[0]), text(t[1])) for t in texts]
    encodings = self._at(int(length)).encode_batch(inputs) if inputs else []
    shape = (len(inputs), int(length))
    ids = np.array([e.ids for e in encodings], np.int32).reshape(shape)
    types = np.array([e.type_ids for e in encodings], np.int32).reshape(shape)
    return ids, types

  def _encode(self, texts: tf.Tensor, length: int) -> tuple[tf.Tensor, tf.Tensor]:
    ids, types = tf.numpy_function(self._encode_numpy, [texts, length], (tf.int32, tf.int32),
                                   stateful=False)
    return tf.ensure_shape(ids, [None, length]), tf.ensure_shape(types, [None, length])

  def encode_batch(self, texts: tf.Tensor, length: int) -> tf.Tensor:
    _check_length(length)
    return self._encode(texts, length)[0]

  def encode_pairs(self, texts_Bx2: tf.Tensor, length: int) -> tuple[tf.Tensor, tf.Tensor]:
    return self._encode(texts_Bx2, length)

  def token(self, token_id: int) -> str:
    return self._decoder.id_to_token(token_id)

  def decode(self, ids: Iterable[int]) -> bytes:
    dropped = {self.specials.pad, self.specials.cls, self.specials.sep, self.specials.mask}
    return self._decoder.decode([int(i) for i in ids if int(i) not in dropped]).encode('utf-8')

  def tokenize(self, texts: list[bytes]) -> list[np.ndarray]:
    encodings = self._decoder.encode_batch([t.decode('utf-8', errors='replace') for t in texts],
                                           add_special_tokens=False)
    return [np.asarray(e.ids, np.int32) for e in encodings]

  @functools.cached_property
  def _continues_V(self) -> np.ndarray:
    """WordPiece: '##' tokens continue a word; byte-level BPE: tokens without a space (or
    newline) marker; other models: tokens without SentencePiece's marker."""
    kind = json.loads(self.serialized)['model']['type']
    vocab = self._decoder.get_vocab(with_added_tokens=True)
    continues_V = np.zeros(self.vocab_size, bool)
    specials = set(dataclasses.astuple(self.specials))
    for token, i in vocab.items():
      if i in specials:
        continue
      continues_V[i] = (token.startswith('##') if kind == 'WordPiece' else
                        not token.startswith(('\u0120', '\u010a')) if kind == 'BPE' else
                        not token.startswith('\u2581'))
    return continues_V

  word_starts = _starts_from_table


def _wordpiece(vocab_path: str) -> hf_tokenizers.Tokenizer:
  """BERT's WordPiece tokenizer over ``vocab_path``, lower-casing as the directory's
  tokenizer_config.json says (``do_lower_case``; default True, as BertTokenizer's)."""
  config_path = os.path.join(os.path.dirname(vocab_path), HF_TOKENIZER_CONFIG)
  lowercase = True
  if os.path.isfile(config_path):
    with open(config_path) as f:
      lowercase = bool(json.load(f).get('do_lower_case', True))
  tokenizer = _bert(hf_tokenizers.models.WordPiece.from_file(vocab_path, unk_token='[UNK]'),
                    lowercase)
  if None in (tokenizer.token_to_id('[CLS]'), tokenizer.token_to_id('[SEP]')):
    raise ValueError(f'{vocab_path} has no [CLS] or [SEP] token: not a BERT-style vocabulary.')
  return _cls_sep(tokenizer)


def _bert(model, lowercase: bool = True) -> hf_tokenizers.Tokenizer:
  """A WordPiece ``model`` with BERT's normalizer, pre-tokenizer and decoder."""
  tokenizer = hf_tokenizers.Tokenizer(model)
  tokenizer.normalizer = hf_tokenizers.normalizers.BertNormalizer(lowercase=lowercase)
  tokenizer.pre_tokenizer = hf_tokenizers.pre_tokenizers.BertPreTokenizer()
  tokenizer.decoder = hf_tokenizers.decoders.WordPiece()
  return tokenizer


def _cls_sep(tokenizer: hf_tokenizers.Tokenizer) -> hf_tokenizers.Tokenizer:
  """With BERT's post-processor: [CLS] a [SEP], pairs [CLS] a [SEP] b [SEP] with types 0/1."""
  tokenizer.post_processor = hf_tokenizers.processors.TemplateProcessing(
      single='[CLS] $A [SEP]', pair='[CLS] $A [SEP] $B:1 [SEP]:1',
      special_tokens=[(t, tokenizer.token_to_id(t)) for t in ('[CLS]', '[SEP]')])
  return tokenizer


def read_huggingface(path: str) -> str:
  """The tokenizer.json content of a ``tokenizer.json``, a WordPiece ``vocab.txt``, or a
  directory holding one (a Hugging Face checkpoint's)."""
  path = storage.canonical(path)
  if storage.is_dir(path):
    for name in (HF_TOKENIZER_FILE, HF_VOCAB_FILE):
      if storage.is_file(os.path.join(path, name)):
        return read_huggingface(os.path.join(path, name))
  if storage.is_file(path) and path.endswith('.json'):
    return storage.read_text(path)
  if storage.is_file(path):
    return _wordpiece(path).to_str()
  raise FileNotFoundError(f'data.tokenizer_path={path!r}: no {HF_TOKENIZER_FILE} or '
                          f'{HF_VOCAB_FILE} there. Give a Hugging Face tokenizer.json, a '
                          'WordPiece vocab.txt, or a checkpoint directory holding one.')


def load_huggingface(workdir: str | None, path: str) -> HuggingFaceTokenizer:
  """The tokenizer at ``path``, copied into ``workdir/tokenizer.json`` (used once ``path`` has
  moved; a different tokenizer at ``path`` is an error)."""
  cached = os.path.join(workdir, HF_TOKENIZER_FILE) if workdir else None
  if cached and storage.is_file(cached):
    saved = storage.read_text(cached)
    if path and storage.exists(path) and read_huggingface(path) != saved:
      raise ValueError(f'{cached} holds another tokenizer than data.tokenizer_path={path!r}: '
                       'use another workdir, or delete it to use the new one.')
    return HuggingFaceTokenizer(saved)
  given = read_huggingface(path)
  tokenizer = HuggingFaceTokenizer(given)
  if cached:
    storage.makedirs(workdir)
    storage.write_atomically(cached, given.encode('utf-8'))
  return tokenizer


# Trained here: the special tokens come first, so their ids are 0-4 (read back by name).
_TRAINED_SPECIALS = ['[PAD]', '[CLS]', '[SEP]', '[UNK]', '[MASK]']
TRAINED_META_FILE = 'tokenizer_meta.json'


def train_huggingface(kind: str, texts: Iterable[bytes], vocab_size: int) -> str:
  """The tokenizer.json of a WordPiece (BERT's) or byte-level BPE (GPT-2's) tokenizer trained on
  ``texts``, assembling [CLS] a [SEP] b [SEP]."""
  models, trainers = hf_tokenizers.models, hf_tokenizers.trainers
  if kind == 'wordpiece':
    tokenizer = _bert(models.WordPiece(unk_token='[UNK]'))
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=_TRAINED_SPECIALS,
                                        show_progress=False)
  elif kind == 'bpe':
    byte_level = hf_tokenizers.pre_tokenizers.ByteLevel
    tokenizer = hf_tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = byte_level(add_prefix_space=False)
    tokenizer.decoder = hf_tokenizers.decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=_TRAINED_SPECIALS,
                                  initial_alphabet=byte_level.alphabet(), show_progress=False)
  else:
    raise ValueError(f'Unknown trained tokenizer {kind!r}; valid: wordpiece, bpe')
  tokenizer.train_from_iterator((t.decode('utf-8', errors='replace') for t in texts), trainer)
  return _cls_sep(tokenizer).to_str()


def load_or_train_huggingface(workdir: str, kind: str, dataset: str, vocab_size: int,
                              read_training_texts: Callable[[], Iterable[bytes]] | None
                              ) -> HuggingFaceTokenizer:
  """``workdir/tokenizer.json``, or as ``load_or_train_sentencepiece``, with its meta file."""
  path = os.path.join(workdir, HF_TOKENIZER_FILE)
  meta_path = os.path.join(workdir, TRAINED_META_FILE)
  meta = {'tokenizer': kind, 'dataset': dataset, 'vocab_size': vocab_size}
  if storage.exists(path):
    cached = storage.read_json(meta_path) if storage.exists(meta_path) else None
    if cached != meta:
      raise ValueError(f'{path} was made for {cached}, not {meta}: use another workdir, or '
                       f'delete {HF_TOKENIZER_FILE} and {TRAINED_META_FILE} to retrain.')
    return HuggingFaceTokenizer(storage.read_text(path))
  if read_training_texts is None:
    raise FileNotFoundError(f'{workdir} has no {HF_TOKENIZER_FILE}: it was not trained with '
                            f'data.tokenizer={kind}, or the file was removed.')
  serialized = train_huggingface(kind, read_training_texts(), vocab_size)
  storage.makedirs(workdir)
  storage.write_json(meta_path, meta)
  storage.write_atomically(path, serialized.encode('utf-8'))
  return HuggingFaceTokenizer(serialized)
