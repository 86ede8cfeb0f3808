"""Text-classification data for the position-scheme ablations.

This namespace holds only the names a config may use, importable without TensorFlow
(``data.DATASET_NAMES``, ``data.TOKENIZERS``); the loaders are in ``data.datasets``.
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
  ``glue/rte``, ``glue/mrpc`` and ``glue/stsb`` (regression) (splits in ``TFDS_TEXT_DATASETS``);
* TFDS text corpora for pre-training (``train.task`` mlm or clm), prepared beforehand:
  ``lm1b``, ``wikipedia/20230601.en``, ``c4/en`` (``TFDS_CORPORA``); a language model also
  reads the texts of any dataset above, ignoring its labels;
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
EMBEDDED_DATASETS = tuple(f'position_probes/{task}' for task in PROBE_TASKS) + (
    'listops', 'listops/small', 'fortunes', 'manpages', 'manpages/pairs', 'docs')


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


def _glue_pair(first: str, second: str, test: str = 'validation', *,
               regression: bool = False) -> TextFields:
  """A GLUE pair task: GLUE's test labels are hidden, so its labelled validation split is our
  test split (as papers report GLUE dev results) and 5% of train is held out for validation."""
  return TextFields((first, second), {'train': 'train[:95%]', 'validation': 'train[95%:]',
                                      'test': test}, pair=True, regression=regression)


# The TFDS text datasets. Where a dataset has no labelled validation split, the last slice of its
# training split is held out for validation (TFDS shuffles examples when it prepares a dataset, so
# the slice is a random sample). GLUE's SST-2 test labels are hidden (-1), so its labelled GLUE
# validation split is our test split, as papers report SST-2 dev accuracy.
TFDS_TEXT_DATASETS = {
    'imdb_reviews': TextFields(('text',), {
        'train': 'train[:90%]', 'validation': 'train[90%:]', 'test': 'test'}),
    'glue/sst2': TextFields(('sentence',), {
        'train': 'train[:95%]', 'validation': 'train[95%:]', 'test': 'validation'}),
    'ag_news_subset': TextFields(('title', 'description'), {
        'train': 'train[:95%]', 'validation': 'train[95%:]', 'test': 'test'}),
    'yelp_polarity_reviews': TextFields(('text',), {
        'train': 'train[:99%]', 'validation': 'train[99%:]', 'test': 'test'}),
    'glue/mnli': _glue_pair('premise', 'hypothesis', 'validation_matched'),
    'glue/qnli': _glue_pair('question', 'sentence'),
    'glue/qqp': _glue_pair('question1', 'question2'),
    'glue/rte': _glue_pair('sentence1', 'sentence2'),
    'glue/mrpc': _glue_pair('sentence1', 'sentence2'),
    'glue/stsb': _glue_pair('sentence1', 'sentence2', regression=True),
}
# Unlabelled TFDS corpora, for language models only.
TFDS_CORPORA = {
    'lm1b': TextFields(('text',), {'train': 'train', 'validation': 'test[:50%]',
                                   'test': 'test[50%:]'}, corpus=True),
    'wikipedia/20230601.en': TextFields(('title', 'text'), {
        'train': 'train[:98%]', 'validation': 'train[98%:99%]', 'test': 'train[99%:]'},
                                        corpus=True),
    'c4/en': TextFields(('text',), {'train': 'train', 'validation': 'validation[:50%]',
                                    'test': 'validation[50%:]'}, corpus=True),
}
DATASET_NAMES = EMBEDDED_DATASETS + tuple(TFDS_TEXT_DATASETS) + tuple(TFDS_CORPORA) + ('files',)
# 'wordpiece' and 'bpe' (byte-level) are trained here, offline, with the `tokenizers` library.
TOKENIZERS = ('byte', 'sentencepiece', 'wordpiece', 'bpe', 'huggingface')
