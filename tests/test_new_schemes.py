"""The position schemes of issue 30: KERPLE (log and power), FIRE and CoPE.

Their formulas against numbers computed here with plain loops; initialisation and
parametrisation; chunked against written-out attention where FIRE's normaliser reads the
positions; the causal mask and packed documents with CoPE's embeddings away from their zero
start; refusals by name; a mesh; short training runs and a bitwise resume. tests/test_models.py
and tests/test_language_model.py run every registered scheme through shapes, padding, shift
invariance, chunked attention, the causal mask and packed documents as well.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
from models import positions as positions_lib
from tests import test_language_model, test_pretraining, test_prope_hybrid
from tests.test_models import batch, key_for, loss_and_grads, make_cfg, model_for
from training import metrics, trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEW = ('kerple_log', 'kerple_power', 'fire', 'cope')
PAIRS = np.asarray([[0, 1, 2, 5, 9, 10], [2, 3, 4, 7, 8, 14]])  # positions [batch 2, length 6]


def pair_relative(positions_BxL: np.ndarray) -> jax.Array:
  return jnp.asarray(positions_BxL[:, None, :] - positions_BxL[:, :, None])


# ------------------------------------------------------------------ formulas


def test_kerple_biases_match_the_formulas():
  r = np.asarray([[0.5, 1.5, 0.01], [0.3, 0.9, 1.7]], np.float32)  # rows r1, r2; 3 heads
  log = np.asarray(positions_lib.kerple_log_bias(jnp.asarray(r), pair_relative(PAIRS)))
  power = np.asarray(positions_lib.kerple_power_bias(jnp.asarray(r), pair_relative(PAIRS)))
  assert log.shape == power.shape == (2, 3, 6, 6)
  for b in range(2):
    for h in range(3):
      for i in range(6):
        for j in range(6):
          d = abs(int(PAIRS[b, j]) - int(PAIRS[b, i]))
          assert log[b, h, i, j] == pytest.approx(-r[0, h] * math.log(1 + r[1, h] * d), rel=1e-5)
          assert power[b, h, i, j] == pytest.approx(-r[0, h] * d ** r[1, h], rel=1e-5, abs=1e-7)


def fire_reference(table, positions_BxL: np.ndarray) -> np.ndarray:
  """FIRE with loops: the paper's f(psi(i - j) / psi(max(L, i))) for keys at or before the query,
  the input negated and normalised by max(L, j) for keys after it (this project's choice)."""
  c, threshold, w_in, b_in, w_out, b_out = (np.asarray(t, np.float64) for t in table)
  psi = lambda x: math.log(c * x + 1)
  batch_size, length = positions_BxL.shape
  out = np.zeros((batch_size, w_out.shape[1], length, length))
  for b in range(batch_size):
    for t in range(length):
      for s in range(length):
        i, j = int(positions_BxL[b, t]), int(positions_BxL[b, s])
        if j <= i:
          u = psi(i - j) / (psi(max(threshold, i)) + 1e-6)
        else:
          u = -psi(j - i) / (psi(max(threshold, j)) + 1e-6)
        hidden = [max(0.0, u * w_in[w] + b_in[w]) for w in range(len(w_in))]
        for h in range(w_out.shape[1]):
          out[b, h, t, s] = sum(hidden[w] * w_out[w, h] for w in range(len(w_in))) + b_out[h]
  return out


def test_fire_bias_matches_the_formula():
  rng = np.random.default_rng(0)
  table = (np.float32(0.3), np.float32(6.0), *(rng.normal(size=shape).astype(np.float32)
                                               for shape in ((5,), (5,), (5, 3), (3,))))
  got = positions_lib.fire_bias(tuple(map(jnp.asarray, table)), pair_relative(PAIRS),
                                jnp.asarray(PAIRS))
  np.testing.assert_allclose(got, fire_reference(table, PAIRS), rtol=1e-5, atol=1e-5)


def cope_reference(q, k, visible, embedding, max_position, causal):
  """CoPE with loops: p_ij = sum_{t=j..i} g_it (j <= i), -sum_{t=i+1..j} g_it (j > i), clipped,
  then q_i . e interpolated between floor(p) and ceil(p), over sqrt(head_dim)."""
  batch_size, length, heads, dim = q.shape
  lowest = 0 if causal else -max_position
  out = np.zeros((batch_size, heads, length, length))
  for b in range(batch_size):
    for h in range(heads):
      for i in range(length):
        gate = [visible[b, 0, i, t] / (1 + math.exp(-(q[b, i, h] @ k[b, t, h]) / math.sqrt(dim)))
                for t in range(length)]
        scores = [q[b, i, h] @ e / math.sqrt(dim) for e in embedding]
        for j in range(length):
          p = sum(gate[j:i + 1]) if j <= i else -sum(gate[i + 1:j + 1])
          row = min(max(p, lowest), max_position) - lowest
          low, high = scores[math.floor(row)], scores[math.ceil(row)]
          out[b, h, i, j] = low + (row - math.floor(row)) * (high - low)
  return out


@pytest.mark.parametrize('causal', [True, False])
def test_cope_bias_matches_the_formula(causal):
  rng = np.random.default_rng(1)
  q, k = (rng.normal(scale=2.0, size=(2, 6, 2, 4)) for _ in range(2))
  visible = np.ones((2, 1, 6, 6), bool)
  visible[1, :, :, 5] = False  # a padding key
  if causal:
    visible &= np.tril(np.ones((6, 6), bool))
  max_position = 2  # positions beyond 2 are clipped
  embedding = rng.normal(size=(3 if causal else 5, 4))
  got = positions_lib.cope_bias(*map(jnp.asarray, (q, k, visible, embedding)), max_position,
                                causal)
  np.testing.assert_allclose(got, cope_reference(q, k, visible, embedding, max_position, causal),
                             rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ parameters


@pytest.mark.parametrize('position, highs', [('kerple_log', (2.0, 1.0)),
                                             ('kerple_power', (1.0, 2.0))])
def test_kerple_starts_as_the_authors_and_is_clamped_into_its_bounds(position, highs):
  """r1, r2 per head drawn from U(0, high), at least 0.01 (chijames/KERPLE); ``project`` clamps
  them into [0.01, inf) (the power's r2 into [0.01, 2]) and leaves values inside unchanged."""
  cfg = make_cfg(position=position, num_heads=8)
  scheme = model_for(cfg).positions
  r = np.asarray(scheme.pair_table())
  assert r.shape == (2, 8)
  for row, high in zip(r, highs):
    assert (row >= 0.01).all() and (row < high).all() and len(set(row.tolist())) == 8
  other = np.asarray(models.init(cfg, key_for(1))[1]['positions']['r'].get_value())
  assert not np.allclose(other, r)
  params = {'positions': {'r': jnp.asarray([[[-5.0, 0.5], [0.001, 9.0]]])}, 'head': 1.0}
  clamped = np.asarray(type(scheme).project(params)['positions']['r'])[0]
  assert clamped[0].tolist() == pytest.approx([0.01, 0.5])
  assert clamped[1].tolist() == pytest.approx([0.01, 2.0 if position == 'kerple_power' else 9.0])


def test_kerple_power_gradient_is_finite_at_distance_zero():
  r = jnp.asarray([[0.5], [1.2]])
  grad = jax.grad(lambda r: positions_lib.kerple_power_bias(r, pair_relative(PAIRS)).sum())(r)
  assert np.isfinite(grad).all() and (np.asarray(grad) != 0).all()


def test_fire_and_cope_start_as_the_authors():
  """FIRE: c = 0.1, L = model.fire_threshold (model.max_length outside a run), MLP weights within
  torch.nn.Linear's default bounds (1 for the first layer, 1/sqrt(width) for the second); one per
  layer, or shared (FIRE-S). CoPE: zero embeddings per layer, npos rows causal, 2 npos - 1
  bidirectional."""
  model = model_for(make_cfg(position='fire', fire_mlp_width=16))
  tables = [layer.attention.positions.params.table() for layer in model.layers]
  for c, threshold, w_in, b_in, w_out, b_out in (map(np.asarray, t) for t in tables):
    assert c == pytest.approx(0.1) and threshold == make_cfg().max_length
    assert w_in.shape == b_in.shape == (16,) and w_out.shape == (16, 4) and b_out.shape == (4,)
    assert np.abs(np.r_[w_in, b_in]).max() <= 1.0
    assert np.abs(np.r_[w_out.ravel(), b_out]).max() <= 0.25
  assert not np.allclose(np.asarray(tables[0][2]), np.asarray(tables[1][2]))
  shared = model_for(make_cfg(position='fire', fire_shared=True))
  assert shared.positions.shared is not None
  assert all(layer.attention.positions.params is None for layer in shared.layers)
  for task, rows in (('classify', 2 * 9 - 1), ('clm', 9)):
    model = model_for(make_cfg(position='cope', cope_npos=9).replace(task=task))
    tables = [np.asarray(layer.attention.positions.embedding.get_value()) for layer in model.layers]
    assert all(t.shape == (rows, 16) and not t.any() for t in tables)


@pytest.mark.parametrize('position', NEW)
def test_gradients_reach_every_scheme_parameter(position):
  cfg = make_cfg(position=position, num_layers=1)
  _, params = models.init(cfg, key_for(0))
  _, grads = loss_and_grads(cfg, params)
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    name = jax.tree_util.keystr(path)
    assert np.isfinite(g).all(), name
    assert 'positions' not in name or np.abs(g).max() > 0, name


# ------------------------------------------------------------------ attention paths


@pytest.mark.parametrize('task', ['classify', 'clm'])
def test_chunked_fire_matches_explicit_beyond_the_threshold(task):
  """With L = 3 the normaliser reads each block's query positions: the chunked blocks give the
  written-out logits (at the real tokens: a padding query sees no key in blocks); and the outputs
  change when all positions shift (not relative there)."""
  cfg = make_cfg(position='fire', fire_threshold=3.0, pooling='mean').replace(task=task)
  chunked = cfg.replace(attention_impl='chunked', attention_chunk_size=4)
  ids, pos, mask = batch(length=11, pad=3, offset=2)
  explicit = model_for(cfg)(ids, pos, mask)
  blocks = nnx.merge(nnx.graphdef(model_for(chunked)), nnx.state(model_for(cfg)))(ids, pos, mask)
  real = slice(None) if task == 'classify' else np.asarray(mask)
  np.testing.assert_allclose(np.asarray(blocks)[real], np.asarray(explicit)[real], atol=2e-6,
                             rtol=1e-5)
  hidden, shifted = (model_for(cfg).encode(ids, p, mask) for p in (pos, pos + 7))
  assert np.abs(np.asarray(shifted) - np.asarray(hidden)).max() > 1e-3


def with_random_cope_embeddings(cfg):
  """A model whose CoPE embeddings are random (they start at zero: a test of their term would
  pass without it)."""
  graphdef, params = models.init(cfg, key_for(0))
  model = nnx.merge(graphdef, params)
  for i, layer in enumerate(model.layers):
    table = layer.attention.positions.embedding
    table.set_value(jax.random.normal(key_for(10 + i), table.get_value().shape))
  return model


@pytest.mark.parametrize('impl', ['explicit', 'xla'])
def test_cope_causal_mask_with_trained_embeddings(impl, monkeypatch):
  monkeypatch.setattr(test_language_model, 'lm_model', with_random_cope_embeddings)
  test_language_model.test_causal_mask_later_tokens_change_no_earlier_output(
      ('cope', 'softmax', impl))
  cfg = test_language_model.lm_cfg('clm', 'cope', attention_impl=impl)
  ids, positions, mask = test_language_model.tokens()
  zero_start = nnx.merge(*models.init(cfg, key_for(0)))
  assert not np.allclose(with_random_cope_embeddings(cfg)(ids, positions, mask),
                         zero_start(ids, positions, mask), atol=1e-4)


def test_cope_at_cls_only_matches_the_full_last_layer():
  """CLS pooling computes the last layer at position 0 only: CoPE's positions for that query
  are the full computation's."""
  model = with_random_cope_embeddings(make_cfg(position='cope'))
  ids, pos, mask = batch()
  full = model.head(model.encode(ids, pos, mask)[:, 0], rngs=None)
  np.testing.assert_allclose(model(ids, pos, mask), full, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize('task', ['mlm', 'clm'])
def test_cope_packed_documents_with_trained_embeddings(task, monkeypatch):
  monkeypatch.setattr(test_language_model, 'lm_model', with_random_cope_embeddings)
  test_language_model.test_packed_documents_never_attend_to_each_other(
      ('cope', 'softmax', task, 'explicit'))


@pytest.mark.parametrize('case', [('fire', 'softmax', 'mlm', 'chunked'),
                                  ('kerple_power', 'softmax', 'clm', 'chunked')],
                         ids=lambda case: '-'.join(case))
def test_packed_documents_in_chunked_and_xla_attention(case):
  test_language_model.test_packed_documents_never_attend_to_each_other(case)


@pytest.mark.parametrize('case', [('kerple_power', 'softmax', 'chunked'),
                                  ('fire', 'softmax', 'chunked'), ('fire', 'softmax', 'xla')],
                         ids=lambda case: '-'.join(case))
def test_causal_mask_in_chunked_and_xla_attention(case):
  test_language_model.test_causal_mask_later_tokens_change_no_earlier_output(case)


def test_a_nope_layer_of_a_hybrid_drops_fire():
  """(KERPLE is a ``PairBias`` scheme like ALiBi and T5, which tests/test_prope_hybrid.py runs.)"""
  test_prope_hybrid.test_a_nope_layer_sees_no_positions('fire')


def test_a_cope_hybrid_has_embeddings_in_its_cope_layers_only():
  model = model_for(make_cfg(position='cope', num_layers=3).replace(nope_layers=(1,)))
  assert [hasattr(layer.attention.positions, 'embedding') for layer in model.layers] == [
      True, False, True]


@pytest.mark.parametrize('overrides, message', [
    ({'position': 'cope', 'attention_impl': 'chunked'},
     "model.position='cope' cannot run on model.attention_impl=chunked"),
    ({'position': 'kerple_log', 'attention_impl': 'splash'},
     "model.position='kerple_log' cannot run on model.attention_impl=splash"),
    ({'position': 'cope', 'attention_impl': 'pallas_flash'},
     "model.position='cope' cannot run on model.attention_impl=pallas_flash"),
    ({'position': 'cope', 'cope_npos': 1}, 'model.cope_npos must be 0'),
    ({'position': 'fire', 'fire_mlp_width': 0}, 'model.fire_mlp_width >= 1'),
    ({'position': 'fire', 'fire_threshold': -1.0}, 'model.fire_threshold >= 0'),
] + [({'position': p, 'attention': 'linear'}, f"model.position='{p}' adds to the attention logits")
     for p in NEW], ids=lambda x: str(x) if isinstance(x, str) else ','.join(map(str, x.values())))
def test_refused_by_name(overrides, message):
  with pytest.raises(ValueError, match=message):
    make_cfg(**overrides)


# ------------------------------------------------------------------ mesh and training runs


@pytest.mark.slow  # ~60 s of CPU: four models compiled twice, in a 4-device process
def test_schemes_on_a_mesh_match_one_device(tmp_path):
  out = tmp_path / 'mesh.json'
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS='--xla_force_host_platform_device_count=4')
  proc = subprocess.run([sys.executable, 'tests/helpers/scheme_mesh_worker.py', f'--out={out}'],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  results = json.loads(out.read_text())
  assert len(results) == 4
  for case, r in results.items():
    assert r['mesh_loss'] == pytest.approx(r['loss'], rel=1e-5), case
    assert r['max_grad_diff'] <= 1e-5 * r['max_grad'], case
  over_tensor = "P(None, 'tensor')"  # the heads axis
  assert results['kerple_log-mlm-explicit']['specs'] == {"['positions']['r']": over_tensor}
  assert results['fire-mlm-chunked']['specs']["['positions']['w_out']"] == over_tensor


def lm_run_config(run_config, tmp_path, task, position, **overrides):
  return run_config(**{
      'train.task': task, 'data.name': 'files',
      'data.train_files': test_pretraining.corpus_file(tmp_path), 'data.max_length': 32,
      'data.eval_tokens': 512, 'data.eval_lengths': '',
      'model.position': position, 'model.num_layers': 1, 'model.cope_npos': 33, **overrides})


@pytest.mark.slow  # ~20 s per run
@pytest.mark.parametrize('position, task', [('kerple_log', 'mlm'), ('kerple_power', 'clm'),
                                            ('fire', 'mlm'), ('cope', 'clm'), ('cope', 'mlm')])
def test_short_training_runs(tmp_path, run_config, position, task):
  config = lm_run_config(run_config, tmp_path, task, position, **{
      'train.num_steps': 4, 'train.eval_every': 4, 'train.log_every': 2,
      'train.checkpoint_every': 4})
  summary = trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert summary['task'] == task and np.isfinite(summary['eval']['test']['loss']).all()
  losses = [r['train/loss'] for r in metrics.read_metrics(str(tmp_path / 'run'))
            if 'train/loss' in r]
  assert len(losses) == 2 and losses[-1] < losses[0]


@pytest.mark.slow  # three runs of 20 steps
def test_fire_clm_run_is_killed_and_resumed_bitwise(tmp_path, run_config, monkeypatch):
  """tests/test_pretraining.py's kill-and-resume of a packed causal run with dropout, under FIRE:
  the same metrics and parameters, bit for bit."""
  fire_config = lambda **overrides: run_config(**{**overrides, 'model.position': 'fire'})
  test_pretraining.test_pretraining_run_is_killed_and_resumed_bitwise(
      tmp_path, fire_config, monkeypatch, 'clm')
