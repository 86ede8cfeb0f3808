"""Language-model data: documents tokenized, packed into rows, masked (MLM) or shifted (CLM).

Packing: each document becomes [CLS] its tokens [SEP]; a split's documents are concatenated in
order into one stream, cut into rows of L tokens (the last row padded), so only the last row
has padding (``packing_efficiency``: real tokens / slots). In a row, ``segments`` numbers the
documents (pieces) 1, 2, ... (0 at padding), attention stays within one (``models.attention``),
and ``positions`` restart at 0 at each document's first token and at the row's start.

A batch is a dict of NumPy arrays, b rows of L:

* ``inputs``, ``positions``, ``segments`` int32 [b, L], ``mask`` bool [b, L] (real tokens);
* MLM (BERT's masking, ``mask_tokens``): ``targets`` int32 [b, M] (the original tokens),
  ``target_positions`` int32 [b, M] and ``target_weights`` float32 [b, M] (1 at a masked token,
  0 at unused slots; M = ceil(mask_rate L) + 1);
* CLM: ``targets`` [b, L], the next token, ``target_weights`` [b, L], 1 where the next token is
  in the same document.

Order and randomness: training row j of global batch s (G rows) is the (s G + j) mod R-th entry
of a permutation of the R rows that depends only on (seed, epoch); its masking depends only on
(seed, s G + j). So a process yields its rows alone, and starting at step s yields exactly what a
fresh iterator yields from its s-th batch on (bitwise resume). Evaluation reads the first
``eval_tokens`` tokens of a split's stream, the same text at every length, masked by row.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Iterator

import numpy as np

from data import sources
from data import tokenizers

Batch = dict[str, np.ndarray]


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
  """Rows of ``length`` tokens: ``inputs``, ``segments``, ``positions``, ``mask`` [R, length]."""
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
  """Real tokens / slots when ``stream`` is packed into rows of ``length``."""
  return len(stream.ids) / (max(1, math.ceil(len(stream.ids) / length)) * length)


def max_predictions(length: int, mask_rate: float) -> int:
  """M, the masked-token slots per row: room for round(mask_rate x length) and one more."""
  return math.ceil(mask_rate * length) + 1


@dataclasses.dataclass(frozen=True)
class Masking:
  """BERT's MLM corruption: ``rate`` of the real non-special tokens are predicted; of those 80%
  become [MASK], 10% a random token, 10% stay. ``whole_word``: a word's tokens are masked
  together (``tokenizer.word_starts``)."""

  tokenizer: tokenizers.Tokenizer
  vocab_size: int
  rate: float = 0.15
  whole_word: bool = False

  @functools.cached_property
  def _ordinary_ids(self) -> np.ndarray:
    specials = set(x for x in dataclasses.astuple(self.tokenizer.specials) if x is not None)
    return np.asarray([i for i in range(self.vocab_size) if i not in specials], np.int32)

  def _chosen(self, row: dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """Indices of the tokens of one row to predict, sorted."""
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
    """One packed row masked: the corrupted ``inputs`` and the targets (see the module doc)."""
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


def next_tokens(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """CLM targets of packed rows: the next token where it is in the same document."""
  targets = np.zeros_like(rows['inputs'])
  targets[:, :-1] = rows['inputs'][:, 1:]
  same = np.zeros_like(rows['mask'])
  same[:, :-1] = rows['mask'][:, 1:] & (rows['segments'][:, 1:] == rows['segments'][:, :-1])
  return dict(rows, targets=targets, target_weights=same.astype(np.float32))


@dataclasses.dataclass(frozen=True)
class Targets:
  """How rows become examples: ``task`` 'mlm' (``masking``) or 'clm'; ``seed`` for masking."""

  task: str
  masking: Masking | None
  seed: int

  def __call__(self, rows: dict[str, np.ndarray], slots: np.ndarray,
               stream_id: int) -> dict[str, np.ndarray]:
    """``rows`` [b, L] with targets; row i is masked from (seed, ``stream_id``, slots[i])."""
    if self.task == 'clm':
      return next_tokens(rows)
    length = rows['inputs'].shape[1]
    num = max_predictions(length, self.masking.rate)
    masked = [self.masking.apply({k: v[i] for k, v in rows.items()},
                                 np.random.default_rng([self.seed, stream_id, int(slot)]), num)
              for i, slot in enumerate(slots)]
    return {k: np.stack([m[k] for m in masked]) for k in masked[0]}


def train_batches(parts: list[dict[str, np.ndarray]], targets: Targets, *,
                  shards: sources.TrainShards, seed: int, start_step: int) -> Iterator[Batch]:
  """Infinite training batches from ``start_step`` on: this process's ``shards.rows`` (first
  row, number b) of each global batch, from ``parts``, the packed rows of the shards
  ``shards.needed`` (see the module doc)."""
  first_row, batch_size = shards.rows
  packed = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
  sizes = [len(p['inputs']) for p in parts]
  offsets = np.cumsum([0] + sizes[:-1])
  permutation = functools.lru_cache(maxsize=2 * len(parts))(
      lambda key, num: np.random.default_rng([seed, key]).permutation(num))
  rows, first_shard = first_row + np.arange(batch_size), shards.needed.start
  step = start_step
  while True:
    index = []
    for row in rows:
      shard, slot = shards.locate(step, int(row))
      num = sizes[shard - first_shard]
      order = permutation(shards.epoch_key(slot // num, shard), num)
      index.append(offsets[shard - first_shard] + order[slot % num])
    slots = step * shards.global_batch_size + rows
    yield targets({k: v[np.asarray(index)] for k, v in packed.items()}, slots, stream_id=0)
    step += 1


def eval_batches(packed: dict[str, np.ndarray], targets: Targets, *, batch_size: int,
                 num_batches: int, first_slot: int) -> Iterator[Batch]:
  """Exactly ``num_batches`` batches of the given rows in order (slots from ``first_slot``, for
  masking), then padding rows, which predict nothing (weight 0)."""
  num = len(packed['inputs'])
  for start in range(0, num_batches * batch_size, batch_size):
    index = np.arange(start, start + batch_size)
    real = index < num
    rows = {k: v[np.minimum(index, max(num - 1, 0))] for k, v in packed.items()}
    batch = targets(rows, first_slot + index, stream_id=1)
    batch['target_weights'] = batch['target_weights'] * real[:, None]
    yield batch


def corpus_texts(read: Callable[[str], tuple[np.ndarray, np.ndarray]], split: str) -> list[bytes]:
  """A source's texts of ``split`` as documents (a pair's two texts are one document)."""
  texts = read(split)[0]
  if texts.ndim == 2:
    return [b'\n'.join(pair) for pair in texts]
  return list(texts)
