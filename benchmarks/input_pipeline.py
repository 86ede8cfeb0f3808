"""Input pipeline throughput vs what the train step consumes, side by side.

  python benchmarks/input_pipeline.py [--lengths=512,4096] [--batch_sizes=4,1] [--rounds=3]

Writes a synthetic JSONL file of long byte-level documents (random words, 2-3x the longest
length, 2 labels) to a temp dir, and reads it with the project's pipeline
(``Dataset.train_batches`` with ``data.name=files``, byte tokenizer, shuffling, tf.data prefetch),
exactly as training does. In rounds it alternates: ``--batches`` batches pulled from the pipeline
(examples/s delivered as NumPy batches), then ``--steps`` jitted train steps of the ``small``
preset with rotary positions at the same batch size (examples/s consumed). Medians over rounds.

Goal: pipeline >= 10x faster than the step at every length.

Then, in alternating rounds, ``--batches`` training batches of ours (``train_batches``: the one
sampler, ``data/batches.py``) against grain's own order (``MapDataset.shuffle(seed).repeat()
.batch(b)``, mapped to the same batches), on the position probes (classification, length 64)
and on MLM (fortunes, byte tokenizer, length 128); it prints ours / grain in examples/s, and
whether grain's first batches equal ours (the order a run must keep).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import grain  # pylint: disable=g-import-not-at-top
import jax  # pylint: disable=g-import-not-at-top
import numpy as np
from absl import app, flags

from benchmarks import common
from data import datasets
from data import lm
from data import pipeline
from data import sources
from training import tasks
from training import trainer
from training.config import run_config

flags.DEFINE_list('lengths', ['512', '4096'], 'Sequence lengths.')
flags.DEFINE_list('batch_sizes', ['4', '1'], 'Batch size at each length.')
flags.DEFINE_string('size', 'small', 'Model preset of the train step.')
flags.DEFINE_integer('documents', 2000, 'Documents in the synthetic file.')
flags.DEFINE_integer('batches', 50, 'Pipeline batches per round.')
flags.DEFINE_integer('steps', 2, 'Train steps per round.')
flags.DEFINE_integer('rounds', 3, 'Rounds.')
flags.DEFINE_integer('grain_batch', 16, 'Batch size of the grain comparison.')
flags.DEFINE_bool('step', True, 'Run the pipeline vs train step comparison.')
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


def _grain_twin(dataset, batch_size: int, seed: int):
  """grain's own order over the same examples, made into the same batches as ours."""
  if isinstance(dataset, datasets.LanguageModelDataset):
    rows = dataset.train_rows(sources.TrainShards(1, batch_size, (0, batch_size)))[0]
    num, make = len(rows['inputs']), lm.maker(rows, dataset.targets, stream_id=0)
  else:
    texts, labels = dataset.source.read('train')
    num, make = len(labels), pipeline.maker(texts, labels, dataset.tokenizer,
                                            length=dataset.info.train_length)
  ds = grain.MapDataset.range(num).shuffle(seed=seed).repeat().batch(batch_size)
  ds = ds.map(lambda examples: make(examples, examples))
  return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=2)))


def _per_batch(batches, rounds: int) -> list[float]:
  """Seconds per batch of each of ``rounds`` pulls of ``--batches`` batches."""
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(FLAGS.batches):
      next(batches)
    times.append((time.perf_counter() - start) / FLAGS.batches)
  return times


def grain_vs_ours(workdir: str) -> tuple[list[list], list[dict]]:
  """Rows and figures of ours vs grain's order on the probes and on MLM."""
  b, rows, figures = FLAGS.grain_batch, [], []
  cases = {'probes': {'data.name': 'position_probes/order', 'data.max_length': 64},
           'mlm': {'data.name': 'fortunes', 'data.tokenizer': 'byte', 'data.max_length': 128,
                   'train.task': 'mlm'}}
  for task, overrides in cases.items():
    c = common.get_config(**overrides)
    rc = run_config(c)
    dataset = tasks.of(rc).load(rc.data, os.path.join(workdir, task), 'joint')
    ours = dataset.train_batches(seed=0, global_batch_size=b)
    theirs = _grain_twin(dataset, b, seed=0)
    same = all(np.array_equal(next(ours).inputs, next(theirs).inputs) for _ in range(3))
    ours_s, theirs_s = [], []
    for _ in range(FLAGS.rounds):  # alternating, so load on the machine hits both
      ours_s += _per_batch(ours, 1)
      theirs_s += _per_batch(theirs, 1)
    o, t = float(np.median(ours_s)), float(np.median(theirs_s))
    rows.append([task, b, f'{b / o:,.0f}', f'{b / t:,.0f}', f'{t / o:.2f}x', str(same)])
    figures.append(common.figure(f'{task} batches: ours / grain shuffle (examples/s)', t / o,
                                 detail=f'same order as ours: {same}'))
  return rows, figures


def main(_):
  lengths = [int(x) for x in FLAGS.lengths] if FLAGS.step else []
  batch_sizes = [int(x) for x in FLAGS.batch_sizes] if FLAGS.step else []
  if len(batch_sizes) != len(lengths):
    raise app.UsageError('--batch_sizes needs one value per --lengths entry')
  rows, figures = [], []
  header = ['length', 'batch', 'pipeline examples/s', 'step examples/s', 'pipeline / step',
            'pipeline ms/batch', 'step ms']
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'docs.jsonl')
    size = write_documents(path, FLAGS.documents, 2.5 * max(lengths, default=0))
    print(f'synthetic file: {FLAGS.documents} documents, {size / 2**20:.1f} MiB', flush=True)
    for length, batch_size in zip(lengths, batch_sizes):
      c = common.get_config(**{'model.size': FLAGS.size, 'model.position': 'rotary',
                               'data.name': 'files', 'data.train_files': path,
                               'data.max_length': length})
      trainer.setup_runtime(c)  # quiet TFDS logs; the compilation cache is off in get_config
      workdir = os.path.join(tmp, f'work{length}')
      batches = datasets.load_classifier(run_config(c).data, workdir).train_batches(seed=0,
                                                             global_batch_size=batch_size)
      first = next(batches)
      assert first.inputs.shape == (batch_size, length), first.inputs.shape
      real = float(np.mean(first.inputs != 0))
      for _ in range(5):  # warm up tf.data (tracing, autotuning)
        next(batches)
      step = common.our_train_step(c, jax.device_put(first))
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
    grain_rows, grain_figures = grain_vs_ours(tmp)
  print(f'machine: {common.machine()}')
  print(f'pipeline: data.name=files (JSONL), byte tokenizer, Dataset.train_batches; step: '
        f'{FLAGS.size} rotary train step; medians of {FLAGS.rounds} alternating rounds')
  common.print_table(header, rows)
  grain_header = ['task', 'batch', 'ours examples/s', 'grain examples/s', 'ours / grain',
                  'grain order = ours']
  common.print_table(grain_header, grain_rows)
  common.write_json(FLAGS.json, {
      'title': 'Input pipeline vs train step',
      'setup': (f'`Dataset.train_batches` on a synthetic JSONL file of {FLAGS.documents} long '
                f'documents (`data.name=files`, byte tokenizer) vs the `{FLAGS.size}` rotary '
                f'train step at the same batch; alternating rounds ({FLAGS.batches} batches / '
                f'{FLAGS.steps} steps), medians of {FLAGS.rounds}'),
      'figures': figures + grain_figures, 'header': header, 'rows': rows,
      'notes': [', '.join(f'{h}: {v}' for h, v in zip(grain_header, r)) for r in grain_rows]})


if __name__ == '__main__':
  app.run(main)
