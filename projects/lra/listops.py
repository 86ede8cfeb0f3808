"""ListOps (Nangia & Bowman 2018), as in Long Range Arena (Tay et al. 2021), generated locally.

An example is a nested prefix expression over the digits 0-9, written as space-separated tokens
in the original format, e.g. ``[MAX 2 9 [MIN 4 7 ] 0 ]``, and its label is the expression's value
(10 classes). Operators:

* ``[MAX``, ``[MIN``: largest / smallest argument;
* ``[MED``: median, rounded down for an even number of arguments (the mean of the two middle
  values, as Long Range Arena's ``int(np.median(...))``);
* ``[SM``: sum modulo 10.

Expressions are random trees (at most ``max_depth`` levels of operators, 2 to ``max_args``
arguments each), rejected unless their length in characters is in ``[min_chars, max_length - 1]``
(``max_length`` counts the [CLS] token, so the byte tokenizer fits every example in
``max_length`` tokens). Labels are balanced by drawing expressions until every class has its
quota. Every split has its own fixed seed, so the data are identical on every machine.

Builder configs: ``listops`` (``data.name='listops'``, up to 512 tokens, as a byte-level
counterpart of LRA's task at 2K tokens) and ``small`` (``data.name='listops/small'``, up to 128).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Iterable
import zlib

import numpy as np
import tensorflow_datasets as tfds

import data
from data import builders

OPERATORS = ('[MAX', '[MIN', '[MED', '[SM')
NUM_CLASSES = 10


def apply_operator(operator: str, args: list[int]) -> int:
  """Value of one operator on its (already evaluated) digit arguments."""
  if not args:
    raise ValueError(f'{operator} has no arguments')
  if operator == '[MAX':
    return max(args)
  if operator == '[MIN':
    return min(args)
  if operator == '[MED':
    ordered = sorted(args)
    return (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) // 2
  if operator == '[SM':
    return sum(args) % 10
  raise ValueError(f'Unknown ListOps operator {operator!r}; valid: {OPERATORS}')


def evaluate(expression: str) -> int:
  """Evaluates a ListOps expression such as ``'[MAX 2 9 [MIN 4 7 ] 0 ]'``; ValueError on an
  unknown token, unbalanced brackets, an operator without arguments, or anything other than
  exactly one value at the top level."""
  stack: list[tuple[str, list[int]]] = []  # Open operators and their evaluated arguments.
  result: list[int] = []
  for token in expression.split():
    if token in OPERATORS:
      stack.append((token, []))
      continue
    if token == ']':
      if not stack:
        raise ValueError(f'Unbalanced "]" in {expression!r}')
      value = apply_operator(*stack.pop())
    elif token.isdigit() and len(token) == 1:
      value = int(token)
    else:
      raise ValueError(f'Unknown token {token!r} in {expression!r}')
    (stack[-1][1] if stack else result).append(value)
  if stack or len(result) != 1:
    raise ValueError(f'{expression!r} is not a single complete expression')
  return result[0]


@dataclasses.dataclass(eq=False)
class ListOpsConfig(tfds.core.BuilderConfig):
  """Expression and split sizes (the module doc); ``num_eval``: each evaluation split's."""

  max_length: int = 512
  min_chars: int = 128
  max_depth: int = 6
  max_args: int = 6
  num_train: int = 20_000
  num_eval: int = 2_000


def _random_tree(rng: random.Random, depth: int, config: ListOpsConfig) -> tuple[list[str], int]:
  """A random expression (tokens) and its value; operators become rarer deeper in the tree."""
  if depth >= config.max_depth or (depth > 0 and rng.random() < 0.35 + 0.1 * depth):
    digit = rng.randrange(10)
    return [str(digit)], digit
  operator = rng.choice(OPERATORS)
  subtrees = [_random_tree(rng, depth + 1, config) for _ in range(rng.randint(2, config.max_args))]
  tokens = [operator] + [token for sub_tokens, _ in subtrees for token in sub_tokens] + [']']
  return tokens, apply_operator(operator, [value for _, value in subtrees])


def generate(config: ListOpsConfig, split: str) -> tuple[list[str], np.ndarray]:
  """One split (seeded by a hash of the config and split names): expressions and their int64
  values, balanced (up to one) over the 10 classes."""
  num = config.num_train if split == 'train' else config.num_eval
  rng = random.Random(zlib.crc32(f'listops/{config.name}/{split}'.encode()))
  quota = [num // NUM_CLASSES + (c < num % NUM_CLASSES) for c in range(NUM_CLASSES)]
  texts, labels = [], []
  while len(texts) < num:
    tokens, value = _random_tree(rng, 0, config)
    text = ' '.join(tokens)
    if quota[value] and config.min_chars <= len(text) < config.max_length:
      quota[value] -= 1
      texts.append(text)
      labels.append(value)
  return texts, np.asarray(labels, np.int64)


_CITATION = """@inproceedings{nangia-bowman-2018-listops,
  title = {{L}ist{O}ps: A Diagnostic Dataset for Latent Tree Learning},
  author = {Nangia, Nikita and Bowman, Samuel},
  booktitle = {NAACL Student Research Workshop},
  year = {2018},
}
@inproceedings{tay2021long,
  title = {Long Range Arena: A Benchmark for Efficient Transformers},
  author = {Tay, Yi and Dehghani, Mostafa and Abnar, Samira and Shen, Yikang and Bahri, Dara and
            Pham, Philip and Rao, Jinfeng and Yang, Liu and Ruder, Sebastian and Metzler, Donald},
  booktitle = {ICLR},
  year = {2021},
}"""


class Listops(builders.EmbeddedBuilder):
  """Nested MAX/MIN/MED/SM expressions over digits; the label is the value."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Configs listops (512 tokens) and small (128 tokens).'}
  BUILDER_CONFIGS = [
      ListOpsConfig(name='listops', description='Expressions of 128-511 characters.'),
      ListOpsConfig(name='small', max_length=128, min_chars=32, max_depth=4, max_args=5,
                    description='Expressions of 32-127 characters.'),
  ]
  HOMEPAGE = 'https://github.com/nyu-mll/spinn/tree/listops-release'
  CITATION = _CITATION
  KEY_BY_INDEX = True

  def class_label(self) -> tfds.features.ClassLabel:
    return tfds.features.ClassLabel(num_classes=NUM_CLASSES)

  def rows(self) -> dict[str, Iterable[tuple]]:
    return {split: zip(*generate(self.builder_config, split))
            for split in ('train', 'validation', 'test')}

  def split_lengths(self, max_length: int) -> dict[str, int]:
    del max_length  # Every expression fits in the config's own.
    return dict.fromkeys(self.info.splits, self.builder_config.max_length)


data.register('listops', data.Entry('embedded', 'listops/listops'))
data.register('listops/small', data.Entry('embedded', 'listops/small'))
