"""Two attention choices that only speed matters for, each timed in the whole train step.

  python benchmarks/attention_impl.py [--size=small] [--length=512] [--batch_size=2] [--rounds=11]

``model.attention_impl='auto'`` uses the written-out ``models.attention.softmax_attention`` on
CPU and ``jax.nn.dot_product_attention`` (XLA) elsewhere. The CPU choice is kept only while the
library call is slower there end to end, for every scheme timed: this script builds the project's train step (forward, backward,
AdamW) with ``explicit`` and with ``xla`` for a scheme without a bias (rotary) and one with a
bias (alibi), times them round-robin and reports xla / explicit per scheme.

With CLS pooling the last layer computes only the [CLS] position's output (one encoder-layer
body with ``num_queries``, no separate variant). It is kept only while it pays: the script also
times rotary with mean pooling, whose last layer computes every position, against CLS pooling.

An evaluation pass (forward only, no dropout) is what 'auto' runs chunked on CPU (blocks of keys
with an online softmax, ``model.attention_impl=chunked``): kept only while the chunked forward is
the faster, the script times the eval step of each scheme both ways (``--eval_batch_size``
examples) and reports chunked / explicit.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # pylint: disable=g-import-not-at-top

from benchmarks import common

flags.DEFINE_string('size', 'small', 'Model preset.')
flags.DEFINE_integer('length', 512, 'Sequence length.')
flags.DEFINE_integer('batch_size', 2, 'Batch size.')
flags.DEFINE_integer('rounds', 11, 'Round-robin rounds.')
flags.DEFINE_integer('repeats', 2, 'Consecutive steps of one variant per round (one sample).')
flags.DEFINE_list('schemes', ['rotary', 'alibi'], 'Position schemes.')
flags.DEFINE_integer('eval_batch_size', 32, 'Examples per timed evaluation pass.')
flags.DEFINE_list('eval_lengths', ['64', '512'], 'Lengths of the timed evaluation passes.')
flags.DEFINE_string('json', None, 'Write the figures here (for run_all.py).')
FLAGS = flags.FLAGS

GOAL = 1.0  # the written-out form stays the CPU default only if xla / explicit exceeds this


def main(_):
  batch = common.synthetic_batch(FLAGS.batch_size, FLAGS.length)
  steps = {}
  variants = [(s, i, 'cls') for s in FLAGS.schemes for i in ('explicit', 'xla')]
  for scheme, impl, pooling in variants + [('rotary', 'explicit', 'mean')]:
    c = common.get_config(**{'model.size': FLAGS.size, 'model.position': scheme,
                             'model.attention_impl': impl, 'model.pooling': pooling,
                             'data.max_length': FLAGS.length})
    steps[scheme, impl, pooling] = common.our_train_step(c, batch, name=f'{scheme}/{impl}')
  samples = common.time_samples({k: s.run for k, s in steps.items()}, rounds=FLAGS.rounds,
                                 repeats=FLAGS.repeats)
  print(f'machine: {common.machine()}')
  rows, figures = [], []
  for scheme in FLAGS.schemes:
    explicit, xla = (scheme, 'explicit', 'cls'), (scheme, 'xla', 'cls')
    ratio = common.paired_ratio(samples, xla, explicit)
    rows.append([scheme, f'{min(samples[explicit]) * 1e3:.0f}', f'{min(samples[xla]) * 1e3:.0f}',
                 f'{ratio:.3f}', common.mib(steps[explicit].memory['peak']),
                 common.mib(steps[xla].memory['peak'])])
    figures.append(common.figure(f'{scheme}: xla step / explicit step', ratio,
                                 goal=f'> {GOAL:.2f} to keep explicit on CPU', met=ratio > GOAL))
  header = ['scheme', 'explicit ms', 'xla ms', 'xla / explicit', 'explicit peak', 'xla peak']
  common.print_table(header, rows)
  full = common.paired_ratio(samples, ('rotary', 'explicit', 'mean'), ('rotary', 'explicit', 'cls'))
  print(f'rotary, last layer at every position (mean pooling) / at [CLS] only: {full:.3f}')
  figures.append(common.figure('rotary: full last layer / CLS-only last layer', full,
                               goal='> 1 to keep the CLS-only last layer', met=full > 1))
  eval_rows, eval_figures = _evaluation()
  rows += eval_rows
  figures += eval_figures
  common.write_json(FLAGS.json, {
      'title': ('Attention choices in the train step: written-out softmax vs '
                'jax.nn.dot_product_attention (XLA); CLS-only last layer vs full'),
      'setup': (f'`{FLAGS.size}` preset, batch {FLAGS.batch_size} x length {FLAGS.length}, '
                f'float32, one train step (forward, backward, AdamW); {FLAGS.rounds} round-robin '
                f'rounds of {FLAGS.repeats} steps; the ratio is the median over rounds of xla / '
                'explicit in the same round; ms are the fastest samples; the `eval` rows are '
                f'the eval step (forward, no dropout) on {FLAGS.eval_batch_size} examples, '
                'chunked in the xla column; the goal applies at the longest length'),
      'figures': figures, 'header': header, 'rows': rows})


def _evaluation() -> tuple[list[list[str]], list[dict]]:
  """The eval step written out vs chunked, per scheme and length: rows and figures (the goal
  at the longest length; shorter ones are reported)."""
  lengths = [int(n) for n in FLAGS.eval_lengths]
  steps = {}
  for length in lengths:
    batch = common.synthetic_batch(FLAGS.eval_batch_size, length)
    for scheme in FLAGS.schemes:
      for impl in ('explicit', 'chunked'):
        c = common.get_config(**{'model.size': FLAGS.size, 'model.position': scheme,
                                 'model.attention_impl': impl, 'data.max_length': length})
        steps[scheme, length, impl] = common.our_forward(c, batch, name=f'{scheme}/{impl} eval')
  samples = common.time_samples({k: s.run for k, s in steps.items()}, rounds=FLAGS.rounds,
                                 repeats=FLAGS.repeats)
  rows, figures = [], []
  for scheme in FLAGS.schemes:
    for length in lengths:
      explicit, chunked = (scheme, length, 'explicit'), (scheme, length, 'chunked')
      ratio = common.paired_ratio(samples, chunked, explicit)
      rows.append([f'{scheme} eval at {length}', f'{min(samples[explicit]) * 1e3:.0f}',
                   f'{min(samples[chunked]) * 1e3:.0f}', f'{ratio:.3f}',
                   common.mib(steps[explicit].memory['peak']),
                   common.mib(steps[chunked].memory['peak'])])
      name = f'{scheme}: chunked eval step / explicit eval step at {length}'
      figures.append(common.figure(name, ratio, goal='< 1.00 to evaluate chunked on CPU',
                                   met=ratio < 1.0) if length == max(lengths)
                     else common.figure(name, ratio))
  print(f'eval step, chunked / explicit: {", ".join(f"{r[0]} {r[3]}" for r in rows)}')
  return rows, figures


if __name__ == '__main__':
  app.run(main)
