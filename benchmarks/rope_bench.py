"""RoPE micro-benchmark: the jitted rotary apply against the memory-bandwidth floor.

  python benchmarks/rope_bench.py [--shape=8,512,12,64] [--layers=12]

Prints, measured side by side in one run:
  * rotary apply / elementwise floor (x * c + d on a tensor of the same size): goal <= 2x;
    both the one-call ``apply_rotary`` (which also computes sin/cos) and the apply with tables
    computed once (as every layer of the model uses it);
  * half layout / interleaved layout;
  * sin/cos recomputed per layer / shared across layers (q and k of every layer).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
from absl import app, flags

import rope
from benchmarks import common

flags.DEFINE_string('shape', '8,512,12,64', 'batch,length,heads,head_dim')
flags.DEFINE_integer('layers', 12, 'Layers sharing one sin/cos table.')
flags.DEFINE_integer('rounds', 5, 'Interleaved rounds.')
flags.DEFINE_string('json', None, 'Write the figures here (for run_all.py).')
FLAGS = flags.FLAGS


def main(_):
  b, length, h, d = (int(x) for x in FLAGS.shape.split(','))
  x = jax.random.normal(jax.random.key(0), (b, length, h, d), jnp.float32)
  positions = jnp.broadcast_to(jnp.arange(length), (b, length))

  floor = jax.jit(lambda x: x * 1.5 + 0.5)
  rotary = {layout: jax.jit(lambda x, p, layout=layout: rope.apply_rotary(x, p, layout=layout))
            for layout in rope.LAYOUTS}
  r = rope.Rotary(head_dim=d)
  xs = jax.random.normal(jax.random.key(1), (FLAGS.layers, 2, b, length, h, d), jnp.float32)

  @jax.jit
  def shared(xs, p):
    tables = r.tables(p)
    return [r.apply(xs[i, j], tables, 'query') for i in range(xs.shape[0]) for j in range(2)]

  @jax.jit
  def recomputed(xs, p):  # per-layer tables (offset positions, so XLA cannot merge them)
    return [r.apply(xs[i, j], r.tables(p + i), 'query')
            for i in range(xs.shape[0]) for j in range(2)]

  tables = {layout: rope.Rotary(head_dim=d, layout=layout).tables(positions)
            for layout in rope.LAYOUTS}
  apply_only = {layout: jax.jit(lambda x, t, layout=layout: rope.apply_rotary_sincos(
      x, t.sin, t.cos, layout=layout)) for layout in rope.LAYOUTS}

  t = common.time_fns({
      'floor': lambda: floor(x),
      'interleaved': lambda: rotary['interleaved'](x, positions),
      'half': lambda: rotary['half'](x, positions),
      'apply interleaved': lambda: apply_only['interleaved'](x, tables['interleaved']),
      'apply half': lambda: apply_only['half'](x, tables['half']),
      'shared': lambda: shared(xs, positions),
      'recomputed': lambda: recomputed(xs, positions),
  }, rounds=FLAGS.rounds)
  print(f'machine: {common.machine()}')
  print(f'tensor [{b}, {length}, {h}, {d}] float32; {FLAGS.layers} layers x (q, k) for sharing')
  print(f'{"measurement":<44} {"ms":>9} {"ratio":>8}')
  print(f'{"elementwise floor (x*a+b)":<44} {t["floor"] * 1e3:9.3f} {1.0:8.2f}')
  for layout in rope.LAYOUTS:
    print(f'{"apply_rotary " + layout + " (with sin/cos) / floor":<44} {t[layout] * 1e3:9.3f} '
          f'{t[layout] / t["floor"]:8.2f}')
  for layout in rope.LAYOUTS:
    name = 'apply ' + layout + ' (shared tables) / floor'
    print(f'{name:<44} {t["apply " + layout] * 1e3:9.3f} {t["apply " + layout] / t["floor"]:8.2f}')
  print(f'{"half / interleaved":<44} {"":9} {t["half"] / t["interleaved"]:8.2f}')
  print(f'{"sin/cos shared, " + str(FLAGS.layers) + " layers":<44} {t["shared"] * 1e3:9.3f} '
        f'{1.0:8.2f}')
  print(f'{"sin/cos recomputed per layer / shared":<44} {t["recomputed"] * 1e3:9.3f} '
        f'{t["recomputed"] / t["shared"]:8.2f}')
  ratio = lambda name: t[name] / t['floor']
  rows = [[f'`apply` with shared sin/cos, {layout} / elementwise floor',
           f'{ratio("apply " + layout):.2f}x'] for layout in rope.LAYOUTS]
  rows += [[f'one-call `apply_rotary` (computes sin/cos too), {layout} / floor',
            f'{ratio(layout):.2f}x'] for layout in rope.LAYOUTS]
  rows += [['half / interleaved (one-call)', f'{t["half"] / t["interleaved"]:.2f}x'],
           [f'{FLAGS.layers} layers x (q, k): sin/cos recomputed per layer / shared',
            f'{t["recomputed"] / t["shared"]:.2f}x']]
  figures = [common.figure(f'apply (shared sin/cos), {layout} / elementwise floor',
                           ratio('apply ' + layout), goal='<= 2x',
                           met=ratio('apply ' + layout) <= 2.0) for layout in rope.LAYOUTS]
  figures.append(common.figure('sin/cos recomputed per layer / shared',
                               t['recomputed'] / t['shared'], goal='> 1x (sharing pays)',
                               met=t['recomputed'] / t['shared'] > 1.0))
  common.write_json(FLAGS.json, {
      'title': 'RoPE apply vs the elementwise floor',
      'setup': f'tensor [{b}, {length}, {h}, {d}] float32, {FLAGS.layers} layers for sharing; '
               f'median of {FLAGS.rounds} interleaved rounds of 30 calls',
      'figures': figures, 'header': ['measurement', 'ratio'], 'rows': rows})


if __name__ == '__main__':
  app.run(main)
