"""``docs``: an offline English corpus for pre-training (about 20 MB), from two apt packages.

* The Python documentation's reStructuredText sources (``apt-get install python3-doc``:
  ``/usr/share/doc/python3.X/html/_sources``), one document per file: the tutorial, the library
  and language references, the HOWTOs, "What's New".
* The Linux man pages as plain text (``apt-get install manpages manpages-dev``; the ``manpages``
  dataset's documents, ``data/manpages.py``), one document per page.

Each document is one example (label: which of the two it comes from). The split is by
document (MD5 of the text: 0 ``test``, 1 ``validation``, else ``train``), so no document is in
two splits. ``.ci/run`` installs the packages, as it does fortunes.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import Iterable

import tensorflow_datasets as tfds

from data import builders
from data import manpages

PYTHON_DOCS = '/usr/share/doc/python3*/html/_sources'


@dataclasses.dataclass
class DocsConfig(tfds.core.BuilderConfig):
  python_docs: str = PYTHON_DOCS  # a glob; the newest match is used
  manpages: manpages.ManpagesConfig = dataclasses.field(
      default_factory=lambda: manpages.ManpagesConfig(name='kinds'))
  min_bytes: int = 200


def python_doc_files(pattern: str) -> list[str]:
  """The .txt sources under the newest directory matching ``pattern``, sorted."""
  roots = sorted(glob.glob(pattern))
  if not roots:
    raise FileNotFoundError(
        f'The Python documentation sources are not installed (nothing matches {pattern}). '
        'Install them with `apt-get install python3-doc` (Debian/Ubuntu), or use another '
        'data.name.')
  return sorted(glob.glob(os.path.join(roots[-1], '**', '*.txt'), recursive=True))


def load_documents(config: DocsConfig) -> dict[str, list[tuple[str, int]]]:
  """Split name -> (text, source id) pairs: the Python docs in path order, then the man pages."""
  documents: dict[str, list[tuple[str, int]]] = {'train': [], 'validation': [], 'test': []}
  seen = set()
  for path in python_doc_files(config.python_docs):
    with open(path, encoding='utf-8', errors='replace') as f:
      text = f.read().strip()
    if len(text.encode('utf-8')) >= config.min_bytes and text not in seen:
      seen.add(text)
      documents[builders.split_of(text)].append((text, 0))
  for split, pages in manpages.load_examples(config.manpages).items():
    documents[split] += [(text, 1) for text, _ in pages if text not in seen]
  return documents


class Docs(builders.EmbeddedBuilder):
  """The Python documentation and the Linux man pages: real English text for pre-training."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'python3-doc reST sources and manpages/manpages-dev as text, split '
                            'by MD5 of each document.'}
  BUILDER_CONFIGS = [DocsConfig(name='all', description='Python docs and man pages.')]
  CLASSES = ('python docs', 'man page')
  HOMEPAGE = 'https://docs.python.org/3/'
  CITATION = ('@misc{docs, title = {The Python documentation and the Linux man-pages}, '
              'howpublished = {Debian packages python3-doc, manpages and manpages-dev}}')

  def rows(self) -> dict[str, Iterable[tuple]]:
    return load_documents(self.builder_config)
