"""Seeds trained together (one vmapped, jitted step) vs one by one.

  python benchmarks/seeds_bench.py [--seeds=3] [--size=tiny] [--batch_size=32] [--length=64]

Builds the real train step of ``training.experiment.Experiment`` for S seeds and for 1 seed, and prints,
measured side by side in one run: time per step of the S-seed step, S x the 1-seed step, the
speed-up, and the compile time of each.
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


def build(num_seeds: int, workdir: str, data_dir: str):
  c = default.get_config()
  c.model.size = FLAGS.size
  c.model.position = FLAGS.position
  c.train.num_seeds = num_seeds
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
  with tempfile.TemporaryDirectory() as tmp:
    data_dir = FLAGS.data_dir or os.path.join(tmp, 'tfds')
    together, compile_s = build(FLAGS.seeds, os.path.join(tmp, 'a'), data_dir)
    alone, compile_1 = build(1, os.path.join(tmp, 'b'), data_dir)

    def one_by_one():
      for _ in range(FLAGS.seeds):
        out = alone()
      return out

    t = common.time_fns({'together': together, 'one_by_one': one_by_one},
                        repeats=FLAGS.repeats)
  print(f'machine: {common.machine()}')
  print(f'{FLAGS.size} {FLAGS.position}, batch {FLAGS.batch_size} x length {FLAGS.length}, '
        f'{FLAGS.seeds} seeds')
  print(f'{"measurement":<46} {"ms":>9}')
  print(f'{"vmapped step, " + str(FLAGS.seeds) + " seeds":<46} {t["together"] * 1e3:9.2f}')
  print(f'{str(FLAGS.seeds) + " x single-seed step":<46} {t["one_by_one"] * 1e3:9.2f}')
  print(f'{"speed-up (one by one / vmapped)":<46} {t["one_by_one"] / t["together"]:9.2f}x')
  print(f'{"compile: vmapped step / single-seed step":<46} {compile_s:6.1f}s / {compile_1:.1f}s '
        f'(one compile instead of {FLAGS.seeds} processes x {compile_1:.1f}s)')
  speed = t['one_by_one'] / t['together']
  common.write_json(FLAGS.json, {
      'title': 'Seeds trained together (vmapped) vs one by one',
      'setup': f'{FLAGS.size} {FLAGS.position}, batch {FLAGS.batch_size} x length '
               f'{FLAGS.length}, {FLAGS.seeds} seeds, real `Experiment` train step; median of '
               f'5 interleaved rounds of {FLAGS.repeats} steps',
      'figures': [common.figure(f'{FLAGS.seeds} seeds vmapped: speed vs one by one', speed,
                                detail='reported (> 1 means vmapping is faster)'),
                  common.figure('compile: vmapped step', compile_s, unit='s',
                                detail=f'single-seed step {compile_1:.1f} s')],
      'header': ['measurement', 'value'],
      'rows': [[f'vmapped step, {FLAGS.seeds} seeds', f'{t["together"] * 1e3:.2f} ms'],
               [f'{FLAGS.seeds} x single-seed step', f'{t["one_by_one"] * 1e3:.2f} ms'],
               ['speed-up (one by one / vmapped)', f'{speed:.2f}x'],
               ['compile: vmapped / single-seed', f'{compile_s:.1f} s / {compile_1:.1f} s']]})


if __name__ == '__main__':
  app.run(main)
