"""Side-by-side timing helpers for the benchmark scripts (not timed tests).

Besides the timing loop (``time_fns``) this module builds "our" train and forward steps the way
training does (``configs/default.py`` -> ``validation.model_config`` -> ``models.init`` ->
``training.optim.make_optimizer`` -> ``training.steps.train_step``), on synthetic byte-level
batches, and reads peak memory from the compiled executable (``memory_analysis``).

Every script takes ``--json=PATH`` and writes its figures there; ``run_all.py`` collects them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import sys
import time
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import models
from configs import default
from data import batches
from training import optim
from training import steps
from training import tasks
from training import trainer
from training import validation
from training.config import run_config

# The XLA flags the project's runs start with (entry points: experiments/cli.py); both programs
# of a comparison run under them, ours and the peer's.
trainer.default_xla_flags()

VOCAB_SIZE = 260  # the byte tokenizer's vocabulary (data.BYTE_VOCAB_SIZE)
NUM_CLASSES = 2


def time_fns(fns: dict[str, Callable[[], object]], *, repeats: int = 30,
             rounds: int = 5, warmup: int = 1) -> dict[str, float]:
  """Median seconds per call of each function, measured interleaved in rounds.

  Each function is called ``warmup`` times first (compilation), then the functions take turns
  (round-robin), ``repeats`` calls each per round, so slow drifts of a shared machine hit them
  alike.
  """
  return {name: float(np.median(s))
          for name, s in time_samples(fns, repeats=repeats, rounds=rounds, warmup=warmup).items()}


def time_samples(fns: dict[str, Callable[[], object]], *, repeats: int = 1, rounds: int = 5,
                 warmup: int = 1) -> dict[str, list[float]]:
  """Seconds per call of each function in each round (see ``time_fns``).

  Odd rounds run the functions in reverse order, so a steady drift of the machine's speed within
  a round does not favour the functions that come first.
  """
  for fn in fns.values():
    for _ in range(warmup):
      jax.block_until_ready(fn())
  samples = {name: [] for name in fns}
  for i in range(rounds):
    order = list(fns.items())
    for name, fn in (order[::-1] if i % 2 else order):
      start = time.perf_counter()
      for _ in range(repeats):
        out = fn()
      jax.block_until_ready(out)
      samples[name].append((time.perf_counter() - start) / repeats)
  return samples


def paired_ratio(samples: dict[str, list[float]], name: str, base: str) -> float:
  """Median over rounds of (time of ``name`` / time of ``base`` in the same round): measured
  side by side, so load that changes between rounds cancels."""
  return float(np.median(np.asarray(samples[name]) / np.asarray(samples[base])))


def machine_memory_bytes() -> int:
  """This machine's physical memory."""
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def machine() -> str:
  dev = jax.devices()[0]
  return (f'{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, '
          f'{jax.device_count()} x {dev.device_kind} ({dev.platform}), jax {jax.__version__}')


def versions() -> str:
  """Versions of the libraries the figures depend on."""
  out = [f'python {platform.python_version()}', f'jax {jax.__version__}',
         f'jaxlib {jax.lib.__version__}' if hasattr(jax.lib, '__version__') else '',
         f'flax {flax.__version__}', f'optax {optax.__version__}']
  if 'transformers' in sys.modules:
    out.append(f'transformers {sys.modules["transformers"].__version__}')
  return ', '.join(o for o in out if o)


def mem_total_bytes() -> int:
  """Physical memory of this machine (0 if unknown)."""
  try:
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  except (ValueError, OSError, AttributeError):
    return 0


def mem_available_bytes() -> int:
  """MemAvailable from /proc/meminfo (0 if unknown)."""
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


def gib(n: float) -> str:
  return f'{n / 2**30:.2f} GiB'


def mib(n: float) -> str:
  return f'{n / 2**20:.0f} MiB'


def memory_bytes(compiled) -> dict[str, int]:
  """Peak-memory estimate of a compiled executable: arguments + outputs + temporaries - aliased
  (donated) buffers, from XLA's ``memory_analysis`` (what XLA allocates; no allocator slack)."""
  m = compiled.memory_analysis()
  if m is None:
    return {'peak': 0, 'temp': 0, 'argument': 0, 'output': 0, 'alias': 0}
  out = {'temp': int(m.temp_size_in_bytes), 'argument': int(m.argument_size_in_bytes),
         'output': int(m.output_size_in_bytes), 'alias': int(m.alias_size_in_bytes)}
  out['peak'] = out['temp'] + out['argument'] + out['output'] - out['alias']
  return out


def flops(compiled) -> float:
  """XLA's FLOP count of a compiled executable (cost_analysis), 0 if unavailable."""
  try:
    cost = compiled.cost_analysis()
  except Exception:  # pylint: disable=broad-except
    return 0.0
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return float((cost or {}).get('flops', 0.0))


# --------------------------------------------------------------------------- our model


def get_config(**overrides: Any):
  """``configs/default.py`` with dotted overrides, e.g. ``get_config(**{'model.size': 'small'})``.

  Dropout stays at the default (0.1 on hidden states, 0 on attention probabilities).
  """
  c = default.get_config()
  c.train.compilation_cache_dir = ''
  c.update_from_flattened_dict(overrides)
  return c


def model_config(c):
  """The model of a benchmark config: the byte vocabulary, or ``c.data.sp_vocab_size`` tokens
  for a language model (``train.task``), as a trained WordPiece gives."""
  vocab = VOCAB_SIZE if c.train.task == 'classify' else c.data.sp_vocab_size
  return validation.model_config(c, vocab_size=vocab, num_classes=NUM_CLASSES)


def synthetic_batch(batch_size: int, length: int, *, seed: int = 0,
                    vocab_size: int = VOCAB_SIZE) -> batches.Classification:
  """A full (unpadded) byte-level batch in the pipeline's format: [CLS] + random bytes."""
  rng = np.random.default_rng(seed)
  inputs = rng.integers(4, vocab_size, (batch_size, length), dtype=np.int32)
  inputs[:, 0] = 1  # [CLS]
  positions = np.broadcast_to(np.arange(length, dtype=np.int32), (batch_size, length))
  return batches.Classification(
      inputs=jnp.asarray(inputs), positions=jnp.asarray(positions.copy()),
      mask=jnp.ones((batch_size, length), bool),
      label=jnp.asarray(rng.integers(0, NUM_CLASSES, (batch_size,), dtype=np.int32)),
      weight=jnp.ones((batch_size,), jnp.float32))


@dataclasses.dataclass
class Step:
  """A compiled step and what it is run on. ``run()`` does one call (train steps carry their
  donated state forward)."""

  name: str
  compiled: Any
  args: tuple
  compile_s: float
  memory: dict[str, int]
  flops: float
  num_params: int
  carries_state: bool = False

  def run(self):
    if self.carries_state:
      state, metrics = self.compiled(*self.args)
      self.args = (state,) + self.args[1:]
      return metrics
    return self.compiled(*self.args)


def compile_timed(jitted, *args) -> tuple[Any, float]:
  start = time.perf_counter()
  compiled = jitted.lower(*args).compile()
  return compiled, time.perf_counter() - start


def lower_only(jitted, *args):
  return jitted.lower(*args)


def _our_parts(c):
  """(model config, train graphdef, eval graphdef, tx, schedule, train_step, eval_step)."""
  cfg = model_config(c)
  graphdef = lambda cfg: jax.eval_shape(functools.partial(models.init, cfg),
                                        jax.random.PRNGKey(0))[0]
  tx, schedule = optim.make_optimizer(c.optim, c.train.num_steps)
  static = steps.Static(graphdef(cfg), graphdef(cfg.replace(deterministic=True)), tx, schedule,
                        tasks.of(run_config(c)), c.optim.grad_accum_steps, c.train.skip_nonfinite)
  return (cfg, tx, functools.partial(steps.train_step, static=static),
          functools.partial(steps.eval_step, static=static))


def our_state(c, tx, key: int = 0):
  """A fresh single-seed ``TrainState`` (no seed axis) and the parameter count."""
  cfg = model_config(c)

  @jax.jit
  def init(key):
    init_key, dropout_key = jax.random.split(key)
    params = nnx.to_pure_dict(models.init(cfg, init_key)[1])
    return steps.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                            opt_state=tx.init(params), key=dropout_key,
                            skipped=jnp.zeros((), jnp.int32))

  state = init(jax.random.PRNGKey(key))
  return state, sum(int(x.size) for x in jax.tree.leaves(state.params))


def our_train_step(c, batch, *, name: str = 'ours', compiled=None) -> Step:
  """The project's train step (``steps.train_step``; forward, backward, AdamW) for one seed, jitted
  with the state donated, compiled for ``batch`` (or ``compiled``, e.g. from
  ``abstract_memory``, is used as is)."""
  _, tx, train_step, _ = _our_parts(c)
  state, num_params = our_state(c, tx)
  seconds = 0.0
  if compiled is None:
    compiled, seconds = compile_timed(jax.jit(train_step, donate_argnums=0), state, batch)
  return Step(name, compiled, (state, batch), seconds, memory_bytes(compiled), flops(compiled),
              num_params, carries_state=True)


def our_forward(c, batch, *, name: str = 'ours forward') -> Step:
  """The project's eval step (deterministic forward + loss sums), jitted and compiled."""
  _, tx, _, eval_step = _our_parts(c)
  state, num_params = our_state(c, tx)
  jitted = jax.jit(eval_step)
  compiled, seconds = compile_timed(jitted, state.params, batch)
  return Step(name, compiled, (state.params, batch), seconds, memory_bytes(compiled),
              flops(compiled), num_params)


def abstract_memory(c, batch_shapes):
  """(peak-memory estimate, compiled) of our train step for abstract batch shapes; nothing runs."""
  _, tx, train_step, _ = _our_parts(c)
  abstract_state = jax.eval_shape(lambda: our_state(c, tx)[0])
  jitted = jax.jit(train_step, donate_argnums=0)
  compiled = jitted.lower(abstract_state, batch_shapes).compile()
  return memory_bytes(compiled), compiled


def abstract_batch(batch_size: int, length: int) -> batches.Classification:
  """The shapes and dtypes of ``synthetic_batch``."""
  return jax.eval_shape(lambda: synthetic_batch(batch_size, length))


# --------------------------------------------------------------------------- reporting


def write_json(path: str | None, result: dict[str, Any]) -> None:
  """Writes a script's result (figures, tables, notes) for ``run_all.py``."""
  if not path:
    return
  result = dict(result, machine=machine(), versions=versions(),
                command=' '.join(['python'] + sys.argv))
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'w') as f:
    json.dump(result, f, indent=1, default=float)


def figure(name: str, value: float, *, goal: str = '', met: bool | None = None,
           unit: str = 'x', detail: str = '') -> dict[str, Any]:
  """One headline figure of a benchmark (a ratio, its goal and whether it is met)."""
  return {'name': name, 'value': value, 'unit': unit, 'goal': goal, 'met': met,
          'detail': detail}


def print_table(header: list[str], rows: list[list[Any]]) -> None:
  widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
            for i, h in enumerate(header)]
  print('  '.join(str(h).ljust(w) for h, w in zip(header, widths)))
  for r in rows:
    print('  '.join(str(x).ljust(w) for x, w in zip(r, widths)))
