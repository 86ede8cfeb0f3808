"""Language-model data: documents tokenized, packed into rows, masked (MLM) or shifted (CLM).

Each document becomes [CLS] its tokens [SEP]; a split's documents are concatenated into one
stream, cut into rows of L tokens (only the last one padded). In a row, ``segments`` numbers the
documents 1, 2, ... (0 at padding) and ``positions`` restart at 0 at each document and row. A
row's masking depends only on (seed, its slot), so resuming at step s is bitwise.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from data import batches
from data import tokenizers


@dataclasses.dataclass(frozen=True)
class Stream:
  """A split tokenized: ``ids`` int32 [T] and each token's document number ``documents`` [T]."""

  ids: np.ndarray
  documents: np.ndarray


def tokenize(tokenizer: tokenizers.Tokenizer, texts: list[bytes]) -> Stream:
  """Documents -> one stream, each as [CLS] tokens [SEP]."""
  s = tokenizer.specials
  pieces = [np.concatenate([[s.cls], ids, [s.sep]]).astype(np.int32)
            for ids in tokenizer.tokenize(list(texts))]
  if not pieces:
    return Stream(np.zeros([0], np.int32), np.zeros([0], np.int32))
  documents = np.repeat(np.arange(len(pieces), dtype=np.int32), [len(p) for p in pieces])
  return Stream(np.concatenate(pieces), documents)


def pack(stream: Stream, length: int) -> dict[str, np.ndarray]:
  """Rows of ``length`` tokens: ``inputs``, ``segments``, ``positions``, ``mask``."""
  rows = max(1, math.ceil(len(stream.ids) / length))
  pad = rows * length - len(stream.ids)
  ids = np.concatenate([stream.ids, np.zeros([pad], np.int32)]).reshape(rows, length)
  documents = np.concatenate([stream.documents, np.full([pad], -1, np.int32)]).reshape(rows, length)
  mask = documents >= 0
  starts = np.ones_like(mask)
  starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
  segments = np.where(mask, np.cumsum(starts, axis=1), 0).astype(np.int32)
  index = np.broadcast_to(np.arange(length), (rows, length))
  first = np.maximum.accumulate(np.where(starts, index, 0), axis=1)
  positions = np.where(mask, index - first, 0).astype(np.int32)
  return {'inputs': ids, 'segments': segments, 'positions': positions, 'mask': mask}


def packing_efficiency(stream: Stream, length: int) -> float:
  return len(stream.ids) / (max(1, math.ceil(len(stream.ids) / length)) * length)


def max_predictions(length: int, mask_rate: float) -> int:
  """M, the masked-token slots per row: room for round(mask_rate x length) and one more."""
  return math.ceil(mask_rate * length) + 1


@dataclasses.dataclass(frozen=True)
class Masking:
  """BERT's MLM corruption: ``rate`` of the real non-special tokens are predicted; of those 80%
  become [MASK], 10% a random token, 10% stay; ``whole_word``: a word's tokens together."""

  tokenizer: tokenizers.Tokenizer
  vocab_size: int
  rate: float = 0.15
  whole_word: bool = False

  @functools.cached_property
  def _ordinary_ids(self) -> np.ndarray:
    specials = set(x for x in dataclasses.astuple(self.tokenizer.specials) if x is not None)
    return np.asarray([i for i in range(self.vocab_size) if i not in specials], np.int32)

  def _chosen(self, row: dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
    s = self.tokenizer.specials
    ids = row['inputs']
    candidates = row['mask'] & (ids != s.cls) & (ids != s.sep) & (ids != s.pad)
    budget = int(round(self.rate * candidates.sum()))
    if budget == 0:
      return np.zeros([0], np.int64)
    if not self.whole_word:
      return np.sort(rng.permutation(np.flatnonzero(candidates))[:budget])
    starts = self.tokenizer.word_starts(ids) | (row['positions'] == 0)
    words = np.cumsum(starts)  # word number of every token
    order = rng.permutation(np.unique(words[candidates]))
    chosen, size = [], 0
    for word in order:
      members = np.flatnonzero((words == word) & candidates)
      if size + len(members) > budget:
        continue  # BERT skips a word that would pass the budget
      chosen.append(members)
      size += len(members)
      if size == budget:
        break
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros([0], np.int64)

  def apply(self, row: dict[str, np.ndarray], rng: np.random.Generator,
            num_predictions: int) -> dict[str, np.ndarray]:
    """One packed row masked: the corrupted ``inputs`` and the targets."""
    chosen = self._chosen(row, rng)[:num_predictions]
    inputs = row['inputs'].copy()
    draw = rng.random(len(chosen))
    masked, randomised = chosen[draw < 0.8], chosen[(draw >= 0.8) & (draw < 0.9)]
    inputs[masked] = self.tokenizer.specials.mask
    inputs[randomised] = rng.choice(self._ordinary_ids, len(randomised))
    pad = num_predictions - len(chosen)
    return dict(row, inputs=inputs,
                targets=np.r_[row['inputs'][chosen], np.zeros(pad, np.int32)].astype(np.int32),
                target_positions=np.r_[chosen, np.zeros(pad, np.int64)].astype(np.int32),
                target_weights=np.r_[np.ones(len(chosen)), np.zeros(pad)].astype(np.float32))


def next_tokens(rows: dict[str, np.ndarray]) -> batches.LanguageModel:
  """Packed rows with CLM targets: the next token where it is in the same document."""
  targets = np.zeros_like(rows['inputs'])
  targets[:, :-1] = rows['inputs'][:, 1:]
  same = np.zeros_like(rows['mask'])
  same[:, :-1] = rows['mask'][:, 1:] & (rows['segments'][:, 1:] == rows['segments'][:, :-1])
  return batches.LanguageModel(**rows, targets=targets, target_weights=same.astype(np.float32))


@dataclasses.dataclass(frozen=True)
class Targets:
  """How rows become examples: masked (``masking``, MLM) or None (the next tokens, CLM); ``seed``
  for masking."""

  masking: Masking | None
  seed: int

  def __call__(self, rows: dict[str, np.ndarray], slots: np.ndarray,
               stream_id: int) -> batches.LanguageModel:
    """``rows`` with targets; row i is masked from (seed, ``stream_id``, slots[i])."""
    if self.masking is None:
      return next_tokens(rows)
    length = rows['inputs'].shape[1]
    num = max_predictions(length, self.masking.rate)
    masked = [self.masking.apply({k: v[i] for k, v in rows.items()},
                                 np.random.default_rng([self.seed, stream_id, int(slot)]), num)
              for i, slot in enumerate(slots)]
    return batches.LanguageModel(**{k: np.stack([m[k] for m in masked]) for k in masked[0]})


def maker(packed: dict[str, np.ndarray], targets: Targets, stream_id: int) -> batches.Make:
  """Batches of the ``packed`` rows; past them, padding that predicts nothing (weight 0)."""
  num = len(packed['inputs'])

  def make(examples: np.ndarray, slots: np.ndarray) -> batches.LanguageModel:
    rows = {k: v[np.minimum(examples, max(num - 1, 0))] for k, v in packed.items()}
    batch = targets(rows, slots, stream_id)
    return batch.replace(target_weights=batch.target_weights * (examples < num)[:, None])
  return make


def corpus_texts(texts: np.ndarray) -> list[bytes]:
  """A source's texts (object [n], or [n, 2] pairs) as documents: a pair's two texts are one."""
  return [b'\n'.join(pair) for pair in texts] if texts.ndim == 2 else list(texts)
