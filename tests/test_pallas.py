"""The Pallas TPU kernels (``model.attention_impl`` splash and pallas_flash) against the
written-out softmax: here on CPU they run in Pallas's TPU interpret mode, so these tests check
the masks, scale, padding and layout around the kernels, not their speed."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
import rope
from models import positions as positions_lib
from models.attention import Visibility, pallas_attention, softmax_attention
from tests.test_language_model import lm_cfg
from tests.test_models import batch, key_for, make_cfg

KERNELS = ('splash', 'pallas_flash')
BATCH, LENGTH, HEADS, HEAD_DIM = 2, 20, 2, 16  # lengths padded to the kernels' 128 inside
ATOL = 1e-5  # float32; measured differences are ~1e-6 (different summation order)


def _inputs(seed: int = 0, head_dim: int = HEAD_DIM):
  """q, k, v [batch, length, heads, head_dim], rotated by RoPE (the model's main scheme), and
  the positions."""
  keys = jax.random.split(jax.random.key(seed), 3)
  q, k, v = (jax.random.normal(key, (BATCH, LENGTH, HEADS, head_dim)) for key in keys)
  positions = jnp.broadcast_to(jnp.arange(LENGTH), (BATCH, LENGTH))
  rotary = rope.Rotary(head_dim=head_dim)
  tables = rotary.tables(positions)
  return rotary.apply(q, tables, role='query'), rotary.apply(k, tables, role='key'), v, positions


def _padding() -> Visibility:
  """Row 0 all real, row 1 ending in 7 padding tokens."""
  return Visibility(jnp.arange(LENGTH)[None] < jnp.asarray([[LENGTH], [LENGTH - 7]]))


def _packed() -> Visibility:
  """Documents 1 and 2 packed in each row (as data/lm.py numbers them), row 1 padded (0)."""
  visibility = _padding()
  segments = jnp.where(visibility.mask_BxL, 1 + (jnp.arange(LENGTH)[None] >= 8), 0)
  return visibility._replace(segments_BxL=segments.astype(jnp.int32))


def _compare(kernel: str, visibility: Visibility, causal: bool, bias=None, rows=None, **inputs):
  """Max |kernel - explicit| over outputs and the gradients of a scalar loss w.r.t. q, k, v
  (and the bias); ``rows`` (bool [batch, length]): the queries compared and in the loss."""
  q, k, v, _ = _inputs(**inputs)
  rows = jnp.ones((BATCH, LENGTH), bool) if rows is None else rows
  weights = jnp.cos(jnp.arange(v.shape[-1])) * rows[..., None, None]

  def loss(attend, q, k, v, bias):
    out = attend(q, k, v, bias)
    return jnp.sum(out * weights), out

  explicit = lambda q, k, v, bias: softmax_attention(q, k, v, bias, visibility.dense(causal))
  pallas = lambda q, k, v, bias: pallas_attention(q, k, v, visibility, kernel=kernel,
                                                  causal=causal, bias=bias)
  argnums = (1, 2, 3) if bias is None else (1, 2, 3, 4)
  grad = lambda attend: jax.grad(loss, argnums, has_aux=True)(attend, q, k, v, bias)
  (grads, out), (grads_ref, out_ref) = jax.jit(grad, static_argnums=0)(pallas), grad(explicit)
  assert np.isfinite(out).all() and out.dtype == out_ref.dtype
  diffs = [float(jnp.max(jnp.abs(out - out_ref) * rows[..., None, None]))]
  diffs += [float(jnp.max(jnp.abs(g - g_ref))) for g, g_ref in zip(grads, grads_ref)]
  assert max(diffs) < ATOL, diffs
  return diffs


@pytest.mark.parametrize('kernel', KERNELS)
def test_padding_bidirectional_rotary_matches_explicit(kernel):
  """Every query, padded ones included, sees the same keys as in 'explicit' (the real ones)."""
  _compare(kernel, _padding(), causal=False)


@pytest.mark.parametrize('kernel', KERNELS)
def test_causal_packed_matches_explicit(kernel):
  """Causal attention within each packed document; the real queries are compared (padding in
  a packed row sees no key: its output is unspecified but finite)."""
  visibility = _packed()
  _compare(kernel, visibility, causal=True, rows=visibility.mask_BxL)


@pytest.mark.parametrize('causal', [False, True], ids=['bidirectional', 'causal'])
@pytest.mark.parametrize('position', ['alibi', 't5'])
def test_flash_bias_matches_explicit(position, causal):
  """pallas_flash adds ALiBi's or T5's bias (broadcast over the batch) exactly; the bias's
  gradient (T5's learned table) comes from the kernel's backward pass."""
  relative = positions_lib.relative_positions(_inputs()[3])
  if position == 'alibi':
    bias = positions_lib.alibi_bias(jnp.asarray(positions_lib.alibi_slopes(HEADS)), relative)
  else:
    table = jax.random.normal(jax.random.key(1), (8, HEADS))
    bias = positions_lib.t5_bias(table, relative, 8, 16, bidirectional=not causal)
  visibility = _packed() if causal else _padding()
  _compare('pallas_flash', visibility, causal, bias=bias[:1], rows=visibility.mask_BxL)


def test_flash_pads_a_wide_head_dim():
  """flash_attention takes a head_dim up to 128 or a multiple of it; 144 is padded with zeros."""
  _compare('pallas_flash', _padding(), causal=False, head_dim=144)


def test_splash_refuses_a_bias():
  q, k, v, _ = _inputs()
  with pytest.raises(ValueError, match='pallas_flash'):
    pallas_attention(q, k, v, _padding(), kernel='splash', causal=False,
                     bias=jnp.zeros((1, HEADS, LENGTH, LENGTH)))


# ------------------------------------------------------------------ the whole model


def _model_parity(cfg, kernel: str, *inputs, segments=None, rows=None):
  """Max |kernel - explicit| over a tiny model's logits (at ``rows``) and the parameter
  gradients of a loss on them (same parameters)."""
  pallas = cfg.replace(attention_impl=kernel)
  graphdef, params = models.init(cfg, key_for(0))
  kwargs = {} if segments is None else {'segments_BxL': segments}

  def loss(cfg, params):
    graphdef = jax.eval_shape(functools.partial(models.init, cfg), key_for(0))[0]
    logits = nnx.merge(graphdef, params)(*inputs, **kwargs)
    if rows is not None:
      logits = logits * rows[..., None]
    return jnp.sum(jnp.sin(logits)), logits

  grad = lambda cfg: jax.grad(loss, 1, has_aux=True)(cfg, params)
  (grads, logits), (grads_ref, logits_ref) = jax.jit(grad, static_argnums=0)(pallas), grad(cfg)
  np.testing.assert_allclose(logits, logits_ref, atol=ATOL, rtol=0)
  # The gradients of the embeddings and the LM head sum over many positions: relative too.
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=ATOL, rtol=1e-4),
               grads, grads_ref)
  return [float(jnp.max(jnp.abs(logits - logits_ref)))] + [
      max(float(jnp.max(jnp.abs(g - r)))
          for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)))]


@pytest.mark.parametrize('kernel,overrides', [
    ('splash', {'position': 'rotary'}),  # CLS pooling: the last layer has one query
    ('splash', {'position': 'learned', 'pooling': 'mean', 'remat': True}),
    ('pallas_flash', {'position': 'alibi', 'pooling': 'mean', 'remat': True}),
    ('pallas_flash', {'position': 't5'}),
    ('pallas_flash', {'position': 'shaw'}),
], ids=lambda x: x if isinstance(x, str) else x['position'])
def test_classifier_matches_explicit(kernel, overrides):
  """Logits and parameter gradients; with model.remat the interpreted kernels must be
  effect-free (jax.checkpoint refuses TPU interpret mode's callbacks)."""
  ids, positions, mask = batch(length=11, pad=3, offset=5)
  _model_parity(make_cfg(**overrides), kernel, ids, positions, mask)


@pytest.mark.parametrize('kernel,position', [('splash', 'rotary'), ('pallas_flash', 't5')])
def test_packed_causal_lm_matches_explicit(kernel, position):
  """A causal LM on two packed documents and padding: the same logits at real tokens."""
  ids = jnp.asarray(np.random.default_rng(0).integers(4, 40, size=(2, 12)))
  mask = jnp.arange(12)[None] < jnp.asarray([[12], [9]])
  segments = jnp.where(mask, 1 + (jnp.arange(12)[None] >= 5), 0).astype(jnp.int32)
  positions = jnp.broadcast_to(jnp.where(jnp.arange(12) >= 5, jnp.arange(12) - 5, jnp.arange(12)),
                               (2, 12))
  _model_parity(lm_cfg('clm', position), kernel, ids, positions, mask, segments=segments,
                rows=mask)


# ------------------------------------------------------------------ what the config refuses


@pytest.mark.parametrize('position', ['alibi', 't5', 'shaw'])
def test_splash_refuses_bias_schemes_by_name(position):
  with pytest.raises(ValueError, match=f"position='{position}'.*splash.*pallas_flash"):
    make_cfg(position=position, attention_impl='splash')


@pytest.mark.parametrize('overrides, message', [
    ({'position': 'shaw', 'shaw_values': True}, "position='shaw'.*shaw_values.*pallas_flash"),
    ({'attention_dropout_rate': 0.1}, 'attention_dropout_rate.*pallas_flash'),
    ({'attention': 'linear'}, 'pallas_flash.*model.attention=linear'),
])
def test_pallas_flash_refusals(overrides, message):
  with pytest.raises(ValueError, match=message):
    make_cfg(attention_impl='pallas_flash', **overrides)


def test_splash_accepts_the_schemes_on_queries_keys_and_embeddings():
  for position in models.config.PALLAS_SCHEMES['splash']:
    make_cfg(position=position, attention_impl='splash')
  make_cfg(position='rotary', attention_impl='splash', **{'rope.rotary_value': True})


def test_pallas_support_is_read_from_the_scheme(monkeypatch):
  """Each scheme declares the kernels that compute it (``pallas_kernels``); the config asks it."""
  assert models.config.PALLAS_SCHEMES == {
      'splash': ('none', 'sinusoidal', 'learned', 'rotary'),
      'pallas_flash': ('none', 'sinusoidal', 'learned', 'shaw', 't5', 'alibi', 'rotary')}
  monkeypatch.setattr(positions_lib.ALiBi, 'pallas_kernels', ('splash', 'pallas_flash'))
  make_cfg(position='alibi', attention_impl='splash')
  monkeypatch.setattr(positions_lib.Rotary, 'pallas_kernels', ('pallas_flash',))
  with pytest.raises(ValueError, match=(
      r"'rotary' cannot run on model.attention_impl=splash \(.*\): with splash valid choices "
      r"are: none, sinusoidal, learned, alibi\. For 'rotary' use "
      r'model.attention_impl=pallas_flash, explicit, xla or chunked\.')):
    make_cfg(position='rotary', attention_impl='splash')


def test_pallas_on_several_devices_is_refused():
  """The kernels are not wrapped in shard_map: a mesh of several devices is refused by name."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  code = ('from configs import tiny; from training import validation; c = tiny.get_config(); '
          "c.model.attention_impl = 'splash'; validation.check_devices(c)")
  proc = subprocess.run([sys.executable, '-c', code], cwd=root, capture_output=True, text=True,
                        env=dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=2',
                                 JAX_PLATFORMS='cpu'), timeout=300)
  assert proc.returncode != 0 and 'runs on one device only' in proc.stderr, proc.stderr[-2000:]
