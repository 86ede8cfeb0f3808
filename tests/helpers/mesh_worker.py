"""Run with 8 simulated CPU devices: trains the tiny model a few steps on several meshes.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/helpers/mesh_worker.py \
      --data_dir=DIR --out=results.json

Writes, per mesh (data, fsdp, tensor) and for one device: the per-step loss and gradient norm,
and the sharding spec and shard shape of a few parameters (tests/test_distributed.py checks them).
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # pylint: disable=g-import-not-at-top
import numpy as np

from configs import tiny
from training import validation
from training.config import run_config
from training.experiment import Experiment

MESHES = ((1, 1, 1), (8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 1, 8))
PARAMS = ('layers/0/attention/query/kernel', 'layers/0/intermediate/kernel',
          'embeddings/word_embeddings/embedding', 'opt:mu/layers/0/intermediate/kernel')


def config_for(data_dir, mesh):
  c = tiny.get_config()
  c.data.data_dir = data_dir
  c.model.num_heads = 8  # so that tensor=8 splits the heads
  c.model.num_layers = 1  # compiles faster; layers add nothing to the sharding
  c.train.batch_size = 16
  c.train.num_seeds = 2
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = mesh
  return run_config(c)


def find(tree, path, within=''):
  """The leaf of ``tree`` whose key path ends with ``path`` ('a/b/0/c') and contains ``within``."""
  want = ''.join(f"[{k}]" if k.isdigit() else f"['{k}']" for k in path.split('/'))
  matches = [v for p, v in jax.tree_util.tree_leaves_with_path(tree)
             if jax.tree_util.keystr(p).endswith(want) and within in jax.tree_util.keystr(p)]
  assert len(matches) == 1, (path, len(matches))
  return matches[0]


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--data_dir', required=True)
  parser.add_argument('--out', required=True)
  parser.add_argument('--steps', type=int, default=3)
  args = parser.parse_args()
  assert jax.device_count() == 8, jax.devices()
  results = {}
  workdir = tempfile.mkdtemp()
  batches = None
  for mesh in MESHES:
    devices = jax.devices()[:1] if mesh == (1, 1, 1) else None
    config = config_for(args.data_dir, mesh)
    exp = Experiment(config, workdir, validation.validate(config, devices=devices).placement)
    if batches is None:
      it = exp.dataset.train_batches(seed=0, global_batch_size=config.train.batch_size)
      batches = [next(it) for _ in range(args.steps)]
    state = exp.init_state()
    losses, norms = [], []
    for local in batches:
      state, m = exp.train_step(state, exp.global_batch(local))
      m = jax.device_get(m)
      losses.append((m['loss_sum'] / m['count']).tolist())
      norms.append(m['grad_norm'].tolist())
    shardings = {}
    for path in PARAMS:
      array = (find(state.opt_state, path[len('opt:mu/'):], '.mu[')
               if path.startswith('opt:') else find(state.params, path))
      shardings[path] = {'spec': [list(a) if isinstance(a, tuple) else a
                                  for a in array.sharding.spec],
                         'shape': list(array.shape),
                         'shard_shape': list(array.addressable_shards[0].data.shape)}
    results['x'.join(map(str, mesh))] = {'loss': losses, 'grad_norm': norms,
                                         'params': shardings,
                                         'mesh': dict(exp.mesh.shape)}
  with open(args.out, 'w') as f:
    json.dump(results, f, indent=1)


if __name__ == '__main__':
  main()
