"""The optimizer: AdamW with warmup and decay, global-norm clipping, gradient accumulation.

The peak learning rate is injected into the optimizer state (``optax.inject_hyperparams``), so
the members of one vmapped run (``optim.learning_rates`` x seeds) each train at their own rate,
and a checkpoint carries it.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ('cosine', 'linear', 'constant', 'rsqrt')


def learning_rates(optim) -> list[float]:
  """The peak learning rates a run trains: ``optim.learning_rates`` or ``optim.learning_rate``."""
  rates = list(optim.learning_rates)
  for rate in rates:
    if not (math.isfinite(rate) and rate > 0):
      raise ValueError(f'optim.learning_rates holds {rate}: every rate must be finite and > 0.')
  return rates or [float(optim.learning_rate)]


def schedule_shape(optim, num_updates: int) -> optax.Schedule:
  """The learning rate over updates divided by its peak: linear warmup to 1, then cosine/linear
  decay to ``optim.end_lr_factor``, constant, or 'rsqrt': sqrt(warmup / t) (the Transformer's
  and Long Range Arena's ``linear_warmup * rsqrt_decay``)."""
  if optim.schedule not in SCHEDULES:
    raise ValueError(f'Unknown optim.schedule {optim.schedule!r}; valid choices: '
                     f'{", ".join(SCHEDULES)}.')
  warmup, decay_steps = optim.warmup_steps, max(num_updates - optim.warmup_steps, 1)
  if optim.schedule == 'cosine':
    decay = optax.cosine_decay_schedule(1.0, decay_steps, alpha=optim.end_lr_factor)
  elif optim.schedule == 'linear':
    decay = optax.linear_schedule(1.0, optim.end_lr_factor, decay_steps)
  elif optim.schedule == 'rsqrt':
    start = float(max(warmup, 1))  # join_schedules also evaluates it before the boundary
    decay = lambda count: jnp.sqrt(start / jnp.maximum(count + start, start))
  else:
    decay = optax.constant_schedule(1.0)
  return decay if warmup == 0 else optax.join_schedules(
      [optax.linear_schedule(0.0, 1.0, warmup), decay], [warmup])


def decay_mask(params):
  """True for the weights that get weight decay: dense kernels, not biases/LayerNorm/embeddings."""
  return jax.tree_util.tree_map_with_path(  # embeddings are 'embedding', position tables '*_table'
      lambda path, _: getattr(path[-1], 'key', None) == 'kernel', params)


def position_mask(params):
  """True for the position scheme's own parameters (under a ``positions`` module)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: any(getattr(k, 'key', None) == 'positions' for k in path), params)


def learning_rate_multipliers(optim, params):
  """Each parameter's learning-rate multiplier: 1 for the head (and a final LayerNorm); with
  ``optim.layer_decay`` d, layer i of L at d^(L - i), below the layers at d^(L + 1);
  ``optim.freeze_encoder``: 0 for all but the head."""
  num_layers = len(params.get('layers', {}))

  def multiplier(path, _):
    top = getattr(path[0], 'key', None)
    if top in ('head', 'final_norm'):
      return 0.0 if optim.freeze_encoder and top != 'head' else 1.0
    if optim.freeze_encoder:
      return 0.0
    if top == 'layers':
      return optim.layer_decay ** (num_layers - int(path[1].key))
    return optim.layer_decay ** (num_layers + 1)
  return jax.tree_util.tree_map_with_path(multiplier, params)


def make_optimizer(optim, num_updates: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """AdamW (+ clipping, + ``optax.MultiSteps`` accumulation) with the peak learning rate injected,
  and the schedule's shape over ``num_updates`` (train steps / grad_accum_steps)."""
  shape = schedule_shape(optim, num_updates)

  def adamw(learning_rate):
    return optax.adamw(lambda count: learning_rate * shape(count), b1=optim.b1, b2=optim.b2,
                       eps=optim.eps, weight_decay=optim.weight_decay, mask=decay_mask)

  tx = optax.inject_hyperparams(adamw)(learning_rate=optim.learning_rate)
  if optim.position_lr_multiplier != 1.0:
    tx = optax.chain(tx, optax.masked(optax.scale(optim.position_lr_multiplier), position_mask))
  if optim.layer_decay != 1.0 or optim.freeze_encoder:
    tx = optax.chain(tx, optax.stateless(lambda updates, params: jax.tree.map(
        lambda u, m: u * m, updates, learning_rate_multipliers(optim, params))))
  if optim.grad_clip_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(optim.grad_clip_norm), tx)
  if optim.grad_accum_steps > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=optim.grad_accum_steps)
  return tx, shape


def peak_learning_rate(opt_state) -> jax.Array:
  """The peak learning rate injected in an optimizer state."""
  return optax.tree_utils.tree_get(opt_state, 'learning_rate')


def with_peak_learning_rate(opt_state, learning_rate: jax.Array):
  """``opt_state`` training at ``learning_rate`` instead."""
  return optax.tree_utils.tree_set(opt_state, learning_rate=learning_rate)
