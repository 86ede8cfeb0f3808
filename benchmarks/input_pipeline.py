"""Input pipeline throughput vs what the train step consumes, side by side.

  python benchmarks/input_pipeline.py [--lengths=512,4096] [--batch_sizes=4,1] [--rounds=3]

Writes a synthetic JSONL file of long byte-level documents (random words, 2-3x the longest
length, 2 labels) to a temp dir, and reads it with the project's pipeline
(``Dataset.train_batches`` with ``data.name=files``, byte tokenizer, shuffling, tf.data prefetch),
exactly as training does. In rounds it alternates: ``--batches`` batches pulled from the pipeline
(examples/s delivered as NumPy batches), then ``--steps`` jitted train steps of the ``small``
preset with rotary positions at the same batch size (examples/s consumed). Medians over rounds.

Goal: pipeline >= 10x faster than the step at every length.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import numpy as np
from absl import app, flags

from benchmarks import common
from data import datasets
from training import trainer

flags.DEFINE_list('lengths', ['512', '4096'], 'Sequence lengths.')
flags.DEFINE_list('batch_sizes', ['4', '1'], 'Batch size at each length.')
flags.DEFINE_string('size', 'small', 'Model preset of the train step.')
flags.DEFINE_integer('documents', 2000, 'Documents in the synthetic file.')
flags.DEFINE_integer('batches', 50, 'Pipeline batches per round.')
flags.DEFINE_integer('steps', 2, 'Train steps per round.')
flags.DEFINE_integer('rounds', 3, 'Rounds.')
flags.DEFINE_string('json', None, 'Write the figures here (for run_all.py).')
FLAGS = flags.FLAGS

GOAL = 10.0
WORDS = ('the of and a to in is you that it he was for on are as with his they I at be this '
         'have from or one had by word but not what all were we when your can said there use an '
         'each which she do how their if will up other about out many then them these so some '
         'her would make like him into time has look two more write go see number no way could '
         'people my than first water been call who oil its now find long down day did get come '
         'made may part position rotary embedding attention').split()


def write_documents(path: str, num: int, chars: int, seed: int = 0) -> int:
  """``num`` JSONL documents of about ``chars`` characters of random words; returns bytes."""
  rng = np.random.default_rng(seed)
  words = np.array(WORDS, dtype=object)
  mean_word = np.mean([len(w) + 1 for w in WORDS])
  with open(path, 'w') as f:
    for i in range(num):
      n = int(chars / mean_word * rng.uniform(0.8, 1.2))
      text = ' '.join(words[rng.integers(0, len(words), n)])
      f.write(json.dumps({'text': text, 'label': int(i % 2)}) + '\n')
  return os.path.getsize(path)


def main(_):
  lengths = [int(x) for x in FLAGS.lengths]
  batch_sizes = [int(x) for x in FLAGS.batch_sizes]
  if len(batch_sizes) != len(lengths):
    raise app.UsageError('--batch_sizes needs one value per --lengths entry')
  rows, figures = [], []
  header = ['length', 'batch', 'pipeline examples/s', 'step examples/s', 'pipeline / step',
            'pipeline ms/batch', 'step ms']
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'docs.jsonl')
    size = write_documents(path, FLAGS.documents, 2.5 * max(lengths))
    print(f'synthetic file: {FLAGS.documents} documents, {size / 2**20:.1f} MiB', flush=True)
    for length, batch_size in zip(lengths, batch_sizes):
      c = common.get_config(**{'model.size': FLAGS.size, 'model.position': 'rotary',
                               'data.name': 'files', 'data.train_files': path,
                               'data.max_length': length})
      trainer.setup_runtime(c)  # quiet TFDS logs; the compilation cache is off in get_config
      workdir = os.path.join(tmp, f'work{length}')
      batches = datasets.load(c.data, workdir).train_batches(seed=0,
                                                             global_batch_size=batch_size)
      first = next(batches)
      assert first['inputs'].shape == (batch_size, length), first['inputs'].shape
      real = float(np.mean(first['inputs'] != 0))
      for _ in range(5):  # warm up tf.data (tracing, autotuning)
        next(batches)
      step = common.our_train_step(c, jax.device_put(
          {k: v for k, v in first.items()}))
      jax.block_until_ready(step.run())
      pipe_s, step_s = [], []
      for _ in range(FLAGS.rounds):
        start = time.perf_counter()
        for _ in range(FLAGS.batches):
          next(batches)
        pipe_s.append((time.perf_counter() - start) / FLAGS.batches)
        start = time.perf_counter()
        for _ in range(FLAGS.steps):
          out = step.run()
        jax.block_until_ready(out)
        step_s.append((time.perf_counter() - start) / FLAGS.steps)
      pipe, stp = float(np.median(pipe_s)), float(np.median(step_s))
      ratio = stp / pipe
      rows.append([length, batch_size, f'{batch_size / pipe:,.0f}', f'{batch_size / stp:.2f}',
                   f'{ratio:,.0f}x', f'{pipe * 1e3:.2f}', f'{stp * 1e3:.0f}'])
      figures.append(common.figure(f'pipeline / train step throughput at length {length}', ratio,
                                   goal=f'>= {GOAL:.0f}x', met=ratio >= GOAL,
                                   detail=f'{real * 100:.0f}% real tokens'))
      print(f'length {length}: pipeline {batch_size / pipe:,.0f} ex/s, step '
            f'{batch_size / stp:.2f} ex/s, ratio {ratio:,.0f}x', flush=True)
      del batches
  print(f'machine: {common.machine()}')
  print(f'pipeline: data.name=files (JSONL), byte tokenizer, Dataset.train_batches; step: '
        f'{FLAGS.size} rotary train step; medians of {FLAGS.rounds} alternating rounds')
  common.print_table(header, rows)
  common.write_json(FLAGS.json, {
      'title': 'Input pipeline vs train step',
      'setup': (f'`Dataset.train_batches` on a synthetic JSONL file of {FLAGS.documents} long '
                f'documents (`data.name=files`, byte tokenizer) vs the `{FLAGS.size}` rotary '
                f'train step at the same batch; alternating rounds ({FLAGS.batches} batches / '
                f'{FLAGS.steps} steps), medians of {FLAGS.rounds}'),
      'figures': figures, 'header': header, 'rows': rows})


if __name__ == '__main__':
  app.run(main)
