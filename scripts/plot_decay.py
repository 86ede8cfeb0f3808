"""Draws RoPE's long-term decay curve (paper Figure 2) and its scaling variants to a PNG.

  python scripts/plot_decay.py --out=docs/decay.png
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # pylint: disable=g-import-not-at-top

from experiments import plots  # pylint: disable=g-import-not-at-top

flags.DEFINE_string('out', 'decay.png', 'Output PNG.')
flags.DEFINE_integer('head_dim', 128, 'Head dimension d.')
flags.DEFINE_float('base', 10000.0, 'RoPE base.')
flags.DEFINE_integer('max_distance', 256, 'Largest relative distance drawn.')
flags.DEFINE_float('factor', 4.0, 'Scaling factor of the variants.')
flags.DEFINE_integer('original_max_length', 64, 'Training length L of the variants.')
FLAGS = flags.FLAGS


def main(_):
  os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
  plots.plot_decay(FLAGS.out, head_dim=FLAGS.head_dim, base=FLAGS.base,
                   max_distance=FLAGS.max_distance, factor=FLAGS.factor,
                   original_max_length=FLAGS.original_max_length)
  print(f'wrote {FLAGS.out}')


if __name__ == '__main__':
  app.run(main)
