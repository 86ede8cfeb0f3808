"""The RoFormer-style encoder classifier (Flax NNX).

Structure and order follow Hugging Face ``RoFormerForSequenceClassification`` so its weights can
be mapped one to one:

  embeddings: word_embeddings (+ token_type_embeddings) (+ scheme embed) -> layer_norm -> dropout
  embeddings_project (only when embedding_size != hidden_size)
  layers[i]: attention.{query,key,value,output} -> attention_norm; intermediate -> output ->
             output_norm  (HF: attention.self.*, attention.output.{dense,LayerNorm},
                           intermediate.dense, output.{dense,LayerNorm})
  final_norm (pre-LN only)
  head: dropout -> dense -> GELU -> dropout -> out_proj  (HF RoFormerClassificationHead)

Post-LN (default) is x = LN(x + dropout(sublayer(x))); pre-LN is x = x + dropout(sublayer(LN(x)))
with a final LayerNorm. GELU is exact (erf). Parameters are float32; activations use the
compute dtype (LayerNorm statistics and softmax in float32); logits are float32.

The forward pass is pure: no RNG state lives in the model. Dropout (active iff
``not cfg.deterministic``) draws keys from the ``rngs`` passed to the call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models import positions as positions_lib
from models import sharding
from models.attention import SelfAttention
from models.config import ModelConfig

PAD_ID = 0

_HIDDEN = (sharding.BATCH, sharding.LENGTH, sharding.EMBED)


def _dense(cfg: ModelConfig, features_in: int, features_out: int,
           names: tuple[str | None, str], *, rngs: nnx.Rngs) -> nnx.Linear:
  """A dense layer with bias; ``names`` are the logical axes of its kernel."""
  return nnx.Linear(features_in, features_out, dtype=cfg.compute_dtype, kernel_init=cfg.initializer,
                    kernel_metadata=sharding.param_metadata(names),
                    bias_metadata=sharding.param_metadata(names[1:]), rngs=rngs)


class LayerNorm(nnx.LayerNorm):
  """``nnx.LayerNorm`` under the ``layer_norm`` name scope (profiles attribute its ops)."""

  def __call__(self, x: jax.Array, *args, **kwargs) -> jax.Array:
    with jax.named_scope('layer_norm'):
      return super().__call__(x, *args, **kwargs)


class Dropout(nnx.Dropout):
  """``nnx.Dropout`` under the ``dropout`` name scope (profiles attribute its ops)."""

  def __call__(self, x: jax.Array, *args, **kwargs) -> jax.Array:
    with jax.named_scope('dropout'):
      return super().__call__(x, *args, **kwargs)


def _layer_norm(cfg: ModelConfig, features: int, *, rngs: nnx.Rngs) -> nnx.LayerNorm:
  return LayerNorm(features, epsilon=cfg.layer_norm_eps, dtype=cfg.compute_dtype,
                   use_fast_variance=False,
                   scale_metadata=sharding.param_metadata((sharding.EMBED,)),
                   bias_metadata=sharding.param_metadata((sharding.EMBED,)), rngs=rngs)


def _dropout(cfg: ModelConfig) -> nnx.Dropout:
  return Dropout(cfg.dropout_rate, deterministic=cfg.deterministic)


class Embeddings(nnx.Module):
  """Token (+ token-type) embeddings, the scheme's ``embed`` term, LayerNorm and dropout."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.word_embeddings = nnx.Embed(
        cfg.vocab_size, cfg.embedding_size, dtype=cfg.compute_dtype, embedding_init=cfg.initializer,
        embedding_metadata=sharding.param_metadata((sharding.VOCAB, sharding.EMBED)), rngs=rngs)
    self.token_type_embeddings = nnx.data(None)
    if cfg.type_vocab_size:
      self.token_type_embeddings = nnx.Embed(
          cfg.type_vocab_size, cfg.embedding_size, dtype=cfg.compute_dtype, embedding_init=cfg.initializer,
          embedding_metadata=sharding.param_metadata((None, sharding.EMBED)), rngs=rngs)
    self.layer_norm = _layer_norm(cfg, cfg.embedding_size, rngs=rngs)
    self.dropout = _dropout(cfg)

  def __call__(self, inputs_BxL: jax.Array, positions_BxL: jax.Array,
               token_type_ids_BxL: jax.Array | None, scheme: positions_lib.PositionScheme, *,
               rngs: nnx.Rngs | None) -> jax.Array:
    """[batch, length, embedding_size] in the compute dtype."""
    x_BxLxE = self.word_embeddings(inputs_BxL)
    if self.token_type_embeddings is not None:
      if token_type_ids_BxL is None:
        token_type_ids_BxL = jnp.zeros_like(inputs_BxL)
      x_BxLxE = x_BxLxE + self.token_type_embeddings(token_type_ids_BxL)
    x_BxLxE = scheme.embed(x_BxLxE, positions_BxL)
    return self.dropout(self.layer_norm(x_BxLxE), rngs=rngs)


class EncoderLayer(nnx.Module):
  """Self-attention and a GELU feed-forward block, each with residual, dropout and LayerNorm."""

  def __init__(self, cfg: ModelConfig, hooks: positions_lib.LayerHooks, *, rngs: nnx.Rngs):
    self.attention = SelfAttention(cfg, hooks, rngs=rngs)
    self.attention_norm = _layer_norm(cfg, cfg.hidden_size, rngs=rngs)
    self.intermediate = _dense(cfg, cfg.hidden_size, cfg.mlp_dim, (sharding.EMBED, sharding.MLP),
                               rngs=rngs)
    self.output = _dense(cfg, cfg.mlp_dim, cfg.hidden_size, (sharding.MLP, sharding.EMBED),
                         rngs=rngs)
    self.output_norm = _layer_norm(cfg, cfg.hidden_size, rngs=rngs)
    self.dropout = _dropout(cfg)
    self.pre_norm = cfg.norm == 'pre'

  @jax.named_scope('feed_forward')
  def _feed_forward(self, x_BxLxE: jax.Array) -> jax.Array:
    h_BxLxM = jax.nn.gelu(self.intermediate(x_BxLxE), approximate=False)
    h_BxLxM = sharding.constrain(h_BxLxM, (sharding.BATCH, sharding.LENGTH, sharding.MLP))
    return self.output(h_BxLxM)

  @jax.named_scope('dropout')
  def _dropout_rows(self, y_BxQxE: jax.Array, full_shape: tuple[int, ...],
                    rngs: nnx.Rngs | None) -> jax.Array:
    """``self.dropout`` of the first Q rows of a [batch, length, hidden] tensor: the same key and
    the same mask (drawn at the full shape, then sliced) as ``self.dropout`` on all rows."""
    dropout = self.dropout
    if dropout.rate == 0.0 or dropout.deterministic:
      return y_BxQxE
    key = rngs[dropout.rng_collection]()
    keep_prob = 1.0 - dropout.rate
    mask = jax.random.bernoulli(key, p=keep_prob, shape=full_shape)[:, :y_BxQxE.shape[1]]
    return jax.lax.select(mask, y_BxQxE / keep_prob, jnp.zeros_like(y_BxQxE))

  def __call__(self, x_BxLxE: jax.Array, mask_BxL: jax.Array,
               ctx: positions_lib.PositionContext, *, rngs: nnx.Rngs | None,
               num_queries: int | None = None) -> jax.Array:
    """[batch, length, hidden] -> [batch, length, hidden].

    With ``num_queries``, only the first ``num_queries`` positions' outputs are computed
    ([batch, num_queries, hidden]; keys and values still come from every position), with the same
    values and dropout masks as the same rows of the full output.
    """
    if num_queries is not None:
      return self._first_rows(x_BxLxE, mask_BxL, ctx, rngs, num_queries)
    if self.pre_norm:
      x_BxLxE = x_BxLxE + self.dropout(
          self.attention(self.attention_norm(x_BxLxE), mask_BxL, ctx, rngs=rngs), rngs=rngs)
      x_BxLxE = x_BxLxE + self.dropout(self._feed_forward(self.output_norm(x_BxLxE)), rngs=rngs)
    else:
      x_BxLxE = self.attention_norm(
          x_BxLxE + self.dropout(self.attention(x_BxLxE, mask_BxL, ctx, rngs=rngs), rngs=rngs))
      x_BxLxE = self.output_norm(x_BxLxE + self.dropout(self._feed_forward(x_BxLxE), rngs=rngs))
    return sharding.constrain(x_BxLxE, _HIDDEN)

  def _first_rows(self, x_BxLxE: jax.Array, mask_BxL: jax.Array,
                  ctx: positions_lib.PositionContext, rngs: nnx.Rngs | None,
                  num: int) -> jax.Array:
    shape = x_BxLxE.shape
    if self.pre_norm:
      attended_BxQxE = self.attention(self.attention_norm(x_BxLxE), mask_BxL, ctx, rngs=rngs,
                                      num_queries=num)
      x_BxQxE = x_BxLxE[:, :num] + self._dropout_rows(attended_BxQxE, shape, rngs)
      x_BxQxE = x_BxQxE + self._dropout_rows(
          self._feed_forward(self.output_norm(x_BxQxE)), shape, rngs)
    else:
      attended_BxQxE = self.attention(x_BxLxE, mask_BxL, ctx, rngs=rngs, num_queries=num)
      x_BxQxE = self.attention_norm(
          x_BxLxE[:, :num] + self._dropout_rows(attended_BxQxE, shape, rngs))
      x_BxQxE = self.output_norm(
          x_BxQxE + self._dropout_rows(self._feed_forward(x_BxQxE), shape, rngs))
    return sharding.constrain(x_BxQxE, _HIDDEN)


def _apply_layer(layer: EncoderLayer, x_BxLxE: jax.Array, mask_BxL: jax.Array,
                 ctx: positions_lib.PositionContext, rngs: nnx.Rngs | None) -> jax.Array:
  return layer(x_BxLxE, mask_BxL, ctx, rngs=rngs)


_apply_layer_remat = nnx.remat(_apply_layer)


def _apply_layer_cls(layer: EncoderLayer, x_BxLxE: jax.Array, mask_BxL: jax.Array,
                     ctx: positions_lib.PositionContext, rngs: nnx.Rngs | None) -> jax.Array:
  """The layer's output at position 0 only, [batch, 1, hidden]."""
  return layer(x_BxLxE, mask_BxL, ctx, rngs=rngs, num_queries=1)


_apply_layer_cls_remat = nnx.remat(_apply_layer_cls)


class ClassificationHead(nnx.Module):
  """Hugging Face's RoFormerClassificationHead on a pooled vector: dropout -> dense -> GELU ->
  dropout -> out_proj."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.dense = _dense(cfg, cfg.hidden_size, cfg.hidden_size, (sharding.EMBED, sharding.MLP),
                        rngs=rngs)
    self.out_proj = _dense(cfg, cfg.hidden_size, cfg.num_classes,
                           (sharding.MLP, sharding.CLASSES), rngs=rngs)
    self.dropout = _dropout(cfg)

  def __call__(self, pooled_BxE: jax.Array, *, rngs: nnx.Rngs | None) -> jax.Array:
    """[batch, hidden] -> float32 logits [batch, num_classes]."""
    x_BxE = self.dense(self.dropout(pooled_BxE, rngs=rngs))
    x_BxE = self.dropout(jax.nn.gelu(x_BxE, approximate=False), rngs=rngs)
    return self.out_proj(x_BxE).astype(jnp.float32)


class Classifier(nnx.Module):
  """Encoder + pooling + classification head; the position scheme is ``cfg.position``.

  Call as ``model(inputs_BxL, positions_BxL, mask_BxL=None, token_type_ids_BxL=None, *,
  rngs=None)`` -> float32 logits [batch, num_classes]; ``model.encode(...)`` (same arguments) ->
  final hidden states [batch, length, hidden] in the compute dtype.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embeddings = Embeddings(cfg, rngs=rngs)
    self.embeddings_project = nnx.data(None)
    if cfg.embedding_size != cfg.hidden_size:
      self.embeddings_project = _dense(cfg, cfg.embedding_size, cfg.hidden_size,
                                       (None, sharding.EMBED), rngs=rngs)
    self.positions = positions_lib.build(cfg, rngs=rngs)
    self.layers = nnx.List([EncoderLayer(cfg, self.positions.layer_hooks(rngs=rngs), rngs=rngs)
                            for _ in range(cfg.num_layers)])
    self.final_norm = nnx.data(None)
    if cfg.norm == 'pre':
      self.final_norm = _layer_norm(cfg, cfg.hidden_size, rngs=rngs)
    self.head = ClassificationHead(cfg, rngs=rngs)

  def _check_inputs(self, inputs_BxL: jax.Array, positions_BxL: jax.Array,
                    mask_BxL: jax.Array | None, token_type_ids_BxL: jax.Array | None,
                    rngs: nnx.Rngs | None) -> None:
    shape = inputs_BxL.shape
    if len(shape) != 2:
      raise ValueError(f'inputs must be [batch, length] token ids, got shape {shape}.')
    for name, array in (('positions', positions_BxL), ('mask', mask_BxL),
                        ('token_type_ids', token_type_ids_BxL)):
      if array is not None and array.shape != shape:
        raise ValueError(f'{name} shape {array.shape} does not match inputs shape {shape}.')
    if token_type_ids_BxL is not None and not self.cfg.type_vocab_size:
      raise ValueError('token_type_ids given but model.type_vocab_size=0 (no token types).')
    if rngs is None and self.uses_dropout:
      raise ValueError('Dropout is active (cfg.deterministic=False): pass '
                       'rngs=nnx.Rngs(dropout=key), or use cfg.replace(deterministic=True).')

  @property
  def uses_dropout(self) -> bool:
    """Whether a call draws dropout keys."""
    cfg = self.cfg
    return not cfg.deterministic and (cfg.dropout_rate > 0 or cfg.attention_dropout_rate > 0)

  @property
  def computes_cls_only(self) -> bool:
    """Whether ``__call__`` computes the last layer at the [CLS] position only.

    With CLS pooling only position 0 of the last layer reaches the logits, so its other
    positions' queries, attention, output projection and feed-forward block are dead work (the
    `small` train step at length 512: 41.6 instead of 53.2 GFLOP). Softmax attention only; not
    with attention-probability dropout in training (its mask is drawn over all queries). Logits
    equal the full computation's up to float rounding (the matmuls have fewer rows), with the
    same dropout masks.
    """
    cfg = self.cfg
    return (cfg.pooling == 'cls' and cfg.attention == 'softmax' and
            not (cfg.attention_dropout_rate > 0 and not cfg.deterministic))

  def _encode(self, inputs_BxL: jax.Array, positions_BxL: jax.Array,
              mask_BxL: jax.Array | None, token_type_ids_BxL: jax.Array | None,
              rngs: nnx.Rngs | None, cls_only: bool = False) -> tuple[jax.Array, jax.Array]:
    """(final hidden states [batch, length, hidden] (``cls_only``: [batch, 1, hidden], position
    0 only), bool mask [batch, length])."""
    self._check_inputs(inputs_BxL, positions_BxL, mask_BxL, token_type_ids_BxL, rngs)
    mask_BxL = inputs_BxL != PAD_ID if mask_BxL is None else mask_BxL.astype(bool)
    with jax.named_scope('embeddings'):
      x_BxLxE = self.embeddings(inputs_BxL, positions_BxL, token_type_ids_BxL, self.positions,
                                rngs=rngs)
    if self.embeddings_project is not None:
      x_BxLxE = self.embeddings_project(x_BxLxE)
    x_BxLxE = sharding.constrain(x_BxLxE, _HIDDEN)
    with jax.named_scope('positions'):
      ctx = self.positions.prepare(positions_BxL)
    apply_layer = _apply_layer_remat if self.cfg.remat else _apply_layer
    apply_last = apply_layer
    if cls_only:
      apply_last = _apply_layer_cls_remat if self.cfg.remat else _apply_layer_cls
    for i, layer in enumerate(self.layers):
      apply = apply_last if i == len(self.layers) - 1 else apply_layer
      x_BxLxE = apply(layer, x_BxLxE, mask_BxL, ctx, rngs)
    if self.final_norm is not None:
      x_BxLxE = self.final_norm(x_BxLxE)
    return x_BxLxE, mask_BxL

  def encode(self, inputs_BxL: jax.Array, positions_BxL: jax.Array,
             mask_BxL: jax.Array | None = None, token_type_ids_BxL: jax.Array | None = None, *,
             rngs: nnx.Rngs | None = None) -> jax.Array:
    """Final hidden states [batch, length, hidden] in the compute dtype.

    Args:
      inputs_BxL: int token ids [batch, length] (pad id 0).
      positions_BxL: int positions [batch, length] (always explicit).
      mask_BxL: bool [batch, length], true at real tokens; None: ``inputs_BxL != 0``.
      token_type_ids_BxL: int [batch, length] (needs model.type_vocab_size > 0); None: zeros.
      rngs: dropout keys, ``nnx.Rngs(dropout=key)``; required unless cfg.deterministic.
    """
    return self._encode(inputs_BxL, positions_BxL, mask_BxL, token_type_ids_BxL, rngs)[0]

  def __call__(self, inputs_BxL: jax.Array, positions_BxL: jax.Array,
               mask_BxL: jax.Array | None = None, token_type_ids_BxL: jax.Array | None = None, *,
               rngs: nnx.Rngs | None = None) -> jax.Array:
    """float32 logits [batch, num_classes]; arguments as ``encode``."""
    x_BxLxE, mask_BxL = self._encode(inputs_BxL, positions_BxL, mask_BxL, token_type_ids_BxL,
                                     rngs, cls_only=self.computes_cls_only)
    if self.cfg.pooling == 'cls':
      pooled_BxE = x_BxLxE[:, 0]
    else:
      weights_BxLx1 = mask_BxL[..., None].astype(jnp.float32)
      total_BxE = jnp.sum(x_BxLxE.astype(jnp.float32) * weights_BxLx1, axis=1)
      pooled_BxE = (total_BxE / jnp.maximum(jnp.sum(weights_BxLx1, axis=1), 1.0)).astype(
          x_BxLxE.dtype)
    with jax.named_scope('head'):
      logits_BxC = self.head(sharding.constrain(pooled_BxE, (sharding.BATCH, sharding.EMBED)),
                             rngs=rngs)
    return sharding.constrain(logits_BxC, (sharding.BATCH, sharding.CLASSES))


def init(cfg: ModelConfig, key: jax.Array) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, params) of a freshly initialised ``Classifier``.

  Works eagerly, under ``jax.jit(init, static_argnums=0)`` and under
  ``jax.eval_shape(functools.partial(init, cfg), key)``. All model state is ``nnx.Param``.
  """
  return nnx.split(Classifier(cfg, rngs=nnx.Rngs(params=key)), nnx.Param)


def count_params(params: nnx.State) -> int:
  """Total number of parameters (works on arrays and on ``jax.eval_shape`` results)."""
  return sum(int(x.size) for x in jax.tree.leaves(params))
