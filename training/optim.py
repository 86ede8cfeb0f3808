"""The optimizer: AdamW with warmup and decay, global-norm clipping, gradient accumulation."""

from __future__ import annotations

import jax
import ml_collections
import optax

SCHEDULES = ('cosine', 'linear', 'constant')


def learning_rate_schedule(optim: ml_collections.ConfigDict, num_updates: int) -> optax.Schedule:
  """Linear warmup to ``optim.learning_rate``, then cosine/linear decay or constant."""
  if optim.schedule not in SCHEDULES:
    raise ValueError(f'Unknown optim.schedule {optim.schedule!r}; valid choices: '
                     f'{", ".join(SCHEDULES)}.')
  peak, warmup = optim.learning_rate, optim.warmup_steps
  decay_steps = max(num_updates - warmup, 1)
  if optim.schedule == 'cosine':
    decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=optim.end_lr_factor)
  elif optim.schedule == 'linear':
    decay = optax.linear_schedule(peak, peak * optim.end_lr_factor, decay_steps)
  else:
    decay = optax.constant_schedule(peak)
  return decay if warmup == 0 else optax.join_schedules(
      [optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def decay_mask(params):
  """True for the weights that get weight decay: dense kernels, not biases/LayerNorm/embeddings."""
  return jax.tree_util.tree_map_with_path(  # embeddings are 'embedding', position tables '*_table'
      lambda path, _: getattr(path[-1], 'key', None) == 'kernel', params)


def make_optimizer(optim: ml_collections.ConfigDict,
                   num_updates: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """AdamW (+ clipping, + ``optax.MultiSteps`` accumulation) and its learning-rate schedule over
  ``num_updates`` optimizer updates (train steps / grad_accum_steps)."""
  schedule = learning_rate_schedule(optim, num_updates)
  tx = optax.adamw(schedule, b1=optim.b1, b2=optim.b2, eps=optim.eps,
                   weight_decay=optim.weight_decay, mask=decay_mask)
  if optim.grad_clip_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(optim.grad_clip_norm), tx)
  if optim.grad_accum_steps > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=optim.grad_accum_steps)
  return tx, schedule
