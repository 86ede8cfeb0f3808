"""p-RoPE (``rope.p``, Barbero et al. 2025) and per-layer NoPE/scheme hybrids
(``model.nope_layers`` / ``model.nope_interval``): the frequencies against numbers computed here,
the limits p=1 (RoPE) and p=0 (NoPE), the difference from ``rope.rotary_dim``, what a NoPE layer
sees, the refusals, and the roles the new fields carry."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
import rope
import settings
import storage
from configs.default import get_config
from data import datasets
from helpers import entry
from interop import export
from models import encoder
from models import positions as positions_lib
from training import config as config_lib
from training import evaluation
from training import init_from

VOCAB, CLASSES = 30, 3
SMALL = {'hidden_size': 16, 'num_heads': 2, 'mlp_dim': 32, 'init_std': 0.2}
PER_LAYER = ('rotary', 'alibi', 't5', 'shaw')
SCHEME_HOOKS = {'rotary': positions_lib.RotaryHooks, 'alibi': positions_lib.PairBiasHooks,
                't5': positions_lib.PairBiasHooks, 'shaw': positions_lib.ShawHooks}


def make_cfg(**overrides) -> models.ModelConfig:
  """A 16-wide model from configs/default.py; keys 'field' (model group) or 'rope.field'."""
  config = get_config()
  config.update_from_flattened_dict({k if '.' in k else f'model.{k}': v
                                     for k, v in {**SMALL, **overrides}.items()})
  run = config_lib.run_config(config)
  return run.model_config(vocab_size=VOCAB, num_classes=CLASSES).replace(deterministic=True)


def logits(cfg: models.ModelConfig, positions, ids=None) -> np.ndarray:
  graphdef, params = models.init(cfg, jax.random.key(0, impl='rbg'))
  model = nnx.merge(graphdef, params)
  positions = jnp.asarray(positions)
  if ids is None:
    ids = jnp.asarray(np.random.default_rng(1).integers(1, VOCAB, size=positions.shape))
  return np.asarray(model(ids, positions, jnp.ones(positions.shape, bool)))


def numpy_frequencies(d: int, p: float, base: float = 10000.0, divide: float = 1.0) -> np.ndarray:
  """p-RoPE's theta_i, one pair at a time: the paper's kept pairs int(p * d // 2), the highest
  frequencies first, keep base^(-2i/d) (divided by a linear-interpolation factor); the rest 0."""
  kept = math.floor(p * d / 2 + 1e-9)
  return np.array([base ** (-2 * i / d) / divide if i < kept else 0.0 for i in range(d // 2)])


# ---------------------------------------------------------------------------------------- p-RoPE


@pytest.mark.parametrize('d', [8, 16, 64])
@pytest.mark.parametrize('p', [0.0, 0.25, 0.5, 0.75, 0.8, 1.0])
def test_frequencies_keep_the_highest_fraction_p_of_the_pairs(d, p):
  got = rope.inv_frequencies(d, rope.RopeConfig(p=p))
  np.testing.assert_allclose(got, numpy_frequencies(d, p), rtol=1e-6)
  # with a frequency scaling the kept pairs are scaled and the others stay at zero
  linear = rope.inv_frequencies(d, rope.RopeConfig(p=p, scaling='linear', scaling_factor=4.0))
  np.testing.assert_allclose(linear, numpy_frequencies(d, p, divide=4.0), rtol=1e-6)


@pytest.mark.parametrize('p, want', [
    (1.0, [-0.30116868, 0.89517075, 1.3817732, 1.0948375]),
    (0.5, [-0.30116868, 1.0, 1.3817732, 1.0]),
])
def test_matches_the_values_of_gemmas_proportional_rope_test(p, want):
  """The expected outputs of google-deepmind/gemma gemma/gm/math/_positional_embeddings_test.py
  (ones [1, 1, 1, 4] at position 1, base 100, its half-split pairs)."""
  got = rope.apply_rotary(jnp.ones((1, 1, 1, 4)), jnp.asarray([[1]]), base=100.0, layout='half',
                          p=p)
  np.testing.assert_allclose(np.asarray(got)[0, 0, 0], want, atol=1e-6)


@pytest.mark.parametrize('layout', rope.LAYOUTS)
def test_p_one_is_rope_and_p_zero_no_rotation_exactly(layout):
  x = jax.random.normal(jax.random.key(0), (2, 12, 3, 16))
  positions = jnp.broadcast_to(jnp.arange(12) * 37, (2, 12))
  plain = rope.apply_rotary(x, positions, layout=layout)
  np.testing.assert_array_equal(rope.apply_rotary(x, positions, layout=layout, p=1.0), plain)
  np.testing.assert_array_equal(rope.apply_rotary(x, positions, layout=layout, p=0.0), x)


def test_p_is_not_rotary_dim():
  """Both leave part of a 16-feature head unrotated, but rope.rotary_dim=8 lays the whole
  spectrum base^(-2i/8) over features 0-7 (its lowest pair turns at 10000^(-3/4)), while p=0.5
  keeps the head's own base^(-2i/16) on its 4 fastest pairs (the slowest rotated one at
  10000^(-3/8)) and sets the 4 slowest pairs to zero: every feature keeps its pair's theta_i."""
  half_head = rope.inv_frequencies(8)  # what rotary_dim=8 uses
  prope = rope.inv_frequencies(16, rope.RopeConfig(p=0.5))
  np.testing.assert_allclose(half_head, [10000.0 ** (-k / 4) for k in range(4)], rtol=1e-6)
  np.testing.assert_allclose(prope[:4], [10000.0 ** (-k / 8) for k in range(4)], rtol=1e-6)
  assert not np.any(prope[4:])
  x = jax.random.normal(jax.random.key(1), (1, 1, 1, 16))
  at = jnp.asarray([[5]])
  for layout, unrotated in (('interleaved', np.arange(8, 16)),
                            ('half', np.r_[4:8, 12:16])):  # the pairs (i, i + 8), i = 4 .. 7
    partial = np.asarray(rope.apply_rotary(x, at, layout=layout, rotary_dim=8))[0, 0, 0]
    p_rope = np.asarray(rope.apply_rotary(x, at, layout=layout, p=0.5))[0, 0, 0]
    changed = np.flatnonzero(p_rope != np.asarray(x)[0, 0, 0])
    assert set(changed).isdisjoint(unrotated) and len(changed) == 8, layout
    np.testing.assert_array_equal(partial[8:], np.asarray(x)[0, 0, 0, 8:])
    assert not np.allclose(partial, p_rope)


def test_p_composes_with_rotary_dim_and_the_layouts():
  """p counts the pairs of the rotary_dim rotated features; converting the features to the other
  layout gives the same query-key products, as for RoPE."""
  positions = jnp.asarray([[0, 4, 9, 30]])
  tables = rope.Rotary(head_dim=16, rotary_dim=8, p=0.5).tables(positions)
  np.testing.assert_allclose(tables.sin[..., :2], rope.Rotary(head_dim=16, rotary_dim=8).tables(
      positions).sin[..., :2], rtol=1e-6)
  assert not np.any(tables.sin[..., 2:]) and np.all(tables.cos[..., 2:] == 1.0)
  q, k = jax.random.normal(jax.random.key(3), (2, 1, 4, 1, 16))
  to_half = rope.layout_permutation(16, src='interleaved', dst='half')

  def products(q, k, layout):
    rq, rk = (rope.apply_rotary(x, positions, p=0.5, layout=layout) for x in (q, k))
    return np.asarray(jnp.einsum('blhd,bshd->bhls', rq, rk))

  np.testing.assert_allclose(products(q[..., to_half], k[..., to_half], 'half'),
                             products(q, k, 'interleaved'), atol=1e-5)


@pytest.mark.parametrize('p', [0.25, 0.5, 0.75])
def test_query_key_products_depend_on_the_distance_only(p):
  q, k = jax.random.normal(jax.random.key(2), (2, 1, 8, 2, 16))
  positions = jnp.asarray([[0, 3, 9, 10, 31, 40, 41, 63]])

  def logits_at(offset):
    rq = rope.apply_rotary(q, positions + offset, p=p)
    rk = rope.apply_rotary(k, positions + offset, p=p)
    return np.asarray(jnp.einsum('blhd,bshd->bhls', rq, rk))

  np.testing.assert_allclose(logits_at(0), logits_at(1000), atol=2e-4)


def test_p_zero_model_is_the_model_without_positions():
  positions = np.broadcast_to(np.arange(10), (2, 10))
  none = logits(make_cfg(position='none'), positions)
  np.testing.assert_allclose(logits(make_cfg(**{'rope.p': 0.0}), positions), none, atol=1e-6)
  assert not np.allclose(logits(make_cfg(**{'rope.p': 0.5}), positions), none, atol=1e-4)


@pytest.mark.parametrize('overrides, phrase', [
    ({'rope.p': 1.5}, r'rope.p must be in \[0, 1\]'),
    ({'rope.p': float('nan')}, r'rope.p must be in \[0, 1\]'),
    ({'rope.p': 0.5, 'rope.xpos': True, 'train.task': 'clm'}, 'rope.xpos=True'),
    ({'rope.p': 0.5, 'position': 'alibi'}, 'rope.p only applies to model.position=rotary'),
])
def test_p_refusals_name_the_fields(overrides, phrase):
  with pytest.raises(ValueError, match=phrase):
    make_cfg(**overrides)


# ------------------------------------------------------------------------------- hybrids


@pytest.mark.parametrize('position', PER_LAYER)
def test_a_nope_layer_sees_no_positions(position):
  """A 1-layer model whose layer is NoPE ignores the positions entirely (shifted, reversed,
  repeated) and is the model without positions: same shared weights, same logits."""
  cfg = make_cfg(position=position, num_layers=1, nope_layers='0')
  ordered = np.broadcast_to(np.arange(10), (2, 10))
  base = logits(cfg, ordered)
  for positions in (ordered + 7, ordered[:, ::-1], np.zeros((2, 10), int)):
    np.testing.assert_allclose(logits(cfg, positions), base, atol=1e-6)
  np.testing.assert_allclose(logits(make_cfg(position='none', num_layers=1), ordered), base,
                             atol=1e-6)
  scheme = make_cfg(position=position, num_layers=1)
  assert not np.allclose(logits(scheme, ordered[:, [3, 0, 7, 1, 9, 2, 5, 8, 4, 6]]),
                         logits(scheme, ordered), atol=1e-4)


@pytest.mark.parametrize('position', PER_LAYER)
def test_the_other_layers_keep_the_scheme(position):
  """Layers 0 and 2 of 3 get the scheme's hooks (Shaw's tables drawn for them only), layer 1
  none; the model still reads the order and a relative scheme stays shift-invariant."""
  cfg = make_cfg(position=position, num_layers=3, nope_layers='1')
  model = nnx.merge(*models.init(cfg, jax.random.key(0, impl='rbg')))
  hooks = [type(layer.attention.positions) for layer in model.layers]
  assert hooks[1] is encoder.NoPositionHooks
  assert hooks[0] is hooks[2] is SCHEME_HOOKS[position]
  if position == 'shaw':
    tables = [layer.attention.positions for layer in model.layers]
    assert [hasattr(t, 'key_table') for t in tables] == [True, False, True]
  ordered = np.broadcast_to(np.arange(10), (2, 10))
  base = logits(cfg, ordered)
  np.testing.assert_allclose(logits(cfg, ordered + 50), base, atol=1e-5)
  shuffled = ordered[:, [3, 0, 7, 1, 9, 2, 5, 8, 4, 6]]  # ALiBi's |i - j| ignores a reversal
  assert not np.allclose(logits(cfg, shuffled), base, atol=1e-4)


def test_chunked_attention_and_causal_masks_agree_with_a_hybrid():
  """ALiBi shares its bias through the context; its NoPE layer takes none, per block too."""
  ordered = np.broadcast_to(np.arange(12), (2, 12))
  common = dict(position='alibi', num_layers=2, nope_layers='0', **{'train.task': 'clm'})
  explicit = logits(make_cfg(attention_impl='explicit', **common), ordered)
  chunked = logits(make_cfg(attention_impl='chunked', attention_chunk_size=4, **common), ordered)
  np.testing.assert_allclose(chunked, explicit, atol=1e-5)
  ids = np.random.default_rng(1).integers(1, VOCAB, size=(2, 12))
  changed = ids.copy()
  changed[:, 8:] = (changed[:, 8:] % (VOCAB - 1)) + 1  # later tokens only
  cfg = make_cfg(attention_impl='explicit', **common)
  np.testing.assert_allclose(logits(cfg, ordered, jnp.asarray(changed))[:, :8],
                             logits(cfg, ordered, jnp.asarray(ids))[:, :8], atol=1e-6)


def test_interval_follows_llama4_and_smollm3():
  """transformers' default no_rope_layers (Llama4TextConfig, SmolLM3Config) is
  int((i + 1) % no_rope_layer_interval != 0) per layer, 1 meaning RoPE: 0 marks the NoPE ones."""
  hf_mask = [int((i + 1) % 4 != 0) for i in range(8)]
  cfg = make_cfg(num_layers=8, nope_interval=4)
  assert cfg.position_free_layers == tuple(i for i, uses in enumerate(hf_mask) if not uses)
  assert cfg.position_free_layers == make_cfg(num_layers=8, nope_layers='7,3').position_free_layers


@pytest.mark.parametrize('overrides, phrase', [
    ({'nope_layers': '2'}, r'model.nope_layers=2 must name distinct layers 0 \.\. 1'),
    ({'nope_layers': '-1'}, 'model.nope_layers=-1 must name distinct layers'),
    ({'nope_interval': -2}, 'model.nope_interval must be >= 0'),
    ({'nope_interval': 3}, r'model.nope_interval=3 makes no layer of the 2 NoPE'),
    ({'nope_interval': 2, 'nope_layers': '0'}, 'set one of them'),
    ({'nope_layers': '0', 'position': 'sinusoidal'},
     "model.position='sinusoidal' has none: it adds positions to the embeddings"),
    ({'nope_layers': '0', 'position': 'learned'}, 'valid choices are: .*rotary'),
    ({'nope_layers': '0', 'position': 'none'}, "model.position='none' has none"),
])
def test_hybrid_refusals_name_the_field(overrides, phrase):
  with pytest.raises(ValueError, match=phrase):
    make_cfg(**overrides)


def test_a_layer_given_twice_is_refused():
  with pytest.raises(ValueError, match='more than once'):
    make_cfg(nope_layers='1,1')
  with pytest.raises(ValueError, match='must name distinct layers'):  # typed, past the CLI
    make_cfg().replace(nope_layers=(1, 1))
  assert make_cfg().replace(nope_layers=[1]).nope_layers == (1,)  # a saved JSON list: hashable


@pytest.mark.parametrize('overrides, field', [
    ({'nope_layers': '1'}, 'model.nope_layers'),
    ({'nope_interval': 2}, 'model.nope_interval'),
    ({'rope.p': 0.75}, 'rope.p'),
])
def test_hugging_face_export_refuses_by_name(overrides, field):
  """transformers' RoFormer rotates in every layer at every frequency (RoFormerConfig has no
  per-layer or partial switch): a ValueError, so the CLI exits with status 2."""
  with pytest.raises(ValueError, match=f'cannot express this model: {field}='):
    export.check_exportable(make_cfg(**overrides))


def test_the_export_script_refuses_a_hybrid_as_a_user_error(tmp_path):
  """scripts/export_hf.py on a run with NoPE layers exits with status 2 naming the field, before
  it reads a parameter (the run has none here) or writes anything."""
  workdir, out = tmp_path / 'run', tmp_path / 'hf'
  storage.makedirs(str(workdir))
  run = settings.replace(config_lib.RunConfig(), {'model.nope_layers': (1,)})
  storage.write_json(str(workdir / 'config.json'), settings.to_dict(run))
  datasets.save_info(datasets.DatasetInfo(
      name='files', num_classes=2, class_names=('a', 'b'), vocab_size=VOCAB, train_length=16,
      eval_splits={}, num_train_examples=1), str(workdir))
  proc = entry.run(['scripts/export_hf.py', f'--workdir={workdir}', f'--out={out}'])
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert 'cannot express this model: model.nope_layers=(1,)' in proc.stderr
  assert not out.exists()


# ------------------------------------------------------------------------------- roles


def test_the_new_fields_reach_the_derived_sets():
  new = {'model.nope_layers', 'model.nope_interval', 'rope.p'}
  assert new <= set(config_lib.RESULT_FIELDS) and new <= set(config_lib.FIXED_ON_RESUME)
  assert not new & set(config_lib.EVALUATION_FIELDS)
  assert new & set(config_lib.PARAMETER_FIELDS) == {'model.nope_layers', 'model.nope_interval'}
  assert new <= set(init_from._CHECKPOINT_FIELDS)  # pylint: disable=protected-access
  with pytest.raises(ValueError, match='rope.p cannot change at evaluation'):
    evaluation.parse_overrides(['rope.p=0.5'])
  flags = config_lib.defaults()
  assert flags.model.nope_layers == '' and flags.model.nope_interval == 0 and flags.rope.p == 1.0
  flags.model.nope_layers = '1, 0'
  run = config_lib.run_config(flags)
  assert run.model.nope_layers == (1, 0)
  assert config_lib.run_config(json.loads(json.dumps(settings.to_dict(run)))) == run


@pytest.mark.parametrize('source_kind', ['workdir', 'huggingface'])
def test_init_from_refuses_a_source_with_other_nope_layers(tmp_path, source_kind):
  source = str(tmp_path / 'source')
  storage.makedirs(source)
  if source_kind == 'workdir':
    saved = settings.to_dict(config_lib.RunConfig())
  else:
    saved = {'model_type': 'roformer', 'hidden_size': 64, 'num_attention_heads': 4,
             'num_hidden_layers': 2, 'intermediate_size': 128, 'type_vocab_size': 0}
  storage.write_json(f'{source}/config.json', saved)
  run = settings.replace(config_lib.RunConfig(), {
      'train.init_from': source, 'model.nope_layers': (1,)})
  with pytest.raises(init_from.InitFromError,
                     match=r'model.nope_layers \(\(\) there, \(1,\) here\).*nope_layers=\.'):
    init_from.check_source(run)
