"""AdamW with warmup and decay, global-norm clipping and gradient accumulation; the peak rate is
injected into the optimizer state, so each member of a run trains at its own."""

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
  """The learning rate over its peak: linear warmup, then cosine/linear decay to
  ``optim.end_lr_factor``, constant, or 'rsqrt' (LRA's ``linear_warmup * rsqrt_decay``)."""
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
  """True for dense kernels, the weights that get weight decay."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], 'key', None) == 'kernel', params)


def position_mask(params):
  """True for the parameters under a ``positions`` module (the position scheme's)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: any(getattr(k, 'key', None) == 'positions' for k in path), params)


def learning_rate_multipliers(optim, params):
  """Each parameter's learning-rate multiplier (``optim.layer_decay``, ``optim.freeze_encoder``)."""
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
  """The optimizer, and the schedule's shape over ``num_updates`` (steps / grad_accum_steps)."""
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
  return optax.tree_utils.tree_get(opt_state, 'learning_rate')


def with_peak_learning_rate(opt_state, learning_rate: jax.Array):
  return optax.tree_utils.tree_set(opt_state, learning_rate=learning_rate)
