"""Tiny preset for tests and smoke runs: seconds on one CPU core.

  python train.py --config=configs/tiny.py --workdir=/tmp/tiny
"""

from configs import default


def get_config():
  c = default.get_config()
  c.model.size = 'tiny'  # 2 layers, hidden 64, 4 heads.
  c.model.dropout_rate = 0.0  # No dropout: a few steps must already lower the loss.
  c.train.batch_size = 16
  c.train.eval_batch_size = 64
  c.train.num_steps = 20
  c.train.eval_every = 10
  c.train.log_every = 5
  c.train.checkpoint_every = 10
  c.optim.warmup_steps = 2
  c.train.compilation_cache_dir = ''  # Keep the test session's cache (tests/conftest.py).
  c.train.eval_max_length = 128  # The probes' long test splits cost minutes here.
  return c
