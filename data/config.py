"""``DataConfig``: the ``data`` group of a run config, and the checks that need only the group."""

from __future__ import annotations

import dataclasses

import data
import settings

PROJECT_HINT = (' A project\'s datasets (projects/<name>/, e.g. chomsky/<task>) are registered '
                'when its config file is used (--config=projects/<name>/configs/...) or '
                'train.projects names it.')

P, R, T = settings.Role.PARAMETERS, settings.Role.RESULTS, settings.Role.RUNTIME


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
  """What the model reads, and how it is tokenized and batched."""

  # Dataset (data.DATASETS; docs/data.md). A parameter: the classes and a trained vocabulary are
  # the dataset's.
  name: str = settings.setting('position_probes/order', P)
  # TFDS data_dir (prepared data; embedded builders are generated here).
  data_dir: str | None = settings.setting(None, T)
  # Tokens per example, including the [CLS] token; longer texts are truncated.
  max_length: int = settings.setting(64, R, evaluation=True)
  # data.TOKENIZERS: 'byte' (no vocabulary), 'sentencepiece', 'wordpiece' or 'bpe' (trained on
  # the training split, cached in the workdir), or 'huggingface' (data.tokenizer_path).
  tokenizer: str = settings.setting('byte', P)
  # Vocabulary size of the tokenizers trained here (sentencepiece, wordpiece, bpe).
  sp_vocab_size: int = settings.setting(8000, P)
  # data.tokenizer='huggingface': a tokenizer.json, a WordPiece vocab.txt, or a checkpoint
  # directory holding one (copied into the workdir).
  tokenizer_path: str = settings.setting('', R)
  # data.name=files: CSV/TSV/JSONL (or .txt, for language models) paths for training.
  train_files: tuple[str, ...] = settings.setting((), R, items=str, example='train.csv,more.csv')
  # data.name=files: validation paths (empty = hold out 10% of train).
  validation_files: tuple[str, ...] = settings.setting((), R, items=str, example='dev.csv')
  # data.name=files: test paths (empty = use validation).
  test_files: tuple[str, ...] = settings.setting((), R, items=str, example='test.csv')
  text_column: str = settings.setting('text', R)  # data.name=files: column/key with the text.
  # data.name=files: column/key with the label (names or integers).
  label_column: str = settings.setting('label', R)
  # data.name=files: column/key of a second text (sentence pairs; '' = none), joined as [CLS] a
  # [SEP] b [SEP] (model.type_vocab_size >= 2) or one by one with model.dual_encoder.
  text_b_column: str = settings.setting('', R)
  # data.name=files: the column names of CSV/TSV files without a header row; empty = the first
  # row names them.
  columns: tuple[str, ...] = settings.setting((), R, items=str,
                                              example='label,id1,id2,text1,text2')
  # data.name=files: data.files.QUOTING. 'auto': .csv files by CSV rules, .tsv/.tab files not
  # quoted (a row a line, as GLUE's); 'csv' or 'none': that rule for every file.
  quoting: str = settings.setting('auto', R)
  # data.name=files: real-valued labels (STS-B-like): one output, squared error, Pearson's and
  # Spearman's correlation.
  regression: bool = settings.setting(False, R)
  # MLM (data/lm.py): fraction of tokens predicted (80% [MASK], 10% random, 10% kept).
  mask_rate: float = settings.setting(0.15, R)
  # MLM: mask all the tokens of a word together.
  whole_word_masking: bool = settings.setting(False, R)
  # Language models: evaluation lengths beyond data.max_length (test split as 'test_<n>').
  eval_lengths: tuple[int, ...] = settings.setting((), R, items=int, example='128,256')
  # Evaluate on the first this many tokens of each split (the same text at every length).
  eval_tokens: int = settings.setting(65536, R)
  # Data-order seed, shared by all model seeds so seeds differ only in init and dropout.
  seed: int = settings.setting(0, R)
  prefetch: int = settings.setting(2, T)  # Batches prepared ahead, in as many threads.
  # The training split cut into this many shards (data/sources.py TrainShards), each with its
  # own shuffle: a process reads only its shards. On k hosts use a multiple of k dividing the
  # global batch; it is part of the data order (the number of processes is not).
  num_shards: int = settings.setting(1, R)
  # Randomized positional encodings (docs/randomized_positions.md): N > 0 gives each document a
  # sorted random sample of the positions 0 .. N - 1 (the paper's N: 2048); 0: off.
  random_positions: int = settings.setting(0, R)
  # data.name=chomsky/<task> (projects/chomsky/README.md): training lengths are uniform in
  # 1..this, one per batch (the papers: 40).
  chomsky_train_length: int = settings.setting(40, R)
  # The test lengths (splits test_<n>); empty: chomsky_train_length + 1 .. 500.
  chomsky_test_lengths: tuple[int, ...] = settings.setting((), R, items=int, example='41,100,500',
                                                           evaluation=True)
  # Examples at each test length (the authors' range_test_total_batch_size: 512).
  chomsky_samples_per_length: int = settings.setting(512, R, evaluation=True)
  # A test length's accuracy is the mean over its batches of this many examples (the authors'
  # range_test_sub_batch_size: 64).
  chomsky_eval_batch_size: int = settings.setting(64, R, evaluation=True)
  # Examples in the validation and in the test split, at the training lengths.
  chomsky_validation_size: int = settings.setting(512, R)

  def __post_init__(self):
    if self.max_length <= 1:
      raise ValueError(f'data.max_length must be > 1 ([CLS] plus at least one token), got '
                       f'{self.max_length}: pass e.g. --config.data.max_length=64.')
    if not 0 < self.mask_rate < 1 or self.eval_tokens <= 0:
      raise ValueError(f'data.mask_rate must be in (0, 1) and data.eval_tokens > 0, got '
                       f'{self.mask_rate} and {self.eval_tokens}.')
    for field, valid in (('name', tuple(data.DATASETS)), ('tokenizer', data.TOKENIZERS)):
      if getattr(self, field) not in valid:
        raise ValueError(f'data.{field}={getattr(self, field)!r} is not valid; valid choices: '
                         f'{", ".join(valid)}.' + (PROJECT_HINT if field == 'name' else ''))
    self._check_labels()
    self._check_random_positions()
    self._check_chomsky()
    if self.text_b_column and self.name != 'files':
      raise ValueError(f'data.text_b_column={self.text_b_column!r} names a column of your own '
                       f'files, but data.name={self.name!r}; use data.name=files or drop '
                       'text_b_column.')

  def _check_random_positions(self) -> None:
    longest = max((self.max_length, *self.eval_lengths))
    if self.random_positions < 0 or 0 < self.random_positions < longest:
      raise ValueError(f'data.random_positions={self.random_positions} must be 0 (off) or at '
                       f'least the longest length trained or evaluated, {longest} tokens '
                       '(data.max_length, data.eval_lengths): positions are drawn from 0 .. N - 1 '
                       'without repetition. The paper uses 2048.')

  def _check_chomsky(self) -> None:
    sizes = ('chomsky_train_length', 'chomsky_samples_per_length', 'chomsky_eval_batch_size',
             'chomsky_validation_size')
    if bad := [f'data.{f}={getattr(self, f)}' for f in sizes if getattr(self, f) <= 0]:
      raise ValueError(f'{", ".join(bad)}: these sizes must be positive integers.')
    if self.chomsky_samples_per_length % self.chomsky_eval_batch_size:
      raise ValueError(f'data.chomsky_samples_per_length={self.chomsky_samples_per_length} is '
                       'not a multiple of data.chomsky_eval_batch_size='
                       f'{self.chomsky_eval_batch_size}: a test length\'s accuracy is the mean '
                       'over its full batches, so give e.g. 512 and 64 (the papers\').')
    if short := [n for n in self.chomsky_test_lengths if n <= 0]:
      raise ValueError(f'data.chomsky_test_lengths has lengths {short}: a test length is a '
                       'positive number of input tokens, e.g. 41,100,500.')

  @property
  def chomsky_tests(self) -> tuple[int, ...]:
    return self.chomsky_test_lengths or tuple(range(self.chomsky_train_length + 1, 501))

  @property
  def _tfds_fields(self) -> data.TextFields | None:
    entry = data.DATASETS.get(self.name)
    return entry.fields if entry and entry.fields and not entry.fields.corpus else None

  def _check_labels(self) -> None:
    fields = self._tfds_fields
    if fields and fields.regression != self.regression:
      raise ValueError(f'data.name={self.name!r} has '
                       f'{"real-valued" if fields.regression else "class"} labels: set '
                       f'data.regression={fields.regression}.')
    if self.regression and self.name != 'files' and not fields:
      raise ValueError(f'data.regression=True reads real-valued labels from your own files (or '
                       f'glue/stsb), but data.name={self.name!r}; use data.name=files.')

  @property
  def pairs(self) -> bool:
    """Each example is a pair of texts (data.text_b_column, or a GLUE pair task)."""
    fields = self._tfds_fields
    return bool(self.text_b_column) or bool(fields and fields.pair)
