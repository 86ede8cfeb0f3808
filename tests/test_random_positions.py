"""Randomized positional encodings (data.random_positions; Ruoss et al. 2023): the draw, its
keys, the checks, every position scheme on the drawn positions, and bitwise resume."""

import numpy as np
import pytest

import models
from data import batches
from training import evaluation, prediction, validation
from training.config import run_config as typed
from training.experiment import Experiment
from tests.test_models import batch as model_batch, make_cfg, model_for
from tests.test_training import assert_kill_and_resume_is_bitwise

N = 64


def classification(lengths, length=16):
  """Classification rows with ``lengths`` real tokens each, positions 0, 1, ... as the pipeline
  makes them."""
  mask = np.arange(length) < np.asarray(lengths)[:, None]
  positions = np.where(mask, np.arange(length), 0).astype(np.int32)
  rows = len(lengths)
  return batches.Classification(np.where(mask, 7, 0).astype(np.int32), positions, mask,
                                np.zeros(rows, np.int32), np.ones(rows, np.float32))


def assert_drawn(positions, mask):
  """Real tokens: strictly increasing (sorted, no repeat) in [0, N); padding: 0."""
  real = positions[mask]
  assert np.all(np.diff(real) > 0) and np.all((real >= 0) & (real < N))
  assert np.all(positions[~mask] == 0)


def test_positions_are_sorted_distinct_in_range_and_padding_keeps_zero():
  lengths = [1, 5, 16, 9, 0, 12]
  b = classification(lengths)
  drawn = batches.RandomPositions(N, seed=3).training(b, step=5, rows=range(len(lengths)))
  assert drawn.positions.dtype == np.int32 and drawn.positions.shape == b.positions.shape
  for row in range(len(lengths)):
    assert_drawn(drawn.positions[row], b.mask[row])
  # Everything else is the batch's own; a long row is not simply 0 .. n - 1.
  np.testing.assert_array_equal(drawn.inputs, b.inputs)
  assert not np.array_equal(drawn.positions[2], np.arange(16))


def test_draw_depends_only_on_seed_step_and_global_row():
  b = classification([10] * 8)
  draw = batches.RandomPositions(N, seed=0)
  whole = draw.training(b, step=7, rows=range(8)).positions
  # Process 1 of 2 computes global rows 4..7 alone: the same positions.
  half = draw.training(classification([10] * 4), step=7, rows=range(4, 8)).positions
  np.testing.assert_array_equal(half, whole[4:])
  np.testing.assert_array_equal(draw.training(b, step=7, rows=range(8)).positions, whole)
  assert len({tuple(p) for p in whole}) == 8  # rows differ
  other_step = draw.training(b, step=8, rows=range(8)).positions
  other_seed = batches.RandomPositions(N, seed=1).training(b, step=7, rows=range(8)).positions
  assert all(not np.array_equal(a, c) for a, c in zip(whole, other_step))
  assert all(not np.array_equal(a, c) for a, c in zip(whole, other_seed))
  evaluated = draw.evaluation(b, 'test@16', range(8)).positions
  assert not np.array_equal(evaluated, whole)
  np.testing.assert_array_equal(draw.evaluation(b, 'test@16', range(8)).positions, evaluated)


def test_packed_rows_draw_per_document_and_pairs_per_text():
  segments = np.array([[1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 0, 0],
                       [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]], np.int32)
  mask = segments > 0
  zeros = np.zeros_like(segments)
  lm = batches.LanguageModel(zeros, zeros, segments, mask, zeros, zeros.astype(np.float32))
  drawn = batches.RandomPositions(N, seed=0).training(lm, step=0, rows=[0, 1]).positions
  for row in range(2):
    for document in (1, 2, 3):
      at = segments[row] == document
      if at.any():
        assert_drawn(drawn[row][at], np.ones(at.sum(), bool))
  assert np.all(drawn[0, 12:] == 0)
  # Each document starts its own sorted draw: over three of them the row is not sorted.
  assert np.any(np.diff(drawn[0, :12]) <= 0)
  # Two-tower pairs [B, 2, L]: each text its own draw.
  lengths = np.array([[3, 11], [16, 2]])
  pair_mask = np.arange(16) < lengths[..., None]
  pairs = batches.Classification(pair_mask.astype(np.int32), np.zeros_like(pair_mask, np.int32),
                                 pair_mask, np.zeros(2, np.int32), np.ones(2, np.float32))
  drawn = batches.RandomPositions(N, seed=0).training(pairs, step=0, rows=[0, 1]).positions
  for row in range(2):
    for text in range(2):
      assert_drawn(drawn[row, text], pair_mask[row, text])


@pytest.mark.parametrize('position', sorted(models.SCHEMES))
def test_every_scheme_runs_on_random_positions(position):
  """Every scheme reads the drawn positions (the learned table has N rows): finite outputs
  that differ from those at 0 .. L - 1, exactly for the schemes that declare they read position
  ids (not none, nor CoPE, whose positions are counted from its gates): the ablation grid runs
  only those randomized."""
  ids, positions, mask = model_batch(length=8, pad=3)
  b = batches.Classification(np.asarray(ids), np.asarray(positions), np.asarray(mask),
                             np.zeros(2, np.int32), np.ones(2, np.float32))
  drawn = batches.RandomPositions(N, seed=0).training(b, step=0, rows=[0, 1])
  model = model_for(make_cfg(position=position, max_length=N, pooling='mean'))
  plain = np.asarray(model(ids, positions, mask))
  randomized = np.asarray(model(ids, drawn.positions, mask))
  assert np.isfinite(randomized).all()
  assert np.array_equal(plain, randomized) != models.reads_positions(position)
  assert models.reads_positions(position) == (position not in ('none', 'cope'))


def test_lengths_beyond_n_and_a_short_learned_table_are_refused(run_config):
  with pytest.raises(ValueError, match=r'data\.random_positions=32 must be 0 \(off\) or at '
                                       r'least the longest length.*64'):
    typed(run_config(**{'data.random_positions': 32}))
  with pytest.raises(ValueError, match=r'data\.random_positions=-1 must be 0'):
    typed(run_config(**{'data.random_positions': -1}))
  with pytest.raises(ValueError, match=r'longest length trained or evaluated, 256'):
    typed(run_config(**{'data.random_positions': 128, 'data.eval_lengths': '256'}))
  learned = typed(run_config(**{'data.random_positions': 2048, 'model.position': 'learned'}))
  with pytest.raises(ValueError, match=r'model\.max_length=512 is shorter than '
                                       r'data\.random_positions=2048'):
    learned.check_model()
  # The probes are evaluated at 96 and 128 tokens (configs/tiny.py): N = 64 cannot reach them.
  with pytest.raises(ValueError, match=r'data\.random_positions=64 .* up to 128 tokens'):
    Experiment(typed(run_config(**{'data.random_positions': 64})), None)
  with pytest.raises(ValueError, match=r'data\.random_positions=256.*cannot be evaluated at 512'):
    evaluation._check_lengths(typed(run_config(**{'data.random_positions': 256})), [128, 512])


def randomized_config(run_config, csv_file, **overrides):
  return run_config(**{'data.name': 'files', 'data.train_files': csv_file,
                       'data.max_length': 32, 'data.random_positions': N,
                       'model.num_layers': 1, 'model.hidden_size': 32, 'model.num_heads': 2,
                       'model.mlp_dim': 64, 'model.dropout_rate': 0.1, 'train.num_steps': 8,
                       'train.eval_every': 4, 'train.checkpoint_every': 4,
                       'train.log_every': 2, 'train.eval_batch_size': 32, **overrides})


def test_evaluation_positions_do_not_depend_on_the_batch_size(run_config, csv_file, tmp_path):
  def positions(eval_batch_size):
    config = typed(randomized_config(run_config, csv_file,
                                     **{'train.eval_batch_size': eval_batch_size}))
    exp = Experiment(config, str(tmp_path))
    drawn = [(b.positions, b.mask, b.weight) for b in exp.eval_batches('validation')]
    return np.concatenate([p[w > 0] for p, _, w in drawn]), np.concatenate(
        [m[w > 0] for _, m, w in drawn])

  small, mask = positions(8)
  large, _ = positions(64)
  np.testing.assert_array_equal(small, large)
  for row_positions, row_mask in zip(small, mask):
    assert_drawn(row_positions, row_mask)


@pytest.mark.slow  # three tiny runs: about 25 s here
def test_kill_and_resume_of_a_randomized_run_is_bitwise(tmp_path, run_config, csv_file,
                                                        monkeypatch):
  config = randomized_config(run_config, csv_file)
  straight = assert_kill_and_resume_is_bitwise(config, tmp_path, monkeypatch,
                                               kill_at=7)  # resumes at 4
  first = next(Experiment(validation.load_config(straight), straight).train_batches(4))
  assert_drawn(first.positions[0], first.mask[0])  # the run drew its positions
  # predict.py draws as the run evaluated: per input line, the same on every call.
  drawn_for, draw = [], batches.RandomPositions.evaluation
  monkeypatch.setattr(batches.RandomPositions, 'evaluation', lambda self, b, split, examples: (
      drawn_for.append(split), draw(self, b, split, examples))[1])
  inputs = tmp_path / 'inputs.txt'
  inputs.write_text('example 1 ab\nexample 2 ababab\n')
  once, again = (list(prediction.predict(straight, str(inputs))) for _ in range(2))
  assert once == again and len(once) == 2 and drawn_for == ['predict', 'predict']
