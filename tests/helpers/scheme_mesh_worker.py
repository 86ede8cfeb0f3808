"""Run with 4 simulated CPU devices: the position schemes of issue 30 on a (data 1, fsdp 2,
tensor 2) mesh against one device, on packed documents.

  XLA_FLAGS=--xla_force_host_platform_device_count=4 python tests/helpers/scheme_mesh_worker.py \
      --out=results.json

Writes, per case (scheme, task, attention_impl): the loss and the largest gradient difference on
the mesh and on one device, and the mesh's partition specs of the scheme's parameters
(tests/test_new_schemes.py checks them).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np
from flax import nnx

import models
from training import partitioning
from training.config import MeshConfig

CASES = (('kerple_log', 'mlm', 'explicit'), ('kerple_power', 'clm', 'chunked'),
         ('fire', 'mlm', 'chunked'), ('cope', 'clm', 'xla'))
VOCAB, LENGTH = 40, 12


def packed_batch():
  """Four rows of two documents each (positions restart, segments 1 and 2)."""
  ids = np.random.default_rng(0).integers(4, VOCAB, size=(4, LENGTH))
  first = np.asarray([3, 5, 7, 9])[:, None]
  index = np.arange(LENGTH)[None]
  positions = np.where(index < first, index, index - first)
  segments = np.where(index < first, 1, 2)
  return jnp.asarray(ids), jnp.asarray(positions), jnp.asarray(segments)


def loss_and_grads(cfg, graphdef, params):
  ids, positions, segments = packed_batch()

  def loss(params):
    logits = nnx.merge(graphdef, params)(ids, positions, ids > 0, segments_BxL=segments)
    return jnp.sum(jnp.sin(logits))
  return jax.jit(jax.value_and_grad(loss))(params)


def run_case(position, task, impl, mesh, rules):
  cfg = models.ModelConfig(position=position, task=task, attention_impl=impl,
                           attention_chunk_size=4, num_layers=1, vocab_size=VOCAB, num_classes=1,
                           deterministic=True)
  key = jax.random.key(0)
  graphdef, params = models.init(cfg, key)
  loss, grads = loss_and_grads(cfg, graphdef, params)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    graphdef, sharded = jax.jit(models.init, static_argnums=0)(cfg, key)
    specs = nnx.get_partition_spec(sharded)
    mesh_loss, mesh_grads = loss_and_grads(cfg, graphdef, sharded)
  diffs = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()),
                       nnx.to_pure_dict(grads), nnx.to_pure_dict(mesh_grads))
  scheme_specs = {jax.tree_util.keystr(p): str(v.get_value())
                  for p, v in jax.tree_util.tree_leaves_with_path(
                      specs, is_leaf=lambda x: isinstance(x, nnx.Variable))
                  if 'positions' in jax.tree_util.keystr(p)}
  return {'loss': float(loss), 'mesh_loss': float(mesh_loss),
          'max_grad_diff': max(jax.tree.leaves(diffs)),
          'max_grad': max(float(np.abs(np.asarray(g)).max()) for g in jax.tree.leaves(grads)),
          'specs': scheme_specs}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', required=True)
  args = parser.parse_args()
  mesh_config = MeshConfig(data=1, fsdp=2, tensor=2)
  mesh = partitioning.make_mesh(mesh_config)
  rules = partitioning.logical_rules(mesh_config)
  results = {'-'.join(case): run_case(*case, mesh, rules) for case in CASES}
  with open(args.out, 'w') as f:
    json.dump(results, f, indent=1)


if __name__ == '__main__':
  main()
