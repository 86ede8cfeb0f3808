"""The Chomsky-hierarchy tasks (projects/chomsky/tasks.py): each sampler on hand-computed examples and
against plain-Python solutions, the training lengths, determinism in (seed, step), the
query-token batches, loss and accuracy on output positions only, and runs through the trainer."""

import itertools
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import data
import models
from data import batches
from projects.chomsky import tasks as chomsky
from data import datasets
from data.config import DataConfig
from training import evaluation
from training import tasks
from training import trainer
from training.config import run_config as typed


class Scripted:
  """A stand-in for ``np.random.Generator`` that returns the given draws in order, checking each
  is a value the real call could return."""

  def __init__(self, *draws):
    self.draws = list(draws)

  def _next(self, size):
    value = np.asarray(self.draws.pop(0))
    assert value.shape == (() if size is None else np.empty(size).shape)
    return value

  def integers(self, low, high=None, size=None):
    value = self._next(size)
    assert np.all((low <= value) & (value < high)), (low, high, value)
    return value if size is not None else int(value)

  def choice(self, options, size=None):
    value = self._next(size)
    assert np.isin(value, options).all()
    return value


def _sample(name, n, *draws):
  rng = Scripted(*draws)
  inputs, outputs = chomsky.TASKS[name].sample(rng, 1, n)
  assert not rng.draws, 'draws left over'
  return inputs[0].tolist(), outputs[0].tolist()


# (task, n, the draws, the input, the output), each worked out by hand from the task's definition
# (projects/chomsky/README.md); several are the authors' docstring examples.
HAND = [
    ('even_pairs', 6, [[0, 0, 1, 1, 1, 0]], [0, 0, 1, 1, 1, 0], [0]),  # 01, 10: even
    ('even_pairs', 7, [[0, 1, 0, 1, 0, 0, 1]], [0, 1, 0, 1, 0, 0, 1], [1]),  # 5 unequal pairs
    ('parity_check', 7, [[1, 0, 1, 0, 1, 0, 0]], [1, 0, 1, 0, 1, 0, 0], [1]),
    ('parity_check', 5, [[0, 1, 1, 1, 1]], [0, 1, 1, 1, 1], [0]),
    # moves 2 0 1 0 0 = +1 -1 0 -1 -1 = -2 = 3 mod 5
    ('cycle_navigation', 5, [[2, 0, 1, 0, 0]], [2, 0, 1, 0, 0], [3]),
    # 1 + 2 * 3 = 7 = 2 (mod 5); + is 5, - is 6, * is 7
    ('modular_arithmetic', 5, [[1, 2, 3]], [[5, 7]], [1, 5, 2, 7, 3], [2]),
    # an even length loses a token: 4 - 3 * 2 - 1 = -3 = 2 (mod 5)
    ('modular_arithmetic', 8, [[4, 3, 2, 1]], [[6, 7, 6]], [4, 6, 3, 7, 2, 6, 1], [2]),
    # stack 0 1 1 0, PUSH 1, POP, POP -> 0 1 1, read top to bottom, termination, 0s to n + 1
    ('stack_manipulation', 7, 4, [0, 1, 1, 0], [4, 2, 2], [0, 1, 1, 0, 4, 2, 2],
     [1, 1, 0, 2, 0, 0, 0, 0]),
    # stack 1 1 0 popped empty (the authors' second example)
    ('stack_manipulation', 6, 3, [1, 1, 0], [2, 2, 2], [1, 1, 0, 2, 2, 2],
     [2, 0, 0, 0, 0, 0, 0]),
    ('stack_manipulation', 4, 1, [1], [2, 2, 3], [1, 2, 2, 3], [0, 2, 0, 0, 0]),
    ('reverse_string', 6, [[0, 1, 1, 0, 1, 0]], [0, 1, 1, 0, 1, 0], [0, 1, 0, 1, 1, 0]),
    # (3 * 4) = 12 = 2; tokens ( 8, * 7, ) 9; the draws: left length, left digit, right digit, op
    ('modular_arithmetic_brackets', 5, 1, 3, 4, 2, [8, 3, 7, 4, 9], [2]),
    # ((-2) - 4): left length 4 -> (-2), right length 1 -> 4, op '-': -6 = 4; - is 6
    ('modular_arithmetic_brackets', 8, 4, 2, 4, 1, [8, 8, 6, 2, 9, 6, 4, 9], [4]),
    # (1 + 3) = 4 with x at the first digit: (x+3)=4, x = 1; + 5, ( 7, ) 8, x 9, = 10
    ('solve_equation', 7, 1, 1, 3, 0, 0, [7, 9, 5, 3, 8, 10, 4], [1]),
    # the position drawn is ')' (index 4): the next digit, cyclically, is the first one
    ('solve_equation', 7, 1, 2, 4, 1, 4, [7, 9, 6, 4, 8, 10, 3], [2]),
    ('duplicate_string', 3, [[1, 0, 1]], [1, 0, 1], [1, 0, 1, 1, 0, 1]),
    # 0110 0110 with index 6 replaced: the missing token is 1 (the authors' example)
    ('missing_duplicate_string', 8, [[0, 1, 1, 0]], [6], [0, 1, 1, 0, 0, 1, 2, 0], [1]),
    # odd length: 101 101 then the padding token 3, index 4 replaced
    ('missing_duplicate_string', 7, [[1, 0, 1]], [4], [1, 0, 1, 1, 2, 1, 3], [0]),
    ('missing_duplicate_string', 1, [1], [1]),
    # the authors' code: odd indices first (0-based), then even ones
    ('odds_first', 8, [[0, 0, 1, 1, 0, 1, 0, 1]], [0, 0, 1, 1, 0, 1, 0, 1],
     [0, 1, 1, 1, 0, 1, 0, 0]),
    ('odds_first', 3, [[1, 1, 0]], [1, 1, 0], [1, 1, 0]),
    # 4 + 22 = 26, little-endian: 001 2 01101 -> 01011 2 0000 (the authors' example)
    ('binary_addition', 9, 3, [0, 0, 1], [0, 1, 1, 0, 1], [0, 0, 1, 2, 0, 1, 1, 0, 1],
     [0, 1, 0, 1, 1, 2, 0, 0, 0, 0]),
    # 9 + 32 = 41 (the authors' second example)
    ('binary_addition', 11, 4, [1, 0, 0, 1], [0, 0, 0, 0, 0, 1],
     [1, 0, 0, 1, 2, 0, 0, 0, 0, 0, 1], [1, 0, 0, 1, 0, 1, 2, 0, 0, 0, 0, 0]),
    # up to 2 tokens one number, no separator: 2 = 01 -> 01 2
    ('binary_addition', 2, 2, [0, 1], [0, 1, 2]),
    # 4 * 22 = 88 = 0001101 (the authors' example, with its last 0 one place off)
    ('binary_multiplication', 9, 3, [0, 0, 1], [0, 1, 1, 0, 1], [0, 0, 1, 2, 0, 1, 1, 0, 1],
     [0, 0, 0, 1, 1, 0, 1, 2, 0]),
    ('binary_multiplication', 2, 1, [1, 0], [0, 2]),
    # 37 = 100101 -> floor(sqrt) 6 = 110 (big-endian; the authors' docstring writes 101)
    ('compute_sqrt', 6, [1, 0, 1, 0, 0, 1], [1, 0, 0, 1, 0, 1], [1, 1, 0]),
    ('compute_sqrt', 3, [1, 1, 1], [1, 1, 1], [1, 0]),  # 7 -> 2
    ('bucket_sort', 8, [[1, 0, 2, 0, 4, 1, 1, 2]], [1, 0, 2, 0, 4, 1, 1, 2],
     [0, 0, 1, 1, 1, 2, 2, 4]),
]


@pytest.mark.parametrize('case', HAND, ids=[f'{c[0]}-{c[1]}' for c in HAND])
def test_hand_computed_examples(case):
  name, n, *draws, inputs, outputs = case
  assert _sample(name, n, *draws) == (inputs, outputs)


def test_every_task_has_hand_examples_and_the_papers_sizes():
  assert {c[0] for c in HAND} == set(tuple(chomsky.TASKS)) == set(chomsky.TASKS)
  sizes = {name: (t.level, t.input_size, t.output_size, t.output_length(10), t.terminated)
           for name, t in chomsky.TASKS.items()}
  assert sizes == {
      'even_pairs': ('regular', 2, 2, 1, False), 'modular_arithmetic': ('regular', 9, 5, 1, False),
      'parity_check': ('regular', 2, 2, 1, False), 'cycle_navigation': ('regular', 3, 5, 1, False),
      'stack_manipulation': ('dcf', 5, 3, 11, True), 'reverse_string': ('dcf', 2, 2, 10, False),
      'modular_arithmetic_brackets': ('dcf', 11, 5, 1, False),
      'solve_equation': ('dcf', 11, 5, 1, False), 'duplicate_string': ('cs', 2, 2, 20, False),
      'missing_duplicate_string': ('cs', 4, 2, 1, False), 'odds_first': ('cs', 2, 2, 10, False),
      'binary_addition': ('cs', 3, 3, 11, True), 'binary_multiplication': ('cs', 3, 3, 10, True),
      'compute_sqrt': ('cs', 2, 2, 5, False), 'bucket_sort': ('cs', 5, 5, 10, False)}


def _little(bits):
  return sum(b * 2**i for i, b in enumerate(bits))


def _terminated(digits, m):
  return digits + [2] + [0] * (m - len(digits) - 1)


def _expression_value(tokens, ops):
  """A bracketed expression's value mod 5 by a plain recursive-descent parse."""
  text = ''.join(str(t) if t < 5 else ops[t] for t in tokens)

  def parse(i):  # -> value, next index; a term is a digit, -term, or (expr op expr)
    if text[i].isdigit():
      return int(text[i]), i + 1
    if text[i] == '-':
      value, i = parse(i + 1)
      return -value, i
    left, i = parse(i + 1)
    if text[i] == ')':  # (d) or (-d)
      return left, i + 1
    op = text[i]
    right, i = parse(i + 1)
    return {'+': left + right, '-': left - right, '*': left * right}[op], i + 1

  value, end = parse(0)
  assert end == len(text)
  return value % 5


def _solve(name, x):
  """Each task's output from its input, written from the definitions in plain loops."""
  n = len(x)
  if name == 'even_pairs':
    return [sum(x[i] != x[i + 1] for i in range(n - 1)) % 2]
  if name == 'parity_check':
    return [sum(x) % 2]
  if name == 'cycle_navigation':
    return [sum(m - 1 for m in x) % 5]
  if name == 'modular_arithmetic':
    text = ''.join(str(t) if t < 5 else '+-*'[t - 5] for t in x)
    return [eval(text) % 5]  # Python's precedence is the task's  # pylint: disable=eval-used
  if name == 'stack_manipulation':
    split = next((i for i, t in enumerate(x) if t >= 2), n)
    stack = list(x[:split])
    for action in x[split:]:
      if action == 2:
        stack = stack[:-1]
      else:
        stack.append(action - 3)
    return _terminated(stack[::-1], n + 1)
  if name == 'reverse_string':
    return x[::-1]
  if name == 'modular_arithmetic_brackets':
    return [_expression_value(x, {5: '+', 6: '-', 7: '*', 8: '(', 9: ')'})]
  if name == 'solve_equation':
    if n < 3:
      return [0]
    ops = {5: '+', 6: '-', 7: '(', 8: ')'}
    value = x[-1]
    return [next(d for d in range(5) if _expression_value(
        [d if t == 9 else t for t in x[:-2]], ops) == value)]
  if name == 'duplicate_string':
    return x + x
  if name == 'missing_duplicate_string':
    if n == 1:
      return [1]
    half, at = n // 2, x.index(2)
    return [x[at + half] if at < half else x[at - half]]
  if name == 'odds_first':
    return [x[i] for i in range(1, n, 2)] + [x[i] for i in range(0, n, 2)]
  if name in ('binary_addition', 'binary_multiplication'):
    add = name == 'binary_addition'
    if n <= 2:
      return _terminated([int(c) for c in reversed(f'{_little(x):b}')] if add else [0] * (n - 1),
                         n + add)
    at = x.index(2)
    a, b = _little(x[:at]), _little(x[at + 1:])
    return _terminated([int(c) for c in reversed(f'{a + b if add else a * b:b}')], n + add)
  if name == 'compute_sqrt':
    root = math.isqrt(int(''.join(map(str, x)), 2))
    return [int(c) for c in f'{root:b}'.zfill(math.ceil(n / 2))]
  assert name == 'bucket_sort'
  return sorted(x)


@pytest.mark.parametrize('name', tuple(chomsky.TASKS))
def test_samplers_agree_with_plain_solutions(name):
  task, rng = chomsky.TASKS[name], np.random.default_rng(0)
  for n in (1, 2, 3, 4, 5, 8, 13, 40, 61):
    inputs, outputs = task.sample(rng, 6, n)
    assert inputs.shape == (6, chomsky.input_length(task, n))
    assert outputs.shape == (6, task.output_length(inputs.shape[1]))
    assert inputs.min() >= 0 and inputs.max() < task.input_size
    assert outputs.min() >= 0 and outputs.max() < task.output_size
    for x, y in zip(inputs.tolist(), outputs.tolist()):
      assert y == _solve(name, x), (n, x)


def test_queries_batch_puts_one_query_token_per_output_after_the_input():
  task = chomsky.TASKS['binary_addition']  # 1 + 1 = 2: input 1 2 1, output 01 2 0
  batch = chomsky.make_batch(task, [(np.array([1, 2, 1]), np.array([0, 1, 2, 0])),
                                    (np.array([1]), np.array([1, 2]))], 8, 5)
  query = task.input_size
  np.testing.assert_array_equal(batch.inputs, [[1, 2, 1, query, query, query, query, 0],
                                               [1, query, query, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(batch.positions, [[0, 1, 2, 3, 4, 5, 6, 0], [0, 1, 2] + [0] * 5])
  np.testing.assert_array_equal(batch.mask, [[1] * 7 + [0], [1] * 3 + [0] * 5])
  np.testing.assert_array_equal(batch.target_positions, [[3, 4, 5, 6, 0], [1, 2, 0, 0, 0]])
  np.testing.assert_array_equal(batch.targets, [[0, 1, 2, 0, 0], [1, 2, 0, 0, 0]])
  np.testing.assert_array_equal(batch.target_weights, [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
  # the accuracy stops at the termination token; the loss counts the 0 after it too
  np.testing.assert_array_equal(batch.scored, [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])


class _Table:
  """A stand-in model whose logits at every position are a fixed table [B, L, C], read at the
  query positions as the classifier reads its hidden states."""

  def __init__(self, logits_BxLxC):
    self.logits_BxLxC = jnp.asarray(logits_BxLxC)

  def __call__(self, inputs, positions, mask, *, rngs, segments_BxL, target_positions_BxM):
    assert segments_BxL is None
    return jnp.take_along_axis(self.logits_BxLxC, target_positions_BxM[..., None], axis=1)


def _scores(batch, logits_BxLxC):
  kind = tasks.KINDS['queries']
  logits, label, weight, scored = kind.forward(_Table(logits_BxLxC), batch)
  loss, sums = kind.loss(logits, label, weight, scored_B=scored)
  return float(loss), float(sums['correct_sum'] / sums['scored'])


def test_loss_and_accuracy_count_output_positions_only():
  task = chomsky.TASKS['stack_manipulation']
  rows = [(np.array([1, 0, 3]), np.array([0, 0, 1, 2])),  # stack 1 0, PUSH 0 -> 0 0 1
          (np.array([1, 2, 2]), np.array([2, 0, 0, 0]))]  # popped empty
  batch = chomsky.make_batch(task, rows, 8, 4)
  logits_BxLxC = np.random.default_rng(0).normal(size=(2, 8, 3))
  loss, accuracy = _scores(batch, logits_BxLxC)
  # independently: cross-entropy over the 8 outputs; accuracy over the 4 + 1 scored ones
  expected_loss, right = [], []
  for b, (x, y) in enumerate(rows):
    for k, target in enumerate(y):
      row = logits_BxLxC[b, len(x) + k]
      expected_loss.append(np.log(np.exp(row).sum()) - row[target])
      if k <= list(y).index(2):
        right.append(np.argmax(row) == target)
  assert loss == pytest.approx(np.mean(expected_loss), rel=1e-5)
  assert accuracy == pytest.approx(np.mean(right))
  inputs_changed = logits_BxLxC.copy()
  inputs_changed[:, :3] = 100 * np.random.default_rng(1).normal(size=(2, 3, 3))
  inputs_changed[1, 7] = -50.0  # padding
  assert _scores(batch, inputs_changed) == (loss, accuracy)
  after_termination = logits_BxLxC.copy()
  after_termination[1, 4:7] += [0.0, 9.0, 0.0]  # row 1's outputs 1..3 come after its 2
  changed_loss, same_accuracy = _scores(batch, after_termination)
  assert changed_loss != loss and same_accuracy == accuracy
  query_changed = logits_BxLxC.copy()
  query_changed[0, 3] = [0.0, 0.0, 9.0]  # row 0's first output: wrong now
  assert _scores(batch, query_changed)[0] != loss


def test_classifier_reads_its_head_at_the_query_tokens(run_config):
  config = typed(run_config(**{'data.name': 'chomsky/reverse_string'}))
  cfg = config.model_config(vocab_size=3, num_classes=2).replace(deterministic=True)
  graphdef, params = jax.jit(models.init, static_argnums=0)(cfg, jax.random.key(0, impl='rbg'))
  batch = chomsky.make_batch(chomsky.TASKS['reverse_string'],
                             [(np.array([0, 1, 1]), np.array([1, 1, 0]))], 8, 4)

  @jax.jit
  def both(params):
    model = nnx.merge(graphdef, params)
    hidden_BxLxE = model.encode(batch.inputs, batch.positions, batch.mask)
    return (model(batch.inputs, batch.positions, batch.mask,
                  target_positions_BxM=batch.target_positions),
            model.head(hidden_BxLxE[:, np.asarray(batch.target_positions[0])], rngs=None))

  logits_BxMxC, expected = both(params)
  assert logits_BxMxC.shape == (1, 4, 2)
  np.testing.assert_allclose(logits_BxMxC, expected, rtol=1e-5, atol=1e-6)


def _dataset(name='chomsky/parity_check', **fields):
  return tasks.KINDS['queries'].load(DataConfig(name=name, **fields), None, 'joint')


def test_training_lengths_are_uniform_in_1_to_40_one_per_batch():
  dataset = _dataset(prefetch=1)
  lengths = []
  for batch in itertools.islice(dataset.train_batches(seed=0, global_batch_size=2), 2000):
    n_B = batch.target_positions[:, 0]  # the query follows the n input tokens
    assert len(set(n_B.tolist())) == 1
    lengths.append(int(n_B[0]))
  counts = np.bincount(lengths, minlength=41)[1:]
  assert counts.min() > 0 and len(counts) == 40
  chi2 = ((counts - 50) ** 2 / 50).sum()
  assert chi2 < 72  # 39 degrees of freedom: p = 0.001


def _equal(a, b):
  return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_batches_depend_only_on_seed_and_step():
  dataset = _dataset('chomsky/binary_addition', prefetch=1)
  run = lambda **kw: dataset.train_batches(global_batch_size=4, **kw)
  fresh = list(itertools.islice(run(seed=0), 6))
  assert _equal(next(run(seed=0, start_step=5)), fresh[5])  # a resume draws the same batch
  assert not _equal(next(run(seed=1, start_step=5)), fresh[5])
  halves = [next(run(seed=0, start_step=5, process_index=p, process_count=2)) for p in (0, 1)]
  assert _equal(jax.tree.map(lambda *h: np.concatenate(h), *halves), fresh[5])
  again = _dataset('chomsky/binary_addition', prefetch=1)
  assert _equal(next(again.train_batches(seed=0, global_batch_size=4, start_step=3)), fresh[3])


def test_evaluation_examples_do_not_depend_on_the_batch_size():
  dataset = _dataset('chomsky/duplicate_string', chomsky_test_lengths=(50,),
                     chomsky_samples_per_length=8, chomsky_eval_batch_size=4, prefetch=1)
  by_4 = list(dataset.eval_batches('test_50', global_batch_size=4))
  by_8 = list(dataset.eval_batches('test_50', global_batch_size=8))
  assert len(by_4) == 2 and len(by_8) == 1
  assert _equal(jax.tree.map(lambda *h: np.concatenate(h), *by_4), by_8[0])
  assert by_8[0].inputs.shape == (8, chomsky.bucket(150)) and by_8[0].targets.shape == (8, 128)
  assert dataset.info.eval_splits == {'validation': 40, 'test': 40, 'test_50': 50}


@pytest.mark.parametrize('fields,phrase', [
    ({'chomsky_samples_per_length': 100}, 'not a multiple of data.chomsky_eval_batch_size'),
    ({'chomsky_test_lengths': (41, 0)}, 'chomsky_test_lengths has lengths [0]'),
    ({'chomsky_train_length': 0}, 'must be positive'),
])
def test_bad_suite_settings_are_refused(fields, phrase):
  with pytest.raises(ValueError, match=phrase.replace('[', r'\[').replace(']', r'\]')):
    DataConfig(name='chomsky/parity_check', **fields)


def test_test_lengths_default_to_the_papers():
  assert DataConfig(name='chomsky/parity_check').chomsky_tests == tuple(range(41, 501))
  with pytest.raises(ValueError, match='generated task'):
    datasets.load_language_model(DataConfig(name='chomsky/parity_check'), None, 'mlm', True)


# Train at lengths 1..3 (one padded shape) and test at 4 and 5: a few compilations only.
_SMALL = {'data.chomsky_train_length': 3, 'data.chomsky_test_lengths': '4,5',
          'data.chomsky_samples_per_length': 8, 'data.chomsky_eval_batch_size': 4,
          'data.chomsky_validation_size': 12, 'train.num_steps': 4, 'train.eval_every': 4,
          'train.checkpoint_every': 4, 'train.log_every': 2, 'model.size': 'tiny'}


@pytest.mark.parametrize('name,seeds,random', [('chomsky/reverse_string', 1, 64),
                                               ('chomsky/parity_check', 2, 0)])
def test_a_task_trains_and_is_scored_at_every_test_length(tmp_path, run_config, name, seeds,
                                                          random):
  workdir = str(tmp_path / 'run')
  config = run_config(**_SMALL, **{'data.name': name, 'train.num_seeds': seeds,
                                   'data.random_positions': random})
  summary = trainer.train_and_evaluate(config, workdir)
  assert summary['dataset'] == name and list(summary['eval']) == ['test']
  with open(os.path.join(workdir, 'chomsky_lengths.json')) as f:
    lengths = json.load(f)
  assert lengths['lengths'] == [4, 5] and lengths['samples_per_length'] == 8
  accuracy_NxK = np.asarray(lengths['accuracy'])
  assert accuracy_NxK.shape == (seeds, 2) and ((0 <= accuracy_NxK) & (accuracy_NxK <= 1)).all()
  assert summary['chomsky']['score'] == pytest.approx(accuracy_NxK.mean(axis=1))
  assert summary['chomsky']['best'] == pytest.approx(accuracy_NxK.mean(axis=1).max())
  with open(os.path.join(workdir, 'chomsky_lengths.csv')) as f:
    assert f.read().splitlines()[0] == 'length,' + ','.join(f'seed_{s}' for s in range(seeds))
  assert os.path.getsize(os.path.join(workdir, 'chomsky_lengths.png')) > 0


def test_random_positions_apply_to_the_queries_and_cover_the_test_lengths(run_config, tmp_path):
  batch = chomsky.make_batch(chomsky.TASKS['duplicate_string'],
                             [(np.array([1, 0, 1]), np.array([1, 0, 1, 1, 0, 1])),
                              (np.array([1]), np.array([1, 1]))], 12, 8)
  drawn = batches.randomized_positions(batch, 64, [(0, 1), (0, 2)])
  for row, real in enumerate((9, 3)):
    positions = drawn.positions[row]
    assert (np.diff(positions[:real]) > 0).all() and positions[:real].max() < 64
    assert (positions[real:] == 0).all()
  # reverse_string at test length 40 has 80 tokens with its queries: more than N = 64
  config = run_config(**{**_SMALL, 'data.name': 'chomsky/reverse_string',
                         'data.chomsky_test_lengths': '5,40', 'data.random_positions': 64})
  with pytest.raises(ValueError, match='up to 80 tokens'):
    trainer.train_and_evaluate(config, str(tmp_path / 'refused'))


def test_eval_may_override_the_test_lengths():
  assert evaluation.parse_overrides(['data.chomsky_test_lengths=12, 30',
                                     'data.chomsky_samples_per_length=16']) == {
                                         'data.chomsky_test_lengths': (12, 30),
                                         'data.chomsky_samples_per_length': 16}
  with pytest.raises(ValueError, match='comma-separated int'):
    evaluation.parse_overrides(['data.chomsky_test_lengths=12,x'])
