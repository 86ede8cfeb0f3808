"""Tests for models/: every scheme x attention kind on the tiny preset."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
import rope
from configs.default import get_config
from models import positions as positions_lib
from models import sharding

VOCAB = 40
CLASSES = 3
SCHEMES = tuple(models.SCHEMES)
LINEAR_SCHEMES = ('none', 'sinusoidal', 'learned', 'rotary')
COMBOS = [(p, 'softmax') for p in SCHEMES] + [(p, 'linear') for p in LINEAR_SCHEMES]
# FIRE is relative below its threshold L (512 at the start); CoPE never reads the positions.
INVARIANT = ('none', 'shaw', 't5', 'alibi', 'rotary', 'kerple_log', 'kerple_power', 'fire',
             'cope')
# Pre-LN, mean pooling, an embedding projection and token types, in one configuration.
PRE_LN = {'position': 'none', 'norm': 'pre', 'pooling': 'mean', 'embedding_size': 32,
          'type_vocab_size': 2}


def key_for(seed: int) -> jax.Array:
  """A PRNG key; RngBitGenerator keys compile far faster than threefry on CPU (test speed)."""
  return jax.random.key(seed, impl='rbg')


def make_cfg(deterministic: bool = True, **overrides) -> models.ModelConfig:
  """A tiny config from configs/default.py; keys are 'field' (model group) or 'rope.field'."""
  config = get_config()
  config.update_from_flattened_dict({k if '.' in k else f'model.{k}': v
                                     for k, v in overrides.items()})
  return models.ModelConfig(**config.model, rope=rope.RopeConfig(**config.rope),
                            vocab_size=VOCAB, num_classes=CLASSES, deterministic=deterministic)


def batch(length: int = 8, pad: int = 3, offset: int = 0):
  """Token ids [2, length] (row 0 ends in `pad` padding tokens, id 0), positions
  offset + arange, and the mask of real tokens."""
  ids = np.random.default_rng(0).integers(1, VOCAB, size=(2, length))
  ids[0, length - pad:] = 0
  positions = np.broadcast_to(np.arange(length) + offset, (2, length))
  return jnp.asarray(ids), jnp.asarray(positions), jnp.asarray(ids != 0)


@functools.lru_cache(maxsize=None)
def model_for(cfg: models.ModelConfig) -> models.Classifier:
  graphdef, params = models.init(cfg, key_for(0))
  return nnx.merge(graphdef, params)


def combo_id(combo) -> str:
  return '-'.join(combo)


# ------------------------------------------------------------------ shapes, dtypes, combos


@pytest.mark.parametrize('combo', COMBOS, ids=combo_id)
def test_shapes_and_dtypes(combo):
  position, attention = combo
  model = model_for(make_cfg(position=position, attention=attention, pooling='mean'))
  ids, pos, mask = batch()
  hidden = model.encode(ids, pos, mask)
  logits = model(ids, pos, mask)
  assert hidden.shape == (2, 8, 64) and hidden.dtype == jnp.float32
  assert logits.shape == (2, CLASSES) and logits.dtype == jnp.float32
  assert np.isfinite(logits).all()


@pytest.mark.parametrize('overrides', [
    {'rope.layout': 'half', 'rope.rotary_dim': 8},
    {'rope.scaling': 'yarn', 'rope.scaling_factor': 4.0},
    {'rope.scaling': 'dynamic_ntk', 'rope.scaling_factor': 2.0, 'rope.original_max_length': 4},
    {'rope.scaling': 'llama3', 'rope.scaling_factor': 8.0, 'rope.rotary_value': True},
    {'rope.rotary_value': True, 'attention': 'linear', 'linear_feature_map': 'relu'},
    {'position': 'shaw', 'shaw_values': True, 'attention_dropout_rate': 0.1},
    PRE_LN,
], ids=lambda o: ','.join(f'{k}={v}' for k, v in o.items()))
def test_variants_run(overrides):
  model = model_for(make_cfg(**overrides))
  ids, pos, mask = batch()
  logits = model(ids, pos, mask)
  assert logits.shape == (2, CLASSES) and np.isfinite(logits).all()


@pytest.mark.parametrize('combo', [('rotary', 'softmax'), ('shaw', 'softmax'),
                                   ('learned', 'linear')], ids=combo_id)
def test_bfloat16_forward(combo):
  position, attention = combo
  cfg = make_cfg(position=position, attention=attention, dtype='bfloat16',
                 shaw_values=position == 'shaw')
  graphdef, params = models.init(cfg, key_for(0))
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
  model = nnx.merge(graphdef, params)
  ids, pos, mask = batch()
  hidden = model.encode(ids, pos, mask)
  logits = model(ids, pos, mask)
  assert hidden.dtype == jnp.bfloat16
  assert logits.dtype == jnp.float32 and np.isfinite(logits).all()
  fp32_graphdef, _ = jax.eval_shape(functools.partial(models.init, cfg.replace(dtype='float32')),
                                    key_for(0))
  reference = nnx.merge(fp32_graphdef, params)(ids, pos, mask)
  np.testing.assert_allclose(logits, reference, atol=0.05)


@pytest.mark.parametrize('position', ['shaw', 't5', 'alibi'])
def test_linear_attention_rejects_logit_schemes(position):
  with pytest.raises(ValueError, match='none, sinusoidal, learned, rotary'):
    make_cfg(position=position, attention='linear')


# ------------------------------------------------------------------ padding and translation


PADDING_CASES = ([combo + ('mean',) for combo in COMBOS] +
                 [('rotary', 'softmax', 'cls'), ('shaw', 'softmax', 'cls'),
                  ('rotary', 'linear', 'cls')])


@pytest.mark.parametrize('case', PADDING_CASES, ids=combo_id)
def test_padding_changes_nothing(case):
  position, attention, pooling = case
  model = model_for(make_cfg(position=position, attention=attention, pooling=pooling))
  ids, pos, mask = batch(length=8, pad=3)
  ids_padded = jnp.pad(ids, ((0, 0), (0, 5)))  # 5 more padding tokens per row
  mask_padded = jnp.pad(mask, ((0, 0), (0, 5)))
  _, pos_padded, _ = batch(length=13)
  real = np.asarray(mask)
  hidden = model.encode(ids, pos, mask)
  hidden_padded = model.encode(ids_padded, pos_padded, mask_padded)[:, :8]
  np.testing.assert_allclose(np.asarray(hidden)[real], np.asarray(hidden_padded)[real],
                             atol=2e-5)
  np.testing.assert_allclose(model(ids, pos, mask), model(ids_padded, pos_padded, mask_padded),
                             atol=2e-5)


@pytest.mark.parametrize('combo', COMBOS, ids=combo_id)
def test_translation(combo):
  position, attention = combo
  model = model_for(make_cfg(position=position, attention=attention, pooling='mean'))
  ids, pos, mask = batch()
  _, shifted, _ = batch(offset=7)
  hidden, hidden_shifted = model.encode(ids, pos, mask), model.encode(ids, shifted, mask)
  if position in INVARIANT:
    np.testing.assert_allclose(hidden, hidden_shifted, atol=1e-4)
  else:
    assert np.abs(np.asarray(hidden) - np.asarray(hidden_shifted)).max() > 1e-2




# ------------------------------------------------------------------ gradients, remat, jit


def loss_and_grads(cfg: models.ModelConfig, params, key=None):
  """Loss and gradients for a fixed batch, eagerly (eager ops compile once for all tests)."""
  graphdef, _ = jax.eval_shape(functools.partial(models.init, cfg), key_for(0))
  ids, pos, mask = batch()

  def loss(params):
    rngs = None if key is None else nnx.Rngs(dropout=key)
    logits = nnx.merge(graphdef, params)(ids, pos, mask, rngs=rngs)
    return jnp.sum(jax.nn.log_softmax(logits)[:, 0])

  return jax.value_and_grad(loss)(params)


@pytest.mark.parametrize('overrides', [
    PRE_LN, {'position': 'sinusoidal'}, {'position': 'learned'},
    {'position': 'shaw', 'shaw_values': True}, {'position': 't5'}, {'position': 'alibi'},
    {'position': 'rotary'}, {'position': 'rotary', 'attention': 'linear'},
], ids=lambda o: ','.join(f'{k}={v}' for k, v in o.items()))
def test_gradients_finite_and_nonzero(overrides):
  cfg = make_cfg(**overrides)
  _, params = models.init(cfg, key_for(0))
  _, grads = loss_and_grads(cfg, params)
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    name = jax.tree_util.keystr(path)
    assert np.isfinite(g).all(), name
    assert np.abs(g).max() > 0, name


@pytest.mark.parametrize('num_layers', [1, pytest.param(4, marks=pytest.mark.slow)])  # 4: ~50 s
def test_remat_same_outputs_and_gradients(num_layers):
  """Remat against the plain model, with both dropouts active; with 4 layers the first 3 run
  as one rolled loop, which carries the dropout stream (the same draws)."""
  cfg = make_cfg(position='shaw', shaw_values=True, deterministic=False,
                 attention_dropout_rate=0.1, num_layers=num_layers)
  _, params = models.init(cfg, key_for(0))
  key = key_for(7)
  loss, grads = loss_and_grads(cfg, params, key)
  loss_remat, grads_remat = loss_and_grads(cfg.replace(remat=True), params, key)
  np.testing.assert_allclose(loss, loss_remat, rtol=1e-5)
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-5), grads, grads_remat)


@pytest.mark.parametrize('overrides', [
    {'position': 'rotary'}, {'position': 'shaw', 'shaw_values': True}, PRE_LN | {'pooling': 'cls'},
], ids=lambda o: ','.join(f'{k}={v}' for k, v in o.items()))
def test_cls_pooling_computes_the_last_layer_at_cls_only(overrides):
  """With CLS pooling the last layer computes position 0 only: the same logits as the head on
  the full encoder output, and the same gradients."""
  cfg = make_cfg(**overrides)
  graphdef, params = models.init(cfg, key_for(0))
  ids, pos, mask = batch()

  def losses(params):
    model = nnx.merge(graphdef, params)
    full = model.head(model.encode(ids, pos, mask)[:, 0], rngs=None)
    return jnp.stack([jnp.sum(model(ids, pos, mask) ** 2), jnp.sum(full ** 2)])

  np.testing.assert_allclose(*losses(params), rtol=1e-5)
  grads = [jax.grad(lambda p, i=i: losses(p)[i])(params) for i in range(2)]
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-5), *grads)


def test_jit_matches_eager():
  cfg = make_cfg(position='alibi', deterministic=False, num_layers=1)
  graphdef, params = models.init(cfg, key_for(0))
  ids, pos, mask = batch()

  def forward(params, key):
    return nnx.merge(graphdef, params)(ids, pos, mask, rngs=nnx.Rngs(dropout=key))

  key = key_for(3)
  np.testing.assert_allclose(jax.jit(forward)(params, key), forward(params, key), atol=1e-5)


def test_dropout_keys():
  cfg = make_cfg(position='rotary', deterministic=False)
  graphdef, params = models.init(cfg, key_for(0))
  model = nnx.merge(graphdef, params)
  ids, pos, mask = batch()
  run = lambda seed: model(ids, pos, mask, rngs=nnx.Rngs(dropout=key_for(seed)))
  np.testing.assert_array_equal(run(1), run(1))
  assert np.abs(np.asarray(run(1)) - np.asarray(run(2))).max() > 1e-4
  with pytest.raises(ValueError, match='rngs=nnx.Rngs'):
    model(ids, pos, mask)
  eval_graphdef, _ = jax.eval_shape(functools.partial(models.init, cfg.replace(deterministic=True)),
                                    key_for(0))
  eval_model = nnx.merge(eval_graphdef, params)
  np.testing.assert_array_equal(eval_model(ids, pos, mask), eval_model(ids, pos, mask))


# ------------------------------------------------------------------ errors


def test_learned_longer_than_max_length_raises():
  model = model_for(make_cfg(position='learned', max_length=8))
  ids, pos, mask = batch(length=9)
  with pytest.raises(models.LengthError, match='max_length=8'):
    model(ids, pos, mask)
  with pytest.raises(ValueError, match='max_length=8'):  # also under jit
    jax.jit(lambda ids, pos: model(ids, pos, mask))(ids, pos)


def test_learned_position_values_out_of_range_are_nan():
  model = model_for(make_cfg(position='learned', max_length=8))
  ids, pos, mask = batch(offset=1)
  assert np.isnan(model(ids, pos, mask)).all()


def test_every_scheme_declares_its_facts():
  """What the rest of the code asks about a scheme (its Pallas kernels, a length limit, whether
  it adds positions at all, its name) is declared on the scheme, not compared by name."""
  for name, scheme in models.SCHEMES.items():
    assert scheme.name == name
    assert isinstance(scheme.adds_positions, bool) and isinstance(scheme.has_max_length, bool)
    assert set(scheme.pallas_kernels) <= set(models.config.PALLAS_SCHEMES), name
    assert models.has_max_length(name) == scheme.has_max_length
  assert [n for n, s in models.SCHEMES.items() if s.has_max_length] == ['learned']
  assert [n for n, s in models.SCHEMES.items() if not s.adds_positions] == ['none']
  assert not models.has_max_length('fourier')  # not a scheme: validation reports it


def test_nope_and_length_facts_are_read_from_the_scheme(monkeypatch):
  """A NoPE hybrid's refusal and the model.max_length checks (the run config's, evaluation's, a
  fine-tune's carried fields) ask the scheme, not its name."""
  # training sits above models: imported here only, for the checks that ask the scheme
  from training import carry, config as run_config_lib, evaluation
  with pytest.raises(ValueError, match='it adds no position information'):
    make_cfg(position='none', nope_interval=2)
  monkeypatch.setattr(positions_lib.NoPositions, 'adds_positions', True)
  make_cfg(position='none', nope_interval=2)  # now a per-layer scheme (of empty hooks)
  config = get_config()
  config.model.update(position='alibi', max_length=8)
  run = run_config_lib.run_config(config)
  assert 'model.max_length' not in carry.shaping_fields(run)
  monkeypatch.setattr(positions_lib.ALiBi, 'has_max_length', True)
  assert 'model.max_length' in carry.shaping_fields(run)
  with pytest.raises(ValueError, match=r'model\.position=alibi has no embedding'):
    run.check_model()
  with pytest.raises(ValueError, match=r'model\.position=alibi\) has position embeddings for 8'):
    evaluation._check_lengths(run, [16])  # pylint: disable=protected-access


@pytest.mark.parametrize('overrides, message', [
    ({'position': 'fourier'}, 'model.position.*none, sinusoidal, learned, shaw, t5, alibi, rotary'),
    ({'attention': 'performer'}, 'model.attention.*softmax, linear'),
    ({'norm': 'sandwich'}, 'model.norm.*post, pre'),
    ({'pooling': 'max'}, 'model.pooling.*cls, mean'),
    ({'dtype': 'float16'}, 'model.dtype.*float32, bfloat16'),
    ({'size': 'huge'}, 'model.size.*tiny, small, base'),
    ({'linear_feature_map': 'exp'}, 'model.linear_feature_map.*elu\\+1, relu'),
    ({'rope.layout': 'zigzag'}, 'RoPE layout.*interleaved, half'),
    ({'rope.scaling': 'dynamic'}, 'RoPE scaling.*none, linear, ntk, dynamic_ntk, yarn, llama3'),
    ({'rope.xpos': True}, 'rope.xpos=True needs causal attention'),
    ({'rope.scaling': 'yarn', 'rope.scaling_factor': 4.0, 'attention': 'linear'},
     'un-normalised'),
    ({'num_heads': 5}, 'not divisible by model.num_heads=5'),
    ({'hidden_size': 60, 'num_heads': 4, 'position': 'rotary'}, 'even head_dim'),
    ({'rope.rotary_dim': 32}, 'rotary_dim=32 is larger than head_dim=16'),
    ({'rope.rotary_dim': 6, 'position': 'alibi'}, 'rope.rotary_dim only applies to'),
    ({'rope.xpos': True, 'position': 't5'}, 'rope.xpos only applies to model.position=rotary'),
    ({'shaw_values': True, 'position': 'rotary'}, 'model.shaw_values only applies'),
    ({'attention': 'linear', 'attention_dropout_rate': 0.1}, 'attention_dropout_rate'),
    ({'position': 't5', 't5_num_buckets': 7}, 'model.t5_num_buckets'),
    ({'position': 'shaw', 'shaw_max_distance': 0}, 'model.shaw_max_distance'),
    ({'position': 't5', 'relative_init_std': -1.0}, 'model.relative_init_std'),
    ({'position': 'sinusoidal', 'embedding_size': 33}, 'even embedding width'),
    ({'rope.scaling': 'yarn', 'rope.yarn_beta_fast': 0.5}, 'beta_fast'),
])
def test_invalid_config_raises(overrides, message):
  with pytest.raises(ValueError, match=message):
    make_cfg(**overrides)


def test_bad_inputs_raise():
  model = model_for(make_cfg())
  ids, pos, mask = batch()
  with pytest.raises(ValueError, match='positions shape'):
    model(ids, pos[:, :4], mask)
  with pytest.raises(ValueError, match='type_vocab_size=0'):
    model(ids, pos, mask, token_type_ids_BxL=jnp.zeros_like(ids))


# ------------------------------------------------------------------ scheme internals


def test_alibi_slopes_follow_the_paper():
  np.testing.assert_allclose(positions_lib.alibi_slopes(8), 2.0 ** -np.arange(1, 9))
  # 6 heads: the 4-head slopes, then every other slope of the 8-head sequence (2 of them).
  np.testing.assert_allclose(positions_lib.alibi_slopes(6),
                             [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3])


def test_t5_buckets():
  relative = jnp.arange(-200, 201)[None, None, :]
  buckets = np.asarray(positions_lib.t5_buckets(relative, 32, 128))[0, 0]
  distance = np.arange(-200, 201)
  assert buckets[distance == 0] == 0
  np.testing.assert_array_equal(buckets[(distance < 0) & (distance > -8)], np.arange(7, 0, -1))
  np.testing.assert_array_equal(buckets[(distance > 0) & (distance < 8)], 16 + np.arange(1, 8))
  assert (buckets[distance <= -128] == 15).all() and (buckets[distance >= 128] == 31).all()
  assert (np.diff(buckets[distance >= 0]) >= 0).all()


@pytest.mark.parametrize('position', ['shaw', 't5', 'learned'])
def test_relative_init_std_draws_only_the_relative_tables_wider(position):
  """model.relative_init_std rescales shaw's and t5's tables (same draws); nothing else."""
  leaves = lambda **o: {jax.tree_util.keystr(k): np.asarray(v) for k, v in
                        jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(
                            models.init(make_cfg(position=position, **o), key_for(0))[1]))}
  base, wide = leaves(), leaves(relative_init_std=1.0)
  std = make_cfg().init_std
  relative = [k for k in base if k.endswith("['key_table']") or
              (position == 't5' and "['positions']" in k)]
  assert len(relative) == {'shaw': 2, 't5': 1, 'learned': 0}[position]
  for k, v in base.items():
    np.testing.assert_allclose(wide[k], v / std if k in relative else v, rtol=1e-5)


def test_sinusoidal_table_matches_vaswani():
  table = np.asarray(positions_lib.sinusoidal_table(jnp.array([[0, 3]]), 8))[0]
  i = np.arange(4)
  np.testing.assert_allclose(table[1, 0::2], np.sin(3 / 10000 ** (2 * i / 8)), rtol=1e-6)
  np.testing.assert_allclose(table[1, 1::2], np.cos(3 / 10000 ** (2 * i / 8)), rtol=1e-6)
  np.testing.assert_allclose(table[0], np.tile([0.0, 1.0], 4))


# ------------------------------------------------------------------ sharding


def test_constrain_is_a_noop_without_rules_and_mesh():
  x = jnp.ones((2, 3))
  assert sharding.constrain(x, ('batch', 'embed')) is x
  with pytest.raises(ValueError, match='Unknown logical axis'):
    sharding.param_metadata(('batch', 'model'))


def test_init_under_jit_and_eval_shape_with_mesh_and_rules():
  """Jitted init under a mesh and rules shards eagerly; eval_shape gives the same tree."""
  mesh = jax.make_mesh((1,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
  # 'heads' and 'batch' share a mesh axis: activations [batch, length, heads, kv] keep it once.
  rules = (('batch', 'data'), ('length', None), ('embed', None), ('heads', 'data'), ('kv', None),
           ('mlp', 'data'), ('vocab', None), ('classes', None))
  cfg = make_cfg(position='t5', num_layers=1)
  ids, pos, mask = batch()
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    graphdef, params = jax.jit(models.init, static_argnums=0)(cfg, key_for(0))
    specs = nnx.get_partition_spec(params)
    logits = jax.jit(lambda params: nnx.merge(graphdef, params)(ids, pos, mask))(params)
  _, abstract = jax.eval_shape(functools.partial(models.init, cfg), key_for(0))
  assert jax.tree.map(lambda x: (x.shape, x.dtype), params) == jax.tree.map(
      lambda x: (x.shape, x.dtype), abstract)
  assert models.count_params(params) == models.count_params(abstract)
  layer = specs['layers'][0]
  assert layer['attention']['query']['kernel'].get_value() == jax.P(None, 'data', None)
  assert layer['intermediate']['kernel'].get_value() == jax.P(None, 'data')
  np.testing.assert_allclose(logits, model_for(cfg)(ids, pos, mask), atol=1e-6)
  with nnx.logical_axis_rules((('heads', 'model'), ('kv', 'model'))):
    assert sharding.logical_to_mesh(('heads', 'kv')) == jax.P('model', None)


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
@pytest.mark.parametrize('head_dim', [64, 48])
def test_softmax_attention_matches_the_library(dtype, head_dim):
  """The written-out CPU softmax attention against jax.nn.dot_product_attention (XLA), with a
  bias and a key padding mask; head_dim 64 scales exactly (1/8), 48 rounds once in the queries."""
  from models.attention import softmax_attention  # pylint: disable=g-import-not-at-top
  kq, kk, kv, kb = jax.random.split(jax.random.PRNGKey(0), 4)
  shape = (2, 16, 3, head_dim)
  q, k, v = (jax.random.normal(key, shape, jnp.dtype(dtype)) for key in (kq, kk, kv))
  bias = jax.random.normal(kb, (1, 3, 16, 16), jnp.float32)
  mask = jnp.arange(16)[None, None, None, :] < jnp.array([16, 11])[:, None, None, None]
  ours = jax.jit(softmax_attention)(q, k, v, bias, mask)
  library = jax.jit(functools.partial(jax.nn.dot_product_attention, implementation='xla'))(
      q, k, v, bias=bias.astype(q.dtype), mask=mask)
  assert ours.dtype == q.dtype and ours.shape == shape
  tolerance = {'float32': 1e-5, 'bfloat16': 2e-2}[dtype]
  np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(library, np.float32),
                             atol=tolerance, rtol=tolerance)


def test_bfloat16_attention_keeps_bfloat16_probabilities_for_the_backward_pass(monkeypatch):
  """In bf16 the written-out attention's forward values are those of jax.nn.softmax's rule
  bitwise, its gradients agree with that rule's to bf16 rounding, and the gradient keeps less
  memory: the bf16 probabilities, not a float32 copy as well. In float32 nothing changes."""
  from models import attention  # pylint: disable=g-import-not-at-top
  ours_rule = attention._softmax_as  # pylint: disable=protected-access
  library_rule = lambda logits, dtype: jax.nn.softmax(logits, axis=-1).astype(dtype)

  def compiled_with(rule, *qkv):
    monkeypatch.setattr(attention, '_softmax_as', rule)
    loss = lambda q, k, v: jnp.sum(
        attention.softmax_attention(q, k, v, None, None).astype(jnp.float32) ** 2)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(*qkv).compile()

  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  qkv = [jax.random.normal(key, (2, 256, 4, 32), jnp.bfloat16) for key in keys]
  ours, library = compiled_with(ours_rule, *qkv), compiled_with(library_rule, *qkv)
  (value, grads), (library_value, library_grads) = ours(*qkv), library(*qkv)
  assert value == library_value
  for g, h in zip(grads, library_grads):
    g, h = np.asarray(g, np.float32), np.asarray(h, np.float32)
    assert np.linalg.norm(g - h) < 2e-2 * np.linalg.norm(h)
  temp = lambda f: f.memory_analysis().temp_size_in_bytes
  assert temp(ours) < temp(library)
  float32 = [x.astype(jnp.float32) for x in qkv]
  same = jax.tree.map(jnp.array_equal, compiled_with(ours_rule, *float32)(*float32),
                      compiled_with(library_rule, *float32)(*float32))
  assert all(jax.tree.leaves(same))


def test_every_scheme_starts_from_the_same_shared_parameters():
  """For one key, embeddings, encoder layers and head are identical whatever the scheme; the
  scheme's own parameters (learned table, Shaw tables, T5 bias) come from their own stream."""
  key = jax.random.PRNGKey(5)
  shared = {}
  for position in SCHEMES:
    cfg = make_cfg(position=position, shaw_values=position == 'shaw')
    params = nnx.to_pure_dict(models.init(cfg, key)[1])
    flat = {jax.tree_util.keystr(p): np.asarray(v)
            for p, v in jax.tree_util.tree_leaves_with_path(params)
            if 'positions' not in jax.tree_util.keystr(p)}
    shared[position] = flat
  reference = shared['none']
  for position, flat in shared.items():
    assert flat.keys() == reference.keys(), position
    for name, value in flat.items():
      np.testing.assert_array_equal(value, reference[name], err_msg=f'{position}: {name}')


CHUNKED_CASES = [{'position': p} for p in SCHEMES if p != 'cope'] + [  # cope refuses chunked
    {'position': 'shaw', 'shaw_values': True, 'shaw_max_distance': 3},
    {'position': 't5', 't5_num_buckets': 8, 't5_max_distance': 16},
    {'position': 'rotary', 'pooling': 'mean'}]


@pytest.mark.parametrize('overrides', CHUNKED_CASES,
                         ids=lambda o: ','.join(f'{k}={v}' for k, v in o.items()))
def test_chunked_attention_matches_the_written_out_form(overrides):
  """Blocks of 4 queries x keys over 11 tokens (3 of them padding, the last block partial, the
  first query block at CLS alone in the last layer): the same logits and gradients as
  'explicit', to float32 rounding, for every scheme's bias and value terms."""
  cfg = make_cfg(attention_impl='explicit', **overrides)  # 'auto' evaluates chunked on CPU
  chunked = cfg.replace(attention_impl='chunked', attention_chunk_size=4)
  _, params = models.init(cfg, key_for(0))
  ids, pos, mask = batch(length=11, pad=3, offset=5)

  def loss_and_logits(cfg, params):
    def loss(params):
      logits = nnx.merge(nnx.graphdef(model_for(cfg)), params)(ids, pos, mask)
      return jnp.sum(jnp.sin(logits)), logits
    return jax.value_and_grad(loss, has_aux=True)(params)

  (_, logits), grads = loss_and_logits(cfg, params)
  (_, logits_chunked), grads_chunked = loss_and_logits(chunked, params)
  np.testing.assert_allclose(logits_chunked, logits, atol=2e-6, rtol=1e-5)
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=2e-6, rtol=1e-4),
               grads_chunked, grads)


def test_chunked_attention_gives_padded_positions_the_written_out_outputs():
  """Every position's hidden state, padded ones too (a padded query attends to the real keys,
  as in HF's RoFormer): the same in blocks as written out."""
  cfg = make_cfg(position='rotary', attention_impl='explicit')
  _, params = models.init(cfg, key_for(0))
  ids, pos, mask = batch(length=11, pad=3)
  hidden = lambda cfg: np.asarray(nnx.merge(nnx.graphdef(model_for(cfg)), params).encode(
      ids, pos, mask, None))
  chunked = cfg.replace(attention_impl='chunked', attention_chunk_size=4)
  np.testing.assert_allclose(hidden(chunked), hidden(cfg), atol=2e-6, rtol=1e-5)


def test_auto_attention_evaluates_chunked_and_trains_written_out_on_cpu():
  """'auto' on CPU: the evaluation pass in blocks where the scheme can run so (the faster
  forward, benchmarks/attention_impl.py), training written out; an explicit choice is kept."""
  assert make_cfg(position='rotary').attention_implementation == 'chunked'
  assert make_cfg(False, position='rotary').attention_implementation == 'explicit'
  assert make_cfg(position='cope').attention_implementation == 'explicit'
  assert make_cfg(position='t5', attention_impl='xla').attention_implementation == 'xla'
  assert make_cfg(position='rotary', attention='linear').attention_implementation == 'explicit'


def test_chunked_attention_memory_is_linear_in_the_length():
  """XLA's temporaries for a chunked train step at 8x the length grow about 8x, not 64x (at
  shorter lengths the blocks' fixed costs would hide a quadratic term)."""
  def temp_bytes(length):
    cfg = make_cfg(position='alibi', attention_impl='chunked', attention_chunk_size=128,
                   num_layers=1, max_length=length)
    graphdef, params = models.init(cfg, key_for(0))
    ids = jnp.ones((1, length), jnp.int32)
    pos = jnp.arange(length)[None]

    def loss(params):
      return nnx.merge(graphdef, params)(ids, pos, ids > 0).sum()
    compiled = jax.jit(jax.grad(loss)).lower(params).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  assert temp_bytes(8192) / temp_bytes(1024) < 12  # quadratic: 64


@pytest.mark.parametrize('pooling', ['cls', 'mean'])
def test_dual_encoder_encodes_each_text_alone(pooling):
  """Two towers: the logits are the head on [u, v, u*v, u-v], u and v each text's pooled vector
  computed alone (so padding one text changes nothing of the other's)."""
  cfg = make_cfg(dual_encoder=True, pooling=pooling)
  model = model_for(cfg)
  ids, pos, mask = batch()
  pair = lambda x: jnp.stack([x, x[::-1]], axis=1)  # [2, 2, L]: (row 0, row 1), (row 1, row 0)
  logits = model(pair(ids), pair(pos), pair(mask))
  single = model_for(make_cfg(pooling=pooling))
  encoded = model.encode(ids, pos, mask)
  if pooling == 'cls':
    pooled = encoded[:, 0]
  else:
    pooled = (encoded * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  u, v = pooled, pooled[::-1]
  expected = model.head(jnp.concatenate([u, v, u * v, u - v], -1), rngs=None)
  np.testing.assert_allclose(logits, expected, atol=1e-5)
  assert not np.allclose(logits[0], logits[1])  # the order of a pair matters (u - v)
  assert single.head.dense.kernel.shape[0] * 4 == model.head.dense.kernel.shape[0]
  with pytest.raises(ValueError, match=r'\[batch, 2, length\]'):
    model(ids, pos, mask)
