"""Language models (issue 15): the causal mask under every scheme, packed documents kept apart,
causal and packed linear attention against the quadratic form, the tied MLM head."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
import rope
from configs.default import get_config
from tests.test_models import COMBOS, VOCAB, combo_id, key_for

LENGTH = 12


def lm_cfg(task: str, position: str, attention: str = 'softmax', **overrides):
  config = get_config()
  config.update_from_flattened_dict({k if '.' in k else f'model.{k}': v
                                     for k, v in overrides.items()})
  config.model.position, config.model.attention = position, attention
  return models.ModelConfig(**config.model, rope=rope.RopeConfig(**config.rope), task=task,
                            vocab_size=VOCAB, num_classes=1, deterministic=True)


def lm_model(cfg):
  graphdef, params = models.init(cfg, key_for(0))
  return nnx.merge(graphdef, params)


def tokens(seed: int = 0):
  ids = np.random.default_rng(seed).integers(4, VOCAB, size=(2, LENGTH))
  positions = np.broadcast_to(np.arange(LENGTH), (2, LENGTH))
  return jnp.asarray(ids), jnp.asarray(positions), jnp.ones((2, LENGTH), bool)


CAUSAL_CASES = [c + ('explicit',) for c in COMBOS] + [
    (p, 'softmax', 'chunked') for p in ('t5', 'alibi', 'rotary', 'shaw')] + [
    ('rotary', 'softmax', 'xla'), ('alibi', 'softmax', 'xla')]


@pytest.mark.parametrize('case', CAUSAL_CASES, ids=combo_id)
def test_causal_mask_later_tokens_change_no_earlier_output(case):
  position, attention, impl = case
  cfg = lm_cfg('clm', position, attention, attention_impl=impl, attention_chunk_size=4)
  model = lm_model(cfg)
  ids, positions, mask = tokens()
  changed = ids.at[:, 7:].set((ids[:, 7:] + 5) % VOCAB)
  before = model(ids, positions, mask)
  after = model(changed, positions, mask)
  assert before.shape == (2, LENGTH, VOCAB)
  np.testing.assert_allclose(before[:, :7], after[:, :7], atol=1e-5)
  assert not np.allclose(before[:, 7:], after[:, 7:], atol=1e-4)


def test_mlm_is_bidirectional():
  model = lm_model(lm_cfg('mlm', 'rotary'))
  ids, positions, mask = tokens()
  before = model(ids, positions, mask)
  after = model(ids.at[:, -1].set(5), positions, mask)
  assert not np.allclose(before[:, 0], after[:, 0], atol=1e-4)


PACKED_CASES = [c + (task, 'explicit') for c in COMBOS for task in ('mlm', 'clm')] + [
    (p, 'softmax', task, impl) for p in ('t5', 'rotary') for task in ('mlm', 'clm')
    for impl in ('chunked', 'xla')]


@pytest.mark.parametrize('case', PACKED_CASES, ids=combo_id)
def test_packed_documents_never_attend_to_each_other(case):
  """Two documents packed in one row give exactly what each gives alone (positions restart),
  and perturbing the second document's tokens leaves the first's hidden states unchanged."""
  position, attention, task, impl = case
  model = lm_model(lm_cfg(task, position, attention, attention_impl=impl,
                          attention_chunk_size=4))
  ids = tokens()[0][:1]
  first = 5
  positions = jnp.asarray(np.r_[np.arange(first), np.arange(LENGTH - first)])[None]
  segments = jnp.asarray(np.r_[np.ones(first, int), np.full(LENGTH - first, 2)])[None]
  mask = jnp.ones_like(ids, bool)
  packed = model(ids, positions, mask, segments_BxL=segments)
  alone_1 = model(ids[:, :first], positions[:, :first], mask[:, :first])
  alone_2 = model(ids[:, first:], positions[:, first:], mask[:, first:])
  np.testing.assert_allclose(packed[:, :first], alone_1, atol=2e-5)
  np.testing.assert_allclose(packed[:, first:], alone_2, atol=2e-5)
  other = ids.at[:, first:].set((ids[:, first:] + 3) % VOCAB)
  np.testing.assert_allclose(model.encode(other, positions, mask, segments_BxL=segments)[:, :first],
                             model.encode(ids, positions, mask, segments_BxL=segments)[:, :first],
                             atol=1e-6)


def quadratic_linear_attention(q, k, v, causal, segments, rotary, tables):
  """Eq. 19 written out per query: sum over its visible keys."""
  phi = lambda x: jax.nn.elu(x) + 1.0
  pq, pk = phi(q), phi(k)
  rq, rk = rotary.apply(pq, tables, role='query'), rotary.apply(pk, tables, role='key')
  length = q.shape[1]
  visible = np.ones((q.shape[0], length, length), bool)
  if causal:
    visible &= np.tril(np.ones((length, length), bool))
  if segments is not None:
    visible &= np.asarray(segments)[:, :, None] == np.asarray(segments)[:, None, :]
  numerator = jnp.einsum('BTHD,BSHD,BTS,BSHU->BTHU', rq, rk, visible, v)
  normaliser = jnp.einsum('BTHD,BSHD,BTS->BTH', pq, pk, visible)
  return numerator / (normaliser[..., None] + 1e-6)


@pytest.mark.parametrize('causal,packed', [(True, False), (True, True), (False, True)])
def test_causal_and_packed_linear_attention_match_the_quadratic_form(causal, packed):
  keys = jax.random.split(jax.random.key(0), 3)
  q, k = (jax.random.normal(key, (2, 10, 2, 8)) for key in keys[:2])
  v = jax.random.normal(keys[2], (2, 10, 2, 6))
  rotary = rope.Rotary(head_dim=8)
  segments = jnp.asarray([[1] * 4 + [2] * 6, [1] * 7 + [2] * 2 + [3]]) if packed else None
  tables = rotary.tables(jnp.broadcast_to(jnp.arange(10), (2, 10)))
  fast = rope.linear_attention(q, k, v, causal=causal, segments=segments, rotary=rotary,
                               tables=tables)
  slow = quadratic_linear_attention(q, k, v, causal, segments, rotary, tables)
  np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-5)


def test_mlm_head_is_tied_and_predicts_at_the_given_positions():
  cfg = lm_cfg('mlm', 'rotary')
  model = lm_model(cfg)
  ids, positions, mask = tokens()
  full = model(ids, positions, mask)
  where = jnp.asarray([[3, 0], [11, 5]])
  chosen = model(ids, positions, mask, target_positions_BxM=where)
  np.testing.assert_allclose(chosen, jnp.take_along_axis(full, where[..., None], 1), atol=1e-6)
  params = nnx.state(model, nnx.Param)
  assert 'decoder' not in str(jax.tree_util.tree_structure(params))  # the output layer is tied
  assert params['head']['bias'].shape == (VOCAB,)


def test_xpos_needs_a_causal_model():
  with pytest.raises(ValueError, match='causal'):
    lm_cfg('mlm', 'rotary', **{'rope.xpos': True})
  model = lm_model(lm_cfg('clm', 'rotary', **{'rope.xpos': True}))
  assert np.isfinite(model(*tokens())).all()
