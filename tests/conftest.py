"""Shared fixtures: one TFDS data_dir per test process, so embedded datasets are generated once."""

import pytest


@pytest.fixture(scope='session')
def tfds_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('tfds'))
