"""Compile time of the train step, with the persistent compilation cache disabled.

  python benchmarks/compile_time.py [--sizes=small,base] [--length=512] [--batch_size=8]
                                    [--repeats=2]

For each preset: ``jax.jit(train_step).lower(state, batch)`` (tracing + lowering to StableHLO) and
``.compile()`` (XLA) timed separately, on abstract shapes (nothing is initialised or run), with
``jax_enable_compilation_cache`` off and ``jax.clear_caches()`` before every measurement, so each
is a cold compile in this process. Median of ``--repeats``, presets interleaved.
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

flags.DEFINE_list('sizes', ['small', 'base'], 'Model presets.')
flags.DEFINE_string('position', 'rotary', 'Position scheme.')
flags.DEFINE_integer('length', 512, 'Sequence length.')
flags.DEFINE_integer('batch_size', 8, 'Batch size.')
flags.DEFINE_integer('repeats', 2, 'Cold compiles per preset (interleaved).')
flags.DEFINE_string('json', None, 'Write the figures here (for run_all.py).')
FLAGS = flags.FLAGS


def measure(size: str) -> tuple[float, float, int]:
  """(lower seconds, compile seconds, params) of one cold compile."""
  jax.clear_caches()
  c = common.get_config(**{'model.size': size, 'model.position': FLAGS.position,
                           'data.max_length': FLAGS.length})
  _, tx, train_step, _ = common._our_parts(c)  # pylint: disable=protected-access
  abstract = jax.eval_shape(lambda: common.our_state(c, tx)[0])
  batch = common.abstract_batch(FLAGS.batch_size, FLAGS.length)
  start = time.perf_counter()
  lowered = jax.jit(train_step, donate_argnums=0).lower(abstract, batch)
  lower_s = time.perf_counter() - start
  start = time.perf_counter()
  lowered.compile()
  compile_s = time.perf_counter() - start
  return lower_s, compile_s, sum(int(x.size) for x in jax.tree.leaves(abstract.params))


def main(_):
  jax.config.update('jax_enable_compilation_cache', False)
  results = {size: [] for size in FLAGS.sizes}
  params = {}
  for _ in range(FLAGS.repeats):
    for size in FLAGS.sizes:
      lower_s, compile_s, params[size] = measure(size)
      results[size].append((lower_s, compile_s))
      print(f'{size}: lower {lower_s:.1f} s, compile {compile_s:.1f} s', flush=True)
  header = ['preset', 'params', 'trace + lower s', 'XLA compile s', 'total s']
  rows, figures = [], []
  for size in FLAGS.sizes:
    lower_s = float(np.median([r[0] for r in results[size]]))
    compile_s = float(np.median([r[1] for r in results[size]]))
    rows.append([size, f'{params[size]:,}', f'{lower_s:.1f}', f'{compile_s:.1f}',
                 f'{lower_s + compile_s:.1f}'])
    figures.append(common.figure(f'`{size}` train step cold compile (trace + lower + compile)',
                                 lower_s + compile_s, unit='s', detail='reported'))
  print(f'machine: {common.machine()}')
  print(f'train step (fwd + bwd + AdamW), {FLAGS.position}, batch {FLAGS.batch_size} x length '
        f'{FLAGS.length}; persistent cache off; median of {FLAGS.repeats} cold compiles')
  common.print_table(header, rows)
  common.write_json(FLAGS.json, {
      'title': 'Compile time of the train step',
      'setup': (f'{FLAGS.position}, batch {FLAGS.batch_size} x length {FLAGS.length}, float32; '
                '`jax.jit(train_step).lower(...)` and `.compile()` on abstract shapes, persistent '
                f'compilation cache off, `jax.clear_caches()` before each; median of '
                f'{FLAGS.repeats}'),
      'figures': figures, 'header': header, 'rows': rows})


if __name__ == '__main__':
  app.run(main)
