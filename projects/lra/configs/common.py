"""Long Range Arena tasks (Tay et al. 2021) with LRA's own recipe."""

import math


def lra_optimizer(c, *, warmup_steps: int) -> None:
  """LRA's optimizer: 0.05 x linear warmup x rsqrt decay (peak 0.05 / sqrt(warmup)), weight
  decay 0.1, Adam b2 0.98, eps 1e-9."""
  c.optim.warmup_steps = warmup_steps
  c.optim.schedule = 'rsqrt'
  c.optim.learning_rate = 0.05 / math.sqrt(warmup_steps)
  c.optim.weight_decay = 0.1
  c.optim.b2 = 0.98
  c.optim.eps = 1e-9


def lra_encoder(c, *, num_layers: int, hidden_size: int, num_heads: int, mlp_dim: int,
                max_length: int) -> None:
  """An LRA task's encoder: its sizes, CLS pooling, inputs of ``max_length`` bytes (with
  [CLS]), softmax in blocks (memory linear in the length on CPU/TPU)."""
  c.data.max_length = c.model.max_length = max_length
  c.model.update(size='small', num_layers=num_layers, hidden_size=hidden_size,
                 num_heads=num_heads, mlp_dim=mlp_dim, pooling='cls', attention_impl='chunked')


def lra_training(c, *, num_steps: int, eval_every: int) -> None:
  """LRA's batch of 32 for ``num_steps`` steps, evaluated and checkpointed every
  ``eval_every``."""
  c.train.update(batch_size=32, num_steps=num_steps, eval_every=eval_every,
                 checkpoint_every=eval_every)
