"""Per-host input (data.num_shards): a process reads only the shards its rows draw from, the
global batches do not depend on the number of processes, and a resumed iterator continues
exactly."""

import jax
import numpy as np
import pytest

from data import datasets, sources
from training import tasks
from training.config import run_config as typed


def _load(run_config, csv_file, tmp_path, num_shards, **overrides):
  config = run_config(**{'data.name': 'files', 'data.train_files': csv_file,
                         'data.num_shards': num_shards, **overrides})
  dataset = tasks.of(typed(config)).load(typed(config).data, str(tmp_path), 'joint')
  reads = []
  real = dataset.source.read

  def read(split, shard_index=0, shard_count=1):
    reads.append((split, shard_index, shard_count))
    return real(split, shard_index, shard_count)

  object.__setattr__(dataset.source, 'read', read)
  return dataset, reads


def _take(iterator, n):
  return [next(iterator) for _ in range(n)]


def _joined(parts):
  """The global batches from each process's batches (rows in process order)."""
  return [jax.tree.map(lambda *rows: np.concatenate(rows), *batches) for batches in zip(*parts)]


@pytest.mark.parametrize('task', ['classify', 'mlm'])
def test_two_processes_read_their_shards_and_form_the_global_batches(run_config, csv_file,
                                                                     tmp_path, task):
  extra = {} if task == 'classify' else {'train.task': 'mlm', 'data.max_length': 16}
  dataset, _ = _load(run_config, csv_file, tmp_path, 4, **extra)
  single = _take(dataset.train_batches(seed=1, global_batch_size=8, process_index=0,
                                       process_count=1), 12)
  pair = []
  for p in range(2):  # each process with its own dataset object (and caches)
    own, reads = _load(run_config, csv_file, tmp_path, 4, **extra)
    pair.append(_take(own.train_batches(seed=1, global_batch_size=8, process_index=p,
                                        process_count=2), 12))
    # Process p of 2 reads shards 2p and 2p + 1 of 4 of the training split: its half.
    assert sorted({r for r in reads if r[0] == 'train'}) == [('train', 2 * p, 4),
                                                             ('train', 2 * p + 1, 4)]
  for batch, joined in zip(single, _joined(pair)):
    jax.tree.map(np.testing.assert_array_equal, batch, joined)
  # Resume: from step 7 exactly what the fresh iterator gave at step 7.
  resumed = _take(own.train_batches(seed=1, global_batch_size=8, start_step=7,
                                        process_index=1, process_count=2), 5)
  for a, b in zip(resumed, pair[1][7:]):
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_each_shard_fills_its_rows_with_its_own_examples(run_config, csv_file, tmp_path):
  dataset, _ = _load(run_config, csv_file, tmp_path, 2)
  texts = {j: set(dataset.source.read('train', j, 2)[0]) for j in range(2)}
  batches = _take(dataset.train_batches(seed=0, global_batch_size=4, process_index=0,
                                        process_count=1), 80)
  decode = lambda batch, row: dataset.tokenizer.decode(batch.inputs[row][batch.mask[row]])
  for batch in batches:
    for row in range(4):
      assert decode(batch, row) in texts[row // 2]
  # Over one epoch of shard 0 (two rows a step) every example of shard 0 appears once.
  steps = len(texts[0]) // 2
  seen = [decode(b, r) for b in batches[:steps] for r in range(2)]
  assert len(set(seen)) == len(seen)


def test_shards_must_divide_the_batch(run_config, csv_file, tmp_path):
  dataset, _ = _load(run_config, csv_file, tmp_path, 3)
  with pytest.raises(ValueError, match='data.num_shards=3 must be >= 1 and divide'):
    dataset.train_batches(seed=0, global_batch_size=8)
  from training import validation  # pylint: disable=g-import-not-at-top
  for bad in (0, 3):  # the tiny config's batch is 16
    with pytest.raises(ValueError, match=f'data.num_shards={bad} must be'):
      validation.check_devices(run_config(**{'data.num_shards': bad}))


def test_needed_shards():
  shards = sources.TrainShards(4, 8, (2, 4))  # rows 2..5 of 8, 2 rows a shard
  assert list(shards.needed) == [1, 2]
  assert shards.locate(3, 5) == (2, 7)
  assert list(sources.TrainShards(1, 8, (4, 4)).needed) == [0]
