"""Fortunes: topic classification of real human-written text, available offline.

Debian's ``fortunes`` package (``apt-get install fortunes``) installs ~15k quotations, jokes and
poems in category files under ``/usr/share/games/fortunes``; in each file the items are separated
by lines holding only ``%``. This dataset takes ten well-populated, distinct categories (about 4.2k
items; the offensive ``off/`` files of ``fortunes-off`` are never used) and asks for the category
of an item. Items are cleaned of terminal overstriking (``_\\b``), stripped, and dropped when empty
or when the same text appears in two categories. The split is fixed by a hash of the text: MD5
modulo 10 is 0 for ``test``, 1 for ``validation``, otherwise ``train`` (about 80/10/10).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Iterable

import tensorflow_datasets as tfds

from data import builders

FORTUNES_DIR = '/usr/share/games/fortunes'

CATEGORIES = ('computers', 'education', 'food', 'law', 'love', 'politics', 'science',
              'songs-poems', 'sports', 'startrek')


@dataclasses.dataclass(eq=False)
class FortunesConfig(tfds.core.BuilderConfig):
  directory: str = FORTUNES_DIR
  categories: tuple[str, ...] = CATEGORIES


def read_fortunes(path: str) -> list[str]:
  """The cleaned, non-empty items of one fortune file, in file order."""
  with open(path, 'rb') as f:
    content = f.read().decode('utf-8', errors='replace')
  content = re.sub('.\x08', '', content)  # Overstriking: "_\bx" underlines x, "x\bx" bolds it.
  items = re.split(r'^%\n', content + '\n', flags=re.MULTILINE)
  return [item.strip() for item in items if item.strip()]


def load_examples(config: FortunesConfig) -> dict[str, list[tuple[str, int]]]:
  """Split name -> (text, class id) pairs, in category then file order."""
  missing = [c for c in config.categories if not os.path.isfile(os.path.join(config.directory, c))]
  if missing:
    raise FileNotFoundError(
        f'Fortune files {missing} not found in {config.directory}. Install them with '
        '`apt-get install fortunes` (Debian/Ubuntu), or use another data.name.')
  categories_of: dict[str, set[int]] = {}
  for label, category in enumerate(config.categories):
    for text in read_fortunes(os.path.join(config.directory, category)):
      categories_of.setdefault(text, set()).add(label)
  examples: dict[str, list[tuple[str, int]]] = {'train': [], 'validation': [], 'test': []}
  for text, labels in categories_of.items():
    if len(labels) == 1:
      examples[builders.split_of(text)].append((text, labels.pop()))
  return examples


class Fortunes(builders.EmbeddedBuilder):
  """Which of ten topics does a fortune-cookie quotation come from."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Ten categories of Debian fortunes 1:1.99.1, split by MD5 of text.'}
  BUILDER_CONFIGS = [FortunesConfig(name='topics', description='Ten categories: ' +
                                    ', '.join(CATEGORIES))]
  HOMEPAGE = 'https://packages.debian.org/stable/fortunes'
  CITATION = ('@misc{fortunes, title = {fortune-mod: the fortunes database}, '
              'note = {Debian package fortunes}}')

  def class_label(self) -> tfds.features.ClassLabel:
    return tfds.features.ClassLabel(names=self.builder_config.categories)

  def rows(self) -> dict[str, Iterable[tuple]]:
    return load_examples(self.builder_config)
