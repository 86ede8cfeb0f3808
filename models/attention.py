"""Multi-head self-attention whose position scheme is a set of hooks (``models.positions``).

Softmax attention (logits and softmax in float32, the scheme's bias, the key padding mask) is
``softmax_attention``: the computation of ``jax.nn.dot_product_attention``'s XLA implementation,
written out for one group of heads. On CPU that form is what XLA fuses into one kernel (dot,
bias, mask, softmax, dot); the library call adds a grouped-query axis whose mask ``select``
splits the fusion (measured on 2 CPU cores, [4, 512, 4, 64]: the attention forward ~2x slower). On GPU/TPU the library call is kept (``jax.nn.dot_product_attention``, where JAX may
pick fused kernels), and ``dot_product_attention_implementation('cudnn')`` asks for cuDNN's
flash attention. Explicit probabilities (with dropout or a value term) are formed only where
those cannot be used: a scheme that mixes relative representations into the values (Shaw with
``model.shaw_values``) or attention-probability dropout. Linear attention is
``rope.linear_attention`` (RoFormer eq. 19), which rotates phi(q), phi(k) itself.

Parameter layout (Hugging Face RoFormer's query/key/value/output dense layers, reshaped):
query/key/value kernels [embed, heads, head_dim] with biases [heads, head_dim]; output kernel
[heads, head_dim, embed] with bias [embed].
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import rope
from models import sharding
from models.config import ModelConfig
from models.positions import LayerHooks, PositionContext

_HEADS = (sharding.BATCH, sharding.LENGTH, sharding.HEADS, sharding.KV)
IMPLEMENTATIONS = (None, 'xla', 'cudnn', 'explicit')
_implementation: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    'dot_product_attention_implementation', default=None)


@contextlib.contextmanager
def dot_product_attention_implementation(name: str | None):
  """Within this context, softmax attention uses implementation ``name``:

  * None (default): ``softmax_attention`` on CPU, ``jax.nn.dot_product_attention`` elsewhere;
  * 'explicit': ``softmax_attention`` on every backend;
  * 'xla' or 'cudnn': ``jax.nn.dot_product_attention(implementation=name)``; 'cudnn' is cuDNN's
    fused flash attention on NVIDIA GPUs (bfloat16/float16, head_dim <= 128; it raises where
    unsupported).

  It acts at trace time: wrap the ``jit(...).lower`` or first call, not later calls.
  """
  if name not in IMPLEMENTATIONS:
    raise ValueError(f'Unknown attention implementation {name!r}; valid choices: '
                     f'{", ".join(map(str, IMPLEMENTATIONS))}.')
  token = _implementation.set(name)
  try:
    yield
  finally:
    _implementation.reset(token)


def softmax_attention(q_BxLxHxD: jax.Array, k_BxLxHxD: jax.Array, v_BxLxHxD: jax.Array,
                      bias: jax.Array | None, mask: jax.Array | None) -> jax.Array:
  """softmax(q k^T / sqrt(head_dim) + bias, masked) v, as ``jax.nn.dot_product_attention``'s XLA
  implementation computes it (same dtypes, softmax and mask value; the scale is applied to the
  queries, see below), for queries and keys with the same number of heads. Forward values equal
  the library's (bitwise for head_dim 64 in float32 and bfloat16 as measured; XLA's fused kernel
  may round differently by an ulp).

  Args:
    q_BxLxHxD, k_BxLxHxD, v_BxLxHxD: [batch, length, heads, head_dim], one dtype.
    bias: float [batch or 1, heads or 1, length_q, length_k] added to the logits, or None.
    mask: bool [batch or 1, heads or 1, length_q or 1, length_k], true where attending, or None.
  Returns:
    [batch, length, heads, head_dim] in the inputs' dtype.
  """
  logits_dtype = jnp.promote_types(q_BxLxHxD.dtype, jnp.float32)
  precision = None
  if q_BxLxHxD.dtype == jnp.bfloat16:
    precision = jax.lax.DotAlgorithmPreset.BF16_BF16_F32
  elif q_BxLxHxD.dtype == jnp.float16:
    precision = jax.lax.DotAlgorithmPreset.F16_F16_F32
  # Queries are scaled before the dot (as Flax's and Hugging Face's attention do): XLA on CPU
  # materialises a logit-shaped [batch, heads, L, L] broadcast of the scale for its fused
  # dot kernel otherwise. Exact for power-of-two head_dim**0.5 (e.g. head_dim 64, 256); other
  # head sizes round once in the queries instead of once in the logits.
  q_BxLxHxD = q_BxLxHxD * jnp.asarray(1.0 / np.sqrt(q_BxLxHxD.shape[-1]), q_BxLxHxD.dtype)
  logits_BxHxLxL = jnp.einsum('BTNH,BSNH->BNTS', q_BxLxHxD, k_BxLxHxD, precision=precision,
                              preferred_element_type=logits_dtype)
  if bias is not None:
    logits_BxHxLxL = (logits_BxHxLxL + bias).astype(logits_dtype)
  if mask is not None:
    # Masked logits become large_negative: added rather than selected (jnp.where), which gives
    # the same values (|logit| is far below half an ulp of large_negative, and an added 0 is
    # exact) and lets XLA on CPU fuse dot, bias, softmax and dot into one kernel.
    large_negative = -0.7 * min(jnp.finfo(logits_dtype).max, jnp.finfo(jnp.float32).max)
    logits_BxHxLxL = logits_BxHxLxL + jnp.where(mask, jnp.zeros((), logits_dtype),
                                                jnp.asarray(large_negative, logits_dtype))
  probs_BxHxLxL = jax.nn.softmax(logits_BxHxLxL.astype(jnp.float32), axis=-1).astype(
      k_BxLxHxD.dtype)
  return jnp.einsum('BNTS,BSNH->BTNH', probs_BxHxLxL, v_BxLxHxD)


class SelfAttention(nnx.Module):
  """Bidirectional multi-head self-attention.

  Attributes:
    query, key, value: projections [embed] -> [heads, head_dim].
    output: projection [heads, head_dim] -> [embed].
    positions: this layer's position hooks.
    dropout: dropout on attention probabilities.
  """

  def __init__(self, cfg: ModelConfig, positions: LayerHooks, *, rngs: nnx.Rngs):
    heads, head_dim = cfg.num_heads, cfg.head_dim
    in_kernel = sharding.param_metadata((sharding.EMBED, sharding.HEADS, sharding.KV))
    in_bias = sharding.param_metadata((sharding.HEADS, sharding.KV))

    def projection() -> nnx.LinearGeneral:
      return nnx.LinearGeneral(cfg.hidden_size, (heads, head_dim), dtype=cfg.compute_dtype,
                               kernel_init=cfg.initializer, kernel_metadata=in_kernel,
                               bias_metadata=in_bias, rngs=rngs)

    self.query = projection()
    self.key = projection()
    self.value = projection()
    self.output = nnx.LinearGeneral(
        (heads, head_dim), cfg.hidden_size, axis=(-2, -1), dtype=cfg.compute_dtype,
        kernel_init=cfg.initializer,
        kernel_metadata=sharding.param_metadata((sharding.HEADS, sharding.KV, sharding.EMBED)),
        bias_metadata=sharding.param_metadata((sharding.EMBED,)), rngs=rngs)
    self.positions = positions
    self.dropout = nnx.Dropout(cfg.attention_dropout_rate, deterministic=cfg.deterministic)
    self.kind = cfg.attention
    self.feature_map = cfg.linear_feature_map
    self.fused_qkv = cfg.fused_qkv
    self.explicit_probabilities = positions.mixes_values or (
        cfg.attention_dropout_rate > 0 and not cfg.deterministic)

  def __call__(self, x_BxLxE: jax.Array, mask_BxL: jax.Array, ctx: PositionContext, *,
               rngs: nnx.Rngs | None, num_queries: int | None = None) -> jax.Array:
    """Attends over the real (mask true) keys; returns [batch, length, embed].

    Args:
      x_BxLxE: inputs [batch, length, embed] in the compute dtype.
      mask_BxL: bool [batch, length], true at real tokens.
      ctx: the forward pass's shared position state.
      rngs: dropout keys (used only with attention-probability dropout in training).
      num_queries: compute the outputs of the first ``num_queries`` positions only (all keys
        still attended): [batch, num_queries, embed]. Softmax attention only.
    """
    x_q_BxQxE = x_BxLxE
    if num_queries is not None:
      if self.kind != 'softmax':
        raise ValueError('num_queries needs softmax attention.')
      x_q_BxQxE = x_BxLxE[:, :num_queries]
      ctx_q = ctx.first_queries(num_queries)
    else:
      ctx_q = ctx
    with jax.named_scope('qkv_projection'):
      if self.fused_qkv:
        q_BxLxHxD, k_BxLxHxD, v_BxLxHxD = self._project(x_BxLxE, num_queries)
      else:
        q_BxLxHxD = self.query(x_q_BxQxE)
        k_BxLxHxD = self.key(x_BxLxE)
        v_BxLxHxD = self.value(x_BxLxE)
    q_BxLxHxD = sharding.constrain(q_BxLxHxD, _HEADS)
    k_BxLxHxD = sharding.constrain(k_BxLxHxD, _HEADS)
    v_BxLxHxD = sharding.constrain(v_BxLxHxD, _HEADS)
    with jax.named_scope('positions'):
      v_BxLxHxD = self.positions.rotate(v_BxLxHxD, ctx, 'value')
    if self.kind == 'linear':
      with jax.named_scope('linear_attention'):
        out_BxLxHxD = rope.linear_attention(
            q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, mask=mask_BxL, rotary=self.positions.rotary,
            tables=ctx.rotary_tables, feature_map=self.feature_map)
    else:
      with jax.named_scope('positions'):
        q_BxLxHxD = self.positions.rotate(q_BxLxHxD, ctx_q, 'query')
        k_BxLxHxD = self.positions.rotate(k_BxLxHxD, ctx, 'key')
        bias = self.positions.bias(q_BxLxHxD, ctx_q)
      mask_Bx1x1xL = mask_BxL[:, None, None, :]
      with jax.named_scope('softmax_attention'):
        if self.explicit_probabilities:
          out_BxLxHxD = self._attend_explicitly(q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, bias,
                                                mask_Bx1x1xL, ctx_q, rngs)
        else:
          implementation = _implementation.get()
          if implementation is None and jax.default_backend() == 'cpu':
            implementation = 'explicit'
          if implementation == 'explicit':
            out_BxLxHxD = softmax_attention(q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, bias, mask_Bx1x1xL)
          else:
            out_BxLxHxD = jax.nn.dot_product_attention(
                q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, bias=bias, mask=mask_Bx1x1xL,
                implementation=implementation)
    out_BxLxHxD = sharding.constrain(out_BxLxHxD, _HEADS)
    with jax.named_scope('output_projection'):
      return self.output(out_BxLxHxD)

  def _project(self, x_BxLxE: jax.Array, num_queries: int | None
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The query, key and value projections as one matmul (``model.fused_qkv``).

    The three kernels stay separate parameters (Hugging Face's layout, so checkpoints convert
    one to one); they are stacked here, inside the step, into one [embed, n, heads, head_dim]
    kernel, so the inputs are read once and the backward pass forms one input gradient instead
    of three. With ``num_queries`` the query is projected from those rows only and keys/values
    are fused. Off by default: on the 2-core CPU it measured 3-5% slower per train step
    (`small`, length 512; three [embed, embed] matmuls beat one [embed, 3 x embed] there); on
    accelerators one larger matmul usually wins (``benchmarks/gpu.sh`` times both).
    """
    dtype = self.query.dtype
    projections = (self.key, self.value) if num_queries is not None else (
        self.query, self.key, self.value)
    kernel_ExNxHxD = jnp.stack([p.kernel[...] for p in projections], axis=1).astype(dtype)
    bias_NxHxD = jnp.stack([p.bias[...] for p in projections]).astype(dtype)
    out_BxLxNxHxD = jnp.einsum('BLE,ENHD->BLNHD', x_BxLxE.astype(dtype), kernel_ExNxHxD,
                               precision=self.query.precision) + bias_NxHxD
    outs = [out_BxLxNxHxD[:, :, i] for i in range(len(projections))]
    if num_queries is not None:
      outs.insert(0, self.query(x_BxLxE[:, :num_queries]))
    return tuple(outs)

  def _attend_explicitly(self, q_BxLxHxD: jax.Array, k_BxLxHxD: jax.Array,
                         v_BxLxHxD: jax.Array, bias: jax.Array | None, mask_Bx1x1xL: jax.Array,
                         ctx: PositionContext, rngs: nnx.Rngs | None) -> jax.Array:
    """Softmax attention with explicit probabilities (float32 logits and softmax)."""
    logits_BxHxLxL = jnp.einsum('blhd,bmhd->bhlm', q_BxLxHxD, k_BxLxHxD,
                                preferred_element_type=jnp.float32)
    logits_BxHxLxL = logits_BxHxLxL / math.sqrt(q_BxLxHxD.shape[-1])
    if bias is not None:
      logits_BxHxLxL = logits_BxHxLxL + bias
    logits_BxHxLxL = jnp.where(mask_Bx1x1xL, logits_BxHxLxL, jnp.finfo(jnp.float32).min)
    probs_BxHxLxL = jax.nn.softmax(logits_BxHxLxL, axis=-1).astype(v_BxLxHxD.dtype)
    probs_BxHxLxL = self.dropout(probs_BxHxLxL, rngs=rngs)
    out_BxLxHxD = jnp.einsum('bhlm,bmhd->blhd', probs_BxHxLxL, v_BxLxHxD)
    value_term = self.positions.value_term(probs_BxHxLxL, ctx)
    return out_BxLxHxD if value_term is None else out_BxLxHxD + value_term
