"""Step time and peak memory of softmax (written out, and chunked) vs linear attention, all
with rotary, over length.

  python benchmarks/length_scaling.py [--size=tiny] [--lengths=512,2048,8192,16384] [--rounds=3]

``softmax`` is ``model.attention_impl=explicit`` (the CPU default), ``chunked`` is
``model.attention_impl=chunked`` (blocks of ``--chunk_size`` with an online softmax, Rabe and
Staats 2021), ``linear`` is RoFormer's eq. 19.

Batch 1. For each (attention, length) the train step is compiled first and its peak memory read
from XLA's ``memory_analysis`` (arguments + outputs + temporaries - donated); a configuration
whose estimate exceeds ``--memory_fraction`` of the memory available now is reported as not
fitting and is not run (so the script never runs the machine out of memory). Everything that
fits is timed round-robin within its attention kind (one step each per round), median of
``--rounds``.

Goals: linear attention fits 16k and grows linearly: time and memory at 16k / at 2k <= 12
(linear growth is 8, quadratic 64); chunked softmax attention fits 16k, its memory growing
linearly (the same <= 12).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import numpy as np
from absl import app, flags

from benchmarks import common

flags.DEFINE_string('size', 'tiny', 'Model preset.')
flags.DEFINE_list('lengths', ['512', '2048', '8192', '16384'], 'Sequence lengths.')
flags.DEFINE_list('attentions', ['softmax', 'chunked', 'linear'], 'Attention kinds.')
flags.DEFINE_integer('chunk_size', 512, 'model.attention_chunk_size for chunked.')
flags.DEFINE_integer('rounds', 3, 'Round-robin rounds.')
# A quarter: XLA's CPU estimate undercounts what the step allocates. The softmax step at 16,384
# tokens, estimated at 8.1 GiB, peaked at 23.2 GiB of resident memory run alone, and was killed
# for memory within the whole benchmark.
flags.DEFINE_float('memory_fraction', 0.25, 'Run only steps whose compiled memory estimate is '
                   'below this fraction of the memory available (MemAvailable).')
flags.DEFINE_string('json', None, 'Write the figures here (for run_all.py).')
FLAGS = flags.FLAGS

GROWTH_GOAL = 12.0


def _fits_and_growth(kind, lengths, t, memory, skipped) -> list[dict]:
  """Whether ``kind`` fits the longest length, and its growth from 2k (or the first) to it."""
  lo, hi = (2048 if 2048 in lengths else lengths[0]), lengths[-1]
  figures = []
  if (kind, hi) in t:
    figures.append(common.figure(f'{kind} attention fits length {hi}', 1.0, unit='yes',
                                 goal='fits', met=True,
                                 detail=f'peak ~{common.gib(memory[kind, hi])}'))
  elif (kind, hi) in skipped:
    figures.append(common.figure(f'{kind} attention fits length {hi}', 0.0, unit='no',
                                 goal='fits', met=False, detail=skipped[kind, hi]))
  if (kind, hi) in t and (kind, lo) in t and hi != lo:
    growth = t[kind, hi] / t[kind, lo]
    bound = f'(linear {hi // lo}x, quadratic {(hi // lo) ** 2}x)'
    if kind == 'linear':
      figures.append(common.figure(f'linear attention step time {hi} / {lo}', growth,
                                   goal=f'<= {GROWTH_GOAL:.0f}x {bound}',
                                   met=growth <= GROWTH_GOAL))
    else:  # softmax's work is quadratic in any form; only its memory is linear
      figures.append(common.figure(f'{kind} attention step time {hi} / {lo}', growth,
                                   detail=f'reported {bound}'))
    mgrowth = memory[kind, hi] / memory[kind, lo]
    figures.append(common.figure(
        f'{kind} attention peak memory {hi} / {lo}', mgrowth,
        goal=f'<= {GROWTH_GOAL:.0f}x', met=mgrowth <= GROWTH_GOAL))
  return figures


def main(_):
  lengths = [int(x) for x in FLAGS.lengths]
  steps, memory, skipped = {}, {}, {}
  for attention in FLAGS.attentions:
    for length in lengths:
      c = common.get_config(**{
          'model.size': FLAGS.size, 'model.position': 'rotary', 'data.max_length': length,
          'model.attention': 'linear' if attention == 'linear' else 'softmax',
          'model.attention_impl': 'chunked' if attention == 'chunked' else 'explicit',
          'model.attention_chunk_size': FLAGS.chunk_size})
      est, compiled = common.abstract_memory(c, common.abstract_batch(1, length))
      memory[attention, length] = est['peak']
      budget = FLAGS.memory_fraction * common.mem_available_bytes()
      key = (attention, length)
      if budget and est['peak'] > budget:
        skipped[key] = (f'does not fit: needs ~{common.gib(est["peak"])}, more than '
                        f'{FLAGS.memory_fraction:.0%} of the {common.gib(budget / FLAGS.memory_fraction)}'
                        ' available')
        print(f'{attention} {length}: {skipped[key]}', flush=True)
        continue
      steps[key] = common.our_train_step(c, common.synthetic_batch(1, length), compiled=compiled)
      print(f'{attention} {length}: compiled, ~{common.gib(est["peak"])}', flush=True)
  # Round-robin within each attention kind: a multi-GiB softmax step disturbs the steps right
  # after it (measured: linear attention at 2k looked 6x slower when interleaved with softmax
  # at 8k), and the growth figures compare lengths of one kind.
  t = {}
  for attention in FLAGS.attentions:
    group = {k: s.run for k, s in steps.items() if k[0] == attention}
    samples = common.time_samples(group, rounds=FLAGS.rounds)
    t.update({k: float(np.median(v)) for k, v in samples.items()})

  header = ['attention', 'length', 'ms/step', 'ms / 1k tokens', 'peak mem', 'time vs first',
            'mem vs first']
  rows = []
  for attention in FLAGS.attentions:
    first = (attention, lengths[0])
    for length in lengths:
      k = (attention, length)
      mem = common.gib(memory[k])
      if k in skipped:
        rows.append([attention, length, 'not run', '', mem + ' (est.)', '',
                     f'{memory[k] / memory[first]:.1f}x'])
        continue
      rows.append([attention, length, f'{t[k] * 1e3:.0f}', f'{t[k] * 1e6 / length:.1f}', mem,
                   f'{t[k] / t[first]:.1f}x' if first in t else '',
                   f'{memory[k] / memory[first]:.1f}x'])
  print(f'machine: {common.machine()} ({common.gib(common.mem_total_bytes())} RAM)')
  print(f'{FLAGS.size} preset, rotary, batch 1, float32 train step; median of {FLAGS.rounds} '
        'round-robin rounds per attention kind')
  common.print_table(header, rows)
  for k, why in skipped.items():
    print(f'{k[0]} at {k[1]}: {why}')

  figures = []
  for kind in ('linear', 'chunked'):
    figures += _fits_and_growth(kind, lengths, t, memory, skipped)
  for length in lengths:
    if ('softmax', length) in t and ('linear', length) in t:
      figures.append(common.figure(f'softmax / linear step time at {length}',
                                   t['softmax', length] / t['linear', length],
                                   detail='reported'))
    elif ('softmax', length) in skipped:
      figures.append(common.figure(f'softmax at {length}', 0.0, unit='does not fit',
                                   detail=skipped['softmax', length]))
  common.write_json(FLAGS.json, {
      'title': 'Length scaling: softmax (written out and chunked) vs linear attention (rotary)',
      'setup': (f'`{FLAGS.size}` preset, batch 1, float32 train step; median of {FLAGS.rounds} '
                'round-robin rounds within each attention kind; memory = XLA memory_analysis of the compiled step; a step '
                f'estimated above {FLAGS.memory_fraction:.0%} of available memory is not run'),
      'figures': figures, 'header': header, 'rows': rows})


if __name__ == '__main__':
  app.run(main)
