"""The base of the embedded TFDS builders, whose data are generated or read on this machine.

A builder's description is its module's docstring; its TFDS name (the class name in snake case),
config and ``VERSION`` name its folder in the data_dir.
"""

from __future__ import annotations

import abc
import hashlib
import sys
from typing import ClassVar, Iterable

import tensorflow_datasets as tfds


def split_of(text: str) -> str:
  """The fixed split of an embedded text: MD5 modulo 10 is 0 for test, 1 for validation."""
  bucket = int(hashlib.md5(text.encode('utf-8')).hexdigest(), 16) % 10
  return {0: 'test', 1: 'validation'}.get(bucket, 'train')


BUILDERS = {}  # TFDS name -> every embedded builder class, a project's too (by subclassing)


class EmbeddedBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A TFDS builder of labelled texts made here: features ``TEXTS`` and ``label``."""

  TEXTS: ClassVar[tuple[str, ...]] = ('text',)
  CLASSES: ClassVar[tuple[str, ...]] = ()  # the label's names, unless class_label says otherwise
  KEY_BY_INDEX: ClassVar[bool] = False  # generated in a fixed order: a row's index is its key
  HOMEPAGE: ClassVar[str | None] = None
  CITATION: ClassVar[str | None] = None

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    BUILDERS[cls.name] = cls

  def class_label(self) -> tfds.features.ClassLabel:
    return tfds.features.ClassLabel(names=self.CLASSES)

  @abc.abstractmethod
  def rows(self) -> dict[str, Iterable[tuple]]:
    """Split -> its examples as tuples of ``TEXTS`` then the label, in key order."""

  def key(self, index: int, row: tuple) -> int | str:
    """The TFDS key of a split's ``index``-th row. TFDS orders examples by key: changing keys
    reorders a prepared dataset, which its VERSION must then say."""
    return index if self.KEY_BY_INDEX else hashlib.md5(row[0].encode('utf-8')).hexdigest()

  def description(self) -> str:
    return sys.modules[type(self).__module__].__doc__

  def split_lengths(self, max_length: int) -> dict[str, int]:
    """Split -> its length in tokens: ``max_length`` for natural text; generated data fix theirs."""
    return dict.fromkeys(self.info.splits, max_length)

  def _info(self) -> tfds.core.DatasetInfo:
    texts = {name: tfds.features.Text() for name in self.TEXTS}
    return tfds.core.DatasetInfo(
        builder=self, description=self.description(),
        features=tfds.features.FeaturesDict({**texts, 'label': self.class_label()}),
        supervised_keys=('text', 'label') if self.TEXTS == ('text',) else None,
        homepage=self.HOMEPAGE, citation=self.CITATION)

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Generated or read from local files; nothing to download.
    return {split: self._generate_examples(rows) for split, rows in self.rows().items()}

  def _generate_examples(self, rows: Iterable[tuple]):
    for index, row in enumerate(rows):
      *texts, label = row
      yield self.key(index, row), {**dict(zip(self.TEXTS, texts)), 'label': int(label)}
