"""The pure train and eval steps, mapped over a leading member axis N.

The N members of one run, a (learning rate, seed) pair each, train in one jitted step (their own
init, dropout keys and rate; shared batches), vmapped together or one after another in a loop
(``over_members``); N = 1 is an ordinary run.
"""

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


@dataclasses.dataclass(frozen=True)
class Static:
  """What a run's steps close over: the model's graph for training and for evaluation (no
  dropout), the optimizer and its schedule's shape, the task kind (``training/tasks.py``), and
  ``regression`` (the eval step then also returns each example's prediction, target and weight,
  for the correlations computed on the host)."""

  train_graphdef: nnx.GraphDef
  eval_graphdef: nnx.GraphDef
  tx: optax.GradientTransformation
  schedule_shape: optax.Schedule
  kind: tasks.TaskKind
  grad_accum_steps: int = 1
  skip_nonfinite: bool = False
  regression: bool = False


def train_step(state: TrainState, batch: batches.Batch, static: Static
               ) -> tuple[TrainState, dict]:
  """One member's update on one batch: loss, gradients, AdamW, the NaN/Inf guard."""
  dropout_key = jax.random.fold_in(state.key, state.step)

  def loss_fn(params):
    model = nnx.merge(static.train_graphdef, params)
    logits, label, weight, scored = static.kind.forward(model, batch,
                                                        nnx.Rngs(dropout=dropout_key))
    with jax.named_scope('loss'):
      return static.kind.loss(logits, label, weight, static.regression, scored)

  (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  with jax.named_scope('optimizer'):
    grad_norm = optax.global_norm(grads)
    updates, opt_state = static.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
  # The updated parameters too: a finite gradient times a huge learning rate overflows.
  finite = (jnp.isfinite(loss) & jnp.isfinite(grad_norm)
            & jnp.isfinite(optax.global_norm(params)))
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
  """``step(member, batch)`` for every member of a stacked ``members`` (batch shared), as
  ``jax.lax.map`` with ``batch_size``: None runs them one after another as written for one
  member; k runs k at a time in one vmapped computation, the groups one after another; 0 vmaps
  them all. The loops are compiled into the same step."""
  return lambda members, batch: jax.lax.map(lambda member: step(member, batch), members,
                                            batch_size=batch_size)


def jit_steps(static: Static, state_sharding, batch_sharding, replicated, rules, loop: bool):
  """Maps the steps over the member axis (``over_members``) and jits them once, state donated;
  they run under the mesh and the logical-axis ``rules``, so the model's activation annotations
  (``models.sharding.constrain``) become sharding constraints. With ``loop`` the members run one
  at a time: the train step as written for one member (faster on XLA's CPU backend than through
  a vmap of one: benchmarks/README.md, ``seeds_bench``), evaluation through a vmap of one (there
  the faster form); without ``loop`` every member runs at once, vmapped."""
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
