"""Property tests for rope/: the paper's claims checked, not assumed."""

import math

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rope

hypothesis.settings.register_profile('rope', deadline=None, max_examples=25)
hypothesis.settings.load_profile('rope')

dims = st.sampled_from([2, 4, 8, 16, 64])
bases = st.sampled_from([100.0, 10000.0, 500000.0])


def rotation_matrix(m: float, dim: int, base: float) -> np.ndarray:
  """Eq. 15's explicit block-diagonal R^d_{Theta,m}, in float64."""
  theta = base ** -(np.arange(0, dim, 2, dtype=np.float64) / dim)
  out = np.zeros((dim, dim))
  for i, t in enumerate(theta):
    c, s = math.cos(m * t), math.sin(m * t)
    out[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c, -s], [s, c]]
  return out


def rot(x, positions, **kw):
  """apply_rotary on a single vector/head: x [L, D], positions [L]."""
  return np.asarray(rope.apply_rotary(jnp.asarray(x)[:, None, :], jnp.asarray(positions), **kw))[:, 0]


def rng(seed=0):
  return np.random.default_rng(seed)


@hypothesis.given(d=dims, base=bases, m=st.integers(0, 5000), seed=st.integers(0, 100))
def test_equals_block_diagonal_matrix_eq15(d, base, m, seed):
  x = rng(seed).normal(size=d)
  want = rotation_matrix(m, d, base) @ x
  got = rot(x[None].astype(np.float32), [m], base=base)[0]
  # Angles are float32 (as specified): error grows like m * 2^-24.
  np.testing.assert_allclose(got, want, atol=1e-5 + 4e-7 * m * np.abs(x).max())


@hypothesis.given(d=dims, base=bases, m=st.integers(0, 1000), seed=st.integers(0, 100))
def test_equals_complex_form_eq12(d, base, m, seed):
  x = rng(seed).normal(size=d)
  theta = base ** -(np.arange(0, d, 2) / d)
  z = (x[0::2] + 1j * x[1::2]) * np.exp(1j * m * theta)
  want = np.stack([z.real, z.imag], -1).reshape(-1)
  got = rot(x[None].astype(np.float32), [m], base=base)[0]
  np.testing.assert_allclose(got, want, atol=2e-5 + 4e-7 * m * np.abs(x).max())


@pytest.mark.parametrize('layout', rope.LAYOUTS)
@hypothesis.given(d=dims, m=st.integers(0, 300), n=st.integers(0, 300), s=st.integers(-200, 200),
                  seed=st.integers(0, 100))
def test_relative_property(layout, d, m, n, s, seed):
  hypothesis.assume(m + s >= 0 and n + s >= 0)
  q, k = rng(seed).normal(size=(2, d)).astype(np.float32)
  qm, kn = rot(np.stack([q, k]), [m, n], layout=layout)
  qs, ks = rot(np.stack([q, k]), [m + s, n + s], layout=layout)
  q0, knm = rot(np.stack([q, k]), [0, n - m], layout=layout)
  np.testing.assert_allclose(qm @ kn, qs @ ks, atol=1e-4 * d)
  np.testing.assert_allclose(qm @ kn, q @ knm, atol=1e-4 * d)
  np.testing.assert_array_equal(q0, q)  # position 0 is the identity


@pytest.mark.parametrize('layout', rope.LAYOUTS)
def test_norm_preserved_and_composition(layout):
  x = rng(1).normal(size=(6, 32)).astype(np.float32)
  m = np.array([0, 1, 7, 100, 1000, 4095])
  y = rot(x, m, layout=layout)
  np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-6)
  # R_m then R_n equals R_{m+n}.
  n = np.array([3, 0, 50, 17, 24, 1])
  # float32 angles: about one ulp of m * theta_0 (~5e-4 rad at m = 4096).
  np.testing.assert_allclose(rot(y, n, layout=layout), rot(x, m + n, layout=layout), atol=1e-3)


def test_explicit_positions_offsets_packing_per_example():
  x = jnp.asarray(rng(2).normal(size=(2, 10, 3, 8)), jnp.float32)
  # Per-example positions and an offset.
  positions = jnp.stack([jnp.arange(10), jnp.arange(10) + 37])
  y = rope.apply_rotary(x, positions)
  np.testing.assert_allclose(y[1], rope.apply_rotary(x[1:], jnp.arange(10)[None] + 37)[0])
  # Packed: two segments restarting at 0 equal the two sequences rotated on their own.
  packed = jnp.concatenate([jnp.arange(4), jnp.arange(6)])[None]
  yp = rope.apply_rotary(x[:1], packed)
  np.testing.assert_allclose(yp[0, :4], rope.apply_rotary(x[:1, :4], jnp.arange(4)[None])[0])
  np.testing.assert_allclose(yp[0, 4:], rope.apply_rotary(x[:1, 4:], jnp.arange(6)[None])[0])
  # Float positions work (fractional positions, e.g. interpolation).
  yf = rope.apply_rotary(x, positions.astype(jnp.float32))
  np.testing.assert_allclose(yf, y, atol=1e-6)
  # Leading dims beyond batch.
  x5 = jnp.stack([x, x])
  np.testing.assert_allclose(rope.apply_rotary(x5, jnp.stack([positions] * 2))[1], y)


@hypothesis.given(d=st.sampled_from([4, 8, 16, 64]), rotary_frac=st.sampled_from([2, 4]),
                  heads=st.integers(1, 3), seed=st.integers(0, 100))
def test_layout_conversion_gives_identical_scores(d, rotary_frac, heads, seed):
  """Half layout with permuted q/k weights == interleaved layout: identical attention scores."""
  r = rng(seed)
  rotary_dim = max(2, d // rotary_frac // 2 * 2)
  embed, length = 12, 7
  x = r.normal(size=(1, length, embed)).astype(np.float32)
  wq, wk = r.normal(size=(2, embed, heads * d)).astype(np.float32)
  bq = r.normal(size=(heads * d,)).astype(np.float32)
  pos = jnp.arange(length)[None] * 13

  def scores(wq, bq, wk, layout):
    q = (x @ wq + bq).reshape(1, length, heads, d)
    k = (x @ wk).reshape(1, length, heads, d)
    q = rope.apply_rotary(q, pos, layout=layout, rotary_dim=rotary_dim)
    k = rope.apply_rotary(k, pos, layout=layout, rotary_dim=rotary_dim)
    return np.einsum('bqhd,bkhd->bhqk', q, k)

  conv = lambda w: rope.convert_qk_projection(w, head_dim=d, src='interleaved', dst='half',
                                              rotary_dim=rotary_dim)
  want = scores(wq, bq, wk, 'interleaved')
  np.testing.assert_allclose(scores(conv(wq), conv(bq), conv(wk), 'half'), want,
                             atol=1e-4, rtol=1e-5)
  # Without the permutation the scores differ (the porting bug this guards against); with a
  # single rotated pair the two layouts coincide.
  assert rotary_dim == 2 or not np.allclose(scores(wq, bq, wk, 'half'), want, atol=1e-3)
  # The permutation round-trips.
  back = rope.convert_qk_projection(conv(wq), head_dim=d, src='half', dst='interleaved',
                                    rotary_dim=rotary_dim)
  np.testing.assert_array_equal(back, wq)


def test_half_layout_matches_neox_formula():
  d = 8
  x = rng(3).normal(size=(1, d)).astype(np.float32)
  m = 5
  theta = 10000.0 ** -(np.arange(0, d, 2) / d)
  cos, sin = np.tile(np.cos(m * theta), 2), np.tile(np.sin(m * theta), 2)
  rotate_half = np.concatenate([-x[:, d // 2:], x[:, :d // 2]], -1)
  np.testing.assert_allclose(rot(x, [m], layout='half'), x * cos + rotate_half * sin, atol=1e-6)


@pytest.mark.parametrize('layout', rope.LAYOUTS)
def test_partial_rotary_passes_features_through_bit_identical(layout):
  x = jnp.asarray(rng(4).normal(size=(2, 9, 2, 16)), jnp.bfloat16)
  pos = jnp.arange(9)[None].repeat(2, 0) + 3
  y = rope.apply_rotary(x, pos, layout=layout, rotary_dim=6)
  np.testing.assert_array_equal(np.asarray(y[..., 6:]), np.asarray(x[..., 6:]))
  full = rope.apply_rotary(x[..., :6], pos, layout=layout)
  np.testing.assert_array_equal(np.asarray(y[..., :6]), np.asarray(full))


def test_jit_vmap_plain_agree_and_gradients_reach_x():
  x = jnp.asarray(rng(5).normal(size=(3, 11, 2, 8)), jnp.float32)
  pos = jnp.arange(11)[None].repeat(3, 0) * 7
  r = rope.Rotary(head_dim=8, layout='half', rotary_dim=4)
  plain = r.apply(x, r.tables(pos))
  jitted = jax.jit(lambda x, p: r.apply(x, r.tables(p)))(x, pos)
  vmapped = jax.vmap(lambda x, p: r.apply(x[None], r.tables(p[None]))[0])(x, pos)
  np.testing.assert_allclose(jitted, plain, atol=1e-6)
  np.testing.assert_allclose(vmapped, plain, atol=1e-6)
  np.testing.assert_allclose(rope.apply_rotary(x, pos, layout='half', rotary_dim=4), plain,
                             atol=1e-6)
  # Gradient of <g, R x> wrt x is R^T g = R_{-m} g: it reaches x, unchanged in norm.
  g = jnp.asarray(rng(6).normal(size=x.shape), jnp.float32)
  grad = jax.grad(lambda x: jnp.sum(rope.apply_rotary(x, pos) * g))(x)
  np.testing.assert_allclose(grad, rope.apply_rotary(g, -pos), atol=1e-5)


def test_shared_tables_equal_one_call_form():
  x = jnp.asarray(rng(7).normal(size=(2, 5, 4, 16)), jnp.float32)
  pos = jnp.arange(5)[None].repeat(2, 0)
  r = rope.Rotary(head_dim=16)
  tables = r.tables(pos)
  assert tables.sin.dtype == jnp.float32 and tables.sin.shape == (2, 5, 8)
  np.testing.assert_allclose(r.apply(x, tables, 'key'), rope.apply_rotary(x, pos), atol=1e-6)
  # apply_rotary_sincos with the tables directly.
  np.testing.assert_allclose(rope.apply_rotary_sincos(x, tables.sin, tables.cos),
                             rope.apply_rotary(x, pos), atol=1e-6)


def test_rotary_value_role_has_no_temperature_or_xpos():
  x = jnp.asarray(rng(8).normal(size=(1, 5, 1, 8)), jnp.float32)
  pos = jnp.arange(5)[None]
  yarn = dict(scaling='yarn', scaling_factor=4.0, original_max_length=16)
  r = rope.Rotary(head_dim=8, xpos=True, **yarn)
  tables = r.tables(pos)
  plain = rope.Rotary(head_dim=8, **yarn)
  np.testing.assert_allclose(r.apply(x, tables, 'value'),
                             plain.apply(x, plain.tables(pos), 'value'), atol=1e-6)


# ------------------------------------------------------------------- precision

def test_bf16_at_position_100000_matches_fp32_to_bf16_rounding():
  x32 = jnp.asarray(rng(9).normal(size=(1, 4, 2, 64)), jnp.float32)
  x16 = x32.astype(jnp.bfloat16)
  pos = jnp.array([[100000, 100001, 65537, 99999]])
  got = rope.apply_rotary(x16, pos)
  assert got.dtype == jnp.bfloat16
  want = rope.apply_rotary(x16.astype(jnp.float32), pos)  # fp32 computation, same inputs
  # One bf16 rounding of the result: relative error <= 2^-8 per element.
  err = np.abs(np.asarray(got, np.float32) - np.asarray(want))
  assert np.all(err <= 2 ** -8 * np.abs(np.asarray(want)) + 1e-6)
  # bf16 angles (the bug) would be far off: bf16 cannot even represent these positions.
  bf16_positions = np.asarray(jnp.asarray(pos, jnp.bfloat16), np.float32)
  assert np.any(bf16_positions != np.asarray(pos))


def test_int_and_float_positions_give_fp32_tables():
  r = rope.Rotary(head_dim=8)
  for p in (jnp.arange(4)[None], jnp.arange(4, dtype=jnp.bfloat16)[None]):
    assert r.tables(p).cos.dtype == jnp.float32


# ------------------------------------------------------------------- scaling

@pytest.mark.parametrize('kind', rope.SCALING_KINDS)
def test_scaling_variants_reduce_to_plain_rope_at_factor_1(kind):
  plain = rope.inv_frequencies(64)
  config = rope.RopeConfig(scaling=kind, scaling_factor=1.0, original_max_length=128)
  np.testing.assert_allclose(rope.inv_frequencies(64, config), plain, rtol=1e-7)
  assert config.attention_factor == 1.0


def test_linear_interpolation_at_s_times_m_equals_plain_at_m():
  x = jnp.asarray(rng(10).normal(size=(1, 6, 2, 16)), jnp.float32)
  m = jnp.array([[0, 1, 5, 10, 100, 333]])
  s = 4.0
  scaled = rope.apply_rotary(x, (m * s).astype(jnp.float32), scaling='linear',
                            scaling_factor=s)
  np.testing.assert_allclose(scaled, rope.apply_rotary(x, m), atol=1e-5)


def test_ntk_interpolates_lowest_frequency_by_s_and_keeps_highest():
  d, s = 64, 8.0
  plain = rope.inv_frequencies(d)
  ntk = rope.inv_frequencies(d, rope.RopeConfig(scaling='ntk', scaling_factor=s))
  assert ntk[0] == plain[0]
  np.testing.assert_allclose(ntk[-1], plain[-1] / s, rtol=1e-6)
  assert np.all(np.diff(ntk / plain) <= 1e-7)  # monotone interpolation


def test_yarn_reference_ramp_matches_hand_computed_frequencies():
  # d=16, L=512, base 10000, s=4: the correction dims are 16 ln(512 / (2 pi r)) / (2 ln 10000),
  # 0.8 for r=32 and 3.8 for r=1, rounded to 0 and 4: pairs 0..3 ramp over (i - 0) / 4.
  d, s = 16, 4.0
  plain = rope.inv_frequencies(d)
  yarn = rope.inv_frequencies(d, rope.RopeConfig(scaling='yarn', scaling_factor=s,
                                                 original_max_length=512))
  keep = np.array([1.0, 0.75, 0.5, 0.25, 0.0, 0.0, 0.0, 0.0])
  np.testing.assert_allclose(yarn, keep * plain + (1 - keep) * plain / s, rtol=1e-6)


def test_yarn_reference_ramp_matches_hugging_face():
  torch = pytest.importorskip('torch')
  rope_utils = pytest.importorskip('transformers.modeling_rope_utils')
  llama = pytest.importorskip('transformers').LlamaConfig
  for d, length, s in ((64, 512, 4.0), (128, 4096, 8.0), (32, 2048, 16.0)):
    hf = llama(hidden_size=d, num_attention_heads=1, rope_theta=10000.0,
               max_position_embeddings=int(length * s),
               rope_scaling={'rope_type': 'yarn', 'factor': s, 'beta_fast': 32, 'beta_slow': 1,
                             'original_max_position_embeddings': length})
    inv_freq, factor = rope_utils._compute_yarn_parameters(hf, torch.device('cpu'))
    ours = rope.RopeConfig(scaling='yarn', scaling_factor=s, original_max_length=length)
    np.testing.assert_allclose(rope.inv_frequencies(d, ours), inv_freq.numpy(), rtol=1e-6)
    assert ours.attention_factor == pytest.approx(factor)
  paper = rope.inv_frequencies(64, rope.RopeConfig(scaling='yarn', scaling_factor=4.0,
                                                   original_max_length=512, yarn_ramp='paper'))
  assert not np.allclose(paper, rope.inv_frequencies(64, rope.RopeConfig(
      scaling='yarn', scaling_factor=4.0, original_max_length=512)), rtol=1e-2)


def test_yarn_paper_ramp_by_parts_and_temperature():
  d, s, length = 64, 4.0, 512
  plain = rope.inv_frequencies(d)
  options = dict(scaling='yarn', scaling_factor=s, original_max_length=length,
                 yarn_beta_fast=32, yarn_beta_slow=1, yarn_ramp='paper')
  sc = rope.RopeConfig(**options)
  yarn = rope.inv_frequencies(d, sc)
  turns = length * plain / (2 * np.pi)
  np.testing.assert_allclose(yarn[turns > 32], plain[turns > 32], rtol=1e-7)
  np.testing.assert_allclose(yarn[turns < 1], plain[turns < 1] / s, rtol=1e-6)
  mid = (turns >= 1) & (turns <= 32)
  assert np.all((yarn[mid] <= plain[mid] + 1e-9) & (yarn[mid] >= plain[mid] / s - 1e-9))
  assert sc.attention_factor == pytest.approx(0.1 * math.log(s) + 1)
  # The temperature multiplies q and k (so the logits by its square), not values.
  r = rope.Rotary(head_dim=d, **options)
  x = jnp.ones((1, 1, 1, d))
  t = r.tables(jnp.zeros((1, 1)))
  np.testing.assert_allclose(r.apply(x, t, 'query'), x * sc.attention_factor, rtol=1e-6)
  np.testing.assert_allclose(r.apply(x, t, 'value'), x)


def test_llama3_scaling_regions():
  d, s, length = 128, 8.0, 8192
  sc = rope.RopeConfig(base=500000.0, scaling='llama3', scaling_factor=s,
                       original_max_length=length, llama3_low_freq_factor=1.0,
                       llama3_high_freq_factor=4.0)
  plain = rope.inv_frequencies(d, rope.RopeConfig(base=500000.0))
  got = rope.inv_frequencies(d, sc)
  wavelength = 2 * np.pi / plain
  high = wavelength < length / 4
  low = wavelength > length / 1
  np.testing.assert_allclose(got[high], plain[high], rtol=1e-7)
  np.testing.assert_allclose(got[low], plain[low] / s, rtol=1e-6)
  mid = ~high & ~low
  assert mid.any() and np.all((got[mid] < plain[mid]) & (got[mid] > plain[mid] / s))


def test_xpos_relative_decay_and_shift_invariance():
  d = 16
  r = rope.Rotary(head_dim=d, xpos=True, xpos_scale_base=64.0)
  q, k = rng(11).normal(size=(2, d)).astype(np.float32)

  def score(m, n):
    x = jnp.asarray(np.stack([q, k]))[None, :, None, :]
    pos = jnp.array([[m, n]])
    t = r.tables(pos)
    rq = r.apply(x, t, 'query')[0, 0, 0]
    rk = r.apply(x, t, 'key')[0, 1, 0]
    return float(rq @ rk)

  assert score(40, 10) == pytest.approx(score(70, 40), rel=1e-4, abs=1e-4)
  # With q = k the score at distance 0 is |q|^2 and decays with the distance.
  r0 = rope.Rotary(head_dim=d, xpos=True, xpos_scale_base=64.0)
  x = jnp.asarray(np.stack([q, q]))[None, :, None, :]
  t = r0.tables(jnp.array([[50, 50]]))
  assert float(r0.apply(x, t, 'query')[0, 0, 0] @ r0.apply(x, t, 'key')[0, 1, 0]) == \
      pytest.approx(float(q @ q), rel=1e-4)



def test_xpos_decays_before_the_query_and_grows_after_it():
  # q = k = ones: pair i scores 2 cos((m - n) theta_i) zeta_i^((m - n) / base) (closed form).
  d, scale_base = 16, 64.0
  r = rope.Rotary(head_dim=d, xpos=True, xpos_scale_base=scale_base)
  theta = 10000.0 ** -(np.arange(0, d, 2) / d)
  zeta = (np.arange(0, d, 2) / d + 0.4) / 1.4
  x = jnp.ones((1, 2, 1, d))

  def score(m, n):
    t = r.tables(jnp.array([[m, n]]))
    return float(r.apply(x, t, 'query')[0, 0, 0] @ r.apply(x, t, 'key')[0, 1, 0])

  for m, n in ((250, 50), (50, 250)):
    expected = np.sum(2 * np.cos((m - n) * theta) * zeta ** ((m - n) / scale_base))
    assert score(m, n) == pytest.approx(expected, rel=1e-3, abs=1e-3)
  plain = np.sum(2 * np.cos(200 * theta))
  assert abs(score(250, 50)) < abs(plain) < abs(score(50, 250))  # key before / after the query
  assert score(50, 250) == pytest.approx(117.0, abs=1.0)  # the figure, plain 10.4
  assert plain == pytest.approx(10.4, abs=0.1)



def test_linear_attention_refuses_unnormalised_scalings():
  x = jnp.ones((1, 4, 1, 8))
  for options in ({'xpos': True}, {'scaling': 'yarn', 'scaling_factor': 4.0}):
    r = rope.Rotary(head_dim=8, **options)
    with pytest.raises(ValueError, match='not be normalised'):
      rope.linear_attention(x, x, x, rotary=r, tables=r.tables(jnp.arange(4)[None]))

def test_dynamic_ntk_is_plain_up_to_the_original_length_then_ntk_at_the_run_length():
  d, s, length = 64, 4.0, 512
  config = rope.RopeConfig(scaling='dynamic_ntk', scaling_factor=s, original_max_length=length)
  plain = rope.inv_frequencies(d)
  np.testing.assert_array_equal(rope.inv_frequencies(d, config, length=100), plain)
  np.testing.assert_array_equal(rope.inv_frequencies(d, config, length=length), plain)
  # At 2L the factor is s * 2 - (s - 1) = 5: the NTK base 10000 * 5^(d / (d - 2)).
  base = 10000.0 * 5.0 ** (d / (d - 2))
  np.testing.assert_allclose(rope.inv_frequencies(d, config, length=2 * length),
                             base ** -(np.arange(0, d, 2) / d), rtol=1e-6)
  # The rotary tables follow the static sequence length.
  r = rope.Rotary(head_dim=d, scaling='dynamic_ntk', scaling_factor=s, original_max_length=4)
  t = r.tables(jnp.arange(8)[None])
  ntk = rope.inv_frequencies(d, rope.RopeConfig(scaling='ntk', scaling_factor=s * 2 - (s - 1)))
  np.testing.assert_allclose(t.sin[0, 3], np.sin(3 * ntk), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------- linear attention

def eq19_direct(q, k, v, mask, positions, phi=lambda x: np.where(x > 0, x + 1, np.exp(x))):
  """O(n^2) evaluation of eq. 19 per query, in float64."""
  b, length, h, d = q.shape
  out = np.zeros(v.shape)
  for bi in range(b):
    for hi in range(h):
      pq = phi(q[bi, :, hi].astype(np.float64))
      pk = phi(k[bi, :, hi].astype(np.float64))
      rq = np.stack([rotation_matrix(positions[bi, i], d, 10000.0) @ pq[i] for i in range(length)])
      rk = np.stack([rotation_matrix(positions[bi, j], d, 10000.0) @ pk[j] for j in range(length)])
      for i in range(length):
        num = sum(mask[bi, j] * (rq[i] @ rk[j]) * v[bi, j, hi] for j in range(length))
        den = sum(mask[bi, j] * (pq[i] @ pk[j]) for j in range(length))
        out[bi, i, hi] = num / den
  return out


def test_linear_attention_equals_direct_eq19():
  r = rng(12)
  b, length, h, d = 2, 6, 2, 8
  q, k, v = (r.normal(size=(b, length, h, d)).astype(np.float32) for _ in range(3))
  mask = np.array([[1] * 6, [1] * 4 + [0] * 2], np.float32)
  positions = np.stack([np.arange(length), np.arange(length) + 9])
  rotary = rope.Rotary(head_dim=d)
  got = rope.linear_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                              mask=jnp.asarray(mask), rotary=rotary,
                              tables=rotary.tables(jnp.asarray(positions)), eps=0.0)
  np.testing.assert_allclose(got, eq19_direct(q, k, v, mask, positions), rtol=2e-4, atol=2e-5)


def test_linear_attention_padding_does_not_change_real_tokens():
  r = rng(13)
  length, pad, h, d = 5, 4, 2, 8
  q, k, v = (r.normal(size=(1, length + pad, h, d)).astype(np.float32) for _ in range(3))
  positions = jnp.arange(length + pad)[None]
  rotary = rope.Rotary(head_dim=d)
  mask = jnp.asarray([[1] * length + [0] * pad])
  padded = rope.linear_attention(q, k, v, mask=mask, rotary=rotary, tables=rotary.tables(positions))
  short = rope.linear_attention(q[:, :length], k[:, :length], v[:, :length], rotary=rotary,
                                tables=rotary.tables(positions[:, :length]))
  np.testing.assert_allclose(padded[:, :length], short, atol=1e-5)


def test_linear_attention_without_rotary_and_bf16():
  q = jnp.ones((1, 3, 1, 4), jnp.bfloat16)
  v = jnp.arange(12, dtype=jnp.bfloat16).reshape(1, 3, 1, 4)
  out = rope.linear_attention(q, q, v)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out[0, 0, 0], np.float32), [4, 5, 6, 7], rtol=1e-2)


# ------------------------------------------------------------------- decay

def test_decay_bound_decreases_with_distance():
  distances = np.arange(0, 256)
  bound = rope.decay_bound(distances, head_dim=128)
  assert bound[0] == pytest.approx((128 / 2 + 1) / 2)  # |S_j| = j at distance 0
  windows = bound.reshape(8, 32).mean(axis=1)
  assert np.all(np.diff(windows) < 0)
  # Also for a scaling variant (decays more slowly, as it should).
  scaled = rope.decay_bound(distances, 128,
                           rope.RopeConfig(scaling='linear', scaling_factor=4.0))
  assert np.all(np.diff(scaled.reshape(8, 32).mean(axis=1)) < 0)
  assert scaled[64] > bound[64]


# ------------------------------------------------------------------- errors

@pytest.mark.parametrize('kwargs, match', [
    (dict(head_dim=7), 'even head_dim'),
    (dict(head_dim=8, rotary_dim=5), 'even rotary_dim'),
    (dict(head_dim=8, rotary_dim=16), 'larger than head_dim'),
    (dict(head_dim=8, layout='neox'), "valid choices: interleaved, half"),
    (dict(head_dim=8, base=1.0), 'base'),
])
def test_bad_rotary_arguments_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    rope.Rotary(**kwargs)


def test_bad_scaling_and_shapes_raise():
  with pytest.raises(ValueError, match='valid choices: none, linear, ntk, dynamic_ntk, yarn, llama3'):
    rope.RopeConfig(scaling='dynamic')
  with pytest.raises(ValueError, match='positions shape'):
    rope.apply_rotary(jnp.ones((2, 5, 1, 8)), jnp.zeros((2, 4)))
  with pytest.raises(ValueError, match=r'\[\.\.\., length, heads, head_dim\]'):
    rope.apply_rotary(jnp.ones((5, 8)), jnp.zeros((5,)))
  with pytest.raises(ValueError, match='even head_dim'):
    rope.apply_rotary(jnp.ones((1, 5, 1, 7)), jnp.zeros((1, 5)))
  with pytest.raises(ValueError, match='feature map'):
    rope.linear_attention(jnp.ones((1, 2, 1, 4)), jnp.ones((1, 2, 1, 4)), jnp.ones((1, 2, 1, 4)),
                          feature_map='softmax')
