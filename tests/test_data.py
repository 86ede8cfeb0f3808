"""Tests for data/: tokenizers, files, TFDS (mocked), embedded datasets and the pipelines."""

from __future__ import annotations

import collections
import gzip
import itertools
import json
import os
import time

import hypothesis
from hypothesis import strategies as st
import jax
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import data
import settings
from configs import default
from projects.lra import listops
from projects.lra.configs import listops as lra_listops
from projects.lra.configs import retrieval as lra_retrieval
from data import batches as batches_lib
from data import builders
from data import datasets
from data import files as files_lib
from data import fortunes
from data import manpages
from data import position_probes
from data import sources
from data import tokenizers
from data.config import DataConfig


def _typed(config):
  """The data group as the library takes it (typed, lists parsed)."""
  return settings.build_group(DataConfig, config, 'data')


def _config(**overrides):
  config = default.get_config().data
  config.update(overrides)
  return config


def info_of(config, workdir=None):
  return datasets.load_classifier(_typed(config), workdir).info


def train_batches(config, *, workdir=None, **kwargs):
  return datasets.load_classifier(_typed(config), workdir).train_batches(**kwargs)


def eval_batches(config, split, *, workdir=None, **kwargs):
  return datasets.load_classifier(_typed(config), workdir).eval_batches(split, **kwargs)


def _take(iterator, n):
  return list(itertools.islice(iterator, n))


def _write(path, content: bytes | str) -> str:
  with open(path, 'wb') as f:
    f.write(content.encode() if isinstance(content, str) else content)
  return str(path)


def _csv_dataset(tmp_path, num: int, num_classes: int = 3) -> str:
  """A CSV file with texts 'example <i>' and integer labels i % num_classes."""
  rows = ''.join(f'example {i},{i % num_classes}\n' for i in range(num))
  return _write(tmp_path / 'train.csv', 'text,label\n' + rows)


# ---------------------------------------------------------------- tokenizers


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(texts=st.lists(st.binary(max_size=40), min_size=1, max_size=6),
                  length=st.integers(2, 48))
def test_byte_tokenizer_round_trip(texts, length):
  tokenizer = tokenizers.ByteTokenizer()
  ids = tokenizer.encode_batch(tf.constant(texts, tf.string), length).numpy()
  assert ids.shape == (len(texts), length) and ids.dtype == np.int32
  for text, row in zip(texts, ids):
    assert row[0] == tokenizers.CLS_ID
    body = text[:length - 1]
    assert tokenizer.decode(row) == body
    assert (row[1 + len(body):] == tokenizers.PAD_ID).all()
    assert (row[1:1 + len(body)] >= tokenizers.NUM_SPECIAL).all()
    assert (row < tokenizers.BYTE_VOCAB_SIZE).all()


def test_byte_tokenizer_non_utf8_and_empty():
  texts = [b'', b'\xff\xfe\x00ok', 'héllo'.encode()]
  ids = tokenizers.ByteTokenizer().encode_batch(tf.constant(texts), 8).numpy()
  np.testing.assert_array_equal(ids[0], [1, 0, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(ids[1][:6], [1, 0xff + 4, 0xfe + 4, 4, ord('o') + 4, ord('k') + 4])
  assert tokenizers.ByteTokenizer().decode(ids[2]) == 'héllo'.encode()


def test_sentencepiece_trained_offline_and_cached(tmp_path):
  corpus = [f'the {w} sat on the mat number {i}'.encode()
            for i in range(200) for w in ('cat', 'dog', 'bird')]
  workdir = str(tmp_path)
  tok = tokenizers.load_or_train_sentencepiece(workdir, 'corpus', 100, lambda: corpus)
  assert os.path.exists(os.path.join(workdir, 'spm.model'))
  assert tok.vocab_size <= 100

  def fail():
    raise AssertionError('the cached model must be reused')

  cached = tokenizers.load_or_train_sentencepiece(workdir, 'corpus', 100, fail)
  texts = [b'the cat sat', b'', b'bad \xff bytes', b'the dog sat on the mat ' * 20]
  ids = cached.encode_batch(tf.constant(texts), 16).numpy()
  np.testing.assert_array_equal(ids, tok.encode_batch(tf.constant(texts), 16).numpy())
  assert ids.shape == (4, 16) and (ids[:, 0] == tokenizers.CLS_ID).all()
  assert (ids[1, 1:] == tokenizers.PAD_ID).all() and (ids[3] != tokenizers.PAD_ID).all()
  assert (ids < cached.vocab_size).all()
  assert cached.decode(ids[0]) == b'the cat sat'
  with pytest.raises(ValueError, match='spm.model was trained for'):
    tokenizers.load_or_train_sentencepiece(workdir, 'corpus', 200, fail)


def test_sentencepiece_through_the_pipeline(tmp_path):
  lines = ''.join(f'"the {w} number {i} is here",{i % 2}\n'
                  for i in range(300) for w in ('cat', 'dog'))
  train = _write(tmp_path / 'train.csv', 'text,label\n' + lines)
  config = _config(name='files', train_files=train, tokenizer='sentencepiece', sp_vocab_size=80,
                   max_length=12)
  workdir = str(tmp_path / 'work')
  info = info_of(config, workdir=workdir)
  assert info.vocab_size <= 80 and os.path.exists(os.path.join(workdir, 'spm.model'))
  batch = next(train_batches(config, workdir=workdir, seed=0, global_batch_size=4))
  assert batch.inputs.shape == (4, 12) and (batch.inputs < info.vocab_size).all()
  with pytest.raises(ValueError, match='needs a workdir'):
    info_of(config, workdir=None)


# ---------------------------------------------------------------- files


def test_files_csv_tsv_jsonl_with_string_labels(tmp_path):
  train_csv = _write(tmp_path / 'a.csv', 'id,text,label\n1,"a, quoted\ntext",pos\n2,,neg\n')
  train_tsv = _write(tmp_path / 'b.tsv', 'label\ttext\npos\tgood\n')
  validation = _write(tmp_path / 'v.jsonl',
                      '{"text": "fine", "label": "pos"}\n\n{"text": "", "label": "neg"}\n')
  config = _config(name='files', train_files=f'{train_csv}, {train_tsv}',
                   validation_files=validation, max_length=16)
  workdir = str(tmp_path / 'work')
  info = info_of(config, workdir=workdir)
  assert info.class_names == ('neg', 'pos') and info.num_classes == 2
  assert info.num_train_examples == 3 and info.eval_splits == {'validation': 16, 'test': 16}
  with open(os.path.join(workdir, 'classes.json')) as f:
    assert json.load(f) == {'class_names': ['neg', 'pos'], 'integer_labels': False}
  # The test split defaults to the validation files.
  batches = _take(eval_batches(config, 'test', workdir=workdir, global_batch_size=4), 5)
  assert len(batches) == 1
  np.testing.assert_array_equal(batches[0].label, [1, 0, 0, 0])
  np.testing.assert_array_equal(batches[0].weight, [1, 1, 0, 0])
  assert tokenizers.ByteTokenizer().decode(batches[0].inputs[0]) == b'fine'
  assert (batches[0].inputs[1, 1:] == tokenizers.PAD_ID).all()  # Empty text: [CLS] only.


def test_files_classes_json_is_reused(tmp_path):
  workdir = str(tmp_path / 'work')
  first = _write(tmp_path / 'first.csv', 'text,label\nx,b\ny,c\nz,a\n')
  assert info_of(_config(name='files', train_files=first, validation_files=first),
                 workdir=workdir).class_names == ('a', 'b', 'c')
  # A later run whose files lack class 'a' keeps the saved ids.
  later = _write(tmp_path / 'later.csv', 'text,label\nx,b\ny,c\n')
  config = _config(name='files', train_files=later, validation_files=later)
  assert info_of(config, workdir=workdir).class_names == ('a', 'b', 'c')
  batch = next(eval_batches(config, 'validation', workdir=workdir, global_batch_size=2))
  np.testing.assert_array_equal(batch.label, [1, 2])


def test_files_integer_labels_and_range_error(tmp_path):
  train = _write(tmp_path / 'train.jsonl', ''.join(
      json.dumps({'text': f't{i}', 'label': i % 3}) + '\n' for i in range(6)))
  good = _write(tmp_path / 'good.tsv', 'text\tlabel\nu\t2\n')
  info = info_of(_config(name='files', train_files=train, validation_files=good),
                       workdir=None)
  assert info.class_names == ('0', '1', '2')
  bad = _write(tmp_path / 'bad.csv', 'text,label\nu,1\nv,3\n')
  with pytest.raises(ValueError, match=r'bad\.csv, row 2 \(line 3\): label 3 is outside'):
    info_of(_config(name='files', train_files=train, validation_files=bad), workdir=None)
  negative = _write(tmp_path / 'negative.csv', 'text,label\nu,1\nv,-1\n')
  with pytest.raises(ValueError, match=r'negative\.csv, row 2'):
    info_of(_config(name='files', train_files=negative), workdir=None)
  unknown = _write(tmp_path / 'unknown.csv', 'text,label\nu,x\n')
  with pytest.raises(ValueError, match=r'unknown\.csv, row 1 \(line 2\): label .x. is not'):
    info_of(_config(name='files', train_files=train, validation_files=unknown),
                  workdir=None)


def test_files_non_utf8_bytes_are_kept(tmp_path):
  train = _write(tmp_path / 'train.csv', b'text,label\n"caf\xe9 \xff",a\n,b\n')
  config = _config(name='files', train_files=train, validation_files=train, max_length=8)
  batch = next(eval_batches(config, 'validation', workdir=None, global_batch_size=2))
  assert tokenizers.ByteTokenizer().decode(batch.inputs[0]) == b'caf\xe9 \xff'
  np.testing.assert_array_equal(batch.inputs[1], [1] + [0] * 7)


def test_files_errors(tmp_path):
  with pytest.raises(ValueError, match='needs data.train_files'):
    info_of(_config(name='files'), workdir=None)
  with pytest.raises(FileNotFoundError, match='missing.csv'):
    info_of(_config(name='files', train_files=str(tmp_path / 'missing.csv')), workdir=None)
  no_column = _write(tmp_path / 'x.csv', 'sentence,label\na,b\n')
  with pytest.raises(ValueError, match="no column 'text'"):
    info_of(_config(name='files', train_files=no_column), workdir=None)
  with pytest.raises(ValueError, match='unknown format'):
    info_of(_config(name='files', train_files=_write(tmp_path / 'x.txt', 'a')),
                  workdir=None)
  empty_label = _write(tmp_path / 'e.csv', 'text,label\na,\n')
  with pytest.raises(ValueError, match=r'e\.csv, row 1 \(line 2\): empty label'):
    info_of(_config(name='files', train_files=empty_label), workdir=None)


def test_files_read_what_spreadsheets_and_compressors_write(tmp_path):
  """A byte-order mark (Excel's CSV), gzip, a field over csv's default 128 KiB limit."""
  rows = ''.join(f'text {i},{i % 2}\n' for i in range(20))
  bom = _write(tmp_path / 'bom.csv', b'\xef\xbb\xbftext,label\n' + rows.encode())
  assert info_of(_config(name='files', train_files=bom)).num_train_examples == 18
  packed = tmp_path / 'rows.tsv.gz'
  with gzip.open(packed, 'wt') as f:
    f.write('text\tlabel\n' + rows.replace(',', '\t'))
  assert info_of(_config(name='files', train_files=str(packed))).num_classes == 2
  long_text = 'x' * 200_000
  long = _write(tmp_path / 'long.csv', f'text,label\n"{long_text}",0\n' + rows)
  config = _config(name='files', train_files=long, max_length=8)
  assert info_of(config).num_train_examples == 19


def test_files_refuse_what_they_would_misread(tmp_path):
  good = ''.join(f'row {i},{i % 2}\n' for i in range(20))
  unclosed = _write(tmp_path / 'q.csv', 'text,label\n' + good + '"open quote,1\n' + good)
  with pytest.raises(ValueError, match=r'q\.csv, row 21 \(from line 22\): not valid CSV'):
    info_of(_config(name='files', train_files=unclosed))
  null = _write(tmp_path / 'n.jsonl', '{"text": "a", "label": 1}\n{"text": "b", "label": null}\n')
  with pytest.raises(ValueError, match=r'n\.jsonl, row 2 \(line 2\): the label null'):
    info_of(_config(name='files', train_files=null))
  with pytest.raises(ValueError, match='Decompress'):
    info_of(_config(name='files', train_files=_write(tmp_path / 'x.csv.zip', 'a')))
  ids = _write(tmp_path / 'ids.csv', 'text,label\n' + ''.join(
      f'row {i},{10**12 + i}\n' for i in range(20)))
  with pytest.raises(ValueError, match='looks like an ID column'):
    info_of(_config(name='files', train_files=ids))
  tiny = _write(tmp_path / 'tiny.csv', 'text,label\na,0\nb,1\n')
  with pytest.raises(ValueError, match='The validation split is empty'):
    info_of(_config(name='files', train_files=tiny))


def test_files_holdout_validation(tmp_path):
  config = _config(name='files', train_files=_csv_dataset(tmp_path, 50))
  info = info_of(config, workdir=None)
  assert info.num_train_examples == 45
  train_texts, _ = files_lib.FilesSource(
      train_files=(config.train_files,), validation_files=(), test_files=(),
      columns=files_lib.Columns(text='text', label='label'), workdir=None).read('train')
  held_out = [tokenizers.ByteTokenizer().decode(row) for batch in eval_batches(
      config, 'validation', workdir=None, global_batch_size=8) for row, w in
      zip(batch.inputs, batch.weight) if w]
  assert len(held_out) == 5 and not set(held_out) & set(train_texts)


# ---------------------------------------------------------------- pipelines


def test_batches_shapes_dtypes_cls_positions(tmp_path):
  config = _config(name='files', train_files=_csv_dataset(tmp_path, 30), max_length=12)
  batch = next(train_batches(config, workdir=None, seed=0, global_batch_size=8))
  assert isinstance(batch, batches_lib.Classification) and batch.token_types is None
  assert batch.inputs.shape == (8, 12) and batch.inputs.dtype == np.int32
  assert batch.positions.shape == (8, 12) and batch.positions.dtype == np.int32
  assert batch.label.shape == (8,) and batch.label.dtype == np.int32
  assert batch.weight.shape == (8,) and batch.weight.dtype == np.float32
  assert (batch.inputs[:, 0] == tokenizers.CLS_ID).all() and (batch.weight == 1).all()
  real = batch.inputs != tokenizers.PAD_ID
  np.testing.assert_array_equal(batch.mask, real)
  lengths = [1 + len(tokenizers.ByteTokenizer().decode(row)) for row in batch.inputs]
  np.testing.assert_array_equal(real.sum(1), lengths)
  np.testing.assert_array_equal(batch.positions, np.where(real, np.arange(12), 0))
  for row, label in zip(batch.inputs, batch.label):  # 'example <i>' has label i % 3.
    assert int(tokenizers.ByteTokenizer().decode(row).split()[1]) % 3 == label


def test_train_resume_is_identical_and_epochs_reshuffle(tmp_path):
  config = _config(name='files', train_files=_csv_dataset(tmp_path, 23), max_length=16)
  validation = _write(tmp_path / 'v.csv', 'text,label\nv,0\n')
  config.validation_files = validation
  fresh = _take(train_batches(config, workdir=None, seed=3, global_batch_size=4), 7)
  resumed = _take(train_batches(config, workdir=None, seed=3, global_batch_size=4,
                                      start_step=5), 2)
  for a, b in zip(fresh[5:], resumed):
    jax.tree.map(np.testing.assert_array_equal, a, b)
  # Epochs: 23 examples, 4 per batch; every epoch is a permutation, and the order changes.
  long = _take(train_batches(config, workdir=None, seed=3, global_batch_size=4), 24)
  texts = [bytes(r) for b in long for r in b.inputs]
  epochs = [texts[i * 23:(i + 1) * 23] for i in range(4)]
  for epoch in epochs:
    assert len(set(epoch)) == 23
  assert epochs[0] != epochs[1]
  other_seed = _take(train_batches(config, workdir=None, seed=4, global_batch_size=4), 6)
  assert [bytes(r) for b in other_seed for r in b.inputs] != texts[:24]


def test_process_rows_make_the_global_batch(tmp_path):
  config = _config(name='files', train_files=_csv_dataset(tmp_path, 40), validation_files=
                   _write(tmp_path / 'v.csv', 'text,label\nv,0\n'), max_length=16)
  whole = _take(train_batches(config, workdir=None, seed=0, global_batch_size=8), 6)
  parts = [_take(train_batches(config, workdir=None, seed=0, global_batch_size=8,
                                     process_index=index, process_count=2, start_step=1), 5)
           for index in range(2)]
  for step in range(1, 6):  # Process p's rows of global batch s, from any start step.
    jax.tree.map(lambda a, b, w: np.testing.assert_array_equal(np.concatenate([a, b]), w),
                 parts[0][step - 1], parts[1][step - 1], whole[step])
  assert len({bytes(r) for b in whole[:5] for r in b.inputs}) == 40  # 5 x 8: one epoch.
  with pytest.raises(ValueError, match='not a positive multiple'):
    train_batches(config, workdir=None, seed=0, global_batch_size=9, process_count=2,
                        process_index=0)
  # TFDS sources read each host's part of the split only (tfds.even_splits).
  tiny = position_probes.PositionProbesConfig(name='tiny', task='nearest', length=16,
                                              test_lengths=(32, 64), num_train=40, num_eval=10,
                                              num_extrapolation=10)
  source = sources.embedded_source(position_probes.PositionProbes(config=tiny,
                                                                  data_dir=str(tmp_path)))
  assert {s: source.num_examples(s) for s in source.splits} == {
      'train': 40, 'validation': 10, 'test': 10, **{
          f'test_{n}_{kind}': 10 for n in (32, 64) for kind in ('near', 'far')}}
  parts = [source.read('train', i, 3)[0] for i in range(3)]
  assert sorted(len(p) for p in parts) == [13, 13, 14]
  assert sorted(np.concatenate(parts)) == sorted(source.read('train')[0])
  assert {len(text) for text in source.read('test_64_far')[0]} == {63}


@pytest.mark.parametrize('count', [2, 3])
def test_eval_multihost_covers_every_example_once(tmp_path, count):
  train = _csv_dataset(tmp_path, 11)
  config = _config(name='files', train_files=train, validation_files=train, max_length=16)
  per_host = [_take(eval_batches(config, 'validation', workdir=None,
                                       global_batch_size=2 * count, process_index=i,
                                       process_count=count), 100) for i in range(count)]
  assert len({len(batches) for batches in per_host}) == 1  # Same number of batches everywhere.
  seen = collections.Counter(
      tokenizers.ByteTokenizer().decode(row) for batches in per_host for b in batches
      for row, w in zip(b.inputs, b.weight) if w == 1)
  assert seen == collections.Counter(f'example {i}'.encode() for i in range(11))
  for batches in per_host:
    for b in batches:
      assert (b.inputs[b.weight == 0, 1:] == tokenizers.PAD_ID).all()


def test_eval_max_length_override(tmp_path):
  config = _config(name='files', train_files=_csv_dataset(tmp_path, 10), max_length=8)
  natural = next(eval_batches(config, 'validation', workdir=None, global_batch_size=2))
  longer = next(eval_batches(config, 'validation', workdir=None, global_batch_size=2,
                                   max_length=32))
  assert natural.inputs.shape == (2, 8) and longer.inputs.shape == (2, 32)
  np.testing.assert_array_equal(longer.inputs[:, :8], natural.inputs)  # Short texts.
  with pytest.raises(ValueError, match="no split 'test_128'"):
    eval_batches(config, 'test_128', workdir=None, global_batch_size=2)


def test_unknown_name_lists_valid_names():
  with pytest.raises(ValueError, match=r"data.name='mnist' is not valid.*position_probes/order.*files"):
    info_of(_config(name='mnist'), workdir=None)
  with pytest.raises(ValueError, match="data.tokenizer='unigram-lm' is not valid"):
    info_of(_config(tokenizer='unigram-lm'), workdir=None)


# ---------------------------------------------------------------- TFDS text datasets


@pytest.mark.parametrize('name', [name for name, entry in data.DATASETS.items()
                                  if entry.kind == 'tfds' and not entry.fields.corpus])
def test_unprepared_tfds_dataset_fails_fast(tmp_path, name):
  start = time.time()
  with pytest.raises(FileNotFoundError, match=f'tfds build {name} --data_dir='):
    info_of(_config(name=name, data_dir=str(tmp_path), regression=name == 'glue/stsb'),
            workdir=None)
  assert time.time() - start < 10


def _write_split_metadata(name: str, data_dir: str, num_examples: int,
                          splits=('train', 'validation', 'test')) -> None:
  """Writes dataset_info.json with split sizes, so that mock_data can use MockPolicy.USE_FILES."""
  builder = tfds.builder(name, data_dir=data_dir)
  builder.info.set_splits(tfds.core.SplitDict([
      tfds.core.SplitInfo(name=split, shard_lengths=[num_examples], num_bytes=0)
      for split in splits]))
  os.makedirs(builder.data_dir)
  builder.info.write_to_directory(builder.data_dir)


@pytest.mark.parametrize('name, num_classes', [('imdb_reviews', 2), ('glue/sst2', 2),
                                               ('ag_news_subset', 4),
                                               ('yelp_polarity_reviews', 2)])
def test_tfds_text_datasets_with_mock_data(tmp_path, name, num_classes):
  data_dir = str(tmp_path)
  _write_split_metadata(name, data_dir, 20)
  config = _config(name=name, data_dir=data_dir, max_length=32)
  with tfds.testing.mock_data(num_examples=20, policy=tfds.testing.MockPolicy.USE_FILES,
                              data_dir=data_dir):
    info = info_of(config, workdir=None)
    assert info.num_classes == num_classes and info.vocab_size == 260
    assert info.eval_splits == {'validation': 32, 'test': 32}
    assert 0 < info.num_train_examples <= 20
    batch = next(train_batches(config, workdir=None, seed=0, global_batch_size=4))
    assert batch.inputs.shape == (4, 32) and (batch.inputs[:, 0] == tokenizers.CLS_ID).all()
    assert (batch.inputs[:, 1] != tokenizers.PAD_ID).all()  # The text field was found.
    assert ((batch.label >= 0) & (batch.label < num_classes)).all()
    # Mock data yield 20 examples for any split.
    test = _take(eval_batches(config, 'test', workdir=None, global_batch_size=8), 10)
    assert len(test) == 3 and sum(b.weight.sum() for b in test) == 20
  assert datasets.eval_splits_for_length(info, 1024) == ['test']


@pytest.mark.parametrize('name, num_classes', [('glue/mrpc', 2), ('glue/mnli', 3),
                                               ('glue/stsb', 1)])
def test_glue_pair_tasks_with_mock_data(tmp_path, name, num_classes):
  """GLUE pair tasks read both texts ([CLS] a [SEP] b [SEP], token types); STS-B's labels are
  real numbers; GLUE's labelled validation split is the test split."""
  data_dir = str(tmp_path)
  test = 'validation_matched' if name == 'glue/mnli' else 'validation'
  _write_split_metadata(name, data_dir, 20, splits=('train', test))
  config = _config(name=name, data_dir=data_dir, max_length=32, regression=name == 'glue/stsb')
  with tfds.testing.mock_data(num_examples=20, policy=tfds.testing.MockPolicy.USE_FILES,
                              data_dir=data_dir):
    dataset = datasets.load_classifier(_typed(config), None)
    assert dataset.info.pairs and dataset.info.num_classes == num_classes
    batch = next(dataset.eval_batches('test', global_batch_size=4))
    assert batch.token_types.shape == (4, 32)
    assert ((batch.inputs == tokenizers.SEP_ID).sum(1) == 2).all()
    assert batch.label.dtype == (np.float32 if name == 'glue/stsb' else np.int32)


# ---------------------------------------------------------------- position probes


def _bag_of_tokens_accuracy(train, test):
  """Accuracy of a logistic regression on token counts, trained on `train`, on `test`."""
  def features(texts):
    counts = np.zeros((len(texts), 128))
    for row, text in zip(counts, texts):
      np.add.at(row, np.frombuffer(text.encode(), np.uint8), 1)
    return counts / 8
  x, y = features(train[0]), train[1]
  w, b = np.zeros(x.shape[1]), 0.0
  for _ in range(300):
    p = 1 / (1 + np.exp(-(x @ w + b)))
    w -= 0.5 * (x.T @ (p - y) / len(y) + 1e-3 * w)
    b -= 0.5 * (p - y).mean()
  return (((features(test[0]) @ w + b) > 0) == test[1]).mean()


def _rule(task, text, threshold):
  """The label computed from the text by the task's definition."""
  if task == 'order':
    return int(text.index('A') < text.index('B'))
  if task == 'distance':
    first, second = [i for i, c in enumerate(text) if c == 'X']
    return int(second - first <= threshold)
  q, x, y = text.index('Q'), text.index('X'), text.index('Y')
  near, far = sorted([abs(x - q), abs(y - q)])
  assert far >= 2 * near  # PositionProbesConfig.nearest_ratio.
  return int(abs(y - q) < abs(x - q))


@pytest.mark.parametrize('task', position_probes.TASKS)
def test_probes_balanced_correct_and_bag_of_tokens_at_chance(task):
  config = position_probes.PositionProbesConfig(name=task, task=task, num_train=2000,
                                                num_eval=1000, num_extrapolation=200)
  markers = {'order': 'AB', 'distance': 'XX', 'nearest': 'QXY'}[task]
  splits = {}
  for split, length in config.split_lengths().items():
    texts, labels = position_probes.generate(config, split)
    splits[split] = texts, labels
    assert np.bincount(labels).tolist() == [len(labels) // 2] * 2
    for text, label in zip(texts, labels):
      assert len(text) == length - 1 and text.isascii() and text.isalpha()
      assert sorted(c for c in text if c.isupper()) == sorted(markers)
      assert _rule(task, text, config.threshold) == label
  again_texts, again_labels = position_probes.generate(config, 'test_256_far')  # Deterministic.
  assert again_texts == splits['test_256_far'][0]
  np.testing.assert_array_equal(again_labels, splits['test_256_far'][1])
  # _near splits keep every marker within the training width; _far ones put the markers that
  # define the label further apart than any training example.
  for length in config.test_lengths:
    for text, label in zip(*splits[f'test_{length}_near']):
      columns = [i for i, c in enumerate(text) if c.isupper()]
      assert columns[-1] - columns[0] < config.length - 1
    for text, label in zip(*splits[f'test_{length}_far']):
      columns = [i for i, c in enumerate(text) if c.isupper()]
      if task != 'distance' or label == 0:  # distance: only the far class can be unseen
        assert columns[-1] - columns[0] >= config.length - 1
  accuracy = _bag_of_tokens_accuracy(splits['train'], splits['test'])
  assert abs(accuracy - 0.5) < 0.06, accuracy


def test_probes_prepared_on_first_use(tmp_path):
  config = _config(name='position_probes/order', data_dir=str(tmp_path))
  info = info_of(config, workdir=None)  # Generates the default dataset (a few seconds).
  assert os.path.isdir(tmp_path / 'position_probes' / 'order' / '2.0.0')
  assert info.eval_splits == {'validation': 64, 'test': 64, **{
      f'test_{n}_{kind}': n for n in (96, 128, 192, 256, 512, 1024) for kind in ('near', 'far')}}
  assert info.class_names == ('b_before_a', 'a_before_b') and info.num_train_examples == 20_000
  assert [datasets.eval_splits_for_length(info, n) for n in (64, 128)] == [
      ['test'], ['test_128_near', 'test_128_far']]
  with pytest.raises(ValueError, match='none of 100 tokens'):
    datasets.eval_splits_for_length(info, 100)
  # 500 examples up to 128 tokens, then 32,768 tokens' worth per split.
  batches = _take(eval_batches(config, 'test_128_far', workdir=None, global_batch_size=128), 9)
  assert len(batches) == 2 and batches[0].inputs.shape == (128, 128)
  assert (batches[0].inputs != tokenizers.PAD_ID).all()  # Exactly 128 tokens.
  assert sum(b.weight.sum() for b in batches) == 256
  batches = _take(eval_batches(config, 'test_1024_near', workdir=None, global_batch_size=64), 9)
  assert sum(b.weight.sum() for b in batches) == 32
  with pytest.raises(ValueError, match='would cut them'):
    info_of(_config(name='position_probes/order', data_dir=str(tmp_path), max_length=32),
                  workdir=None)


# ---------------------------------------------------------------- ListOps


def test_listops_evaluator():
  assert listops.evaluate('[MAX 2 9 [MIN 4 7 ] 0 ]') == 9
  assert listops.evaluate('[MIN 4 7 ]') == 4
  assert listops.evaluate('[MED 1 2 3 4 ]') == 2  # Lower of 2.5.
  assert listops.evaluate('[MED 9 1 5 ]') == 5
  assert listops.evaluate('[MED 8 9 ]') == 8
  assert listops.evaluate('[SM 5 6 9 ]') == 0
  assert listops.evaluate('[SM [MAX 3 8 ] [MED 4 [MIN 7 6 ] 9 ] ]') == 4
  assert listops.evaluate('7') == 7
  for bad in ('[MAX 1 2', '[MAX 1 2 ] ]', '[MIN ]', '1 2', '[FOO 1 ]', '[MAX 12 ]', ''):
    with pytest.raises(ValueError):
      listops.evaluate(bad)


def test_listops_generation_and_builder(tmp_path):
  config = listops.ListOpsConfig(name='tiny', max_length=64, min_chars=16, max_depth=3,
                                 max_args=4, num_train=100, num_eval=30)
  texts, labels = listops.generate(config, 'train')
  assert np.bincount(labels, minlength=10).tolist() == [10] * 10
  for text, label in zip(texts, labels):
    assert 16 <= len(text) <= 63 and listops.evaluate(text) == label
  assert listops.generate(config, 'train')[0] == texts  # Deterministic,
  assert listops.generate(config, 'test')[0] != texts  # and seeded per split.
  builder = listops.Listops(config=config, data_dir=str(tmp_path))
  sources.prepare(builder)
  assert builder.info.features['label'].num_classes == 10
  assert builder.info.splits['validation'].num_examples == 30


# ---------------------------------------------------------------- fortunes


def test_fortunes_parsing(tmp_path):
  _write(tmp_path / 'food', 'E\bEat _\bw_\be_\bl_\bl.\n%\n\n%\nShared item\n%\nBread\n\t-- Anon\n')
  _write(tmp_path / 'law', 'Shared item\n%\nObjection!')
  config = fortunes.FortunesConfig(name='t', directory=str(tmp_path), categories=('food', 'law'))
  examples = fortunes.load_examples(config)
  pairs = sorted(pair for split in examples.values() for pair in split)
  assert pairs == [('Bread\n\t-- Anon', 0), ('Eat well.', 0), ('Objection!', 1)]
  for split, split_pairs in examples.items():
    assert all(builders.split_of(text) == split for text, _ in split_pairs)
  missing = fortunes.FortunesConfig(name='m', directory=str(tmp_path), categories=('art',))
  with pytest.raises(FileNotFoundError, match='apt-get install fortunes'):
    fortunes.load_examples(missing)


@pytest.mark.skipif(not os.path.isdir(fortunes.FORTUNES_DIR),
                    reason=f'{fortunes.FORTUNES_DIR} missing: apt-get install fortunes')
def test_fortunes_dataset(tmp_path):
  info = info_of(_config(name='fortunes', data_dir=str(tmp_path), max_length=128),
                       workdir=None)
  assert info.class_names == fortunes.CATEGORIES and info.num_train_examples > 3000
  examples = fortunes.load_examples(fortunes.FortunesConfig(name='topics'))
  assert len(examples['test']) > 300 and len(examples['validation']) > 300
  assert set(label for _, label in examples['train']) == set(range(10))
  batches = list(eval_batches(_config(name='fortunes', data_dir=str(tmp_path),
                                            max_length=128), 'test', workdir=None,
                                    global_batch_size=256))
  assert sum(b.weight.sum() for b in batches) == len(examples['test'])


# ---------------------------------------------------------------- man pages

_PAGE = r'''.\" Copyright and license comments are dropped.
.TH OPEN 2 2023-02-05 "Linux man-pages 6.03"
.SH NAME
open \- open a file
.SH SYNOPSIS
.nf
.B #include <fcntl.h>
.PP
.BI "int open(const char *" pathname ", int " flags );
.fi
.SH DESCRIPTION
The
.BR open ()
system call opens the file \fIpathname\fP.
It returns \(lqa descriptor\(rq
for a \fIpath\fP\ name, \
continued.
.TS
allbox;
lb l.
flag	meaning
T{
O_RDONLY
T}	read only
.TE
'''


def test_man_page_roff_becomes_text():
  text = manpages.roff_to_text(_PAGE)
  assert text.split('\n\n') == [
      'NAME', 'open - open a file', 'SYNOPSIS', '#include <fcntl.h>',
      'int open(const char *pathname, int flags);', 'DESCRIPTION',
      'The open() system call opens the file pathname. It returns "a descriptor" for a path '
      'name, continued.', 'flag meaning\nO_RDONLY\nread only']
  assert manpages.roff_to_text('.\\" c\n.so man2/open.2\n') is None  # a redirect


def test_man_pages_dataset_from_the_package_lists(tmp_path):
  """Pages come from the packages' dpkg lists (links and short pages dropped), labelled by
  section; a missing package fails fast with the install command."""
  man = tmp_path / 'man'
  body = 'Words about the call. ' * 120
  for section, name in (('2', 'open'), ('3', 'printf'), ('7', 'signal')):
    (man / f'man{section}').mkdir(parents=True, exist_ok=True)
    with gzip.open(man / f'man{section}' / f'{name}.{section}.gz', 'wt') as f:
      f.write(_PAGE.replace('open', name) + body)
  with gzip.open(man / 'man3' / 'short.3.gz', 'wt') as f:
    f.write(_PAGE)
  os.symlink(man / 'man3' / 'printf.3.gz', man / 'man3' / 'fprintf.3.gz')
  pages = sorted(str(p) for p in man.rglob('*.gz'))
  (tmp_path / 'manpages.list').write_text('/usr\n' + '\n'.join(pages) + '\n')
  config = manpages.ManpagesConfig(name='t', packages=('manpages',), dpkg_info=str(tmp_path))
  examples = manpages.load_examples(config)
  labels = sorted(label for split in examples.values() for _, label in split)
  assert labels == [0, 1, 2]  # system call, library function, other; no link, no short page
  missing = manpages.ManpagesConfig(name='m', packages=('manpages-dev',),
                                    dpkg_info=str(tmp_path))
  with pytest.raises(FileNotFoundError, match='apt-get install manpages-dev'):
    manpages.load_examples(missing)


@pytest.mark.skipif(not os.path.isfile('/usr/share/man/man2/open.2.gz'),
                    reason='apt-get install manpages manpages-dev')
def test_man_pages_are_long_documents():
  examples = manpages.load_examples(manpages.ManpagesConfig(name='kinds'))
  sizes = sorted(len(text.encode()) for split in examples.values() for text, _ in split)
  assert len(sizes) > 600 and sizes[len(sizes) // 2] >= 4000
  assert {label for _, label in examples['test']} == {0, 1, 2}


@pytest.mark.skipif(not os.path.isdir('/usr/share/man/man2'),
                    reason='apt-get install manpages manpages-dev')
def test_man_page_pairs_are_balanced_real_pairs():
  pairs = manpages.load_pairs(manpages.ManpagesConfig(name='pairs'))
  assert sum(map(len, pairs.values())) > 1000
  for rows in pairs.values():
    assert sum(label for _, _, label in rows) * 2 == len(rows)  # balanced
  summary, description, label = pairs['test'][0]
  assert label == 1 and ' - ' not in summary and len(description) > len(summary)
  assert manpages.summary_and_description('NAME\n\nls - list files\n\nDESCRIPTION\n\n'
                                          'Lists.\n\nSEE ALSO\n\ndir(1)') == (
                                              'list files', 'Lists.')


def test_lra_listops_release_files_read_with_its_config(tmp_path):
  """Files in the LRA release's ListOps format (header, Source<TAB>Target) load with
  projects/lra/configs/listops.py's columns: ten classes by value, the expression as the text."""
  rows = [('( ( [MAX 2 9 ) 0 ] )', 9), ('( [SM 3 4 ] )', 7)] + [
      (f'( [MIN {d} {d} ] )', d) for d in range(10)]
  paths = {}
  for split in ('train', 'val', 'test'):
    paths[split] = _write(tmp_path / f'basic_{split}.tsv', 'Source\tTarget\n' + ''.join(
        f'{source}\t{target}\n' for source, target in rows))
  config = lra_listops.get_config().data
  config.update(train_files=paths['train'], validation_files=paths['val'],
                test_files=paths['test'])
  dataset = datasets.load_classifier(_typed(config), str(tmp_path / 'work'))
  assert dataset.info.num_classes == 10 and dataset.info.train_length == 4000
  texts, labels = dataset.source.read('test')
  assert texts[0] == b'( ( [MAX 2 9 ) 0 ] )' and list(labels[:3]) == [9, 7, 0]


def test_lra_retrieval_release_files_read_with_its_config(tmp_path):
  """Headerless files in the LRA release's Retrieval format (label, id1, id2, text1, text2) load
  with projects/lra/configs/retrieval.py: pairs, each text in its own row of [b, 2, L] (two towers)."""
  rows = [(i % 2, f'paper {i} cites', f'paper {i + 100} is cited') for i in range(12)]
  paths = {split: _write(tmp_path / f'new_aan_pairs.{split}.tsv', ''.join(
      f'{label}\tid{i}\tid{i + 1}\t{a}\t{b}\n' for i, (label, a, b) in enumerate(rows)))
           for split in ('train', 'eval', 'test')}
  config = lra_retrieval.get_config().data
  config.update(train_files=paths['train'], validation_files=paths['eval'],
                test_files=paths['test'], max_length=32)
  dataset = datasets.load_classifier(_typed(config), str(tmp_path / 'work'), pair_layout='dual')
  assert dataset.info.pairs and dataset.info.num_classes == 2
  texts, labels = dataset.source.read('test')
  assert texts.shape == (12, 2) and tuple(texts[1]) == (b'paper 1 cites', b'paper 101 is cited')
  assert list(labels[:3]) == [0, 1, 0]
  batch = next(dataset.eval_batches('test', global_batch_size=4))
  assert batch.inputs.shape == batch.mask.shape == (4, 2, 32) and batch.token_types is None
  tokenizer = dataset.tokenizer
  assert tokenizer.decode(batch.inputs[1, 1]) == b'paper 101 is cited'
  assert batch.positions[1, 0, :3].tolist() == [0, 1, 2]
  assert next(dataset.train_batches(seed=0, global_batch_size=4)).inputs.shape == (4, 2, 32)


def test_headerless_files_need_their_columns_named(tmp_path):
  path = _write(tmp_path / 'pairs.tsv', '1\ta\tb\n')
  with pytest.raises(ValueError, match="no column 'text' in data.columns"):
    files_lib.read_rows(path, files_lib.Columns(text='text', label='label',
                                                names=('label', 'text1', 'text2')))


@hypothesis.settings(deadline=None, max_examples=40)
@hypothesis.given(len_a=st.integers(0, 12), len_b=st.integers(0, 12), length=st.integers(3, 16))
def test_joint_pairs_are_cls_a_sep_b_sep_with_token_types(len_a, len_b, length):
  """[CLS] a [SEP] b [SEP] within the length, token type 1 over b and its [SEP]; a pair that
  does not fit loses tokens from its longer text first, and a text shorter than half the room is
  kept whole."""
  a, b = b'a' * len_a, b'b' * len_b
  texts = tf.constant(np.array([[a, b]], object))
  ids, types = tokenizers.ByteTokenizer().encode_pairs(texts, length)
  ids, types = ids.numpy()[0], types.numpy()[0]
  budget = length - 3
  kept_a, kept_b = int((ids == ord('a') + 4).sum()), int((ids == ord('b') + 4).sum())
  assert kept_a + kept_b == min(len_a + len_b, budget)
  for kept, own, other in ((kept_a, len_a, len_b), (kept_b, len_b, len_a)):
    if own <= budget // 2 or own + other <= budget:
      assert kept == own
  expected = ([tokenizers.CLS_ID] + [ord('a') + 4] * kept_a + [tokenizers.SEP_ID]
              + [ord('b') + 4] * kept_b + [tokenizers.SEP_ID])
  assert ids.tolist() == expected + [tokenizers.PAD_ID] * (length - len(expected))
  assert types.tolist() == ([0] * (kept_a + 2) + [1] * (kept_b + 1)
                            + [0] * (length - len(expected)))


def test_joint_pairs_from_jsonl_files(tmp_path):
  """JSONL pairs (text_a/text_b keys) batch as one joint input with token types."""
  path = _write(tmp_path / 'pairs.jsonl', ''.join(
      json.dumps({'text_a': f'q{i}', 'text_b': 'answer', 'label': i % 2}) + '\n'
      for i in range(20)))
  config = _config(name='files', train_files=path, text_column='text_a', text_b_column='text_b',
                   max_length=12)
  batch = next(eval_batches(config, 'validation', global_batch_size=2))
  assert batch.inputs.shape == batch.token_types.shape == (2, 12)
  tokenizer = tokenizers.ByteTokenizer()
  row = batch.inputs[0]
  assert row[0] == tokenizers.CLS_ID and (row == tokenizers.SEP_ID).sum() == 2
  assert tokenizer.decode(row[batch.token_types[0] == 1]) == b'answer'


def _wordpiece_vocab(tmp_path) -> str:
  words = ['the', 'cat', 'sat', 'on', 'mat', 'dog', '##s', '.', 'a']
  vocab = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + words
  return _write(tmp_path / 'vocab.txt', '\n'.join(vocab) + '\n')


@pytest.mark.parametrize('given', ['vocab.txt', 'tokenizer.json', 'directory'])
def test_huggingface_tokenizer_matches_transformers(tmp_path, given):
  """A WordPiece vocab.txt, its tokenizer.json, or the directory: the special ids are the
  tokenizer's ([PAD] 0, [CLS] 2, [SEP] 3, [MASK] 4 here, not this codebase's), and singles and
  pairs are the ids and token types that transformers' BertTokenizerFast gives."""
  transformers = pytest.importorskip('transformers')
  vocab = _wordpiece_vocab(tmp_path)
  reference = transformers.BertTokenizerFast(vocab_file=vocab)
  reference.save_pretrained(str(tmp_path / 'checkpoint'))
  path = {'vocab.txt': vocab, 'tokenizer.json': str(tmp_path / 'checkpoint' / 'tokenizer.json'),
          'directory': str(tmp_path / 'checkpoint')}[given]
  tokenizer = tokenizers.load_huggingface(str(tmp_path / 'work'), path)
  assert tokenizer.specials == tokenizers.Specials(pad=0, cls=2, sep=3, unk=1, mask=4)
  assert tokenizer.vocab_size == 14
  singles = ['The cats sat on the mat.', 'a dog', '', 'zebra ' * 20]
  pairs = [('The cat sat.', 'a dog sat on a mat'), ('cat ' * 10, 'dog'), ('', '')]
  for length in (6, 12):
    ids = tokenizer.encode_batch(tf.constant([s.encode() for s in singles]), length).numpy()
    expected = reference(singles, max_length=length, truncation=True, padding='max_length')
    assert ids.tolist() == expected['input_ids']
    ids, types = tokenizer.encode_pairs(tf.constant([[a.encode(), b.encode()] for a, b in pairs]),
                                        length)
    expected = reference([a for a, _ in pairs], [b for _, b in pairs], max_length=length,
                         truncation='longest_first', padding='max_length')
    assert ids.numpy().tolist() == expected['input_ids']
    assert types.numpy().tolist() == expected['token_type_ids']
  assert tokenizer.decode([2, 5, 6, 3, 0]) == b'the cat'


def test_huggingface_tokenizer_is_cached_in_the_workdir(tmp_path):
  vocab = _wordpiece_vocab(tmp_path)
  work = str(tmp_path / 'work')
  first = tokenizers.load_huggingface(work, vocab)
  os.remove(vocab)  # the workdir's copy is used once the original has moved
  assert tokenizers.load_huggingface(work, vocab).serialized == first.serialized
  _write(tmp_path / 'vocab.txt', '[PAD]\n[UNK]\n[CLS]\n[SEP]\nother\n')
  with pytest.raises(ValueError, match='holds another tokenizer'):
    tokenizers.load_huggingface(work, vocab)
  with pytest.raises(FileNotFoundError, match='no tokenizer.json or vocab.txt'):
    tokenizers.load_huggingface(str(tmp_path / 'new'), str(tmp_path / 'nothing'))
  os.makedirs(tmp_path / 'bad')
  _write(tmp_path / 'bad' / 'vocab.txt', 'x\ny\n')
  with pytest.raises(ValueError, match='no \\[CLS\\] or \\[SEP\\]'):
    tokenizers.load_huggingface(None, str(tmp_path / 'bad'))


def test_huggingface_tokenizer_through_the_pipeline(tmp_path):
  vocab = _wordpiece_vocab(tmp_path)
  path = _write(tmp_path / 'train.csv', 'text,label\n' + ''.join(
      f'the cat sat {i},{i % 2}\n' for i in range(20)))
  config = _config(name='files', train_files=path, tokenizer='huggingface',
                   tokenizer_path=vocab, max_length=8)
  dataset = datasets.load_classifier(_typed(config), str(tmp_path / 'work'))
  assert dataset.info.vocab_size == 14
  batch = next(dataset.eval_batches('validation', global_batch_size=2))
  # [CLS] the cat sat [UNK] [SEP] [PAD] [PAD]: the mask follows the tokenizer's [PAD] id.
  assert batch.inputs[0].tolist() == [2, 5, 6, 7, 1, 3, 0, 0]
  assert batch.mask[0].tolist() == [True] * 6 + [False] * 2
