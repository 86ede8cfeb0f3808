"""The 15 length-generalisation tasks of Delétang et al. 2023 ("Neural Networks and the Chomsky
Hierarchy"), as Ruoss et al. 2023 ("Randomized Positional Encodings") train encoders on them.

Each task follows the authors' task builders (google-deepmind/randomized_positional_encodings,
tasks/{regular,dcf,cs}/*.py, with the moduli and alphabets of experiments/constants.py): its
input alphabet, its output classes and output length, and for the tasks whose output ends with a
termination token the positions the accuracy counts (projects/chomsky/README.md lists them all). The
examples are drawn here with NumPy's ``Generator``, not the authors' JAX/NumPy/``random``
streams, so the distributions match theirs but no example does.

A sampler ``(rng, b, n) -> (inputs [b, n'], outputs [b, m])`` draws b examples of input length
n (n' = n but for ``modular_arithmetic``, whose expressions have odd length: n' = n - 1 for an
even n, as the authors do); m = ``Task.output_length(n')``. Inputs are token ids ``0 ..
input_size - 1``, outputs class ids ``0 .. output_size - 1``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import flax.struct
import numpy as np

Sampler = Callable[[np.random.Generator, int, int], tuple[np.ndarray, np.ndarray]]

MODULUS = 5  # modular_arithmetic(_brackets), solve_equation (the authors' constants.py)
CYCLE_LENGTH = 5  # cycle_navigation
SORT_VOCAB = 5  # bucket_sort's alphabet
# modular_arithmetic's operator tokens: MODULUS + the authors' OP_BY_CHARACTER ('_' is never drawn).
_PLUS, _MINUS, _TIMES = MODULUS, MODULUS + 1, MODULUS + 2
# The bracketed expressions' tokens (digits are themselves): modular_arithmetic_brackets' and
# solve_equation's alphabets differ (the latter has no '*').
_BRACKETS_IDS = {c: MODULUS + i for i, c in enumerate('+-*()x=')}
_EQUATION_IDS = {c: MODULUS + i for i, c in enumerate('+-()x=')}
TERMINATION = 2  # the output token that ends a stack or a binary number


@dataclasses.dataclass(frozen=True)
class Task:
  """A task: its level in the hierarchy ('regular', 'dcf' or 'cs'), input alphabet size,
  output classes, output length of an input of n tokens, sampler, and ``terminated``: the
  output ends with ``TERMINATION`` followed by 0s, and the accuracy counts the outputs up to and
  including the first termination token only (the authors' ``accuracy_mask``)."""

  name: str
  level: str
  input_size: int
  output_size: int
  output_length: Callable[[int], int]
  sample: Sampler
  terminated: bool = False

  @property
  def single_output(self) -> bool:
    return self.output_length(1) == 1 and self.output_length(100) == 1


def _bits(rng: np.random.Generator, b: int, n: int) -> np.ndarray:
  return rng.integers(0, 2, (b, n))


def _one(values_B: np.ndarray) -> np.ndarray:
  return np.asarray(values_B, np.int64)[:, None]


def even_pairs(rng: np.random.Generator, b: int, n: int) -> tuple[np.ndarray, np.ndarray]:
  """Binary strings; class 1 iff the number of unequal neighbours (01 and 10) is odd."""
  s_BxN = _bits(rng, b, n)
  return s_BxN, _one(np.sum(s_BxN[:, 1:] != s_BxN[:, :-1], axis=1) % 2)


def parity_check(rng: np.random.Generator, b: int, n: int) -> tuple[np.ndarray, np.ndarray]:
  """Binary strings; the number of 1s modulo 2."""
  s_BxN = _bits(rng, b, n)
  return s_BxN, _one(s_BxN.sum(axis=1) % 2)


def cycle_navigation(rng: np.random.Generator, b: int, n: int
                     ) -> tuple[np.ndarray, np.ndarray]:
  """Moves 0, 1, 2 meaning -1, stay, +1 on a cycle of ``CYCLE_LENGTH`` from state 0; the final
  state."""
  moves_BxN = rng.integers(0, 3, (b, n))
  return moves_BxN, _one(np.sum(moves_BxN - 1, axis=1) % CYCLE_LENGTH)


def modular_arithmetic(rng: np.random.Generator, b: int, n: int
                       ) -> tuple[np.ndarray, np.ndarray]:
  """d op d op ... d (odd length: an even n loses a token) with digits mod ``MODULUS`` and
  operators +, -, * drawn uniformly; the value mod ``MODULUS``, * binding before + and -."""
  n -= 1 - n % 2
  digits_BxK = rng.integers(0, MODULUS, (b, n // 2 + 1))
  ops_BxK = rng.choice(np.array([_PLUS, _TIMES, _MINUS]), (b, n // 2))
  expression_BxN = np.empty((b, n), np.int64)
  expression_BxN[:, 0::2], expression_BxN[:, 1::2] = digits_BxK, ops_BxK
  values = []
  for digits, ops in zip(digits_BxK.tolist(), ops_BxK.tolist()):  # plain ints: fast at b = 1
    total, term = 0, digits[0]
    for op, digit in zip(ops, digits[1:]):
      if op == _TIMES:
        term = term * digit % MODULUS
      else:
        total, term = total + term, -digit if op == _MINUS else digit
    values.append((total + term) % MODULUS)
  return expression_BxN, _one(values)


def _bracketed(rng: np.random.Generator, n: int, mult: bool) -> tuple[str, int]:
  """The authors' random bracketed expression of exactly n characters and its value mod
  ``MODULUS``: a digit, -d, (d), (-d), or (left op right) with a uniform split of the length."""
  if n < 5:
    digit = int(rng.integers(0, MODULUS))
    text = ('{}', '-{}', '({})', '(-{})')[n - 1].format(digit)
    return text, (-digit if n in (2, 4) else digit) % MODULUS
  left_n = int(rng.integers(1, n - 3))
  left, left_value = _bracketed(rng, left_n, mult)
  right, right_value = _bracketed(rng, n - 3 - left_n, mult)
  op = '+-*'[int(rng.integers(0, 3 if mult else 2))]
  value = {'+': left_value + right_value, '-': left_value - right_value,
           '*': left_value * right_value}[op]
  return f'({left}{op}{right})', value % MODULUS


def _encode(text: str, ids: dict[str, int]) -> list[int]:
  return [int(c) if c.isdigit() else ids[c] for c in text]


def modular_arithmetic_brackets(rng: np.random.Generator, b: int, n: int
                                ) -> tuple[np.ndarray, np.ndarray]:
  """A bracketed expression of n tokens over digits mod ``MODULUS``, +, -, * and brackets
  (the authors' ``mult=True``); its value."""
  drawn = [_bracketed(rng, n, mult=True) for _ in range(b)]
  return (np.asarray([_encode(text, _BRACKETS_IDS) for text, _ in drawn], np.int64),
          _one([value for _, value in drawn]))


def _equation(rng: np.random.Generator, n: int) -> tuple[str, int]:
  """An expression of n - 2 characters (+ and - only) with one digit, the first at or after a
  uniform position (cyclically), replaced by x, then '=' and the value; x's value."""
  text, value = _bracketed(rng, n - 2, mult=False)
  at = int(rng.integers(0, len(text)))
  while not text[at].isdigit():
    at = (at + 1) % len(text)
  return f'{text[:at]}x{text[at + 1:]}={value}', int(text[at])


def solve_equation(rng: np.random.Generator, b: int, n: int) -> tuple[np.ndarray, np.ndarray]:
  """An equation of n tokens (e.g. ``(x-3)=1``) mod ``MODULUS``; x. Below 3 tokens there is no
  equation: the authors' batch is all token 0 with answer 0."""
  if n < 3:
    return np.zeros((b, n), np.int64), np.zeros((b, 1), np.int64)
  drawn = [_equation(rng, n) for _ in range(b)]
  return (np.asarray([_encode(text, _EQUATION_IDS) for text, _ in drawn], np.int64),
          _one([x for _, x in drawn]))


def _padded(outputs: list[list[int]], m: int) -> np.ndarray:
  """Each output, then the termination token, then 0s to m tokens."""
  return np.asarray([out + [TERMINATION] + [0] * (m - len(out) - 1) for out in outputs],
                    np.int64)


def stack_manipulation(rng: np.random.Generator, b: int, n: int
                       ) -> tuple[np.ndarray, np.ndarray]:
  """A stack of 0s and 1s (bottom to top; 1 to n - 1 of them) then actions 2 (POP, ignored on
  an empty stack), 3 (PUSH 0), 4 (PUSH 1); the final stack top to bottom, the termination token
  and 0s (n + 1 outputs). One token: a stack alone."""
  inputs, outputs = [], []
  for _ in range(b):
    size = 1 if n == 1 else int(rng.integers(1, n))
    stack = rng.integers(0, 2, size).tolist()
    actions = rng.integers(2, 5, n - size).tolist()
    inputs.append(stack + actions)
    for action in actions:
      if action == 2:
        stack = stack[:-1]
      else:
        stack = stack + [action - 3]
    outputs.append(stack[::-1])
  return np.asarray(inputs, np.int64), _padded(outputs, n + 1)


def reverse_string(rng: np.random.Generator, b: int, n: int) -> tuple[np.ndarray, np.ndarray]:
  """Binary strings, reversed."""
  s_BxN = _bits(rng, b, n)
  return s_BxN, s_BxN[:, ::-1].copy()


def duplicate_string(rng: np.random.Generator, b: int, n: int
                     ) -> tuple[np.ndarray, np.ndarray]:
  """Binary strings, twice."""
  s_BxN = _bits(rng, b, n)
  return s_BxN, np.concatenate([s_BxN, s_BxN], axis=1)


def missing_duplicate_string(rng: np.random.Generator, b: int, n: int
                             ) -> tuple[np.ndarray, np.ndarray]:
  """A binary string of n // 2 tokens twice, one token replaced by 2 (uniformly), then 3 if n
  is odd; the replaced token. One token: the authors' input 1 with answer 1."""
  if n == 1:
    return np.ones((b, 1), np.int64), np.ones((b, 1), np.int64)
  s_BxK = _bits(rng, b, n // 2)
  doubled_BxN = np.concatenate([s_BxK, s_BxK, np.full((b, n % 2), 3)], axis=1)
  at_B, rows_B = rng.integers(0, 2 * (n // 2), b), np.arange(b)
  missing_B = doubled_BxN[rows_B, at_B]
  doubled_BxN[rows_B, at_B] = 2
  return doubled_BxN, _one(missing_B)


def odds_first(rng: np.random.Generator, b: int, n: int) -> tuple[np.ndarray, np.ndarray]:
  """Binary strings; the tokens at odd (0-based) indices, then those at even ones, as the
  authors' code does (``s[1::2]`` then ``s[::2]``; their docstring's example has the halves the
  other way round)."""
  s_BxN = _bits(rng, b, n)
  return s_BxN, np.concatenate([s_BxN[:, 1::2], s_BxN[:, 0::2]], axis=1)


def _positive(rng: np.random.Generator, k: int) -> list[int]:
  """A uniform number in 1 .. 2^k - 1 as its k bits, least significant first."""
  while True:
    bits = rng.integers(0, 2, k).tolist()
    if any(bits):
      return bits


def _value(bits_little_endian: list[int]) -> int:
  return sum(bit << i for i, bit in enumerate(bits_little_endian))


def _little_endian(value: int) -> list[int]:
  """The binary digits of value, least significant first, without trailing zeros (0: [0])."""
  return [int(c) for c in reversed(f'{value:b}')]


def _binary_operation(rng: np.random.Generator, b: int, n: int, add: bool
                      ) -> tuple[np.ndarray, np.ndarray]:
  """Two numbers of k and n - 1 - k bits (k uniform in 1 .. n - 2; each uniform in 1 .. 2^bits
  - 1), little-endian with leading zeros, separated by 2; their sum (n + 1 outputs) or product
  (n outputs), little-endian, then termination and 0s. Up to 2 tokens, the authors' input is
  one number in 0 .. 2^n - 2 (n bits); the sum's output is that number, the product's 0s."""
  inputs, outputs = [], []
  for _ in range(b):
    if n <= 2:
      number = int(rng.integers(0, 2 ** n - 1))
      inputs.append([(number >> i) & 1 for i in range(n)])
      outputs.append(_little_endian(number) if add else [0] * (n - 1))
      continue
    k = int(rng.integers(1, n - 1))
    first, second = _positive(rng, k), _positive(rng, n - 1 - k)
    inputs.append(first + [2] + second)
    x, y = _value(first), _value(second)
    outputs.append(_little_endian(x + y if add else x * y))
  return np.asarray(inputs, np.int64), _padded(outputs, n + 1 if add else n)


def binary_addition(rng: np.random.Generator, b: int, n: int) -> tuple[np.ndarray, np.ndarray]:
  """x 2 y in little-endian binary; x + y (``_binary_operation``)."""
  return _binary_operation(rng, b, n, add=True)


def binary_multiplication(rng: np.random.Generator, b: int, n: int
                          ) -> tuple[np.ndarray, np.ndarray]:
  """x 2 y in little-endian binary; x * y (``_binary_operation``)."""
  return _binary_operation(rng, b, n, add=False)


def compute_sqrt(rng: np.random.Generator, b: int, n: int) -> tuple[np.ndarray, np.ndarray]:
  """A number uniform in 1 .. 2^n - 1 in big-endian binary (n bits); the floor of its square
  root in big-endian binary (ceil(n / 2) bits)."""
  m = math.ceil(n / 2)
  inputs, outputs = [], []
  for _ in range(b):
    bits = _positive(rng, n)[::-1]
    root = math.isqrt(_value(bits[::-1]))
    inputs.append(bits)
    outputs.append([(root >> i) & 1 for i in reversed(range(m))])
  return np.asarray(inputs, np.int64), np.asarray(outputs, np.int64)


def bucket_sort(rng: np.random.Generator, b: int, n: int) -> tuple[np.ndarray, np.ndarray]:
  """Strings over ``SORT_VOCAB`` symbols; sorted."""
  s_BxN = rng.integers(0, SORT_VOCAB, (b, n))
  return s_BxN, np.sort(s_BxN, axis=1)


_ONE, _SAME = (lambda n: 1), (lambda n: n)


class Queries(flax.struct.PyTreeNode):
  """Inputs followed by one query token per output, each output predicted at its query token by
  the classification head (``projects/chomsky/tasks.py``): ``inputs``, ``positions`` (0, 1, ... from the
  first input token; 0 at padding) int32 [B, L], ``mask`` bool [B, L]; ``targets`` int32 [B, M]
  the output classes, at the query tokens ``target_positions`` int32 [B, M]; ``target_weights``
  float32 [B, M] 1 at every output (what the loss counts), 0 at padding; ``scored`` float32
  [B, M] 1 at the outputs the accuracy counts (those up to a termination token)."""

  inputs: np.ndarray
  positions: np.ndarray
  mask: np.ndarray
  targets: np.ndarray
  target_positions: np.ndarray
  target_weights: np.ndarray
  scored: np.ndarray


TASKS = {task.name: task for task in (
    Task('even_pairs', 'regular', 2, 2, _ONE, even_pairs),
    Task('modular_arithmetic', 'regular', MODULUS + 4, MODULUS, _ONE, modular_arithmetic),
    Task('parity_check', 'regular', 2, 2, _ONE, parity_check),
    Task('cycle_navigation', 'regular', 3, CYCLE_LENGTH, _ONE, cycle_navigation),
    Task('stack_manipulation', 'dcf', 5, 3, lambda n: n + 1, stack_manipulation, True),
    Task('reverse_string', 'dcf', 2, 2, _SAME, reverse_string),
    Task('modular_arithmetic_brackets', 'dcf', MODULUS + 6, MODULUS, _ONE,
         modular_arithmetic_brackets),
    Task('solve_equation', 'dcf', MODULUS + 6, MODULUS, _ONE, solve_equation),
    Task('duplicate_string', 'cs', 2, 2, lambda n: 2 * n, duplicate_string),
    Task('missing_duplicate_string', 'cs', 4, 2, _ONE, missing_duplicate_string),
    Task('odds_first', 'cs', 2, 2, _SAME, odds_first),
    Task('binary_addition', 'cs', 3, 3, lambda n: n + 1, binary_addition, True),
    Task('binary_multiplication', 'cs', 3, 3, _SAME, binary_multiplication, True),
    Task('compute_sqrt', 'cs', 2, 2, lambda n: math.ceil(n / 2), compute_sqrt),
    Task('bucket_sort', 'cs', SORT_VOCAB, SORT_VOCAB, _SAME, bucket_sort),
)}


def bucket(size: int) -> int:
  """The padded size of ``size`` tokens: 8, 12, 16, 24, 32, 48, ... (powers of 2 and 1.5 times
  them), so that batches of every length share a few shapes (a few compilations) and waste at
  most a third."""
  padded = 8
  while padded < size:
    padded = padded * 3 // 2 if padded & (padded - 1) == 0 else padded * 4 // 3
  return padded


def input_length(task: Task, n: int) -> int:
  """The input tokens of an example drawn at length n (``modular_arithmetic``: odd)."""
  return n - 1 + n % 2 if task.name == 'modular_arithmetic' else n


def shape(task: Task, lengths: range | list[int]) -> tuple[int, int]:
  """(L, M) of a batch holding examples of any of ``lengths``: padded tokens and outputs (one
  for a single-output task)."""
  most = max(lengths, key=lambda n: input_length(task, n) + task.output_length(n))
  n = input_length(task, most)
  outputs = max(task.output_length(input_length(task, k)) for k in lengths)
  return bucket(n + task.output_length(n)), 1 if task.single_output else bucket(outputs)


def make_batch(task: Task, examples: list[tuple[np.ndarray, np.ndarray]], length: int,
               outputs: int) -> Queries:
  """A ``Queries`` batch of (input [n], output [m]) examples: each row the n input tokens, then
  m query tokens (id ``task.input_size``), padded to ``length`` tokens and ``outputs`` outputs."""
  b = len(examples)
  tokens_BxL, positions_BxL = np.zeros((b, length), np.int32), np.zeros((b, length), np.int32)
  mask_BxL = np.zeros((b, length), bool)
  targets_BxM, at_BxM = np.zeros((b, outputs), np.int32), np.zeros((b, outputs), np.int32)
  weights_BxM, scored_BxM = np.zeros((b, outputs), np.float32), np.zeros((b, outputs), np.float32)
  for row, (x_N, y_M) in enumerate(examples):
    n, m = len(x_N), len(y_M)
    tokens_BxL[row, :n + m] = np.concatenate([x_N, np.full(m, task.input_size)])
    positions_BxL[row, :n + m], mask_BxL[row, :n + m] = np.arange(n + m), True
    targets_BxM[row, :m], at_BxM[row, :m], weights_BxM[row, :m] = y_M, n + np.arange(m), 1.0
    # The authors' accuracy_mask: up to the first termination token, that one included.
    last = int(np.argmax(y_M == TERMINATION)) if task.terminated else m - 1
    scored_BxM[row, :last + 1] = 1.0
  return Queries(tokens_BxL, positions_BxL, mask_BxL, targets_BxM, at_BxM, weights_BxM,
                         scored_BxM)
