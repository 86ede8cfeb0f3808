"""Position probes: generated classification tasks that only order and relative position can solve.

An example of a split of length n is a string of n - 1 characters (with the [CLS] token,
exactly n byte tokens): random lowercase filler letters ``a``-``z`` and a few uppercase marker
letters. Within a task, every example of every class has the same markers and i.i.d.
uniform filler, so the multiset of tokens has the same distribution in every class: a model that
sees a bag of tokens (a transformer without position information, a bag-of-words classifier) is
exactly at chance, while the label is a simple function of the markers' positions.

Tasks (builder configs; ``data.name = 'position_probes/<task>'``):

* ``order``: one ``A`` and one ``B``; label 1 (``a_before_b``) iff ``A`` occurs before ``B``.
* ``distance``: two ``X``; label 1 (``near``) iff they are at most ``threshold`` tokens apart
  (absolute, so the rule is the same at every length; default 8). The distance is uniform on
  ``1..threshold`` for ``near`` and on ``threshold+1..n-2`` for ``far``.
* ``nearest``: one query ``Q`` and markers ``X`` and ``Y``; label 0 (``x``) or 1 (``y``): the
  marker nearest to ``Q``. The far marker is at least ``nearest_ratio`` (2) times as far from
  ``Q`` as the near one: this margin makes the task learnable in several hundred steps.

Splits: ``train``, ``validation`` and ``test`` at the training length (64 tokens by default), and
``test_<2 * length>``, ``test_<4 * length>`` (``test_128``, ``test_256``) with the same rule on
longer sequences, for length extrapolation. Sizes: 20k train, 2k in every other split. Classes
are exactly balanced in every split. Every split is generated from its own fixed seed, so the
data are identical on every machine.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import tensorflow_datasets as tfds

import data

TASKS = data.PROBE_TASKS

_CLASS_NAMES = {
    'order': ('b_before_a', 'a_before_b'),
    'distance': ('far', 'near'),
    'nearest': ('x', 'y'),
}

_DESCRIPTIONS = {
    'order': 'One A and one B among lowercase filler: is A before B?',
    'distance': 'Two X among lowercase filler: are they at most `threshold` tokens apart?',
    'nearest': 'Q, X and Y among lowercase filler: which of X and Y is nearest to Q?',
}


@dataclasses.dataclass(eq=False)
class PositionProbesConfig(tfds.core.BuilderConfig):
  """A probe task and its sizes.

  Attributes:
    task: one of ``TASKS``.
    length: training length in tokens including [CLS]; texts have ``length - 1`` characters.
    extrapolation_factors: extra test splits ``test_<f * length>`` of longer sequences.
    threshold: ``distance`` task: largest distance (in tokens) labelled ``near``.
    nearest_ratio: ``nearest`` task: least ratio of the far marker's distance to Q to the near
      marker's.
    num_train: training examples.
    num_eval: examples in each evaluation split.
  """

  task: str = 'order'
  length: int = 64
  extrapolation_factors: tuple[int, ...] = (2, 4)
  threshold: int = 8
  nearest_ratio: int = 2
  num_train: int = 20_000
  num_eval: int = 1_000

  def split_lengths(self) -> dict[str, int]:
    """Split name -> sequence length in tokens (including [CLS]), training split first."""
    lengths = {'train': self.length, 'validation': self.length, 'test': self.length}
    for factor in self.extrapolation_factors:
      lengths[f'test_{factor * self.length}'] = factor * self.length
    return lengths


def _filler(rng: np.random.Generator, num: int, width: int) -> np.ndarray:
  """Uniform lowercase letters: uint8 [num, width] (ASCII codes)."""
  return rng.integers(ord('a'), ord('z') + 1, size=(num, width), dtype=np.uint8)


def _balanced_labels(rng: np.random.Generator, num: int) -> np.ndarray:
  """Exactly balanced (up to one) binary labels in random order: int64 [num]."""
  return rng.permutation(np.arange(num) % 2)


def _distinct_pair(rng: np.random.Generator, num: int, width: int) -> tuple[np.ndarray, np.ndarray]:
  """Two distinct uniform positions in ``[0, width)``, sorted: (first, second), [num] each."""
  a = rng.integers(0, width, size=num)
  b = rng.integers(0, width - 1, size=num)
  b = b + (b >= a)
  return np.minimum(a, b), np.maximum(a, b)


def _order(rng: np.random.Generator, num: int, width: int) -> tuple[np.ndarray, np.ndarray]:
  chars = _filler(rng, num, width)
  labels = _balanced_labels(rng, num)
  first, second = _distinct_pair(rng, num, width)
  rows = np.arange(num)
  chars[rows, first] = np.where(labels == 1, ord('A'), ord('B'))
  chars[rows, second] = np.where(labels == 1, ord('B'), ord('A'))
  return chars, labels


def _distance(rng: np.random.Generator, num: int, width: int,
              threshold: int) -> tuple[np.ndarray, np.ndarray]:
  if not 1 <= threshold < width - 1:
    raise ValueError(f'Distance threshold {threshold} must be in [1, {width - 1}) for {width} '
                     'characters')
  chars = _filler(rng, num, width)
  labels = _balanced_labels(rng, num)
  near = rng.integers(1, threshold + 1, size=num)
  far = rng.integers(threshold + 1, width, size=num)
  gap = np.where(labels == 1, near, far)
  start = rng.integers(0, width - gap)  # Uniform on [0, width - gap).
  rows = np.arange(num)
  chars[rows, start] = ord('X')
  chars[rows, start + gap] = ord('X')
  return chars, labels


def _nearest(rng: np.random.Generator, num: int, width: int,
             ratio: int) -> tuple[np.ndarray, np.ndarray]:
  chars = _filler(rng, num, width)
  labels = _balanced_labels(rng, num)
  # Positions of the query and two markers, uniform given that they are distinct and one marker
  # is at least `ratio` times as far from the query as the other (rejection sampling).
  pos = rng.integers(0, width, size=(num, 3))
  while True:
    q, u, v = pos.T
    du, dv = np.abs(u - q), np.abs(v - q)
    bad = (du == 0) | (dv == 0) | (du == dv) | (np.maximum(du, dv) < ratio * np.minimum(du, dv))
    if not bad.any():
      break
    pos[bad] = rng.integers(0, width, size=(int(bad.sum()), 3))
  q, u, v = pos.T
  u_nearer = np.abs(u - q) < np.abs(v - q)
  near, far = np.where(u_nearer, u, v), np.where(u_nearer, v, u)
  rows = np.arange(num)
  chars[rows, q] = ord('Q')
  chars[rows, near] = np.where(labels == 0, ord('X'), ord('Y'))
  chars[rows, far] = np.where(labels == 0, ord('Y'), ord('X'))
  return chars, labels


def generate(config: PositionProbesConfig, split: str) -> tuple[list[str], np.ndarray]:
  """Generates one split, deterministically (its seed is a hash of the config and split names).

  Returns:
    texts: ``num`` strings of ``split_lengths()[split] - 1`` characters.
    labels: int64 [num], exactly balanced.
  """
  length = config.split_lengths()[split]
  num = config.num_train if split == 'train' else config.num_eval
  rng = np.random.default_rng(zlib.crc32(f'position_probes/{config.name}/{split}'.encode()))
  width = length - 1
  if config.task == 'order':
    chars, labels = _order(rng, num, width)
  elif config.task == 'distance':
    chars, labels = _distance(rng, num, width, config.threshold)
  elif config.task == 'nearest':
    chars, labels = _nearest(rng, num, width, config.nearest_ratio)
  else:
    raise ValueError(f'Unknown position probe task {config.task!r}; valid: {TASKS}')
  return [row.tobytes().decode('ascii') for row in chars], labels


_CITATION = """@misc{position_probes,
  title = {Position probes: order, distance and nearest-marker tasks for position encodings},
  note = {Generated by data/position_probes.py of this repository},
}"""


class PositionProbes(tfds.core.GeneratorBasedBuilder):
  """Generated sequences whose label depends only on order and relative position."""

  VERSION = tfds.core.Version('1.1.0')
  RELEASE_NOTES = {
      '1.0.0': 'Tasks order, distance and nearest; test splits at 1x, 2x, 4x length.',
      '1.1.0': '1,000 examples per evaluation split (was 2,000): halves evaluation time.',
  }
  BUILDER_CONFIGS = [
      PositionProbesConfig(name=task, task=task, description=_DESCRIPTIONS[task]) for task in TASKS
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            'text': tfds.features.Text(),
            'label': tfds.features.ClassLabel(names=_CLASS_NAMES[self.builder_config.task]),
        }),
        supervised_keys=('text', 'label'),
        citation=_CITATION,
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Generated; nothing to download.
    return {split: self._generate_examples(split) for split in self.builder_config.split_lengths()}

  def _generate_examples(self, split: str):
    texts, labels = generate(self.builder_config, split)
    for i, (text, label) in enumerate(zip(texts, labels)):
      yield i, {'text': text, 'label': int(label)}
