"""The pure train and eval steps, mapped over a leading member axis N: the members of a run, a
(learning rate, seed) pair each, train in one jitted step on shared batches (``over_members``)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from data import batches
from training import optim
from training import tasks

Params = Any


class TrainState(flax.struct.PyTreeNode):
  """Training state of N members (leading axis N on every field)."""

  step: jax.Array  # int32 [N], train steps taken
  params: Params  # a pure nested dict of [N, ...] arrays
  opt_state: optax.OptState
  key: jax.Array  # uint32 [N, 2], each seed's PRNG key; step t's dropout key is fold_in(key, t)
  skipped: jax.Array  # int32 [N], updates skipped as not finite


@dataclasses.dataclass(frozen=True)
class Static:
  """What a run's steps close over; with ``regression`` the eval step also returns each example's
  prediction, target and weight (for the correlations computed on the host)."""

  train_graphdef: nnx.GraphDef
  eval_graphdef: nnx.GraphDef
  tx: optax.GradientTransformation
  schedule_shape: optax.Schedule
  kind: tasks.TaskKind
  grad_accum_steps: int = 1
  skip_nonfinite: bool = False
  regression: bool = False
  project: Callable[[Params], Params] | None = None  # the scheme's, after each update (KERPLE)


def train_step(state: TrainState, batch: batches.Batch, static: Static) -> tuple[TrainState, dict]:
  """One member's update on one batch: loss, gradients, AdamW, the NaN/Inf guard."""
  dropout_key = jax.random.fold_in(state.key, state.step)

  def loss_fn(params):
    model = nnx.merge(static.train_graphdef, params)
    logits, label, weight, scored = static.kind.forward(model, batch, nnx.Rngs(dropout=dropout_key))
    with jax.named_scope('loss'):
      return static.kind.loss(logits, label, weight, static.regression, scored)

  (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  with jax.named_scope('optimizer'):
    grad_norm = optax.global_norm(grads)
    updates, opt_state = static.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    if static.project is not None:
      params = static.project(params)
  # The updated parameters too: a finite gradient times a huge learning rate overflows.
  finite = (jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(optax.global_norm(params)))
  skipped = state.skipped
  if static.skip_nonfinite:
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
    skipped = skipped + (~finite).astype(jnp.int32)
  rate = (optim.peak_learning_rate(state.opt_state)
          * static.schedule_shape(state.step // static.grad_accum_steps))
  return (state.replace(step=state.step + 1, params=params, opt_state=opt_state, skipped=skipped),
          dict(sums, grad_norm=grad_norm, finite=finite, learning_rate=rate, skipped=skipped))


def eval_step(params: Params, batch: batches.Batch, static: Static) -> dict:
  """One member's metric sums on one batch (``Static.regression``: and its predictions)."""
  logits, label, weight, scored = static.kind.forward(nnx.merge(static.eval_graphdef, params),
                                                      batch)
  sums = static.kind.loss(logits, label, weight, static.regression, scored)[1]
  if static.regression:
    sums.update(prediction=logits[:, 0].astype(jnp.float32),
                target=label.astype(jnp.float32), weight=weight)
  return sums


def over_members(step: Callable, batch_size: int | None) -> Callable:
  """``step(member, batch)`` for every stacked member, ``jax.lax.map``'s ``batch_size`` at a time
  (None: one after another as written for one member; 0: all vmapped)."""
  return lambda members, batch: jax.lax.map(lambda member: step(member, batch), members,
                                            batch_size=batch_size)


def jit_steps(static: Static, state_sharding, batch_sharding, replicated, rules, loop: bool):
  """The steps over the members, jitted once (state donated), run under the mesh and ``rules`` so
  the model's activation annotations become sharding constraints. With ``loop`` the members run
  one at a time: training as written for one member, evaluation through a vmap of one (each the
  faster form on XLA's CPU backend: benchmarks/README.md, ``seeds_bench``)."""
  train = jax.jit(over_members(functools.partial(train_step, static=static), None if loop else 0),
                  in_shardings=(state_sharding, batch_sharding),
                  out_shardings=(state_sharding, replicated), donate_argnums=0)
  evaluate = jax.jit(over_members(functools.partial(eval_step, static=static), 1 if loop else 0),
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
