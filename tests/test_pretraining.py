"""Pre-training data and runs (issue 15): packing, BERT masking statistics, CLM targets,
tokenizers trained here, deterministic and resumable batches, MLM/CLM runs resumed bitwise."""

from __future__ import annotations

import glob
import itertools
import json
import os

import jax
import numpy as np
import pytest

from data import datasets
from data import lm
from data import tokenizers
from tests.test_training import params_of
from training import metrics
from training import trainer
from training.config import run_config as typed

WORDS = ('the cat sat on a mat while rotary position embeddings encode relative distance in '
         'attention and python functions return values quickly').split()


def documents(num: int, seed: int = 0) -> list[bytes]:
  rng = np.random.default_rng(seed)
  return [' '.join(rng.choice(WORDS, rng.integers(5, 60))).encode() for _ in range(num)]


def corpus_file(tmp_path, num: int = 300) -> str:
  path = tmp_path / 'corpus.txt'
  path.write_bytes(b'\n\n'.join(documents(num)))
  return str(path)


def test_packing_restarts_positions_per_document_and_fills_rows():
  stream = lm.tokenize(tokenizers.ByteTokenizer(), [b'abc', b'defgh', b'ij'])
  rows = lm.pack(stream, 6)
  # [CLS] a b c [SEP] [CLS] | d e f g h [SEP] | [CLS] i j [SEP] pad pad: 16 tokens, 3 rows.
  np.testing.assert_array_equal(rows['segments'], [[1, 1, 1, 1, 1, 2], [1, 1, 1, 1, 1, 1],
                                                   [1, 1, 1, 1, 0, 0]])
  np.testing.assert_array_equal(rows['positions'], [[0, 1, 2, 3, 4, 0], [0, 1, 2, 3, 4, 5],
                                                    [0, 1, 2, 3, 0, 0]])
  assert rows['mask'].sum() == 16 and lm.packing_efficiency(stream, 6) == 16 / 18
  big = lm.tokenize(tokenizers.ByteTokenizer(), documents(500))
  assert lm.packing_efficiency(big, 128) >= 0.95


def masked_rows(whole_word: bool, rows: int = 400, length: int = 128):
  tokenizer = tokenizers.ByteTokenizer()
  packed = lm.pack(lm.tokenize(tokenizer, documents(600)), length)
  masking = lm.Masking(tokenizer, tokenizer.vocab_size, 0.15, whole_word)
  targets = lm.Targets(masking, seed=0)
  slots = np.arange(rows)
  return tokenizer, packed, targets({k: v[:rows] for k, v in packed.items()}, slots, 0)


def test_bert_masking_statistics():
  tokenizer, packed, batch = masked_rows(whole_word=False)
  s = tokenizer.specials
  original = packed['inputs'][:len(batch.inputs)]
  weights = batch.target_weights > 0
  where = batch.target_positions[weights]
  rows = np.nonzero(weights)[0]
  np.testing.assert_array_equal(original[rows, where], batch.targets[weights])
  candidates = packed['mask'][:len(original)] & ~np.isin(original, [s.cls, s.sep, s.pad])
  assert abs(weights.sum() / candidates.sum() - 0.15) < 0.005
  corrupted = batch.inputs[rows, where]
  as_mask = np.mean(corrupted == s.mask)
  kept = np.mean(corrupted == batch.targets[weights])
  assert abs(as_mask - 0.8) < 0.02 and abs(kept - 0.1 - 0.1 / 256) < 0.02
  assert abs(1 - as_mask - kept - 0.1) < 0.02  # random replacements
  assert not np.isin(original[rows, where], [s.cls, s.sep, s.pad]).any()
  unchanged = np.ones_like(original, bool)
  unchanged[rows, where] = False
  np.testing.assert_array_equal(batch.inputs[unchanged], original[unchanged])
  assert batch.targets.shape[1] == lm.max_predictions(128, 0.15)


def test_whole_word_masking_masks_whole_words():
  tokenizer, packed, batch = masked_rows(whole_word=True, rows=50)
  for i in range(50):
    ids = packed['inputs'][i]
    chosen = set(batch.target_positions[i][batch.target_weights[i] > 0].tolist())
    starts = tokenizer.word_starts(ids)
    word = np.cumsum(starts)
    for j in chosen:
      same = np.flatnonzero((word == word[j]) & packed['mask'][i])
      assert all(k in chosen for k in same if ids[k] not in (1, 2))


def test_clm_targets_are_next_tokens_within_a_document():
  rows = lm.next_tokens(lm.pack(lm.tokenize(tokenizers.ByteTokenizer(), [b'ab', b'c']), 4))
  # [CLS] a b [SEP] | [CLS] c [SEP] pad
  np.testing.assert_array_equal(rows.targets[0], rows.inputs[0].tolist()[1:] + [0])
  np.testing.assert_array_equal(rows.target_weights, [[1, 1, 1, 0], [1, 1, 0, 0]])


@pytest.mark.parametrize('kind', ['wordpiece', 'bpe'])
def test_trained_tokenizers_take_special_ids_from_the_vocabulary(tmp_path, kind):
  texts = documents(200)
  tokenizer = tokenizers.load_or_train_huggingface(str(tmp_path), kind, 'files', 300,
                                                   lambda: texts)
  vocab = json.loads(tokenizer.serialized)['model']['vocab']
  names = {'pad': '[PAD]', 'cls': '[CLS]', 'sep': '[SEP]', 'unk': '[UNK]', 'mask': '[MASK]'}
  for role, name in names.items():
    assert getattr(tokenizer.specials, role) == vocab[name]
  ids = tokenizer.tokenize([b'the cat sat on a mat'])[0]
  assert len(ids) and not np.isin(ids, list(vocab[n] for n in names.values())).any()
  assert tokenizer.decode(ids).replace(b' ', b'') == b'thecatsatonamat'
  assert tokenizer.word_starts(ids).sum() == 6  # six words
  again = tokenizers.load_or_train_huggingface(str(tmp_path), kind, 'files', 300, None)
  assert again.serialized == tokenizer.serialized  # cached in the workdir
  with pytest.raises(ValueError, match='delete'):
    tokenizers.load_or_train_huggingface(str(tmp_path), kind, 'files', 400, lambda: texts)


def lm_config(run_config, tmp_path, task='mlm', **overrides):
  return run_config(**{'train.task': task, 'data.name': 'files',
                       'data.train_files': corpus_file(tmp_path), 'data.max_length': 32,
                       'data.eval_tokens': 2048, 'data.eval_lengths': '64',
                       'model.t5_max_distance': 32, **overrides})


def test_lm_batches_resume_and_split_over_processes(tmp_path, run_config):
  dataset = datasets.load_language_model(typed(lm_config(run_config, tmp_path)).data,
                                         str(tmp_path), 'mlm', True)
  fresh = list(itertools.islice(dataset.train_batches(seed=0, global_batch_size=8), 40))
  resumed = next(dataset.train_batches(seed=0, global_batch_size=8, start_step=37))
  jax.tree.map(np.testing.assert_array_equal, fresh[37], resumed)
  halves = [next(dataset.train_batches(seed=0, global_batch_size=8, start_step=5,
                                       process_index=p, process_count=2)) for p in (0, 1)]
  jax.tree.map(lambda whole, *half: np.testing.assert_array_equal(whole, np.concatenate(half)),
               fresh[5], *halves)
  rows = len(lm.pack(dataset.stream('train'), 32)['inputs'])
  seen = np.concatenate([b.inputs for b in fresh[:rows // 8]])
  assert len({r.tobytes() for r in seen}) > 0.9 * len(seen)  # an epoch is a permutation


@pytest.mark.parametrize('task', ['mlm', pytest.param('clm', marks=pytest.mark.slow)])  # clm: ~25 s
def test_pretraining_run_is_killed_and_resumed_bitwise(tmp_path, run_config, monkeypatch, task):
  config = lm_config(run_config, tmp_path, task, **{'model.dropout_rate': 0.1})
  straight = str(tmp_path / 'straight')
  summary = trainer.train_and_evaluate(config, straight)
  assert summary['task'] == task and summary['packing_efficiency'] > 0.95
  assert set(summary['eval']) == {'test', 'test_64'}
  assert summary['eval']['test']['perplexity'][0] < tokenizers.BYTE_VOCAB_SIZE
  real = datasets.LanguageModelDataset.train_batches

  def dying(self, **kwargs):
    for i, batch in enumerate(real(self, **kwargs)):
      if kwargs['start_step'] + i == 13:
        raise KeyboardInterrupt('simulated kill at step 14')
      yield batch

  interrupted = str(tmp_path / 'interrupted')
  monkeypatch.setattr(datasets.LanguageModelDataset, 'train_batches', dying)
  with pytest.raises(KeyboardInterrupt):
    trainer.train_and_evaluate(config, interrupted)
  monkeypatch.setattr(datasets.LanguageModelDataset, 'train_batches', real)
  trainer.train_and_evaluate(config, interrupted)
  with open(os.path.join(straight, metrics.METRICS_FILE)) as a, \
       open(os.path.join(interrupted, metrics.METRICS_FILE)) as b:
    assert a.read() == b.read()
  jax.tree.map(np.testing.assert_array_equal, params_of(straight, 20),
               params_of(interrupted, 20))
  from training import evaluation  # pylint: disable=g-import-not-at-top
  longer = evaluation.evaluate_workdir(straight, eval_lengths=[128])
  assert 'perplexity' in longer['eval']['test@128']
  assert 'perplexity' in evaluation.format_table(longer)


def test_docs_corpus_is_real_text_split_by_document(tmp_path):
  from data import corpus  # pylint: disable=g-import-not-at-top
  missing = corpus.DocsConfig(name='m', python_docs=str(tmp_path / 'none*'))
  with pytest.raises(FileNotFoundError, match='apt-get install python3-doc'):
    corpus.load_documents(missing)
  if not glob.glob(corpus.PYTHON_DOCS) or not os.path.isdir('/usr/share/man/man2'):
    pytest.skip('apt-get install python3-doc manpages manpages-dev')
  documents = corpus.load_documents(corpus.DocsConfig(name='all'))
  size = sum(len(t.encode()) for split in documents.values() for t, _ in split)
  assert size > 10 * 2**20
  texts = {split: {t for t, _ in docs} for split, docs in documents.items()}
  assert not texts['train'] & texts['validation'] and not texts['train'] & texts['test']
  assert {s for _, s in documents['train']} == {0, 1}  # both sources


def test_pretrain_then_fine_tune_with_the_pretrained_tokenizer(tmp_path, run_config):
  """MLM with a WordPiece trained here, then a classifier initialised from it with its
  tokenizer.json (data.tokenizer=huggingface); a new vocabulary (wordpiece again) is refused."""
  from training import init_from  # pylint: disable=g-import-not-at-top
  pretrained = str(tmp_path / 'pretrained')
  trainer.train_and_evaluate(lm_config(run_config, tmp_path, **{
      'data.tokenizer': 'wordpiece', 'data.sp_vocab_size': 200, 'train.num_steps': 4,
      'train.eval_every': 4, 'train.checkpoint_every': 4}), pretrained)
  rows = ''.join(f'{" ".join(documents(1, i)[0].decode().split()[:8])},{i % 2}\n'
                 for i in range(40))
  (tmp_path / 'train.csv').write_text('text,label\n' + rows)
  fine_tune = lambda **changes: run_config(**{
      'data.name': 'files', 'data.train_files': str(tmp_path / 'train.csv'),
      'data.max_length': 32, 'train.init_from': pretrained, 'train.num_steps': 2,
      'data.tokenizer': 'huggingface', **changes})
  trainer.train_and_evaluate(fine_tune(), str(tmp_path / 'tuned'))
  with open(tmp_path / 'tuned' / 'tokenizer.json') as a, open(tmp_path / 'pretrained' /
                                                              'tokenizer.json') as b:
    assert a.read() == b.read()
  with pytest.raises(init_from.InitFromError, match='data.tokenizer=huggingface'):
    trainer.train_and_evaluate(fine_tune(**{'data.tokenizer': 'wordpiece'}),
                               str(tmp_path / 'refused'))


@pytest.mark.parametrize('name, splits', [('lm1b', ('train', 'test')),
                                          ('wikipedia/20230601.en', ('train',)),
                                          ('c4/en', ('train', 'validation'))])
def test_tfds_corpora_with_mock_data(tmp_path, run_config, name, splits):
  """A prepared TFDS corpus pre-trains (text only, no labels); classifying on it is refused."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from tests.test_data import _write_split_metadata  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path / 'tfds')
  _write_split_metadata(name, data_dir, 20, splits)
  config = run_config(**{'data.name': name, 'data.data_dir': data_dir, 'data.max_length': 32})
  with tfds.testing.mock_data(num_examples=20, policy=tfds.testing.MockPolicy.USE_FILES,
                              data_dir=data_dir):
    dataset = datasets.load_language_model(typed(config).data, None, 'clm', False)
    batch = next(dataset.train_batches(seed=0, global_batch_size=4))
    assert batch.inputs.shape == (4, 32) and batch.target_weights.sum() > 0
    assert sum(b.target_weights.sum() for b in dataset.eval_batches(
        'test', global_batch_size=4)) > 0
    with pytest.raises(ValueError, match='unlabelled corpus'):
      datasets.load_classifier(typed(config).data, None)


def test_jsonl_documents_and_a_missing_corpus_file(tmp_path):
  path = tmp_path / 'docs.jsonl'
  path.write_text('\n'.join(json.dumps({'body': d.decode()}) for d in documents(30)))
  source = datasets.files_lib.DocumentsSource(train_files=(str(path),), validation_files=(),
                                              test_files=(), text_column='body')
  assert source.num_examples('train') == 27 and source.num_examples('validation') == 3
  with pytest.raises(FileNotFoundError, match='not found'):
    datasets.files_lib.DocumentsSource(train_files=(str(tmp_path / 'none.txt'),),
                                       validation_files=(), test_files=(), text_column='text')
