"""Seeds trained in one step (vmapped, or looped inside the step) vs one by one.

  python benchmarks/seeds_bench.py [--seeds=3] [--size=tiny] [--batch_size=32] [--length=64]

Builds the real train step of ``training.experiment.Experiment`` for S seeds with
``train.members='vmap'`` and ``'loop'``, and for 1 seed, and prints, measured side by side in one
run: time per step of each S-seed step, S x the 1-seed step, the speeds, and the compile times.
``train.members='auto'`` takes the loop on CPU (one member's activations at a time) and vmap
elsewhere; these figures say what that costs.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
from absl import app, flags

from benchmarks import common
from configs import default
from training.experiment import Experiment

flags.DEFINE_integer('seeds', 3, 'Seeds trained together.')
flags.DEFINE_string('size', 'tiny', 'Model preset.')
flags.DEFINE_string('position', 'rotary', 'Position scheme.')
flags.DEFINE_integer('batch_size', 32, 'Global batch size.')
flags.DEFINE_integer('length', 64, 'Sequence length (data.max_length).')
flags.DEFINE_string('data_dir', None, 'TFDS data_dir for the probes (default: a temp dir).')
flags.DEFINE_integer('repeats', 10, 'Steps per round (5 interleaved rounds).')
flags.DEFINE_string('json', None, 'Write the figures here (for run_all.py).')
FLAGS = flags.FLAGS


def build(num_seeds: int, members: str, workdir: str, data_dir: str):
  c = default.get_config()
  c.model.size = FLAGS.size
  c.model.position = FLAGS.position
  c.train.num_seeds = num_seeds
  c.train.members = members
  c.train.batch_size = FLAGS.batch_size
  c.data.max_length = FLAGS.length
  c.data.data_dir = data_dir
  exp = Experiment(c, workdir)
  state = exp.init_state()
  batch = exp.global_batch(next(exp.train_batches(0)))
  t0 = time.perf_counter()
  compiled = exp.train_step.lower(state, batch).compile()
  compile_s = time.perf_counter() - t0
  holder = {'state': state}

  def step():
    holder['state'], metrics = compiled(holder['state'], batch)
    return metrics['count']

  return step, compile_s


def main(_):
  n = FLAGS.seeds
  with tempfile.TemporaryDirectory() as tmp:
    data_dir = FLAGS.data_dir or os.path.join(tmp, 'tfds')
    built = {mode: build(n, mode, os.path.join(tmp, mode), data_dir) for mode in ('vmap', 'loop')}
    alone, compile_1 = build(1, 'vmap', os.path.join(tmp, 'one'), data_dir)

    def one_by_one():
      for _ in range(n):
        out = alone()
      return out

    t = common.time_fns({'vmap': built['vmap'][0], 'loop': built['loop'][0],
                         'one_by_one': one_by_one}, repeats=FLAGS.repeats)
  speed = {mode: t['one_by_one'] / t[mode] for mode in ('vmap', 'loop')}
  rows = [[f'{n} seeds vmapped in one step', f'{t["vmap"] * 1e3:.2f} ms'],
          [f'{n} seeds looped inside one step', f'{t["loop"] * 1e3:.2f} ms'],
          [f'{n} x single-seed step', f'{t["one_by_one"] * 1e3:.2f} ms'],
          ['speed vs one by one: vmap / loop', f'{speed["vmap"]:.2f}x / {speed["loop"]:.2f}x'],
          ['compile: vmap / loop / single-seed',
           f'{built["vmap"][1]:.1f} s / {built["loop"][1]:.1f} s / {compile_1:.1f} s']]
  print(f'machine: {common.machine()}')
  print(f'{FLAGS.size} {FLAGS.position}, batch {FLAGS.batch_size} x length {FLAGS.length}')
  for name, value in rows:
    print(f'{name:<46} {value:>16}')
  common.write_json(FLAGS.json, {
      'title': 'Members (seeds) in one step, vmapped or looped, vs one by one',
      'setup': f'{FLAGS.size} {FLAGS.position}, batch {FLAGS.batch_size} x length '
               f'{FLAGS.length}, {n} seeds, real `Experiment` train step '
               '(`train.members=vmap|loop`); median of 5 interleaved rounds of '
               f'{FLAGS.repeats} steps',
      'figures': [common.figure(f'{n} seeds vmapped: speed vs one by one', speed['vmap'],
                                goal='>= 1', met=speed['vmap'] >= 1),
                  common.figure(f'{n} seeds looped in one step: speed vs one by one',
                                speed['loop'], goal='>= 0.95 (train.members=auto takes it on '
                                'CPU)', met=speed['loop'] >= 0.95),
                  common.figure('compile: vmapped step', built['vmap'][1], unit='s',
                                detail=f'single-seed step {compile_1:.1f} s')],
      'header': ['measurement', 'value'],
      'rows': rows})


if __name__ == '__main__':
  app.run(main)
