"""Hugging Face ``FlaxRoFormerForSequenceClassification`` (and ``FlaxRoFormerForMaskedLM``)
train and forward steps for the benchmarks: the same step body as
``training.steps.train_step`` around HF's model."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from benchmarks import common
from data import batches


def hf_model(cfg, max_length: int):
  """A randomly initialised FlaxRoFormerForSequenceClassification (``cfg.task`` mlm:
  FlaxRoFormerForMaskedLM) matching ``cfg`` (its compute dtype too)."""
  import transformers  # pylint: disable=g-import-not-at-top
  hf_config = transformers.RoFormerConfig(
      vocab_size=cfg.vocab_size, embedding_size=cfg.embedding_size, hidden_size=cfg.hidden_size,
      num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
      intermediate_size=cfg.mlp_dim, hidden_act='gelu', hidden_dropout_prob=cfg.dropout_rate,
      attention_probs_dropout_prob=cfg.attention_dropout_rate,
      max_position_embeddings=max_length, type_vocab_size=max(cfg.type_vocab_size, 1),
      initializer_range=cfg.init_std, layer_norm_eps=cfg.layer_norm_eps, rotary_value=False,
      num_labels=cfg.num_classes)
  kind = (transformers.FlaxRoFormerForMaskedLM if cfg.language_model
          else transformers.FlaxRoFormerForSequenceClassification)
  return kind(hf_config, seed=0, dtype=cfg.compute_dtype)


def _scored(logits, batch: batches.Batch):
  """What the loss scores: a classifier's logits, labels and weights; HF's MLM logits at every
  position [B, L, V] against the batch's masked tokens spread over all positions (weight 0
  elsewhere)."""
  if isinstance(batch, batches.Classification):
    return logits, batch.label, batch.weight
  labels, weights = targets_everywhere(batch)
  return logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), weights.reshape(-1)


def targets_everywhere(batch: batches.LanguageModel) -> tuple[jax.Array, jax.Array]:
  """An MLM batch's targets and weights at their positions in the rows, [B, L] each (label 0,
  weight 0 at the unmasked positions)."""
  shape = batch.inputs.shape
  rows, where = jnp.arange(shape[0])[:, None], batch.target_positions
  return (jnp.zeros(shape, jnp.int32).at[rows, where].set(batch.targets),
          jnp.zeros(shape, jnp.float32).at[rows, where].add(batch.target_weights))


def hf_steps(model, tx, schedule):
  """HF train and eval steps with exactly the body of ``training.steps.train_step``."""
  import optax  # pylint: disable=g-import-not-at-top
  from training import optim  # pylint: disable=g-import-not-at-top
  from training import tasks  # pylint: disable=g-import-not-at-top

  def logits_fn(params, batch, dropout_key):
    mask = (batch.inputs != 0).astype(jnp.int32)
    return model(batch.inputs, attention_mask=mask, params=params, dropout_rng=dropout_key,
                 train=dropout_key is not None).logits

  def train_step(state, batch):
    dropout_key = jax.random.fold_in(state.key, state.step)

    def loss_fn(params):
      return tasks.loss_and_metrics(*_scored(logits_fn(params, batch, dropout_key), batch))

    (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    grad_norm = optax.global_norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = (jnp.isfinite(loss) & jnp.isfinite(grad_norm)
              & jnp.isfinite(optax.global_norm(params)))
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    metrics = dict(sums, grad_norm=grad_norm, finite=finite, skipped=state.skipped,
                   learning_rate=optim.peak_learning_rate(state.opt_state) * schedule(state.step))
    return new_state, metrics

  def eval_step(params, batch):
    return tasks.loss_and_metrics(*_scored(logits_fn(params, batch, None), batch))[1]

  return train_step, eval_step


def build_hf(cfg, c, batch, max_length: int):
  """(train Step, forward Step) of the HF model."""
  from training import optim  # pylint: disable=g-import-not-at-top
  from training import steps  # pylint: disable=g-import-not-at-top
  model = hf_model(cfg, max_length)
  tx, schedule = optim.make_optimizer(c.optim, c.train.num_steps)
  train_step, eval_step = hf_steps(model, tx, schedule)
  params = jax.tree.map(jnp.asarray, model.params)
  num_params = sum(int(x.size) for x in jax.tree.leaves(params))
  state = steps.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                           opt_state=tx.init(params),
                           key=jax.random.split(jax.random.PRNGKey(0))[1],
                           skipped=jnp.zeros((), jnp.int32))
  fwd_params = jax.tree.map(jnp.copy, params)  # the train step donates (deletes) its state
  fwd, fwd_s = common.compile_timed(jax.jit(eval_step), fwd_params, batch)
  forward = common.Step('hf forward', fwd, (fwd_params, batch), fwd_s, common.memory_bytes(fwd),
                        common.flops(fwd), num_params)
  train, train_s = common.compile_timed(jax.jit(train_step, donate_argnums=0), state, batch)
  trainer = common.Step('hf', train, (state, batch), train_s, common.memory_bytes(train),
                        common.flops(train), num_params, carries_state=True)
  return trainer, forward
