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
for length extrapolation, at each of 96, 128, 192, 256, 512 and 1024 tokens with the same rule,
``test_<n>_near`` (markers within a window of the training width: longer context, seen
distances) and ``test_<n>_far`` (markers further apart than in any training example). Sizes:
20k train, 500 validation and test, 500 in each extrapolation split up to 128 tokens, then 32,768
tokens' worth (170 at 192 tokens ... 32 at 1024). Classes are exactly balanced in every split.
Every split is generated from its own fixed seed, so the data are identical on every machine.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable
import zlib

import numpy as np
import tensorflow_datasets as tfds

import data
from data import builders

TASKS = data.PROBE_TASKS

_CLASS_NAMES = {'order': ('b_before_a', 'a_before_b'), 'distance': ('far', 'near'),
                'nearest': ('x', 'y')}

_DESCRIPTIONS = {
    'order': 'One A and one B among lowercase filler: is A before B?',
    'distance': 'Two X among lowercase filler: are they at most `threshold` tokens apart?',
    'nearest': 'Q, X and Y among lowercase filler: which of X and Y is nearest to Q?',
}


@dataclasses.dataclass(eq=False)
class PositionProbesConfig(tfds.core.BuilderConfig):
  """A probe task (one of ``TASKS``) and its sizes (the module doc); ``length`` counts [CLS]."""

  task: str = 'order'
  length: int = 64
  test_lengths: tuple[int, ...] = (96, 128, 192, 256, 512, 1024)
  threshold: int = 8
  nearest_ratio: int = 2
  num_train: int = 20_000
  num_eval: int = 500
  # Each extrapolation split holds num_extrapolation examples, fewer beyond extrapolation_tokens
  # tokens in all: attention's cost grows with the square of the length.
  num_extrapolation: int = 500
  extrapolation_tokens: int = 32_768

  def split_lengths(self) -> dict[str, int]:
    lengths = {'train': self.length, 'validation': self.length, 'test': self.length}
    for n in self.test_lengths:
      lengths[f'test_{n}_near'] = lengths[f'test_{n}_far'] = n
    return lengths


def _order(rng: np.random.Generator, labels: np.ndarray, width: int,
           config: PositionProbesConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(marker columns [num, markers], their letters, the example's defining distance [num])."""
  del config
  num = len(labels)
  a = rng.integers(0, width, size=num)
  b = rng.integers(0, width - 1, size=num)
  b = b + (b >= a)  # two distinct uniform positions
  first, second = np.minimum(a, b), np.maximum(a, b)
  letters = np.where(labels[:, None] == 1, [ord('A'), ord('B')], [ord('B'), ord('A')])
  return np.stack([first, second], 1), letters, second - first


def _distance(rng: np.random.Generator, labels: np.ndarray, width: int,
              config: PositionProbesConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  num = len(labels)
  near = rng.integers(1, config.threshold + 1, size=num)
  far = rng.integers(config.threshold + 1, width, size=num)
  gap = np.where(labels == 1, near, far)
  start = rng.integers(0, width - gap)  # Uniform on [0, width - gap).
  # Only the far class's distance is free to be unseen: near is defined by a short one.
  return (np.stack([start, start + gap], 1), np.full((num, 2), ord('X')),
          np.where(labels == 1, width, gap))


def _nearest(rng: np.random.Generator, labels: np.ndarray, width: int,
             config: PositionProbesConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  num = len(labels)
  # Positions of the query and two markers, uniform given that they are distinct and one marker
  # is at least `nearest_ratio` times as far from the query as the other (rejection sampling).
  pos = rng.integers(0, width, size=(num, 3))
  while True:
    q, u, v = pos.T
    du, dv = np.abs(u - q), np.abs(v - q)
    bad = ((du == 0) | (dv == 0) | (du == dv)
           | (np.maximum(du, dv) < config.nearest_ratio * np.minimum(du, dv)))
    if not bad.any():
      break
    pos[bad] = rng.integers(0, width, size=(int(bad.sum()), 3))
  u_nearer = du < dv
  near, far = np.where(u_nearer, u, v), np.where(u_nearer, v, u)
  letters = np.where(labels[:, None] == 0, [ord('Q'), ord('X'), ord('Y')],
                     [ord('Q'), ord('Y'), ord('X')])
  return np.stack([q, near, far], 1), letters, np.maximum(du, dv)


# Task -> (columns, letters, defining distance) of its markers, for the labels and a width.
_PLACE_MARKERS = {'order': _order, 'distance': _distance, 'nearest': _nearest}


def _markers(rng: np.random.Generator, labels: np.ndarray, width: int, split: str,
             config: PositionProbesConfig) -> tuple[np.ndarray, np.ndarray]:
  """Marker columns and letters in ``width`` characters: for ``_near`` splits within a window of
  the training width, for ``_far`` splits further apart than it allows."""
  place, train_width = _PLACE_MARKERS[config.task], config.length - 1
  if split.endswith('_near'):
    columns, letters, _ = place(rng, labels, train_width, config)
    return columns + rng.integers(0, width - train_width + 1, size=(len(labels), 1)), letters
  columns, letters, distance = place(rng, labels, width, config)
  while split.endswith('_far') and (short := distance < train_width).any():
    columns[short], letters[short], distance[short] = place(rng, labels[short], width, config)
  return columns, letters


def generate(config: PositionProbesConfig, split: str) -> tuple[list[str], np.ndarray]:
  """One split, seeded by the config and split names: texts and exactly balanced labels."""
  width = config.split_lengths()[split] - 1
  num = {'train': config.num_train, 'validation': config.num_eval,
         'test': config.num_eval}.get(
             split, min(config.num_extrapolation, config.extrapolation_tokens // (width + 1)))
  num -= num % 2
  rng = np.random.default_rng(zlib.crc32(f'position_probes/{config.name}/{split}'.encode()))
  if config.task not in _PLACE_MARKERS:
    raise ValueError(f'Unknown position probe task {config.task!r}; valid: {TASKS}')
  if config.task == 'distance' and not 1 <= config.threshold < config.length - 2:
    raise ValueError(f'Distance threshold {config.threshold} must be in [1, '
                     f'{config.length - 2}) for training texts of {config.length - 1} characters')
  chars = rng.integers(ord('a'), ord('z') + 1, size=(num, width), dtype=np.uint8)  # Filler.
  labels = rng.permutation(np.arange(num) % 2)  # Exactly balanced (up to one), random order.
  columns, letters = _markers(rng, labels, width, split, config)
  chars[np.arange(num)[:, None], columns] = letters
  return [row.tobytes().decode('ascii') for row in chars], labels


_CITATION = """@misc{position_probes,
  title = {Position probes: order, distance and nearest-marker tasks for position encodings},
  note = {Generated by data/position_probes.py of this repository},
}"""


class PositionProbes(builders.EmbeddedBuilder):
  """Generated sequences whose label depends only on order and relative position."""

  VERSION = tfds.core.Version('2.0.0')
  RELEASE_NOTES = {
      '1.0.0': 'Tasks order, distance and nearest; test splits at 1x, 2x, 4x length.',
      '1.1.0': '1,000 examples per evaluation split (was 2,000): halves evaluation time.',
      '2.0.0': 'Test splits at 96 to 1024 tokens, each as _near (markers within the training '
               'width) and _far (unseen distances), 500 examples each up to 128 tokens, then '
               '32,768 tokens per split; validation and test 500 examples.',
  }
  BUILDER_CONFIGS = [
      PositionProbesConfig(name=task, task=task, description=_DESCRIPTIONS[task]) for task in TASKS
  ]
  CITATION = _CITATION
  KEY_BY_INDEX = True

  def class_label(self) -> tfds.features.ClassLabel:
    return tfds.features.ClassLabel(names=_CLASS_NAMES[self.builder_config.task])

  def rows(self) -> dict[str, Iterable[tuple]]:
    return {split: zip(*generate(self.builder_config, split))
            for split in self.builder_config.split_lengths()}

  def split_lengths(self, max_length: int) -> dict[str, int]:
    del max_length  # Each split is generated at its own length.
    return self.builder_config.split_lengths()
