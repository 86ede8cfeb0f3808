"""Fine-tuning the base preset at 512 tokens: examples/s and memory, this project vs Hugging Face.

  python benchmarks/finetune.py [--size=base] [--length=512] [--batch_size=8] [--rounds=3]

RoFormer-base sizes (12 layers, 768 wide, 12 heads, MLP 3,072; byte vocabulary, 2 token types),
bfloat16 activations (float32 parameters), one fine-tuning train step (forward, backward, AdamW)
on a full batch of ``--length`` tokens. Ours runs with ``model.remat=True`` (each layer
recomputed in the backward pass) and without; ``FlaxRoFormerForSequenceClassification`` has no
rematerialisation option, so it runs without, with ``dtype=bfloat16``, through the same step body
(``benchmarks/hf_flax.py``). Times are medians of round-robin rounds; memory is XLA's estimate
of the compiled step (arguments + outputs + temporaries - donated), set against this machine's
memory.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault('USE_TF', '0')
os.environ.setdefault('USE_TORCH', '0')

import numpy as np  # pylint: disable=g-import-not-at-top
from absl import app, flags  # pylint: disable=g-import-not-at-top

from benchmarks import common  # pylint: disable=g-import-not-at-top
from benchmarks import hf_flax  # pylint: disable=g-import-not-at-top

flags.DEFINE_string('size', 'base', 'Model preset.')
flags.DEFINE_integer('length', 512, 'Tokens per example.')
flags.DEFINE_integer('batch_size', 8, 'Examples per step.')
flags.DEFINE_integer('rounds', 3, 'Round-robin rounds.')
flags.DEFINE_string('json', None, 'Write the figures here (for run_all.py).')
FLAGS = flags.FLAGS


def _config(remat: bool):
  return common.get_config(**{'model.size': FLAGS.size, 'model.position': 'rotary',
                              'model.type_vocab_size': 2, 'model.dtype': 'bfloat16',
                              'model.remat': remat, 'data.max_length': FLAGS.length})


def main(_):
  batch = common.synthetic_batch(FLAGS.batch_size, FLAGS.length)
  steps = {'ours, remat': common.our_train_step(_config(True), batch, name='ours, remat'),
           'ours': common.our_train_step(_config(False), batch, name='ours')}
  c = _config(False)
  steps['HF'] = hf_flax.build_hf(common.model_config(c), c, batch, FLAGS.length)[0]
  samples = common.time_samples({k: s.run for k, s in steps.items()}, rounds=FLAGS.rounds)
  seconds = {k: float(np.median(v)) for k, v in samples.items()}
  memory = common.machine_memory_bytes()
  header = ['step', 's/step', 'examples/s', 'vs HF', 'peak memory', 'share of this machine']
  rows = [[k, f'{seconds[k]:.2f}', f'{FLAGS.batch_size / seconds[k]:.2f}',
           f'{seconds["HF"] / seconds[k]:.2f}x', common.mib(s.memory['peak']),
           f'{s.memory["peak"] / memory:.0%}'] for k, s in steps.items()]
  print(f'machine: {common.machine()}')
  common.print_table(header, rows)
  common.write_json(FLAGS.json, {
      'title': f'Fine-tuning {FLAGS.size} at {FLAGS.length} tokens: this project vs HF',
      'setup': (f'`{FLAGS.size}` sizes, bfloat16 activations, batch {FLAGS.batch_size} x '
                f'{FLAGS.length} tokens, same AdamW and loss; HF has no remat option; median of '
                f'{FLAGS.rounds} round-robin rounds; memory from XLA memory_analysis'),
      'figures': _figures(steps, seconds, memory), 'header': header, 'rows': rows})


def _figures(steps: dict, seconds: dict[str, float], memory: int) -> list[dict]:
  peak = {k: s.memory['peak'] for k, s in steps.items()}
  saved = peak['ours'] - peak['ours, remat']
  return [
      common.figure('fine-tuning examples/s vs HF (ours with remat)',
                    seconds['HF'] / seconds['ours, remat'], detail='bf16, remat vs none'),
      common.figure('fine-tuning examples/s vs HF (both without remat)',
                    seconds['HF'] / seconds['ours'], goal='>= 1.0x', met=seconds['ours']
                    <= seconds['HF']),
      common.figure('fine-tuning peak memory, ours / HF (both without remat)',
                    peak['ours'] / peak['HF'], goal='<= 1.0x', met=peak['ours'] <= peak['HF'],
                    detail=f'{common.mib(peak["ours"])} vs {common.mib(peak["HF"])}'),
      common.figure('remat: peak memory of the step, with / without', peak['ours, remat']
                    / peak['ours'], detail=f'saves {common.mib(saved)}'),
      common.figure('remat: step time, with / without',
                    seconds['ours, remat'] / seconds['ours'], detail='the cost of recomputing'),
      common.figure(f'{FLAGS.size} fine-tune at {FLAGS.length} with remat and bf16 fits', 1.0,
                    unit='', goal='fits', met=peak['ours, remat'] < memory / 2,
                    detail=f'{common.mib(peak["ours, remat"])} of {common.mib(memory)}')]


if __name__ == '__main__':
  app.run(main)
