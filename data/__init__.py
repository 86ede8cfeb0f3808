"""Text-classification data for the position-scheme ablations: the names a config may use,
importable without TensorFlow. ``DATASETS`` (``data.name`` -> ``Entry``) lists every dataset
(docs/data.md describes each; a project adds its own with ``register``) and ``TOKENIZERS`` the
tokenizers; the loaders are in ``data.datasets``. Every dataset has the splits ``train``,
``validation`` and ``test``; the position probes also ``test_<n>_near`` and ``test_<n>_far``.
"""

from __future__ import annotations

import dataclasses
import os

# TensorFlow only reads and shuffles data here: its start-up lines (oneDNN's notice, which no
# log level hides, and its CPU-feature INFO line) would come before every command's output, even
# a one-line user error. Level 1 hides INFO lines only. Set before TF is first imported; a
# user's own setting wins.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')
os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')

PROBE_TASKS = ('order', 'distance', 'nearest')


@dataclasses.dataclass(frozen=True)
class TextFields:
  """How a TFDS dataset's examples become (text, label): ``text_keys`` joined with a newline
  (or with ``pair`` the two texts of a pair); ``splits``: our split -> a TFDS split spec."""

  text_keys: tuple[str, ...]
  splits: dict[str, str]
  pair: bool = False
  regression: bool = False  # The label is a real number (STS-B).
  corpus: bool = False  # Text only, no labels (pre-training corpora).


@dataclasses.dataclass(frozen=True)
class Entry:
  """A dataset by ``kind``: ``embedded`` (built here by the builder and config ``builder``,
  'name/config'), ``tfds`` (prepared elsewhere, read as ``fields`` say), ``files`` (the user's),
  or a project's kind, which its task kind loads (``builder``: the project's name for it)."""

  kind: str
  builder: str | None = None
  fields: TextFields | None = None


def _tfds(text_keys: tuple[str, ...], splits: dict[str, str], **kwargs: bool) -> Entry:
  return Entry('tfds', fields=TextFields(text_keys, splits, **kwargs))


def _held_out(test: str, percent: int = 95) -> dict[str, str]:
  """Splits holding out the end of train for validation (a random sample: TFDS shuffles)."""
  return {'train': f'train[:{percent}%]', 'validation': f'train[{percent}%:]', 'test': test}


def _glue_pair(first: str, second: str, test: str = 'validation', *,
               regression: bool = False) -> Entry:
  """A GLUE pair task: its test labels are hidden, so validation is our test (papers report
  GLUE dev results) and 5% of train validates."""
  return _tfds((first, second), _held_out(test), pair=True, regression=regression)


# Every dataset, by data.name. SST-2's GLUE validation split is our test split, as for the pair
# tasks. The corpora are unlabelled, for language models only.
DATASETS = {
    **{f'position_probes/{task}': Entry('embedded', f'position_probes/{task}')
       for task in PROBE_TASKS},
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
