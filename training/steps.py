"""The pure train and eval steps, mapped over a leading member axis N.

The N members of one run, a (learning rate, seed) pair each, train in one jitted step (their own
init, dropout keys and rate; shared batches), vmapped together or one after another in a loop
(``over_members``); N = 1 is an ordinary run.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from data import batches
from training import optim

Params = Any


class TrainState(flax.struct.PyTreeNode):
  """Training state of N members (leading axis N on every field).

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


def loss_and_metrics(logits_BxC: jax.Array, label_B: jax.Array, weight_B: jax.Array,
                     regression: bool = False, scored_B: jax.Array | None = None
                     ) -> tuple[jax.Array, dict]:
  """Weighted mean loss (cross-entropy, or squared error of the one output with
  ``regression``) and metric sums, reduced on the host; binary tasks add the sums of F1
  (class 1 positive). The accuracy and F1 count the rows ``scored_B`` weighs (default: as the
  loss; a Chomsky task's outputs after a termination token are trained on but not scored)."""
  weight_B = weight_B.astype(jnp.float32)
  scored_B = weight_B if scored_B is None else scored_B.astype(jnp.float32)
  logits_BxC = logits_BxC.astype(jnp.float32)
  sums = {}
  if regression:
    losses_B = jnp.square(logits_BxC[:, 0] - label_B.astype(jnp.float32))
    correct_B = jnp.zeros_like(losses_B)
  else:
    losses_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxC, label_B)
    predicted_B = jnp.argmax(logits_BxC, -1)
    correct_B = (predicted_B == label_B).astype(jnp.float32)
    if logits_BxC.shape[-1] == 2:
      positive, truly = predicted_B == 1, label_B == 1
      sums = {name: (cases.astype(jnp.float32) * scored_B).sum() for name, cases in (
          ('true_positive_sum', positive & truly), ('false_positive_sum', positive & ~truly),
          ('false_negative_sum', ~positive & truly))}
  denom = jnp.maximum(weight_B.sum(), 1.0)
  sums.update(loss_sum=(losses_B * weight_B).sum(), correct_sum=(correct_B * scored_B).sum(),
              count=weight_B.sum(), scored=scored_B.sum())
  return (losses_B * weight_B).sum() / denom, sums


def forward(model, batch: batches.Batch, rngs: nnx.Rngs | None = None
            ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array | None]:
  """The model's logits on a batch and the labels, weights and scored rows ``loss_and_metrics``
  scores them against: a classifier's [B, C], label and weight; a language model's [B M, V] or
  a query-token batch's [B M, C] and its targets with their weights (flattened alike)."""
  if isinstance(batch, batches.Classification):
    return (model(batch.inputs, batch.positions, batch.mask, batch.token_types, rngs=rngs),
            batch.label, batch.weight, None)
  queries = isinstance(batch, batches.Queries)
  logits_BxMxV = model(batch.inputs, batch.positions, batch.mask, rngs=rngs,
                       segments_BxL=None if queries else batch.segments,
                       target_positions_BxM=batch.target_positions)
  return (logits_BxMxV.reshape(-1, logits_BxMxV.shape[-1]), batch.targets.reshape(-1),
          batch.target_weights.reshape(-1), batch.scored.reshape(-1) if queries else None)


def make_step_fns(train_graphdef: nnx.GraphDef, eval_graphdef: nnx.GraphDef,
                  tx: optax.GradientTransformation, schedule_shape: optax.Schedule,
                  grad_accum_steps: int, skip_nonfinite: bool, regression: bool = False):
  """The per-seed train and eval steps (pure; vmapped and jitted by the caller). With
  ``regression`` the eval step also returns each example's prediction, target and weight (for
  the correlations, computed on the host)."""

  def train_step(state: TrainState, batch: batches.Batch) -> tuple[TrainState, dict]:
    dropout_key = jax.random.fold_in(state.key, state.step)

    def loss_fn(params):
      model = nnx.merge(train_graphdef, params)
      logits, label, weight, scored = forward(model, batch, nnx.Rngs(dropout=dropout_key))
      with jax.named_scope('loss'):
        return loss_and_metrics(logits, label, weight, regression, scored)

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
                 learning_rate=optim.peak_learning_rate(state.opt_state)
                 * schedule_shape(state.step // grad_accum_steps), skipped=skipped))

  def eval_step(params: Params, batch: batches.Batch) -> dict:
    logits, label, weight, scored = forward(nnx.merge(eval_graphdef, params), batch)
    sums = loss_and_metrics(logits, label, weight, regression, scored)[1]
    if regression:
      sums.update(prediction=logits[:, 0].astype(jnp.float32),
                  target=label.astype(jnp.float32), weight=weight)
    return sums

  return train_step, eval_step


def over_members(step: Callable, batch_size: int | None) -> Callable:
  """``step(member, batch)`` for every member of a stacked ``members`` (batch shared), as
  ``jax.lax.map`` with ``batch_size``: None runs them one after another as written for one
  member; k runs k at a time in one vmapped computation, the groups one after another; 0 vmaps
  them all. The loops are compiled into the same step."""
  return lambda members, batch: jax.lax.map(lambda member: step(member, batch), members,
                                            batch_size=batch_size)


def jit_steps(train_step: Callable, eval_step: Callable, state_sharding, batch_sharding,
              replicated, rules, loop: bool):
  """Maps the steps over the member axis (``over_members``) and jits them once, state donated;
  they run under the mesh and the logical-axis ``rules``, so the model's activation annotations
  (``models.sharding.constrain``) become sharding constraints. With ``loop`` the members run one
  at a time: the train step as written for one member (faster on XLA's CPU backend than through
  a vmap of one: benchmarks/README.md, ``seeds_bench``), evaluation through a vmap of one (there
  the faster form); without ``loop`` every member runs at once, vmapped."""
  train = jax.jit(over_members(train_step, None if loop else 0),
                  in_shardings=(state_sharding, batch_sharding),
                  out_shardings=(state_sharding, replicated), donate_argnums=0)
  evaluate = jax.jit(over_members(eval_step, 1 if loop else 0),
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
