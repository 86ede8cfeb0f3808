"""Side-by-side timing helpers for the benchmark scripts (not timed tests)."""

from __future__ import annotations

import platform
import time
from typing import Callable

import jax
import numpy as np


def time_fns(fns: dict[str, Callable[[], object]], *, repeats: int = 30,
             rounds: int = 5) -> dict[str, float]:
  """Median seconds per call of each function, measured interleaved in rounds.

  Each function is called once first (compilation), then the functions take turns, ``repeats``
  calls each per round, so slow drifts of a shared machine hit them alike.
  """
  for fn in fns.values():
    jax.block_until_ready(fn())
  samples = {name: [] for name in fns}
  for _ in range(rounds):
    for name, fn in fns.items():
      start = time.perf_counter()
      for _ in range(repeats):
        out = fn()
      jax.block_until_ready(out)
      samples[name].append((time.perf_counter() - start) / repeats)
  return {name: float(np.median(s)) for name, s in samples.items()}


def machine() -> str:
  dev = jax.devices()[0]
  return (f'{platform.processor() or platform.machine()}, {jax.device_count()} x '
          f'{dev.device_kind} ({dev.platform}), jax {jax.__version__}')
