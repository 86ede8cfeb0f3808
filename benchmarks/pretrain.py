"""MLM pre-training step: tokens/s, this project vs Hugging Face ``FlaxRoFormerForMaskedLM``.

  python benchmarks/pretrain.py [--size=small] [--length=512] [--batch_size=8] [--vocab=30000]

The same model (``--size`` preset, rotary, post-LN, float32, dropout 0.1, ``--vocab`` WordPiece
tokens, output layer tied to the token embeddings), the same batch (15% of the tokens masked,
BERT's M = ceil(0.15 L) + 1 prediction slots per row), the same AdamW step body and loss
(``benchmarks/hf_flax.py``). Ours runs the MLM head on the masked positions only (as BERT's
original code does), HF's on every position; "ours, head everywhere" runs ours as HF does (and
without the packed rows' document mask, which HF has no input for), which separates that design
choice from the rest of the step: the two then compile to the same matmuls and softmax fusions.
Times are medians of round-robin rounds.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault('USE_TF', '0')
os.environ.setdefault('USE_TORCH', '0')

import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
from absl import app, flags  # pylint: disable=g-import-not-at-top

from benchmarks import common  # pylint: disable=g-import-not-at-top
from benchmarks import hf_flax  # pylint: disable=g-import-not-at-top
from data import batches  # pylint: disable=g-import-not-at-top
from data import lm  # pylint: disable=g-import-not-at-top

flags.DEFINE_string('size', 'small', 'Model preset.')
flags.DEFINE_integer('length', 512, 'Tokens per packed row.')
flags.DEFINE_integer('batch_size', 8, 'Rows per step.')
flags.DEFINE_integer('vocab', 30000, 'Vocabulary size (BERT: 30,522).')
flags.DEFINE_integer('rounds', 9, 'Round-robin rounds.')
flags.DEFINE_string('json', None, 'Write the figures here (for run_all.py).')
FLAGS = flags.FLAGS


def mlm_batch(batch_size: int, length: int, vocab: int, seed: int = 0) -> batches.LanguageModel:
  """One packed row per example (one document), 15% of the tokens to predict."""
  rng = np.random.default_rng(seed)
  num = lm.max_predictions(length, 0.15)
  chosen = np.sort(np.stack([rng.choice(np.arange(1, length), num, replace=False)
                             for _ in range(batch_size)]), axis=1)
  weights = np.ones((batch_size, num), np.float32)
  weights[:, -1] = 0.0  # the spare slot, as in data/lm.py
  inputs = rng.integers(5, vocab, (batch_size, length), dtype=np.int32)
  return batches.LanguageModel(
      inputs=jnp.asarray(inputs),
      positions=jnp.asarray(np.broadcast_to(np.arange(length, dtype=np.int32),
                                            (batch_size, length)).copy()),
      mask=jnp.ones((batch_size, length), bool),
      segments=jnp.ones((batch_size, length), jnp.int32),
      targets=jnp.asarray(np.take_along_axis(inputs, chosen, 1)),
      target_positions=jnp.asarray(chosen.astype(np.int32)),
      target_weights=jnp.asarray(weights))


def everywhere(batch: batches.LanguageModel) -> batches.LanguageModel:
  """The same batch as HF's model sees it: the targets spread over every position (weight 0
  where unmasked), so that our head runs on every position as HF's does, and no document ids
  (one document per row), so that our attention, like HF's, masks padding only."""
  targets, target_weights = hf_flax.targets_everywhere(batch)
  return batch.replace(targets=targets, target_weights=target_weights, target_positions=None,
                       segments=None)


def main(_):
  c = common.get_config(**{'model.size': FLAGS.size, 'model.position': 'rotary',
                           'train.task': 'mlm', 'data.sp_vocab_size': FLAGS.vocab,
                           'data.max_length': FLAGS.length})
  batch = mlm_batch(FLAGS.batch_size, FLAGS.length, FLAGS.vocab)
  steps = {'ours': common.our_train_step(c, batch),
           'ours, head everywhere': common.our_train_step(c, everywhere(batch),
                                                          name='ours, head everywhere'),
           'HF': hf_flax.build_hf(common.model_config(c), c, batch, FLAGS.length)[0]}
  samples = common.time_samples({k: s.run for k, s in steps.items()}, rounds=FLAGS.rounds)
  seconds = {k: float(np.median(v)) for k, v in samples.items()}
  tokens = FLAGS.batch_size * FLAGS.length
  header = ['step', 's/step', 'tokens/s', 'vs HF', 'parameters', 'peak memory']
  rows = [[k, f'{seconds[k]:.3f}', f'{tokens / seconds[k]:,.0f}',
           f'{seconds["HF"] / seconds[k]:.2f}x', f'{s.num_params:,}', common.mib(s.memory['peak'])]
          for k, s in steps.items()]
  print(f'machine: {common.machine()}')
  common.print_table(header, rows)
  ratio = seconds['HF'] / seconds['ours']
  common.write_json(FLAGS.json, {
      'title': f'MLM pre-training step, {FLAGS.size} at {FLAGS.length} tokens: this project vs HF',
      'setup': (f'`{FLAGS.size}` sizes, float32, vocabulary {FLAGS.vocab:,}, batch '
                f'{FLAGS.batch_size} x {FLAGS.length} tokens, 15% masked, same AdamW and loss; '
                f'median of {FLAGS.rounds} round-robin rounds'),
      'figures': [common.figure('MLM train-step tokens/s vs HF FlaxRoFormerForMaskedLM', ratio,
                                goal='>= 1.3x', met=ratio >= 1.3),
                  common.figure('MLM step vs HF, both with the head on every position',
                                seconds['HF'] / seconds['ours, head everywhere'],
                                detail='the encoder and step alone')],
      'header': header, 'rows': rows})


if __name__ == '__main__':
  app.run(main)
