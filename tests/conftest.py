"""Shared fixtures: one TFDS data_dir per test process (embedded datasets are generated once),
the tiny run config the training tests start from and one tiny trained workdir; one persistent
compilation cache for the session."""

import os
import shutil
import tempfile

import jax
import pytest

from configs import tiny

_CACHE = 'JAX_COMPILATION_CACHE_DIR'


def pytest_configure(config):
  """Hundreds of tests compile the same tiny steps, in this process, in the xdist workers and in
  the train.py processes they start: JAX's persistent compilation cache shares the programs (as
  train.compilation_cache_dir does for real runs). The controller makes the directory, and its
  environment reaches every worker and subprocess; a cached program is the one XLA compiled, so
  bitwise tests are unaffected."""
  del config
  if _CACHE not in os.environ:
    os.environ[_CACHE] = tempfile.mkdtemp(prefix='roformer-tests-xla-')
    os.environ['ROFORMER_TESTS_OWN_CACHE'] = '1'
  os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
  jax.config.update('jax_compilation_cache_dir', os.environ[_CACHE])
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)


def pytest_unconfigure(config):
  del config
  if os.environ.get('ROFORMER_TESTS_OWN_CACHE') and 'PYTEST_XDIST_WORKER' not in os.environ:
    shutil.rmtree(os.environ[_CACHE], ignore_errors=True)


@pytest.fixture(scope='session')
def tfds_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('tfds'))


@pytest.fixture(scope='session')
def csv_file(tmp_path_factory):
  """A small CSV dataset (300 rows, 3 classes): cheap to read and to evaluate."""
  path = tmp_path_factory.mktemp('data') / 'train.csv'
  path.write_text('text,label\n' + ''.join(f'example {i} {"ab" * (i % 7)},{i % 3}\n'
                                             for i in range(300)))
  return str(path)


@pytest.fixture(scope='session')
def trained_workdir(tmp_path_factory):
  """(workdir, its CSV): a tiny run of 2 steps on a small CSV (two classes), one checkpoint
  (step 2). Tests copy it before they change it."""
  from training import trainer  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('trained')
  data_file = str(root / 'train.csv')
  with open(data_file, 'w') as f:
    f.write('text,label\n' + ''.join(f'example number {i},{i % 2}\n' for i in range(100)))
  config = tiny.get_config()
  config.data.name, config.data.train_files = 'files', data_file
  config.train.num_steps = config.train.eval_every = config.train.checkpoint_every = 2
  config.train.log_every = 1
  trainer.train_and_evaluate(config, str(root / 'run'))
  return str(root / 'run'), data_file


@pytest.fixture(scope='session')
def run_config(tfds_dir):
  """``run_config(**{'group.field': value})``: configs/tiny.py on this process's TFDS data_dir,
  with dotted overrides."""

  def make(**overrides):
    config = tiny.get_config()
    config.data.data_dir = tfds_dir
    config.update_from_flattened_dict(overrides)
    return config

  return make
