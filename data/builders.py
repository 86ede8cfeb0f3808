"""The base of the embedded TFDS builders, whose data are generated or read on this machine.

A builder declares only its own: ``VERSION``, ``RELEASE_NOTES``, ``BUILDER_CONFIGS``, its labels
and ``rows`` (split -> (text, label), or (text_a, text_b, label) with two ``TEXTS``), ``HOMEPAGE``
and ``CITATION``; its description is its module's docstring. Its TFDS name (the class name in
snake case), config and ``VERSION`` name its folder in the data_dir.
"""

from __future__ import annotations

import abc
import hashlib
import sys
from typing import ClassVar, Iterable

import tensorflow_datasets as tfds


def split_of(text: str) -> str:
  """The fixed split of an embedded text: by MD5 of the text, modulo 10 (0: test, 1:
  validation, else train)."""
  bucket = int(hashlib.md5(text.encode('utf-8')).hexdigest(), 16) % 10
  return {0: 'test', 1: 'validation'}.get(bucket, 'train')


class EmbeddedBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A TFDS builder of labelled texts made here: features ``TEXTS`` and ``label``."""

  TEXTS: ClassVar[tuple[str, ...]] = ('text',)
  CLASSES: ClassVar[tuple[str, ...]] = ()  # the label's names, unless class_label says otherwise
  KEY_BY_INDEX: ClassVar[bool] = False  # generated in a fixed order: a row's index is its key
  HOMEPAGE: ClassVar[str | None] = None
  CITATION: ClassVar[str | None] = None

  def class_label(self) -> tfds.features.ClassLabel:
    return tfds.features.ClassLabel(names=self.CLASSES)

  @abc.abstractmethod
  def rows(self) -> dict[str, Iterable[tuple]]:
    """Split -> its examples as tuples of ``TEXTS`` then the label, in the order they are keyed
    (``key``)."""

  def key(self, index: int, row: tuple) -> int | str:
    """The TFDS key of the ``index``-th row of a split: MD5 of the text, or ``index``. TFDS
    orders a split's examples by their keys, so a builder's keys are part of its data (changing
    them reorders a prepared dataset, which its VERSION must then say)."""
    return index if self.KEY_BY_INDEX else hashlib.md5(row[0].encode('utf-8')).hexdigest()

  def description(self) -> str:
    return sys.modules[type(self).__module__].__doc__

  def split_lengths(self, max_length: int) -> dict[str, int]:
    """Split -> length in tokens that holds its examples: ``max_length`` (truncating) for natural
    text; generated datasets fix theirs."""
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
