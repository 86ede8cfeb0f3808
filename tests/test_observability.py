"""What a run records besides its metrics: a profiler trace of a step window, the
hyper-parameters in TensorBoard, and an optional Weights & Biases run (offline here)."""

import glob
import os

import pytest
import tensorflow as tf

import settings
from training import trainer
from training.config import run_config as typed


def _tags(event_dir):
  """(tag, plugin name) of every summary in a TensorBoard event folder."""
  out = set()
  for path in glob.glob(os.path.join(event_dir, 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        out.add((value.tag, value.metadata.plugin_data.plugin_name))
  return out


def test_profile_hparams_and_offline_wandb(run_config, tmp_path, monkeypatch):
  wandb = pytest.importorskip('wandb')
  monkeypatch.setenv('WANDB_MODE', 'offline')
  monkeypatch.setenv('WANDB_SILENT', 'true')
  config = run_config(**{'data.name': 'position_probes/order', 'train.num_steps': 6,
                         'train.eval_every': 3, 'train.checkpoint_every': 6,
                         'train.log_every': 2, 'train.profile_steps': '2:3',
                         'train.wandb_project': 'roformer-tests'})
  workdir = str(tmp_path / 'run')
  trainer.train_and_evaluate(config, workdir)
  traces = glob.glob(os.path.join(workdir, 'profile', 'plugins', 'profile', '*', '*.xplane.pb'))
  assert len(traces) == 1
  tags = _tags(os.path.join(workdir, 'tb', 'seed_0'))
  assert any(plugin == 'hparams' for _, plugin in tags), tags
  assert ('train/loss', 'scalars') in tags
  runs = glob.glob(os.path.join(workdir, 'wandb', 'offline-run-*', '*.wandb'))
  assert len(runs) == 1, os.listdir(workdir)
  assert wandb.run is None  # finished


def test_hparams_are_flat_scalars(run_config):
  flat = trainer.hparams(settings.to_dict(typed(run_config())))
  assert flat['model.position'] == 'rotary' and flat['train.num_steps'] > 0
  assert all(isinstance(v, (bool, int, float, str)) for v in flat.values())


@pytest.mark.parametrize('spec', ['3', 'a:b', '5:2', '0:1'])
def test_bad_profile_window_is_refused(run_config, spec):
  with pytest.raises(ValueError, match='train.profile_steps'):
    typed(run_config(**{'train.profile_steps': spec}))
