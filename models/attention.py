"""Multi-head self-attention whose position scheme is a set of hooks (``models.positions``).

Softmax attention goes through ``jax.nn.dot_product_attention`` (logits and softmax in float32)
with the scheme's bias and the key padding mask. Explicit probabilities are formed only where
that function cannot be used: a scheme that mixes relative representations into the values
(Shaw with ``model.shaw_values``) or attention-probability dropout. Linear attention is
``rope.linear_attention`` (RoFormer eq. 19), which rotates phi(q), phi(k) itself.

Parameter layout (Hugging Face RoFormer's query/key/value/output dense layers, reshaped):
query/key/value kernels [embed, heads, head_dim] with biases [heads, head_dim]; output kernel
[heads, head_dim, embed] with bias [embed].
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

import rope
from models import sharding
from models.config import ModelConfig
from models.positions import LayerHooks, PositionContext

_HEADS = (sharding.BATCH, sharding.LENGTH, sharding.HEADS, sharding.KV)


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
    self.explicit_probabilities = positions.mixes_values or (
        cfg.attention_dropout_rate > 0 and not cfg.deterministic)

  def __call__(self, x_BxLxE: jax.Array, mask_BxL: jax.Array, ctx: PositionContext, *,
               rngs: nnx.Rngs | None) -> jax.Array:
    """Attends over the real (mask true) keys; returns [batch, length, embed].

    Args:
      x_BxLxE: inputs [batch, length, embed] in the compute dtype.
      mask_BxL: bool [batch, length], true at real tokens.
      ctx: the forward pass's shared position state.
      rngs: dropout keys (used only with attention-probability dropout in training).
    """
    q_BxLxHxD = sharding.constrain(self.query(x_BxLxE), _HEADS)
    k_BxLxHxD = sharding.constrain(self.key(x_BxLxE), _HEADS)
    v_BxLxHxD = sharding.constrain(self.value(x_BxLxE), _HEADS)
    v_BxLxHxD = self.positions.rotate(v_BxLxHxD, ctx, 'value')
    if self.kind == 'linear':
      out_BxLxHxD = rope.linear_attention(
          q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, mask=mask_BxL, rotary=self.positions.rotary,
          tables=ctx.rotary_tables, feature_map=self.feature_map)
    else:
      q_BxLxHxD = self.positions.rotate(q_BxLxHxD, ctx, 'query')
      k_BxLxHxD = self.positions.rotate(k_BxLxHxD, ctx, 'key')
      bias = self.positions.bias(q_BxLxHxD, ctx)
      mask_Bx1x1xL = mask_BxL[:, None, None, :]
      if self.explicit_probabilities:
        out_BxLxHxD = self._attend_explicitly(q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, bias,
                                              mask_Bx1x1xL, ctx, rngs)
      else:
        out_BxLxHxD = jax.nn.dot_product_attention(q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, bias=bias,
                                                   mask=mask_Bx1x1xL)
    out_BxLxHxD = sharding.constrain(out_BxLxHxD, _HEADS)
    return self.output(out_BxLxHxD)

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
