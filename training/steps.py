"""The pure train and eval steps, ``jax.vmap``-ed over a leading seed axis N.

N seeds of one configuration train together in one jitted step (different init and dropout
keys, shared batches); N = 1 is an ordinary run.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

# inputs, positions and mask (true at real tokens) [B, L]; label and weight [B]
Batch = dict[str, jax.Array]
Params = Any


class TrainState(flax.struct.PyTreeNode):
  """Training state of N seeds (leading axis N on every field).

  Attributes:
    step: int32 [N], train steps taken (identical across seeds).
    params: the model parameters, a pure nested dict of [N, ...] arrays.
    key: uint32 [N, 2], each seed's base PRNG key; step t's dropout key is fold_in(key, t).
    skipped: int32 [N], updates skipped because the loss, the gradients or the updated
      parameters were not finite.
  """

  step: jax.Array
  params: Params
  opt_state: optax.OptState
  key: jax.Array
  skipped: jax.Array


def loss_and_metrics(logits_BxC: jax.Array, batch: Batch) -> tuple[jax.Array, dict]:
  """Weighted mean cross-entropy, and metric sums (reduced on the host)."""
  weight_B = batch['weight'].astype(jnp.float32)
  losses_B = optax.softmax_cross_entropy_with_integer_labels(
      logits_BxC.astype(jnp.float32), batch['label'])
  correct_B = (jnp.argmax(logits_BxC, -1) == batch['label']).astype(jnp.float32)
  denom = jnp.maximum(weight_B.sum(), 1.0)
  sums = {'loss_sum': (losses_B * weight_B).sum(), 'correct_sum': (correct_B * weight_B).sum(),
          'count': weight_B.sum()}
  return (losses_B * weight_B).sum() / denom, sums


def make_step_fns(train_graphdef: nnx.GraphDef, eval_graphdef: nnx.GraphDef,
                  tx: optax.GradientTransformation, schedule: optax.Schedule,
                  grad_accum_steps: int, skip_nonfinite: bool):
  """The per-seed train and eval steps (pure; vmapped and jitted by the caller)."""

  def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
    dropout_key = jax.random.fold_in(state.key, state.step)
    inputs, positions, mask = batch['inputs'], batch['positions'], batch['mask']

    def loss_fn(params):
      model = nnx.merge(train_graphdef, params)
      logits = model(inputs, positions, mask, rngs=nnx.Rngs(dropout=dropout_key))
      with jax.named_scope('loss'):
        return loss_and_metrics(logits, batch)

    (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    with jax.named_scope('optimizer'):
      grad_norm = optax.global_norm(grads)
      updates, opt_state = tx.update(grads, state.opt_state, state.params)
      params = optax.apply_updates(state.params, updates)
    # The updated parameters too: a finite gradient times a huge learning rate overflows.
    finite = (jnp.isfinite(loss) & jnp.isfinite(grad_norm)
              & jnp.isfinite(optax.global_norm(params)))
    skipped = state.skipped
    if skip_nonfinite:
      keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
      params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
      skipped = skipped + (~finite).astype(jnp.int32)
    return (state.replace(step=state.step + 1, params=params, opt_state=opt_state, skipped=skipped),
            dict(sums, grad_norm=grad_norm, finite=finite,
                 learning_rate=schedule(state.step // grad_accum_steps), skipped=skipped))

  def eval_step(params: Params, batch: Batch) -> dict:
    inputs, positions, mask = batch['inputs'], batch['positions'], batch['mask']
    logits = nnx.merge(eval_graphdef, params)(inputs, positions, mask)
    return loss_and_metrics(logits, batch)[1]

  return train_step, eval_step


def jit_steps(train_step: Callable, eval_step: Callable, state_sharding, batch_sharding,
              replicated, rules):
  """vmaps the steps over the seed axis (batches shared) and jits them once, state donated; they
  run under the mesh and the logical-axis ``rules``, so the model's activation annotations
  (``models.sharding.constrain``) become sharding constraints."""
  train = jax.jit(jax.vmap(train_step, in_axes=(0, None)),
                  in_shardings=(state_sharding, batch_sharding),
                  out_shardings=(state_sharding, replicated), donate_argnums=0)
  evaluate = jax.jit(jax.vmap(eval_step, in_axes=(0, None)),
                     in_shardings=(state_sharding.params, batch_sharding),
                     out_shardings=replicated)
  mesh = batch_sharding.mesh

  def in_mesh(fn):
    def run(call, *args):
      with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        return call(*args)

    wrapped = functools.wraps(fn)(lambda *args: run(fn, *args))
    wrapped.lower = lambda *args: run(fn.lower, *args)
    return wrapped

  return in_mesh(train), in_mesh(evaluate)
