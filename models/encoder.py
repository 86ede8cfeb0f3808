"""The RoFormer-style encoder: a classifier, or a masked or causal language model (Flax NNX).

Module structure and order follow Hugging Face ``RoFormerForSequenceClassification`` (and
``RoFormerForMaskedLM``'s tied head), so weights map one to one (``interop/hf.py``). GELU is exact
(erf); parameters and logits are float32, activations the compute dtype.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
from flax import nnx

from models import positions as positions_lib
from models import sharding
from models.attention import SelfAttention, Visibility
from models.config import ModelConfig

_HIDDEN = (sharding.BATCH, sharding.LENGTH, sharding.EMBED)


def _dense(cfg: ModelConfig, features_in: int, features_out: int,
           names: tuple[str | None, str], *, rngs: nnx.Rngs) -> nnx.Linear:
  return nnx.Linear(features_in, features_out, dtype=cfg.compute_dtype,
                    kernel_init=cfg.initializer, kernel_metadata=sharding.param_metadata(names),
                    bias_metadata=sharding.param_metadata(names[1:]), rngs=rngs)


class _Scoped:
  """A layer called under the name scope ``scope`` (profiles attribute its ops)."""

  scope: str

  def __call__(self, x: jax.Array, *args, **kwargs) -> jax.Array:
    with jax.named_scope(self.scope):
      return super().__call__(x, *args, **kwargs)


class LayerNorm(_Scoped, nnx.LayerNorm):
  scope = 'layer_norm'


class Dropout(_Scoped, nnx.Dropout):
  scope = 'dropout'


def _layer_norm(cfg: ModelConfig, features: int, *, rngs: nnx.Rngs) -> nnx.LayerNorm:
  return LayerNorm(features, epsilon=cfg.layer_norm_eps, dtype=cfg.compute_dtype,
                   use_fast_variance=False,
                   scale_metadata=sharding.param_metadata((sharding.EMBED,)),
                   bias_metadata=sharding.param_metadata((sharding.EMBED,)), rngs=rngs)


class Embeddings(nnx.Module):
  """Token (+ token-type) embeddings, the scheme's ``embed`` term, LayerNorm and dropout."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    def embed(num: int, axis: str | None) -> nnx.Embed:
      return nnx.Embed(num, cfg.embedding_size, dtype=cfg.compute_dtype,
                       embedding_init=cfg.initializer, rngs=rngs,
                       embedding_metadata=sharding.param_metadata((axis, sharding.EMBED)))

    self.word_embeddings = embed(cfg.vocab_size, sharding.VOCAB)
    self.token_type_embeddings = (embed(cfg.type_vocab_size, None) if cfg.type_vocab_size
                                  else nnx.data(None))
    self.layer_norm = _layer_norm(cfg, cfg.embedding_size, rngs=rngs)
    self.dropout = Dropout(cfg.dropout_rate, deterministic=cfg.deterministic)

  def __call__(self, inputs_BxL: jax.Array, positions_BxL: jax.Array,
               token_type_ids_BxL: jax.Array | None, scheme: positions_lib.PositionScheme, *,
               rngs: nnx.Rngs | None) -> jax.Array:
    x_BxLxE = self.word_embeddings(inputs_BxL)
    if self.token_type_embeddings is not None:
      if token_type_ids_BxL is None:
        token_type_ids_BxL = jnp.zeros_like(inputs_BxL)
      x_BxLxE = x_BxLxE + self.token_type_embeddings(token_type_ids_BxL)
    x_BxLxE = scheme.embed(x_BxLxE, positions_BxL)
    return self.dropout(self.layer_norm(x_BxLxE), rngs=rngs)


class EncoderLayer(nnx.Module):
  """Self-attention and a GELU feed-forward block: post-LN x = LN(x + dropout(f(x))), or pre-LN
  x = x + dropout(f(LN(x)))."""

  def __init__(self, cfg: ModelConfig, hooks: positions_lib.LayerHooks, *, rngs: nnx.Rngs):
    self.attention = SelfAttention(cfg, hooks, rngs=rngs)
    self.attention_norm = _layer_norm(cfg, cfg.hidden_size, rngs=rngs)
    self.intermediate = _dense(cfg, cfg.hidden_size, cfg.mlp_dim, (sharding.EMBED, sharding.MLP),
                               rngs=rngs)
    self.output = _dense(cfg, cfg.mlp_dim, cfg.hidden_size, (sharding.MLP, sharding.EMBED),
                         rngs=rngs)
    self.output_norm = _layer_norm(cfg, cfg.hidden_size, rngs=rngs)
    self.dropout = Dropout(cfg.dropout_rate, deterministic=cfg.deterministic)
    self.pre_norm = cfg.norm == 'pre'

  @jax.named_scope('feed_forward')
  def _feed_forward(self, x_BxLxE: jax.Array) -> jax.Array:
    h_BxLxF = jax.nn.gelu(self.intermediate(x_BxLxE), approximate=False)
    h_BxLxF = sharding.constrain(h_BxLxF, (sharding.BATCH, sharding.LENGTH, sharding.MLP))
    return self.output(h_BxLxF)

  def __call__(self, x_BxLxE: jax.Array, visibility: Visibility,
               ctx: positions_lib.PositionContext, rngs: nnx.Rngs | None,
               num_queries: int | None = None) -> jax.Array:
    """[batch, length, hidden] -> [batch, T, hidden]: T = length, or ``num_queries``."""
    drop = lambda y: self.dropout(y, rngs=rngs)
    first = lambda y: y if num_queries is None else y[:, :num_queries]
    if self.pre_norm:
      attended = self.attention(self.attention_norm(x_BxLxE), visibility, ctx, rngs=rngs,
                                num_queries=num_queries)
      x_BxTxE = first(x_BxLxE) + drop(attended)
      x_BxTxE = x_BxTxE + drop(self._feed_forward(self.output_norm(x_BxTxE)))
    else:
      attended = self.attention(x_BxLxE, visibility, ctx, rngs=rngs, num_queries=num_queries)
      x_BxTxE = self.attention_norm(first(x_BxLxE) + drop(attended))
      x_BxTxE = self.output_norm(x_BxTxE + drop(self._feed_forward(x_BxTxE)))
    return sharding.constrain(x_BxTxE, _HIDDEN)


class NoPositionHooks(positions_lib.LayerHooks):
  """A NoPE layer of a per-layer hybrid (``model.nope_layers``): no rotation, value term or bias,
  not even one the scheme shares through the context (ALiBi's, T5's); no parameters."""

  def bias(self, q_BxLxHxD: jax.Array, ctx: positions_lib.PositionContext) -> None:
    del q_BxLxHxD, ctx


class ClassificationHead(nnx.Module):
  """HF's RoFormerClassificationHead: dropout -> dense -> GELU -> dropout -> out_proj."""

  def __init__(self, cfg: ModelConfig, features_in: int, *, rngs: nnx.Rngs):
    self.dense = _dense(cfg, features_in, cfg.hidden_size, (sharding.EMBED, sharding.MLP),
                        rngs=rngs)
    self.out_proj = _dense(cfg, cfg.hidden_size, cfg.num_classes,
                           (sharding.MLP, sharding.CLASSES), rngs=rngs)
    self.dropout = Dropout(cfg.dropout_rate, deterministic=cfg.deterministic)

  def __call__(self, pooled_BxE: jax.Array, *, rngs: nnx.Rngs | None) -> jax.Array:
    x_BxE = self.dense(self.dropout(pooled_BxE, rngs=rngs))
    x_BxE = self.dropout(jax.nn.gelu(x_BxE, approximate=False), rngs=rngs)
    return self.out_proj(x_BxE).astype(jnp.float32)


class LanguageModelHead(nnx.Module):
  """HF's RoFormerLMPredictionHead: dense -> GELU -> LayerNorm -> tied embeddings + bias."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.dense = _dense(cfg, cfg.hidden_size, cfg.embedding_size, (sharding.EMBED, None),
                        rngs=rngs)
    self.layer_norm = _layer_norm(cfg, cfg.embedding_size, rngs=rngs)
    self.bias = nnx.Param(jnp.zeros((cfg.vocab_size,), jnp.float32),
                          **sharding.param_metadata((sharding.VOCAB,)))

  def __call__(self, x_BxMxE: jax.Array, embeddings: nnx.Embed) -> jax.Array:
    x_BxMxE = self.layer_norm(jax.nn.gelu(self.dense(x_BxMxE), approximate=False))
    logits_BxMxV = embeddings.attend(x_BxMxE).astype(jnp.float32)
    return logits_BxMxV + self.bias[...]


class Classifier(nnx.Module):
  """Encoder + pooling + classification head (or ``cfg.language_model``'s head on every position).
  With CLS pooling (softmax attention) the last layer computes position 0's output only (the
  same logits up to float rounding; dropout masks drawn at the shapes computed)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embeddings = Embeddings(cfg, rngs=rngs)
    self.embeddings_project = nnx.data(None) if cfg.embedding_size == cfg.hidden_size else _dense(
        cfg, cfg.embedding_size, cfg.hidden_size, (None, sharding.EMBED), rngs=rngs)
    self.positions = positions_lib.build(cfg, rngs=rngs)
    nope = cfg.position_free_layers
    self.layers = nnx.List([
        EncoderLayer(cfg, NoPositionHooks() if i in nope else self.positions.layer_hooks(rngs=rngs),
                     rngs=rngs) for i in range(cfg.num_layers)])
    pre_norm = cfg.norm == 'pre'
    self.final_norm = _layer_norm(cfg, cfg.hidden_size, rngs=rngs) if pre_norm else nnx.data(None)
    # Two towers: the head reads [u, v, u*v, u-v] of a pair's pooled vectors (LRA's 'NLI').
    self.head = LanguageModelHead(cfg, rngs=rngs) if cfg.language_model else ClassificationHead(
        cfg, cfg.hidden_size * (4 if cfg.dual_encoder else 1), rngs=rngs)

  def _check_inputs(self, inputs_BxL: jax.Array, positions_BxL: jax.Array, mask_BxL: jax.Array,
                    token_type_ids_BxL: jax.Array | None, rngs: nnx.Rngs | None) -> None:
    shape = inputs_BxL.shape
    if len(shape) != 2:
      raise ValueError(f'inputs must be [batch, length] token ids, got shape {shape}.')
    for name, array in (('positions', positions_BxL), ('mask', mask_BxL),
                        ('token_type_ids', token_type_ids_BxL)):
      if array is not None and array.shape != shape:
        raise ValueError(f'{name} shape {array.shape} does not match inputs shape {shape}.')
    if token_type_ids_BxL is not None and not self.cfg.type_vocab_size:
      raise ValueError('token_type_ids given but model.type_vocab_size=0 (no token types).')
    cfg = self.cfg
    if rngs is None and not cfg.deterministic and (cfg.dropout_rate or cfg.attention_dropout_rate):
      raise ValueError('Dropout is active (cfg.deterministic=False): pass '
                       'rngs=nnx.Rngs(dropout=key), or use cfg.replace(deterministic=True).')

  def encode(self, inputs_BxL: jax.Array, positions_BxL: jax.Array, mask_BxL: jax.Array,
             token_type_ids_BxL: jax.Array | None = None, *, rngs: nnx.Rngs | None = None,
             segments_BxL: jax.Array | None = None,
             last_num_queries: int | None = None) -> jax.Array:
    """Final hidden states [batch, length, hidden]. ``mask_BxL``: true at real tokens; token
    types None mean zeros; ``segments_BxL`` (packed sequences): int document ids, attention stays
    within one; ``rngs`` (``nnx.Rngs(dropout=key)``) unless cfg.deterministic; with
    ``last_num_queries`` the last layer computes only its first positions' outputs."""
    self._check_inputs(inputs_BxL, positions_BxL, mask_BxL, token_type_ids_BxL, rngs)
    visibility = Visibility(mask_BxL.astype(bool), segments_BxL)
    with jax.named_scope('embeddings'):
      x_BxLxE = self.embeddings(inputs_BxL, positions_BxL, token_type_ids_BxL, self.positions,
                                rngs=rngs)
    if self.embeddings_project is not None:
      x_BxLxE = self.embeddings_project(x_BxLxE)
    x_BxLxE = sharding.constrain(x_BxLxE, _HIDDEN)
    with jax.named_scope('positions'):
      ctx = self.positions.prepare(positions_BxL)
      if positions_lib.blockwise(self.cfg):
        ctx = ctx._replace(positions=positions_BxL)
    x_BxLxE = self._layers(x_BxLxE, visibility, ctx, rngs, last_num_queries)
    if self.final_norm is not None:
      x_BxLxE = self.final_norm(x_BxLxE)
    return x_BxLxE

  def _layers(self, x_BxLxE: jax.Array, visibility: Visibility,
              ctx: positions_lib.PositionContext, rngs: nnx.Rngs | None,
              last_num_queries: int | None) -> jax.Array:
    """The layers in turn; with ``cfg.remat`` runs of alike layers are rolled loops."""
    layers = list(self.layers)
    if not self.cfg.remat:
      for layer in layers[:-1]:
        x_BxLxE = layer(x_BxLxE, visibility, ctx, rngs)
      return layers[-1](x_BxLxE, visibility, ctx, rngs, last_num_queries)
    remat = nnx.remat(EncoderLayer.__call__, static_argnums=5)
    # Consecutive layers that share a graph (a hybrid's NoPE layers do not) form one loop.
    for run in [list(run) for _, run in itertools.groupby(layers[:-1], key=nnx.graphdef)]:
      x_BxLxE = (_remat_loop(run, x_BxLxE, visibility, ctx, rngs) if len(run) > 1 else
                 remat(run[0], x_BxLxE, visibility, ctx, rngs, None))
    return remat(layers[-1], x_BxLxE, visibility, ctx, rngs, last_num_queries)

  def __call__(self, inputs: jax.Array, positions: jax.Array, mask: jax.Array,
               token_type_ids_BxL: jax.Array | None = None, *,
               rngs: nnx.Rngs | None = None, segments_BxL: jax.Array | None = None,
               target_positions_BxM: jax.Array | None = None) -> jax.Array:
    """float32 logits [batch, num_classes]; arguments as ``encode`` (``cfg.dual_encoder``: pairs
    [batch, 2, length]). A language model, or a classifier given ``target_positions_BxM`` (query
    tokens), gives logits [batch, M, vocab or classes] there (None: every position)."""
    if self.cfg.language_model or target_positions_BxM is not None:
      x_BxLxE = self.encode(inputs, positions, mask, token_type_ids_BxL, rngs=rngs,
                            segments_BxL=segments_BxL)
      if target_positions_BxM is not None:
        x_BxLxE = jnp.take_along_axis(x_BxLxE, target_positions_BxM[..., None], axis=1)
      with jax.named_scope('head'):
        if self.cfg.language_model:
          return self.head(x_BxLxE, self.embeddings.word_embeddings)
        return self.head(x_BxLxE, rngs=rngs)  # a query token's output classes at each of M
    if self.cfg.dual_encoder:
      if inputs.ndim != 3 or inputs.shape[1] != 2 or token_type_ids_BxL is not None:
        raise ValueError('model.dual_encoder takes pairs: inputs, positions and mask of shape '
                         f'[batch, 2, length] and no token types; got inputs {inputs.shape}.')
      flat = lambda x_Bx2xL: x_Bx2xL.reshape(-1, x_Bx2xL.shape[-1])
      pooled_2BxE = self._pooled(flat(inputs), flat(positions), flat(mask), None, rngs)
      u_BxE, v_BxE = pooled_2BxE[0::2], pooled_2BxE[1::2]
      pooled = jnp.concatenate([u_BxE, v_BxE, u_BxE * v_BxE, u_BxE - v_BxE], axis=-1)
    else:
      pooled = self._pooled(inputs, positions, mask, token_type_ids_BxL, rngs)
    with jax.named_scope('head'):
      logits_BxC = self.head(sharding.constrain(pooled, (sharding.BATCH, sharding.EMBED)),
                             rngs=rngs)
    return sharding.constrain(logits_BxC, (sharding.BATCH, sharding.CLASSES))

  def _pooled(self, inputs_BxL: jax.Array, positions_BxL: jax.Array, mask_BxL: jax.Array,
              token_type_ids_BxL: jax.Array | None, rngs: nnx.Rngs | None) -> jax.Array:
    """The pooled final hidden states [batch, hidden] (``model.pooling``)."""
    cls_only = self.cfg.pooling == 'cls' and self.cfg.attention == 'softmax'
    x_BxLxE = self.encode(inputs_BxL, positions_BxL, mask_BxL, token_type_ids_BxL, rngs=rngs,
                          last_num_queries=1 if cls_only else None)
    if self.cfg.pooling == 'cls':
      return x_BxLxE[:, 0]
    weights_BxLx1 = mask_BxL[..., None].astype(jnp.float32)
    total_BxE = jnp.sum(x_BxLxE.astype(jnp.float32) * weights_BxLx1, axis=1)
    return (total_BxE / jnp.maximum(jnp.sum(weights_BxLx1, axis=1), 1.0)).astype(x_BxLxE.dtype)


def _remat_loop(layers: list[EncoderLayer], x_BxLxE: jax.Array, visibility: Visibility,
                ctx: positions_lib.PositionContext, rngs: nnx.Rngs | None) -> jax.Array:
  """``layers`` as one ``lax.scan`` of remat steps (XLA on CPU keeps every unrolled layer's
  recomputed activations live at once), carrying the dropout stream: the same draws."""
  graphdef = nnx.graphdef(layers[0])
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *(nnx.state(l) for l in layers))
  rngs_def, rngs_state = nnx.split(rngs) if rngs is not None else (None, None)

  @jax.checkpoint
  def step(carry, state):
    x_BxLxE, rngs_state = carry
    layer_rngs = None if rngs is None else nnx.merge(rngs_def, rngs_state)
    x_BxLxE = nnx.merge(graphdef, state)(x_BxLxE, visibility, ctx, layer_rngs)
    return (x_BxLxE, None if rngs is None else nnx.state(layer_rngs)), None

  (x_BxLxE, rngs_state), _ = jax.lax.scan(step, (x_BxLxE, rngs_state), stacked)
  if rngs is not None:
    nnx.update(rngs, rngs_state)
  return x_BxLxE


def init(cfg: ModelConfig, key: jax.Array) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, params) of a fresh ``Classifier``. The scheme's parameters draw from a stream of
  their own, so the shared ones start identical under every scheme: ablations share a start."""
  rngs = nnx.Rngs(params=key, positions=jax.random.fold_in(key, 1))
  return nnx.split(Classifier(cfg, rngs=rngs), nnx.Param)


def count_params(params: nnx.State) -> int:
  """Total number of parameters (works on arrays and on ``jax.eval_shape`` results)."""
  return sum(int(x.size) for x in jax.tree.leaves(params))
