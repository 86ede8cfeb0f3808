"""Text-classification data for the position-scheme ablations.

This namespace holds only the names a config may use, importable without TensorFlow: the
registry ``data.DATASETS`` (name -> ``Entry``: its kind, embedded builder or TFDS fields; the
splits below are there) and ``data.TOKENIZERS``; the loaders are in ``data.datasets``.
``data.name`` picks the dataset:

* embedded, generated or read on this machine and prepared automatically into ``data.data_dir``
  (TFDS's default directory if unset) on first use: ``position_probes/<task>`` (order, distance,
  nearest; see ``data/position_probes.py``), ``listops``, ``listops/small``, ``fortunes``
  (needs ``apt-get install fortunes``) and ``manpages``, long documents (needs ``apt-get install
  manpages manpages-dev``; ``data/manpages.py``), and ``manpages/pairs``, a sentence-pair task
  (does a page's one-line summary belong to this DESCRIPTION?); ``docs``, a 20 MB English corpus
  for pre-training (the Python documentation and the man pages, ``data/corpus.py``; needs
  ``apt-get install python3-doc manpages manpages-dev``);
* TFDS text datasets, which must be prepared beforehand (no download here; see
  ``python -m data.prepare``): ``imdb_reviews``, ``glue/sst2``, ``ag_news_subset``,
  ``yelp_polarity_reviews``, and the GLUE pair tasks ``glue/mnli``, ``glue/qnli``, ``glue/qqp``,
  ``glue/rte``, ``glue/mrpc`` and ``glue/stsb`` (regression);
* TFDS text corpora for pre-training (``train.task`` mlm or clm), prepared beforehand:
  ``lm1b``, ``wikipedia/20230601.en``, ``c4/en``; a language model also
  reads the texts of any dataset above, ignoring its labels;
* added by a project (``projects/<name>/``, imported by its config files or ``train.projects``),
  e.g. ``chomsky/<task>``, generated afresh for every batch (``projects/chomsky/``);
* ``files``: local CSV/TSV/JSONL files (``data/files.py``); for pre-training also plain-text
  files (.txt: documents separated by blank lines).

Every dataset has the splits ``train``, ``validation`` and ``test``; the position probes also
``test_<n>`` at n = 2x and 4x the training length. The special token ids are the tokenizers'
(``data/tokenizers.py``).
"""

from __future__ import annotations

import dataclasses
import os

# TensorFlow only reads and shuffles data here (TFDS, tf.data), on integers and bytes: its
# start-up lines (oneDNN's notice, which no log level hides, and its CPU-feature INFO line, which
# absl's pre-InitializeLog warning comes with) would be the first thing every command prints,
# even before a one-line user error. Level 1 hides INFO lines only: XLA's warnings still show.
# Set before TF is first imported; a user's own setting wins.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')
os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')

PROBE_TASKS = ('order', 'distance', 'nearest')


@dataclasses.dataclass(frozen=True)
class TextFields:
  """How a TFDS dataset's examples become (text, label): ``text_keys`` are the features joined
  with a newline into the text (e.g. AG News title and description), or with ``pair`` the two
  texts of a pair; ``splits`` maps our split names to TFDS split specs (which may slice a TFDS
  split); ``regression``: the label is a real number (STS-B)."""

  text_keys: tuple[str, ...]
  splits: dict[str, str]
  pair: bool = False
  regression: bool = False
  corpus: bool = False  # Text only, no labels (pre-training corpora).


@dataclasses.dataclass(frozen=True)
class Entry:
  """A dataset ``data.name`` may name, by the ``kind`` that ``data/datasets.py`` loads:
  ``embedded``, generated or read here by the embedded TFDS builder (``data/builders.py``) and
  config ``builder`` ('name/config', also its folder in the data_dir); ``tfds``, a TFDS dataset
  prepared elsewhere whose examples become texts as ``fields`` say; ``files``, the user's own
  files; or a kind a project adds, which its task kind loads (``training/tasks.py``; ``builder``
  is then the project's own name for the dataset)."""

  kind: str
  builder: str | None = None
  fields: TextFields | None = None


def _tfds(text_keys: tuple[str, ...], splits: dict[str, str], **kwargs: bool) -> Entry:
  return Entry('tfds', fields=TextFields(text_keys, splits, **kwargs))


def _held_out(test: str, percent: int = 95) -> dict[str, str]:
  """Splits where a dataset has no labelled validation split: the last slice of its training
  split is held out for validation (TFDS shuffles examples when it prepares a dataset, so the
  slice is a random sample)."""
  return {'train': f'train[:{percent}%]', 'validation': f'train[{percent}%:]', 'test': test}


def _glue_pair(first: str, second: str, test: str = 'validation', *,
               regression: bool = False) -> Entry:
  """A GLUE pair task: GLUE's test labels are hidden, so its labelled validation split is our
  test split (as papers report GLUE dev results) and 5% of train is held out for validation."""
  return _tfds((first, second), _held_out(test), pair=True, regression=regression)


# Every dataset, by data.name: adding one is one entry here (for a new embedded builder, also its
# class in data/datasets.py). GLUE's SST-2 test labels are hidden (-1), so its labelled GLUE
# validation split is our test split, as papers report SST-2 dev accuracy. The corpora are
# unlabelled, for language models only.
DATASETS = {
    **{f'position_probes/{task}': Entry('embedded', f'position_probes/{task}')
       for task in PROBE_TASKS},
    'listops': Entry('embedded', 'listops/listops'),
    'listops/small': Entry('embedded', 'listops/small'),
    'fortunes': Entry('embedded', 'fortunes/topics'),
    'manpages': Entry('embedded', 'manpages/kinds'),
    'manpages/pairs': Entry('embedded', 'manpage_pairs/pairs'),
    'docs': Entry('embedded', 'docs/all'),
    'imdb_reviews': _tfds(('text',), _held_out('test', 90)),
    'glue/sst2': _tfds(('sentence',), _held_out('validation')),
    'ag_news_subset': _tfds(('title', 'description'), _held_out('test')),
    'yelp_polarity_reviews': _tfds(('text',), _held_out('test', 99)),
    'glue/mnli': _glue_pair('premise', 'hypothesis', 'validation_matched'),
    'glue/qnli': _glue_pair('question', 'sentence'),
    'glue/qqp': _glue_pair('question1', 'question2'),
    'glue/rte': _glue_pair('sentence1', 'sentence2'),
    'glue/mrpc': _glue_pair('sentence1', 'sentence2'),
    'glue/stsb': _glue_pair('sentence1', 'sentence2', regression=True),
    'lm1b': _tfds(('text',), {'train': 'train', 'validation': 'test[:50%]',
                              'test': 'test[50%:]'}, corpus=True),
    'wikipedia/20230601.en': _tfds(('title', 'text'), {
        'train': 'train[:98%]', 'validation': 'train[98%:99%]', 'test': 'train[99%:]'},
                                   corpus=True),
    'c4/en': _tfds(('text',), {'train': 'train', 'validation': 'validation[:50%]',
                               'test': 'validation[50%:]'}, corpus=True),
    'files': Entry('files'),
}


def register(name: str, entry: Entry) -> None:
  """Adds a project's dataset to ``DATASETS`` (its config files import the project)."""
  if DATASETS.get(name, entry) != entry:
    raise ValueError(f'data.name={name!r} is registered twice, differently.')
  DATASETS[name] = entry


# 'wordpiece' and 'bpe' (byte-level) are trained here, offline, with the `tokenizers` library.
TOKENIZERS = ('byte', 'sentencepiece', 'wordpiece', 'bpe', 'huggingface')
