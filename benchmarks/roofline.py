"""Roofline: the train step against this machine's own limits, measured in one process.

  python benchmarks/roofline.py [--sizes=small,base] [--dtypes=float32,bfloat16] [--length=512]
      [--batch_size=2] [--attention_impl=auto] [--matmul_size=2048] [--stream_mib=256]
  python benchmarks/roofline.py --quick      # tiny shapes, seconds (the test)

Measured side by side, in round-robin rounds (each sample ~``--sample_s`` seconds of calls):

* attainable FLOP/s: an n x n by n x n matmul (2 n^3 FLOPs) in float32 and in bfloat16, at the
  backend's default precision (what the model's dense layers get);
* memory bandwidth: y = x * a + b over ``--stream_mib`` MiB of float32, the buffer donated (read
  once, written once: 2 x its bytes per call);
* the project's train step (forward, backward, AdamW; ``common.our_train_step``) per size and
  dtype. Model FLOPs are counted as MaxText's ``calculate_tflops_training_per_device`` does
  (``benchmarks/model_flops.py``); MFU = model FLOP/s / attainable FLOP/s of the step's dtype,
  the median over rounds of the per-round ratio, so load that changes between rounds hits both
  sides;
* the elementwise parts at the step's shapes, each jitted alone, forward only: RoPE (the model's
  rotary apply on the queries with its shared sin/cos tables), LayerNorm (the model's own
  module) and softmax (float32 logits [B, H, L, L] to probabilities in the compute dtype, as the
  explicit attention does). Each moves at least its inputs once and its output once; that many
  bytes / its time, as a fraction of the measured bandwidth, says how close it is to the floor.

XLA's own count (``cost_analysis()['flops']`` of the compiled step) is printed beside the model
FLOPs: it also counts the elementwise work, the optimizer and the recomputed backward, and on GPU
it may skip custom calls such as cuDNN attention, so it is a cross-check, not the MFU numerator.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx

import models
from benchmarks import common
from benchmarks import model_flops

flags.DEFINE_list('sizes', ['small', 'base'], 'Model presets.')
flags.DEFINE_list('dtypes', ['float32', 'bfloat16'], 'Compute dtypes (model.dtype).')
flags.DEFINE_integer('length', 512, 'Sequence length.')
flags.DEFINE_integer('batch_size', 2, 'Batch size of the train step.')
flags.DEFINE_string('attention_impl', 'auto', 'model.attention_impl of the train step '
                    '(cudnn: fused attention on NVIDIA GPUs).')
flags.DEFINE_integer('matmul_size', 2048, 'n of the n x n x n matmuls.')
flags.DEFINE_integer('stream_mib', 256, 'MiB of float32 the bandwidth op reads (and writes).')
flags.DEFINE_integer('rounds', 5, 'Round-robin rounds.')
flags.DEFINE_float('sample_s', 0.3, 'Seconds of calls per sample (short calls are repeated).')
flags.DEFINE_bool('quick', False, 'Tiny shapes (tiny preset with 1 layer, length 32, small '
                  'matmul and stream, 2 rounds): checks the script in seconds.')
flags.DEFINE_string('json', None, 'Write the figures here (for run_all.py).')
FLAGS = flags.FLAGS

PARTS = ('RoPE', 'LayerNorm', 'softmax')
# An elementwise part should take at most twice the time of its minimal traffic at the measured
# bandwidth, the bar rope_bench sets for the rotary apply: beyond it the part moves its data
# more than twice (extra passes, float32 copies, recomputation), which a fusion can remove.
PART_GOAL = 0.5


class Plan(NamedTuple):
  """What one run measures (the flags, or ``--quick``'s tiny shapes)."""

  sizes: list[str]
  num_layers: int | None  # None: the preset's
  dtypes: list[str]
  length: int
  batch_size: int
  matmul_size: int
  stream_mib: int
  rounds: int
  sample_s: float


def plan() -> Plan:
  if FLAGS.quick:
    return Plan(['tiny'], 1, FLAGS.dtypes, 32, 2, 256, 4, 2, 0.01)
  return Plan(FLAGS.sizes, None, FLAGS.dtypes, FLAGS.length, FLAGS.batch_size, FLAGS.matmul_size,
              FLAGS.stream_mib, FLAGS.rounds, FLAGS.sample_s)


def _repeated(fn: Callable[[], object], seconds: float) -> tuple[Callable[[], object], int]:
  """(``fn`` called k times, k): k calls last about ``seconds`` (short calls are timed in
  batches, so dispatch and timer resolution do not dominate). Calls ``fn`` twice (compile)."""
  jax.block_until_ready(fn())
  start = time.perf_counter()
  jax.block_until_ready(fn())
  k = max(1, int(seconds / max(time.perf_counter() - start, 1e-7)))

  def calls():
    for _ in range(k):
      out = fn()
    return out

  return calls, k


def _carried(jitted, x) -> Callable[[], jax.Array]:
  """Calls ``jitted`` (which donates its argument) on its own last output."""
  holder = [x]

  def run():
    holder[0] = jitted(holder[0])
    return holder[0]

  return run


def machine_limits(p: Plan) -> dict[str, tuple[Callable[[], object], float, float]]:
  """name -> (call, work per call: FLOPs or bytes, XLA's FLOP count): a matmul per dtype and
  the bandwidth op."""
  out = {}
  keys = jax.random.split(jax.random.key(0), 2)
  matmul = jax.jit(jnp.matmul)
  for dtype in p.dtypes:
    a, b = (jax.random.normal(k, (p.matmul_size,) * 2, jnp.dtype(dtype)) for k in keys)
    compiled = matmul.lower(a, b).compile()
    out[f'matmul {dtype}'] = (lambda c=compiled, a=a, b=b: c(a, b), 2.0 * p.matmul_size**3,
                              common.flops(compiled))
  x = jnp.ones((p.stream_mib * 2**20 // 4,), jnp.float32)
  stream = jax.jit(lambda x: x * 0.5 + 1.0, donate_argnums=0)
  out['stream'] = (_carried(stream, x), 2.0 * x.nbytes, 0.0)
  return out


def elementwise_parts(cfg: models.ModelConfig, batch_size: int, length: int
                      ) -> dict[str, tuple[Callable[[], object], float]]:
  """part -> (call, minimal bytes moved) at the step's shapes: inputs read once, output
  written once."""
  keys = jax.random.split(jax.random.key(1), 3)
  dtype = cfg.compute_dtype
  q_BxLxHxD = jax.random.normal(keys[0], (batch_size, length, cfg.num_heads, cfg.head_dim), dtype)
  positions_BxL = jnp.broadcast_to(jnp.arange(length), (batch_size, length))
  rotary = cfg.rotary
  tables = jax.jit(rotary.tables)(positions_BxL)
  rope_fn = jax.jit(lambda x, t: rotary.apply(x, t, 'query'))
  rope_bytes = 2 * q_BxLxHxD.nbytes + tables.sin.nbytes + tables.cos.nbytes

  norm = nnx.merge(*models.init(cfg, keys[1])).layers[0].attention_norm
  norm_def, norm_state = nnx.split(norm)
  norm_fn = jax.jit(lambda state, x: nnx.merge(norm_def, state)(x))
  x_BxLxE = jax.random.normal(keys[2], (batch_size, length, cfg.hidden_size), dtype)
  norm_bytes = 2 * x_BxLxE.nbytes + sum(v.nbytes for v in jax.tree.leaves(norm_state))

  logits_BxHxTxS = jax.random.normal(keys[0], (batch_size, cfg.num_heads, length, length),
                                     jnp.float32)
  softmax_fn = jax.jit(lambda z: jax.nn.softmax(z, axis=-1).astype(dtype))
  softmax_bytes = logits_BxHxTxS.nbytes + logits_BxHxTxS.size * dtype.itemsize
  return {'RoPE': (lambda: rope_fn(q_BxLxHxD, tables), rope_bytes),
          'LayerNorm': (lambda: norm_fn(norm_state, x_BxLxE), norm_bytes),
          'softmax': (lambda: softmax_fn(logits_BxHxTxS), softmax_bytes)}


def _config_name(size: str, dtype: str, length: int) -> str:
  return f'{size}/{length} {dtype}'


def build(p: Plan) -> tuple[dict, dict, dict]:
  """(name -> (call, work per call) of everything measured, name -> train-step facts,
  matmul name -> XLA's FLOP count)."""
  limits = machine_limits(p)
  calls = {name: (fn, work) for name, (fn, work, _) in limits.items()}
  xla = {name: count for name, (_, _, count) in limits.items() if name.startswith('matmul')}
  steps = {}
  batch = common.synthetic_batch(p.batch_size, p.length)
  for size in p.sizes:
    for dtype in p.dtypes:
      c = common.get_config(**{'model.size': size, 'model.position': 'rotary',
                               'model.num_layers': p.num_layers, 'model.dtype': dtype,
                               'model.attention_impl': FLAGS.attention_impl,
                               'data.max_length': p.length})
      cfg = common.model_config(c)
      name = _config_name(size, dtype, p.length)
      step = common.our_train_step(c, batch, name=name)
      counted = model_flops.train_step(cfg, p.batch_size, p.length)
      print(f'{name}: compiled in {step.compile_s:.1f} s; model {counted["total"] / 1e9:.3g} '
            f'GFLOP/step, XLA {step.flops / 1e9:.3g}', flush=True)
      calls[name] = (step.run, counted['total'])
      steps[name] = {'dtype': dtype, 'flops': counted, 'xla_flops': step.flops,
                     'params': step.num_params}
      for part, (fn, moved) in elementwise_parts(cfg, p.batch_size, p.length).items():
        calls[f'{name} {part}'] = (fn, moved)
  return calls, steps, xla


def measure(calls: dict, p: Plan) -> dict[str, np.ndarray]:
  """name -> work per second (FLOP/s or bytes/s) in each round."""
  repeated = {name: _repeated(fn, p.sample_s) for name, (fn, _) in calls.items()}
  samples = common.time_samples({name: fn for name, (fn, _) in repeated.items()}, repeats=1,
                                rounds=p.rounds, warmup=0)
  return {name: calls[name][1] * repeated[name][1] / np.asarray(s)
          for name, s in samples.items()}


def _median_ratio(rates: dict[str, np.ndarray], name: str, limit: str) -> float:
  return float(np.median(rates[name] / rates[limit]))


def report(rates: dict[str, np.ndarray], steps: dict, matmul_xla: dict, p: Plan) -> dict:
  """The figures, table and notes of a run (and prints them)."""
  med = {name: float(np.median(r)) for name, r in rates.items()}
  header = ['step', 'ms/step', 'model GFLOP', 'XLA GFLOP', 'XLA / model', 'model GFLOP/s',
            'attainable GFLOP/s', 'MFU'] + [f'{part} / bandwidth' for part in PARTS]
  rows, figures = [], []
  for dtype in p.dtypes:
    figures.append(common.figure(f'attainable {dtype} matmul', med[f'matmul {dtype}'] / 1e9,
                                 unit='GFLOP/s', detail=f'{p.matmul_size}^3, median of rounds'))
  figures.append(common.figure('memory bandwidth (x * a + b)', med['stream'] / 1e9, unit='GB/s',
                               detail=f'{p.stream_mib} MiB float32 read + written'))
  limits = list(figures)
  for name, facts in steps.items():
    limit = f'matmul {facts["dtype"]}'
    mfu = _median_ratio(rates, name, limit)
    parts = {part: _median_ratio(rates, f'{name} {part}', 'stream') for part in PARTS}
    flops = facts['flops']['total']
    rows.append([name, f'{flops / med[name] * 1e3:.1f}', f'{flops / 1e9:.3g}',
                 f'{facts["xla_flops"] / 1e9:.3g}', f'{facts["xla_flops"] / flops:.2f}',
                 f'{med[name] / 1e9:.1f}', f'{med[limit] / 1e9:.1f}', f'{mfu:.1%}']
                + [f'{parts[part]:.0%}' for part in PARTS])
    figures.append(common.figure(f'MFU, train step {name}', mfu * 100, unit='%',
                                 detail=f'{med[name] / 1e9:.1f} of {med[limit] / 1e9:.1f} '
                                        'GFLOP/s'))
    worst = min(parts, key=parts.get)
    figures.append(common.figure(f'slowest elementwise part / bandwidth floor, {name}',
                                 parts[worst] * 100, unit='%', detail=worst,
                                 goal=f'>= {PART_GOAL:.0%} (<= 2x the floor\'s time)',
                                 met=parts[worst] >= PART_GOAL))
  print(f'machine: {common.machine()}')
  print(f'batch {p.batch_size} x length {p.length}, attention {FLAGS.attention_impl}; '
        f'median of {p.rounds} round-robin rounds')
  for fig in limits:
    print(f'{fig["name"]}: {fig["value"]:,.1f} {fig["unit"]}')
  print('XLA cost_analysis of the matmuls / 2n^3: ' + ', '.join(
      f'{name} {count / (2.0 * p.matmul_size**3):.3f}' for name, count in matmul_xla.items()))
  common.print_table(header, rows)
  return {'figures': figures, 'header': header, 'rows': rows}


def main(_):
  p = plan()
  start = time.perf_counter()
  calls, steps, matmul_xla = build(p)
  rates = measure(calls, p)
  result = report(rates, steps, matmul_xla, p)
  print(f'wall time {time.perf_counter() - start:.0f} s')
  common.write_json(FLAGS.json, dict(
      result, title='Roofline: the train step against this machine\'s attainable FLOP/s and '
                    'bandwidth',
      setup=(f'batch {p.batch_size} x length {p.length}, rotary, attention '
             f'{FLAGS.attention_impl}, one train step (forward, backward, AdamW); attainable '
             f'FLOP/s from a {p.matmul_size}^3 matmul per dtype, bandwidth from x * a + b on '
             f'{p.stream_mib} MiB of float32, all measured in the same {p.rounds} round-robin '
             'rounds; model FLOPs as MaxText counts them (3 x forward weight-matmul and '
             'attention FLOPs, bidirectional, CLS-only last layer); MFU and bandwidth '
             'fractions are medians of per-round ratios; elementwise parts forward only, alone, '
             'at the step\'s shapes, minimal bytes / time'),
      steps=steps))


if __name__ == '__main__':
  app.run(main)
