"""Train-step throughput and model FLOPs utilisation (MFU) on an accelerator.

  python benchmarks/accelerator.py [--size=base] [--length=512] [--batch_size=32]
      [--dtype=bfloat16] [--attention=auto|cudnn|xla] [--steps=20] [--peak_tflops=...]
  python benchmarks/accelerator.py --smoke        # tiny sizes, runs on CPU in seconds

Called by ``benchmarks/gpu.sh``. Builds the project's train step (forward, backward, AdamW) in the
compute dtype (parameters float32, activations ``--dtype``), with softmax attention through
``jax.nn.dot_product_attention(implementation=...)`` (``model.attention_impl``): ``cudnn`` is
cuDNN's fused flash
attention; ``auto`` tries cudnn and falls back to XLA's attention if it is unavailable (and says
so). Reports the median step time over ``--steps`` steps (each synchronised), tokens/s, and MFU =
achieved FLOP/s / peak FLOP/s with FLOPs counted two ways:

* analytic: as MaxText counts a training step (``benchmarks/model_flops.py``): 3 x the forward
  FLOPs of the weight matmuls and of attention (QK^T and PV, 4 B T S H D), the last layer's
  queries only at the CLS position, which is all the classifier computes there;
* compiled: XLA's ``cost_analysis()['flops']`` of the compiled step (what the program computes;
  it includes the optimizer and elementwise work, and on GPU custom calls such as cuDNN
  attention may not be counted).

Peak FLOP/s come from ``PEAK_TFLOPS`` by device kind (dense, no sparsity) or ``--peak_tflops``.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import numpy as np
from absl import app, flags

from benchmarks import common
from benchmarks import model_flops

flags.DEFINE_string('size', 'base', 'Model preset.')
flags.DEFINE_integer('length', 512, 'Sequence length.')
flags.DEFINE_integer('batch_size', 32, 'Batch size.')
flags.DEFINE_enum('dtype', 'bfloat16', ['bfloat16', 'float32'], 'Compute dtype.')
flags.DEFINE_enum('attention', 'auto', ['auto', 'cudnn', 'xla'], 'dot_product_attention '
                  'implementation; auto = cudnn if it compiles here, else xla.')
flags.DEFINE_integer('steps', 20, 'Timed steps (after --warmup).')
flags.DEFINE_integer('warmup', 3, 'Untimed steps after compilation.')
flags.DEFINE_float('peak_tflops', None, 'Peak dense TFLOP/s of one device in --dtype '
                   '(default: from the table by device kind).')
flags.DEFINE_bool('smoke', False, 'Tiny sizes (tiny preset, length 64, batch 4, 3 steps): '
                  'checks the script on any machine, e.g. CPU.')
flags.DEFINE_string('json', None, 'Write the figures here.')
FLAGS = flags.FLAGS

# Dense peak TFLOP/s per device (vendor data sheets, no structured sparsity).
PEAK_TFLOPS = {
    # device-kind substring: {dtype: TFLOP/s}
    'H200': {'bfloat16': 989.0, 'float32': 67.0},
    'H100 PCIe': {'bfloat16': 756.0, 'float32': 51.0},
    'H100 NVL': {'bfloat16': 835.0, 'float32': 60.0},
    'H100': {'bfloat16': 989.0, 'float32': 67.0},  # SXM
    'A100': {'bfloat16': 312.0, 'float32': 19.5},
}


def peak_tflops(device_kind: str, dtype: str) -> tuple[float | None, str]:
  """(peak TFLOP/s, where it came from) for one device."""
  if FLAGS.peak_tflops:
    return FLAGS.peak_tflops, '--peak_tflops'
  for name, table in PEAK_TFLOPS.items():  # most specific names first
    if name.lower() in device_kind.lower():
      return table[dtype], f'table: {name}'
  return None, f'unknown device {device_kind!r}: pass --peak_tflops'


def build(c, batch, implementation):
  c.model.attention_impl = implementation
  return common.our_train_step(c, batch)


def main(_):
  if FLAGS.smoke:
    size, length, batch_size, steps, warmup = 'tiny', 64, 4, 3, 1
  else:
    size, length, batch_size, steps, warmup = (FLAGS.size, FLAGS.length, FLAGS.batch_size,
                                               FLAGS.steps, FLAGS.warmup)
  device = jax.devices()[0]
  print(f'device: {device.device_kind} ({device.platform}), {jax.device_count()} device(s), '
        f'jax {jax.__version__}', flush=True)
  c = common.get_config(**{'model.size': size, 'model.position': 'rotary',
                           'model.dtype': FLAGS.dtype, 'data.max_length': length})
  cfg = common.model_config(c)
  batch = jax.device_put(common.synthetic_batch(batch_size, length))
  wanted = {'auto': ['cudnn', 'xla'], 'cudnn': ['cudnn'], 'xla': ['xla']}[FLAGS.attention]
  step, used, errors = None, None, []
  for implementation in wanted:
    try:
      step = build(c, batch, implementation)
      used = implementation
      break
    except Exception as e:  # pylint: disable=broad-except
      errors.append(f'{implementation}: {type(e).__name__}: {str(e).splitlines()[0][:200]}')
      print(f'attention implementation {implementation} unavailable: {errors[-1]}', flush=True)
  if step is None:
    raise SystemExit('No attention implementation compiled: ' + '; '.join(errors))
  print(f'compiled in {step.compile_s:.1f} s (attention: {used})', flush=True)

  for _ in range(warmup):
    jax.block_until_ready(step.run())
  times, losses = [], []
  for _ in range(steps):
    start = time.perf_counter()
    metrics = jax.block_until_ready(step.run())
    times.append(time.perf_counter() - start)
    losses.append(float(metrics['loss_sum'] / metrics['count']))
  step_s = float(np.median(times))
  tokens = batch_size * length
  flops_analytic = model_flops.train_step(cfg, batch_size, length)['total']
  flops_compiled = step.flops
  peak, peak_source = peak_tflops(device.device_kind, FLAGS.dtype)
  achieved_analytic = flops_analytic / step_s
  achieved_compiled = flops_compiled / step_s
  mfu = achieved_analytic / (peak * 1e12) if peak else None
  mfu_compiled = achieved_compiled / (peak * 1e12) if peak and flops_compiled else None
  device_peak = None
  try:
    device_peak = (device.memory_stats() or {}).get('peak_bytes_in_use')
  except Exception:  # pylint: disable=broad-except
    pass

  pct = lambda x: 'n/a' if x is None else f'{x * 100:.1f}%'
  rows = [
      ['preset', f'{size} ({step.num_params:,} params)'],
      ['batch x length', f'{batch_size} x {length} ({tokens:,} tokens/step)'],
      ['dtype / attention', f'{FLAGS.dtype} / {used}'],
      ['step time (median of %d)' % steps, f'{step_s * 1e3:.2f} ms '
       f'(min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f})'],
      ['tokens/s', f'{tokens / step_s:,.0f}'],
      ['FLOPs/step analytic (MaxText count)', f'{flops_analytic / 1e12:.3f} TFLOP'],
      ['FLOPs/step compiled (cost_analysis)', f'{flops_compiled / 1e12:.3f} TFLOP'],
      ['achieved', f'{achieved_analytic / 1e12:.1f} TFLOP/s analytic, '
       f'{achieved_compiled / 1e12:.1f} TFLOP/s compiled'],
      ['peak', f'{peak} TFLOP/s ({peak_source})' if peak else peak_source],
      ['MFU analytic / compiled', f'{pct(mfu)} / {pct(mfu_compiled)}'],
      ['memory', f'XLA estimate {common.gib(step.memory["peak"])}' +
       (f', device peak in use {common.gib(device_peak)}' if device_peak else '')],
      ['loss first / last', f'{losses[0]:.4f} / {losses[-1]:.4f}'],
  ]
  print(f'machine: {common.machine()}')
  common.print_table(['measurement', 'value'], rows)
  if not all(np.isfinite(losses)):
    raise SystemExit('Non-finite loss.')
  figures = [common.figure('step time', step_s * 1e3, unit='ms'),
             common.figure('tokens/s', tokens / step_s, unit='tokens/s')]
  if mfu is not None:
    figures.append(common.figure('MFU (analytic FLOPs)', mfu * 100, unit='%'))
  if mfu_compiled is not None:
    figures.append(common.figure('MFU (compiled FLOPs)', mfu_compiled * 100, unit='%'))
  common.write_json(FLAGS.json, {
      'title': f'Accelerator: {size} train step, {FLAGS.dtype}, {used} attention',
      'setup': f'{device.device_kind}; batch {batch_size} x length {length}',
      'figures': figures, 'header': ['measurement', 'value'], 'rows': rows,
      'attention_errors': errors})


if __name__ == '__main__':
  app.run(main)
