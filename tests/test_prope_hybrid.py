"""p-RoPE (``rope.p``, Barbero et al. 2025): the frequencies against numbers computed here and
the authors' test values, the limits p=1 (RoPE) and p=0 (NoPE), the difference from
``rope.rotary_dim``, the refusals, and the role of the new field."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
import rope
from configs.default import get_config
from interop import export
from training import config as config_lib
from training import evaluation
from training import init_from

VOCAB, CLASSES = 30, 3
SMALL = {'hidden_size': 16, 'num_heads': 2, 'mlp_dim': 32, 'init_std': 0.2}


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


@pytest.mark.parametrize('overrides, field', [
    ({'rope.p': 0.75}, 'rope.p'),
])
def test_hugging_face_export_refuses_by_name(overrides, field):
  """transformers' RoFormer rotates every pair (RoFormerConfig has no partial switch): a
  ValueError, so the CLI exits with status 2."""
  with pytest.raises(ValueError, match=f'cannot express this model: {field}='):
    export.check_exportable(make_cfg(**overrides))


# ------------------------------------------------------------------------------- roles


def test_p_reaches_the_derived_sets():
  assert 'rope.p' in config_lib.RESULT_FIELDS and 'rope.p' in config_lib.FIXED_ON_RESUME
  assert 'rope.p' not in config_lib.EVALUATION_FIELDS + config_lib.PARAMETER_FIELDS
  assert 'rope.p' in init_from._CHECKPOINT_FIELDS  # pylint: disable=protected-access
  with pytest.raises(ValueError, match='rope.p cannot change at evaluation'):
    evaluation.parse_overrides(['rope.p=0.5'])
