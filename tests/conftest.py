"""Shared fixtures: one TFDS data_dir per test process (embedded datasets are generated once),
and the tiny run config the training tests start from."""

import pytest

from configs import tiny


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
def run_config(tfds_dir):
  """``run_config(**{'group.field': value})``: configs/tiny.py on this process's TFDS data_dir,
  with dotted overrides."""

  def make(**overrides):
    config = tiny.get_config()
    config.data.data_dir = tfds_dir
    config.update_from_flattened_dict(overrides)
    return config

  return make
