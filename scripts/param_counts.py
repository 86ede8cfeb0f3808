"""Prints parameter counts per position scheme and attention kind for a model preset.

  python scripts/param_counts.py --size=tiny [--vocab_size=260] [--num_classes=2]

Ablations report these: every scheme shares the same encoder, so 'extra' is exactly what the
scheme adds (learned table, Shaw's per-layer relative representations, T5's bias table).
Shapes only (``jax.eval_shape``): nothing is initialised, so 'base' is instant too.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top

import models  # pylint: disable=g-import-not-at-top
from configs.default import get_config  # pylint: disable=g-import-not-at-top
from training import validation  # pylint: disable=g-import-not-at-top


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--size', default='tiny', choices=tuple(models.PRESETS),
                      help='Model preset (model.size).')
  parser.add_argument('--vocab_size', type=int, default=260,
                      help='Vocabulary size (default: UTF-8 bytes plus a few special tokens).')
  parser.add_argument('--num_classes', type=int, default=2, help='Classifier outputs.')
  return parser.parse_args(argv)


def count(size: str, position: str, attention: str, *, vocab_size: int,
          num_classes: int) -> int:
  """Parameters of the default config with this preset, scheme and attention kind."""
  config = get_config()
  config.model.size = size
  config.model.position = position
  config.model.attention = attention
  cfg = validation.model_config(config, vocab_size=vocab_size, num_classes=num_classes)
  _, params = jax.eval_shape(functools.partial(models.init, cfg), jax.random.key(0))
  return models.count_params(params)


def table(size: str, *, vocab_size: int, num_classes: int) -> list[tuple[str, str, int, int]]:
  """(position, attention, parameters, extra over position=none) for every allowed pair."""
  rows = []
  for attention in ('softmax', 'linear'):
    baseline = count(size, 'none', attention, vocab_size=vocab_size, num_classes=num_classes)
    for position, scheme in models.SCHEMES.items():
      if attention == 'linear' and not scheme.supports_linear:
        continue
      total = count(size, position, attention, vocab_size=vocab_size, num_classes=num_classes)
      rows.append((position, attention, total, total - baseline))
  return rows


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  print(f'model.size={args.size} vocab_size={args.vocab_size} num_classes={args.num_classes} '
        '(configs/default.py otherwise)')
  print(f'{"position":<12} {"attention":<9} {"parameters":>12} {"extra":>10}')
  for position, attention, total, extra in table(args.size, vocab_size=args.vocab_size,
                                                 num_classes=args.num_classes):
    print(f'{position:<12} {attention:<9} {total:>12,} {extra:>+10,}')


if __name__ == '__main__':
  main()
