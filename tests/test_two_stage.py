"""Issue 31: the two-stage ablation (pre-train every scheme, fine-tune each, train it from scratch
as the control) on a tiny CSV pre-trained on its own texts, and ``train.init_from`` carrying the
source's model (training/carry.py)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from configs import tiny
from projects.two_stage.configs import manpages as two_stage_config
from experiments import ablation
from experiments import report
from helpers import entry
from projects.two_stage import grid as two_stage
import settings
from training import carry
from training import init_from
from training import trainer
from training import validation
from training.config import run_config

WORDS = 'the cat sat on a mat while rotary position embeddings encode relative distance'.split()


@pytest.fixture(scope='module')
def labelled_csv(tmp_path_factory) -> str:
  """60 short labelled texts: the fine-tuning set, and (its texts) the pre-training corpus."""
  path = tmp_path_factory.mktemp('csv') / 'train.csv'
  rows = ''.join(f'{" ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 9))},{i % 2}\n'
                 for i in range(60))
  path.write_text('text,label\n' + rows)
  return str(path)


def tiny_two_stage(csv: str, positions: str = 'none'):
  """projects/two_stage/configs/manpages.py shrunk: 2 seeds, 2 steps a stage, a 16-wide model, the CSV
  as the fine-tuning set and (data.name=files without files) as the pre-training corpus, with a
  WordPiece vocabulary of 120 trained on it."""
  c = two_stage_config.get_config()
  c.ablation.update(positions=positions, datasets='files', num_seeds=2)
  c.data.update(name='files', train_files=csv, max_length=32)
  c.model.t5_max_distance = 32
  steps = dict(num_steps=2, eval_every=2, log_every=2, checkpoint_every=2, batch_size=8,
               eval_batch_size=32, compilation_cache_dir='')
  c.train.update(steps)
  c.optim.warmup_steps = 1
  p = c.pretrain
  p.data.update(name='files', sp_vocab_size=120, max_length=32, eval_lengths='', eval_tokens=512)
  p.model.update(size='tiny', num_layers=1, hidden_size=16, num_heads=2, mlp_dim=32,
                 max_length=32, t5_max_distance=32)
  p.train.update(steps)
  p.optim.warmup_steps = 1
  return c


def test_grid_pairs_seeds_and_carries_the_pretrained_model(tmp_path, labelled_csv):
  c = tiny_two_stage(labelled_csv, 'learned,none')
  workdir = str(tmp_path / 'grid')
  cells = two_stage.check_grid(c, workdir)
  assert [x.name for x in cells] == [
      'pretrain/files/learned', 'pretrain/files/none', 'finetune/files/learned',
      'finetune/files/none', 'scratch/files/learned', 'scratch/files/none']
  configs = {x.name: two_stage.configure(c, workdir, x) for x in cells}
  pre, tuned, scratch = (configs[f'{s}/files/learned'] for s in ('pretrain', 'finetune', 'scratch'))
  # Seed i of the fine-tune is seed i of its pre-training: the same seeds, so member_map pairs
  # them one to one (each fine-tuning member starts from its own pre-training member).
  seeds = lambda rc: [rc.train.seed + i for i in range(rc.train.num_seeds)]
  assert seeds(pre) == seeds(tuned) == seeds(scratch) == [0, 1]
  assert init_from.member_map([0, 1], seeds(pre), seeds(tuned)) == [0, 1]
  assert pre.train.task == 'mlm' and tuned.train.task == scratch.train.task == 'classify'
  assert tuned.train.init_from == os.path.join(os.path.realpath(workdir), 'pretrain/files/learned')
  assert scratch.train.init_from == ''
  for rc in (tuned, scratch):  # the pre-training's model, its length, its vocabulary
    assert (rc.model.hidden_size, rc.model.num_layers, rc.model.max_length) == (16, 1, 32)
    assert (rc.data.tokenizer, rc.data.name) == ('huggingface', 'files')
  assert pre.data.train_files == (labelled_csv,) and pre.data.tokenizer == 'wordpiece'
  # --only takes the pre-training a chosen fine-tune starts from.
  assert [x.name for x in two_stage.select(cells, 'finetune/*/none')] == [
      'pretrain/files/none', 'finetune/files/none']
  c.ablation.positions = 'rotary,learned'
  with pytest.raises(ValueError, match='must include none'):
    two_stage.check_grid(c, workdir)


@pytest.fixture(scope='module')
def finished(tmp_path_factory, labelled_csv):
  """The tiny two-stage grid trained once; the source member each fine-tuning seed started
  from, as init_from mapped it."""
  c = tiny_two_stage(labelled_csv)
  workdir = str(tmp_path_factory.mktemp('two_stage') / 'run')
  mapped, real = [], init_from.member_map

  def recording(*args):
    mapped.append(real(*args))
    return mapped[-1]

  init_from.member_map = recording
  try:
    md = two_stage.run_grid(c, workdir, two_stage.check_grid(c, workdir), command='ablate.py x')
  finally:
    init_from.member_map = real
  return c, workdir, md, mapped


def test_tiny_two_stage_run_end_to_end(finished, monkeypatch):
  c, workdir, md, mapped = finished
  # Both the check before the start and the loading map seed i to pre-training member i.
  assert mapped and all(m == [0, 1] for m in mapped)
  for stage in ('pretrain', 'finetune', 'scratch'):
    with open(os.path.join(workdir, stage, 'files', 'none', 'summary.json')) as f:
      assert json.load(f)['seeds'] == [0, 1]
  # One vocabulary, trained on the CSV's texts in the pre-training, in every stage.
  tokenizers = {open(os.path.join(workdir, s, 'files', 'none', 'tokenizer.json')).read()
                for s in ('pretrain', 'finetune', 'scratch')}
  assert len(tokenizers) == 1
  with open(os.path.join(workdir, 'pretrain/files/none/tokenizer_meta.json')) as f:
    assert json.load(f) == {'tokenizer': 'wordpiece', 'dataset': 'files', 'vocab_size': 120}
  assert '## files: pre-trained against from scratch' in md
  assert '| none | ' in md and 'pre-trained − from scratch' in md and 'p=' in md
  assert '## pre-training on files (mlm)' in md and 'Perplexity' in md
  for name in ('report.md', 'results.csv', 'curves_files_pre_trained.png',
               'curves_files_from_scratch.png', 'loss_pre_training_on_files.png'):
    assert os.path.exists(os.path.join(workdir, name)), name
  calls = []
  monkeypatch.setattr(trainer, 'train_and_evaluate', lambda *a: calls.append(a))
  cells = two_stage.check_grid(c, workdir)  # finished: rerunning and the report train nothing
  two_stage.run_grid(c, workdir, cells)
  assert two_stage.build_report(c, workdir, cells, command='x').startswith('# Position')
  assert not calls


def test_a_changed_pretraining_makes_its_dependents_stale(finished, tmp_path):
  c, workdir, _, _ = finished
  cells = two_stage.check_grid(c, workdir)
  assert not two_stage.stale_cells(c, workdir, cells)
  changed = tiny_two_stage(c.data.train_files)
  changed.pretrain.optim.learning_rate = 0.01
  stale = {x.name: d for x, d in two_stage.stale_cells(changed, workdir, cells).items()}
  assert set(stale) == {'pretrain/files/none', 'finetune/files/none', 'scratch/files/none'}
  assert 'optim.learning_rate' in stale['pretrain/files/none'][0]
  assert 'its pre-training pretrain/files/none has another config' in stale['scratch/files/none'][0]
  with pytest.raises(ValueError, match='--fresh'):
    two_stage.build_report(changed, workdir, cells, command='x')
  # Trained again with the same config (its summary differs): the dependents are stale too.
  summary = os.path.join(workdir, 'pretrain/files/none/summary.json')
  with open(summary) as f:
    original = f.read()
  try:
    with open(summary, 'w') as f:
      f.write(original.replace('"seeds"', '"seeds" ', 1))
    stale = {x.name: d for x, d in two_stage.stale_cells(c, workdir, cells).items()}
    assert set(stale) == {'finetune/files/none', 'scratch/files/none'}
    assert 'was trained again' in stale['finetune/files/none'][0]
  finally:
    with open(summary, 'w') as f:
      f.write(original)


def source_workdir(path, **changes) -> str:
  """A train.py workdir holding only the config.json of configs/tiny.py with ``changes``."""
  c = tiny.get_config()
  c.update_from_flattened_dict(changes)
  os.makedirs(path)
  validation.save_config(settings.to_dict(run_config(c)), str(path), None)
  return str(path)


def test_init_from_carries_the_source_model_unless_overridden(tmp_path):
  source = source_workdir(tmp_path / 'source', **{
      'model.position': 'learned', 'model.hidden_size': 32, 'model.num_heads': 2,
      'model.max_length': 96, 'data.tokenizer': 'wordpiece', 'data.sp_vocab_size': 300,
      'data.max_length': 96, 'model.dropout_rate': 0.3})
  c = tiny.get_config()
  c.train.init_from = source
  filled = run_config(carry.with_source_model(c, explicit=()))
  assert (filled.model.position, filled.model.hidden_size, filled.model.num_heads) == (
      'learned', 32, 2)
  assert filled.model.max_length == 96  # the learned table's length
  assert (filled.data.tokenizer, filled.data.sp_vocab_size) == ('huggingface', 300)
  assert filled.model.dropout_rate == 0.0 and filled.data.max_length == 64  # not shaping: ours
  init_from.check_source(filled)  # loads
  c.model.hidden_size = 48  # set on the command line: kept, and refused naming the field
  kept = run_config(carry.with_source_model(c, explicit={'model.hidden_size'}))
  assert kept.model.hidden_size == 48 and kept.model.position == 'learned'
  with pytest.raises(init_from.InitFromError, match=r'model\.hidden_size \(32 there, 48 here\)'):
    init_from.check_source(kept)
  c.model.hidden_size, c.model.max_length = None, 128
  longer = run_config(carry.with_source_model(c, explicit={'model.max_length'}))
  with pytest.raises(init_from.InitFromError, match=r'model\.max_length \(96 there, 128 here\)'):
    init_from.check_source(longer)
  c.train.init_from = ''
  assert carry.with_source_model(c, explicit=()) is c


def test_train_py_takes_the_model_from_init_from(tmp_path, csv_file):
  """Through the command line: only the field set there differs from the source (the scheme is
  the source's alibi, not the config file's rotary), so the refusal names that field alone."""
  source = source_workdir(tmp_path / 'source', **{'model.position': 'alibi',
                                                  'model.hidden_size': 32, 'model.num_heads': 2})
  proc = entry.run(  # in this process (helpers/entry.py)
      ['train.py', '--config=configs/tiny.py', f'--workdir={tmp_path / "new"}',
       '--config.data.name=files', f'--config.data.train_files={csv_file}',
       f'--config.train.init_from={source}', '--config.model.hidden_size=48'])
  assert proc.returncode == 2, proc.stderr[-3000:]
  error = proc.stderr.strip().splitlines()[-1]
  assert 'model.hidden_size (32 there, 48 here)' in error and 'model.position' not in error


def fake_run(name: str, accuracy: list[float]):
  summary = {'seeds': list(range(len(accuracy))), 'eval': {'test': {'accuracy': accuracy}}}
  return report.Run(name, '', 'manpages', name.split('/')[-1].split('-')[0], 'softmax',
                    summary=summary)


def test_overview_pairs_the_stages_and_the_lengths_by_seed():
  """Pre-trained against from scratch per scheme, and rotary at 1024 against learned at 512 (the
  paper's claim (d)), on known accuracies: the per-seed differences' mean, in points."""
  c = two_stage_config.get_config()
  acc = {('finetune', 'rotary', 512): [0.7, 0.8, 0.9],
         ('scratch', 'rotary', 512): [0.6, 0.6, 0.6],
         ('finetune', 'learned', 512): [0.5, 0.6, 0.7],
         ('scratch', 'learned', 512): [0.5, 0.6, 0.7],
         ('finetune', 'rotary', 1024): [0.9, 0.9, 0.95]}
  runs = {two_stage.StageCell(stage, ablation.Cell('manpages', scheme, 'softmax', length)):
          fake_run(f'{stage}/manpages/{scheme}-L{length}', a)
          for (stage, scheme, length), a in acc.items()}
  md = '\n'.join(two_stage.overview(c, runs))
  sections = {part.split(':')[0]: {line.split(' | ')[0].strip('| '): line
                                   for line in part.splitlines() if line.startswith('|')}
              for part in md.split('## ')[1:]}
  rows = sections['manpages at 512 tokens']
  gain = 100 * np.mean(np.subtract([0.7, 0.8, 0.9], 0.6))  # 20 points on average
  assert f'{gain:+.1f} [' in rows['rotary'] and '(zero variance)' in rows['learned']
  assert '80.0 ± 10.0 | 60.0 ± 0.0' in rows['rotary']
  # Every difference positive: sign-flip p = 2/2^3; Holm over the 2 schemes doubles it.
  assert f'p={2 * 2 / 2**3:.2g}' in rows['rotary']
  longer = 100 * np.mean(np.subtract([0.9, 0.9, 0.95], [0.5, 0.6, 0.7]))
  assert f'{longer:+.1f} [' in sections['manpages']['rotary at 1024']
  assert 'manpages: longer context against learned at 512 tokens' in md
