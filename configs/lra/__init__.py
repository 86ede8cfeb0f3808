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
