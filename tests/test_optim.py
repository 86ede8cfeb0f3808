"""The optimizer: schedule, weight-decay mask, gradient accumulation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import settings
from configs import default
from training import optim
from training.config import OptimConfig


def test_schedule_warmup_then_decay():
  o = default.get_config().optim
  o.warmup_steps, o.end_lr_factor = 10, 0.0
  for name, mid in (('cosine', 0.5), ('linear', 0.5), ('constant', 1.0)):
    o.schedule = name
    s = optim.schedule_shape(o, 110)
    assert float(s(0)) == 0.0 and float(s(5)) == pytest.approx(0.5, rel=1e-4)
    assert float(s(10)) == pytest.approx(1.0)
    assert float(s(60)) == pytest.approx(mid, abs=1e-6)
  o.schedule = 'exp'
  with pytest.raises(ValueError, match='cosine, linear, constant'):
    optim.schedule_shape(o, 10)


def test_no_weight_decay_on_biases_layernorm_embeddings():
  params = {'embeddings': {'word_embeddings': {'embedding': 1}, 'LayerNorm': {'scale': 1}},
            'layers': {0: {'attention': {'query': {'kernel': 1, 'bias': 1}}}},
            'head': {'out_proj': {'kernel': 1}}}
  mask = optim.decay_mask(params)
  assert mask['layers'][0]['attention']['query'] == {'kernel': True, 'bias': False}
  assert mask['head']['out_proj']['kernel'] is True
  assert not any(jax.tree.leaves(mask['embeddings']))


def test_gradient_accumulation_equals_large_batch():
  o = default.get_config().optim
  o.warmup_steps, o.schedule, o.weight_decay, o.grad_clip_norm = 0, 'constant', 0.0, 0.0
  params = {'w': {'kernel': jnp.ones(3)}}
  g1, g2 = {'w': {'kernel': jnp.array([1., 2., 3.])}}, {'w': {'kernel': jnp.array([3., 0., 1.])}}
  o.grad_accum_steps = 2
  tx, _ = optim.make_optimizer(o, 10)
  state = tx.init(params)
  u1, state = tx.update(g1, state, params)
  assert not np.any(u1['w']['kernel'])  # no update until the second micro-batch
  u2, state = tx.update(g2, state, params)
  o.grad_accum_steps = 1
  tx1, _ = optim.make_optimizer(o, 10)
  mean = jax.tree.map(lambda a, b: (a + b) / 2, g1, g2)
  want, _ = tx1.update(mean, tx1.init(params), params)
  np.testing.assert_allclose(u2['w']['kernel'], want['w']['kernel'], rtol=1e-6)


def test_injected_peak_rate_and_position_multiplier():
  """A member's rate lives in its optimizer state: AdamW at 3x the rate moves 3x as far; the
  position scheme's parameters move by their multiplier."""
  o = default.get_config().optim
  o.warmup_steps, o.schedule, o.grad_clip_norm = 0, 'constant', 0.0
  o.weight_decay, o.position_lr_multiplier = 0.0, 10.0
  params = {'layers': {'kernel': jnp.ones(3)}, 'positions': {'embedding': jnp.ones(3)}}
  grads = jax.tree.map(lambda x: x * 0.5, params)
  tx, _ = optim.make_optimizer(o, 10)
  state = tx.init(params)
  assert float(optim.peak_learning_rate(state)) == pytest.approx(o.learning_rate)
  base, _ = tx.update(grads, state, params)
  faster, _ = tx.update(grads, optim.with_peak_learning_rate(state, 3 * o.learning_rate), params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(b, 3 * a, rtol=1e-6), base, faster)
  np.testing.assert_allclose(base['positions']['embedding'], 10 * base['layers']['kernel'],
                             rtol=1e-6)
  rates = lambda text: settings.build_group(OptimConfig, {'learning_rates': text}, 'optim')
  assert optim.learning_rates(rates('3e-4, 1e-3')) == [3e-4, 1e-3]
  with pytest.raises(ValueError, match='finite and > 0'):
    rates('1e-3,nan')


def test_rsqrt_schedule_is_lras_linear_warmup_times_rsqrt_decay():
  """LRA's 'constant * linear_warmup * rsqrt_decay' divided by its peak (at the warmup's end)."""
  config = default.get_config().optim
  config.schedule, config.warmup_steps = 'rsqrt', 100
  shape = optim.schedule_shape(config, 10_000)
  for t in (0, 50, 100, 400, 2500):
    lra = min(1.0, t / 100) / np.sqrt(max(t, 100))
    assert float(shape(t)) == pytest.approx(lra * np.sqrt(100), rel=1e-6), t


def test_layer_decay_and_freezing_scale_each_layers_updates():
  """Layer-wise decay d: layer i of L moves d^(L - i) as far as the head, the embeddings
  d^(L + 1); a frozen encoder does not move at all."""
  params = {'embeddings': {'w': jnp.ones(2)}, 'layers': {0: {'w': jnp.ones(2)},
                                                         1: {'w': jnp.ones(2)}},
            'head': {'w': jnp.ones(2)}}
  grads = jax.tree.map(jnp.ones_like, params)

  def moved(**fields):
    o = default.get_config().optim
    o.update(warmup_steps=0, schedule='constant', weight_decay=0.0, grad_clip_norm=0.0,
             learning_rate=0.1, **fields)
    tx, _ = optim.make_optimizer(o, 10)
    updates, _ = tx.update(grads, tx.init(params), params)
    return jax.tree.map(lambda u: float(-u[0]), updates)

  d = moved(layer_decay=0.5)
  assert d['head']['w'] == pytest.approx(0.1, rel=1e-4)
  assert d['layers'][1]['w'] == pytest.approx(0.05, rel=1e-4) and d['layers'][0]['w'] == pytest.approx(0.025, rel=1e-4)
  assert d['embeddings']['w'] == pytest.approx(0.0125, rel=1e-4)
  frozen = moved(freeze_encoder=True)
  assert frozen['head']['w'] == pytest.approx(0.1, rel=1e-4)
  assert frozen['layers'][0]['w'] == frozen['embeddings']['w'] == 0.0
