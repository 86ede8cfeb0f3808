"""This project's RoFormer vs Hugging Face ``FlaxRoFormerForSequenceClassification``, side by side.

  python benchmarks/hf_compare.py [--size=small] [--lengths=128,256,512,1024,2048]
                                  [--tokens=2048] [--rounds=5]

Both models are randomly initialised with the same sizes (hidden, layers, heads, MLP, vocabulary
260, 2 token types, interleaved rotary, exact GELU, post-LN, dropout 0.1 on hidden states, none on
attention probabilities), take the same batch (all real tokens) and the same optax AdamW
(``training.optim.make_optimizer``, the default config) and loss. Ours is the project's train
step (``training.steps.train_step``); Hugging Face's is the same step body around
``model(input_ids, attention_mask, params=..., dropout_rng=..., train=True)`` (how the
transformers Flax examples train). At each length the batch is ``--tokens / length`` examples
(at least 1). Times are medians of round-robin rounds (ours, HF, ours, HF, ...); memory is XLA's
compiled estimate (arguments + outputs + temporaries - donated), per train step.

Goal: ours >= 1.3x faster per train step at 512, and never slower at any length.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault('USE_TF', '0')  # transformers would import TensorFlow (~20 s)
os.environ.setdefault('USE_TORCH', '0')  # nor torch: only the Flax model is used

import numpy as np  # pylint: disable=g-import-not-at-top
from absl import app, flags

from benchmarks import common
from benchmarks.hf_flax import build_hf

flags.DEFINE_string('size', 'small', 'Model preset (tiny, small, base).')
flags.DEFINE_list('lengths', ['128', '256', '512', '1024', '2048'], 'Sequence lengths.')
flags.DEFINE_integer('tokens', 2048, 'Tokens per batch (batch size = tokens / length, >= 1).')
flags.DEFINE_integer('rounds', 5, 'Round-robin rounds per measurement.')
flags.DEFINE_string('json', None, 'Write the figures here (for run_all.py).')
FLAGS = flags.FLAGS

SPEEDUP_GOAL = 1.3
GOAL_LENGTH = 512


def main(_):
  lengths = [int(x) for x in FLAGS.lengths]
  rows, figures, speedups = [], [], {}
  header = ['length', 'batch', 'ours ms/step', 'HF ms/step', 'train speed-up',
            'ours fwd ms', 'HF fwd ms', 'fwd speed-up', 'ours peak mem', 'HF peak mem',
            'params ours / HF']
  for length in lengths:
    batch_size = max(1, FLAGS.tokens // length)
    batch = common.synthetic_batch(batch_size, length)
    c = common.get_config(**{'model.size': FLAGS.size, 'model.position': 'rotary',
                             'model.type_vocab_size': 2, 'data.max_length': length})
    cfg = common.model_config(c)
    ours = common.our_train_step(c, batch)
    ours_fwd = common.our_forward(c, batch)
    hf, hf_fwd = build_hf(cfg, c, batch, max(lengths))
    print(f'length {length}: compiled (ours {ours.compile_s:.1f} s, HF {hf.compile_s:.1f} s)',
          flush=True)
    samples = common.time_samples({'ours': ours.run, 'hf': hf.run}, repeats=1,
                                  rounds=FLAGS.rounds)
    # Forward steps are ~4x shorter: 4 calls per sample, timed in their own rounds.
    samples.update(common.time_samples({'ours_fwd': ours_fwd.run, 'hf_fwd': hf_fwd.run},
                                       repeats=4, rounds=FLAGS.rounds))
    t = {k: float(np.median(v)) for k, v in samples.items()}
    train_x, fwd_x = t['hf'] / t['ours'], t['hf_fwd'] / t['ours_fwd']
    speedups[length] = (train_x, fwd_x, min(samples['hf']) / min(samples['ours']))
    rows.append([length, batch_size, f'{t["ours"] * 1e3:.0f}', f'{t["hf"] * 1e3:.0f}',
                 f'{train_x:.2f}x', f'{t["ours_fwd"] * 1e3:.0f}', f'{t["hf_fwd"] * 1e3:.0f}',
                 f'{fwd_x:.2f}x', common.mib(ours.memory['peak']),
                 common.mib(hf.memory['peak']), f'{ours.num_params:,} / {hf.num_params:,}'])
    print(f'  train {train_x:.2f}x, forward {fwd_x:.2f}x', flush=True)
    del ours, ours_fwd, hf, hf_fwd

  print(f'machine: {common.machine()}')
  print(f'{FLAGS.size} preset, rotary, float32, {FLAGS.tokens} tokens per batch; speed-up = HF '
        f'time / our time (median of {FLAGS.rounds} round-robin rounds)')
  common.print_table(header, rows)
  if GOAL_LENGTH in speedups:
    x = speedups[GOAL_LENGTH][0]
    figures.append(common.figure(f'train step speed-up vs HF at length {GOAL_LENGTH}', x,
                                 goal=f'>= {SPEEDUP_GOAL}x', met=x >= SPEEDUP_GOAL,
                                 detail=f'fastest / fastest {speedups[GOAL_LENGTH][2]:.2f}x'))
  worst_len = min(speedups, key=lambda n: speedups[n][0])
  worst = speedups[worst_len][0]
  figures.append(common.figure('worst train speed-up vs HF over lengths', worst,
                               goal='>= 1.0x (never slower)', met=worst >= 1.0,
                               detail=f'at length {worst_len}'))
  worst_fwd_len = min(speedups, key=lambda n: speedups[n][1])
  figures.append(common.figure('worst forward speed-up vs HF over lengths',
                               speedups[worst_fwd_len][1], goal='>= 1.0x (never slower)',
                               met=speedups[worst_fwd_len][1] >= 1.0,
                               detail=f'at length {worst_fwd_len}'))
  geo = float(np.exp(np.mean([np.log(v[0]) for v in speedups.values()])))
  figures.append(common.figure('train speed-up vs HF, geometric mean over lengths', geo,
                               detail='reported'))
  common.write_json(FLAGS.json, {
      'title': 'This project vs Hugging Face FlaxRoFormerForSequenceClassification',
      'setup': (f'`{FLAGS.size}` preset sizes in both, rotary (interleaved), float32, dropout '
                f'0.1, {FLAGS.tokens} tokens per batch, same optax AdamW and loss; speed-up = HF '
                f'time / our time, median of {FLAGS.rounds} round-robin rounds (train steps: 1 call '
                'per sample; forward: 4 calls per sample, in rounds of their own); peak memory is '
                'XLA memory_analysis of the compiled train step (arguments + outputs + '
                'temporaries - donated)'),
      'figures': figures, 'header': header, 'rows': rows})


if __name__ == '__main__':
  app.run(main)
