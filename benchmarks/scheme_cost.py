"""Cost of each position scheme: the jitted train step relative to ``none``, side by side.

  python benchmarks/scheme_cost.py [--size=small] [--length=512] [--batch_size=4] [--rounds=7]

For every scheme (``SCHEMES``: the registry's, in this order) builds the project's train
step (forward, backward, AdamW via optax; ``training.steps.train_step``) of the same preset on
the same synthetic byte-level batch, then times them round-robin (one step of each scheme per
round, ``--rounds`` rounds) and reports the median step time of each relative to ``none``, plus
the compiled peak-memory estimate. Goal: rotary within 3% of none.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top
from absl import app, flags

from benchmarks import common

SCHEMES = ('none', 'sinusoidal', 'learned', 'shaw', 't5', 'alibi', 'rotary', 'kerple_log',
           'kerple_power', 'fire', 'cope')

flags.DEFINE_string('size', 'small', 'Model preset.')
flags.DEFINE_integer('length', 512, 'Sequence length.')
flags.DEFINE_integer('batch_size', 2, 'Batch size.')
flags.DEFINE_integer('rounds', 21, 'Round-robin rounds (--repeats steps of each scheme per round).')
flags.DEFINE_integer('repeats', 2, 'Consecutive steps of one scheme per round (one sample).')
flags.DEFINE_list('schemes', list(SCHEMES), 'Schemes to time (none is always included).')
flags.DEFINE_string('json', None, 'Write the figures here (for run_all.py).')
FLAGS = flags.FLAGS

ROTARY_GOAL = 1.03


def main(_):
  schemes = ['none'] + [s for s in FLAGS.schemes if s != 'none']
  batch = common.synthetic_batch(FLAGS.batch_size, FLAGS.length)
  steps = {}
  for scheme in schemes:
    c = common.get_config(**{'model.size': FLAGS.size, 'model.position': scheme,
                             'data.max_length': FLAGS.length})
    steps[scheme] = common.our_train_step(c, batch, name=scheme)
    print(f'compiled {scheme:<11} {steps[scheme].compile_s:5.1f} s', flush=True)
  samples = common.time_samples({s: steps[s].run for s in schemes}, rounds=FLAGS.rounds,
                                 repeats=FLAGS.repeats)
  t = {s: float(np.median(v)) for s, v in samples.items()}
  ratio = {s: common.paired_ratio(samples, s, 'none') for s in schemes}
  # Noise on a shared machine only adds time: the fastest sample of each is its least disturbed.
  ratio_min = {s: min(samples[s]) / min(samples['none']) for s in schemes}

  print(f'machine: {common.machine()}')
  print(f'{FLAGS.size} preset, batch {FLAGS.batch_size} x length {FLAGS.length}, float32, '
        f'train step (fwd + bwd + AdamW), {FLAGS.rounds} round-robin rounds of {FLAGS.repeats} '
        'steps; / none = median of per-round ratios; min / min = ratio of the fastest samples')
  rows = []
  for s in schemes:
    spread = (max(samples[s]) - min(samples[s])) / t[s]
    rows.append([s, f'{t[s] * 1e3:.0f}', f'{ratio[s]:.3f}', f'{ratio_min[s]:.3f}',
                 f'{spread * 100:.0f}%', f'{steps[s].num_params:,}',
                 common.mib(steps[s].memory['peak'])])
  header = ['scheme', 'ms/step', '/ none', 'min / min', 'spread', 'params', 'peak mem']
  common.print_table(header, rows)

  figures = []
  if 'rotary' in t:
    figures.append(common.figure('rotary step / none step', ratio['rotary'],
                                 goal=f'<= {ROTARY_GOAL:.2f}', met=ratio['rotary'] <= ROTARY_GOAL,
                                 detail=f'fastest / fastest {ratio_min["rotary"]:.3f}'))
  for s in ('shaw', 't5', 'alibi', 'sinusoidal', 'learned', 'kerple_log', 'kerple_power', 'fire',
            'cope'):
    if s in t:
      figures.append(common.figure(f'{s} step / none step', ratio[s],
                                   detail='reported, no goal'))
  common.write_json(FLAGS.json, {
      'title': 'Position-scheme cost: train step relative to `none`',
      'setup': (f'`{FLAGS.size}` preset, batch {FLAGS.batch_size} x length {FLAGS.length}, '
                f'float32, dropout 0.1, one train step (forward, backward, AdamW); {FLAGS.rounds} '
                f'round-robin rounds of {FLAGS.repeats} steps per scheme (order reversed every '
                'other round); "/ none" is the median over rounds of the ratio to `none` in the '
                'same round, "min / min" the ratio of the fastest samples, ms/step the median time; '
                '"spread" is (max - min) / median over the rounds; peak memory from XLA '
                'memory_analysis of the compiled step'),
      'figures': figures, 'header': header, 'rows': rows})


if __name__ == '__main__':
  app.run(main)
