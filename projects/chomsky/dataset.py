"""The Chomsky tasks as a dataset: ``data.name=chomsky/<task>``, generated afresh for every
batch, with ``Dataset``'s methods."""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator

import numpy as np

import data
from data import batches
from data import datasets
from data import sources
from data.config import DataConfig
from projects.chomsky import tasks


@dataclasses.dataclass(frozen=True)
class ChomskyDataset:
  """A Chomsky-hierarchy task (``projects/chomsky/tasks.py``), generated: the same methods as ``Dataset``.

  Training batch s draws its input length uniformly in 1 .. ``data.chomsky_train_length`` and
  its examples from ``default_rng([seed, 0, s])``, so it depends on (seed, s) alone. Evaluation
  example j of ``validation`` (``test``) has length 1 + j mod N from ``default_rng([seed, 1 (2),
  j])``, of ``test_<n>`` length n from ``default_rng([seed, 3, n, j])``: the same examples at
  any batch size and on any number of processes. A batch is padded to its lengths' shape
  (``tasks.shape``), whatever ``max_length`` asks. The lengths in ``info`` count input tokens,
  without the query tokens (``tokens``).
  """

  info: datasets.DatasetInfo
  task: tasks.Task
  seed: int
  prefetch: int
  samples_per_length: int
  validation_size: int

  @classmethod
  def load(cls, config: DataConfig, workdir: str | None = None,
           pair_layout: str = 'joint') -> ChomskyDataset:
    """The query-token task kind's loader (generated: nothing is read or written)."""
    del workdir, pair_layout
    task = tasks.TASKS[data.DATASETS[config.name].builder]
    length = config.chomsky_train_length
    info = datasets.DatasetInfo(
        name=config.name, num_classes=task.output_size,
        class_names=tuple(map(str, range(task.output_size))), vocab_size=task.input_size + 1,
        train_length=length, num_train_examples=0,  # drawn afresh at every step
        eval_splits={'validation': length, 'test': length,
                     **{f'test_{n}': n for n in config.chomsky_tests}})
    return cls(info, task, config.seed, config.prefetch, config.chomsky_samples_per_length,
               config.chomsky_validation_size)

  def num_examples(self, split: str, length: int | None = None) -> int:
    del length
    return self.samples_per_length if split.startswith('test_') else self.validation_size

  def _lengths(self, split: str) -> list[int]:
    if split not in self.info.eval_splits:
      raise ValueError(f'{self.info.name} has no split {split!r}; valid: validation, test, '
                       'test_<n> for each of data.chomsky_test_lengths.')
    return ([self.info.eval_splits[split]] if split.startswith('test_')
            else list(range(1, self.info.train_length + 1)))

  def example(self, split: str, j: int) -> tuple[np.ndarray, np.ndarray]:
    """(input, output) of example j of an evaluation split."""
    if split.startswith('test_'):
      n, key = self.info.eval_splits[split], [self.seed, 3, self.info.eval_splits[split], j]
    else:
      n, key = 1 + j % self.info.train_length, [self.seed, 1 if split == 'validation' else 2, j]
    inputs, outputs = self.task.sample(np.random.default_rng(key), 1, n)
    return inputs[0], outputs[0]

  def train_batches(self, *, seed: int, global_batch_size: int, start_step: int = 0,
                    process_index: int | None = None,
                    process_count: int | None = None) -> Iterator[tasks.Queries]:
    """This process's rows of every global training batch from ``start_step`` on."""
    index, _, size = datasets.local_share(process_index, process_count, global_batch_size)
    rows = slice(index * size, (index + 1) * size)

    def at(step: int) -> tasks.Queries:
      rng = np.random.default_rng([seed, 0, step])
      n = int(rng.integers(1, self.info.train_length + 1))
      inputs, outputs = self.task.sample(rng, global_batch_size, n)
      return tasks.make_batch(self.task, list(zip(inputs[rows], outputs[rows])),
                                *tasks.shape(self.task, [n]))

    return batches.by_step(at, start_step=start_step, prefetch=self.prefetch)

  def eval_batches(self, split: str, *, global_batch_size: int, max_length: int | None = None,
                   process_index: int | None = None,
                   process_count: int | None = None) -> Iterator[tasks.Queries]:
    """The split's examples once, as ``Dataset.eval_batches`` shares them out (process p of k
    evaluates the p-th of k contiguous parts), then weight-0 padding examples."""
    del max_length
    index, count, size = datasets.local_share(process_index, process_count, global_batch_size)
    lengths, num = self._lengths(split), self.num_examples(split)
    start, stop = sources.shard_bounds(num, index, count)

    def make(examples: np.ndarray, slots: np.ndarray) -> tasks.Queries:
      del slots
      batch = tasks.make_batch(self.task, [self.example(split, int(j)) for j in start + examples],
                                 *tasks.shape(self.task, lengths))
      real_Bx1 = (start + examples < stop)[:, None].astype(np.float32)
      return batch.replace(target_weights=batch.target_weights * real_Bx1,
                           scored=batch.scored * real_Bx1)

    return batches.evaluate(make, batch_size=size, prefetch=self.prefetch,
                            num_batches=math.ceil(math.ceil(num / count) / size))

  def tokens(self, length: int) -> int:
    """Tokens of an example of ``length`` input tokens: the input and its query tokens."""
    n = tasks.input_length(self.task, length)
    return n + self.task.output_length(n)
