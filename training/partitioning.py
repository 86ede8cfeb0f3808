"""The device mesh and the one table that maps logical axis names to mesh axes.

Model code names logical axes (``batch``, ``length``, ``embed``, ``heads``, ``kv``, ``mlp``,
``vocab``, ``classes``); only this file knows the mesh axes (``data``, ``fsdp``, ``tensor``).
"""

from __future__ import annotations

import math

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ('data', 'fsdp', 'tensor')
BATCH_AXES = ('data', 'fsdp')  # the batch is split over both data-parallel axes


def mesh_shape(mesh_config: ml_collections.ConfigDict, num_devices: int) -> tuple[int, ...]:
  """Resolves the (data, fsdp, tensor) sizes; one may be -1 to fill the remaining devices."""
  sizes = [int(mesh_config[a]) for a in MESH_AXES]
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f'mesh sizes {dict(zip(MESH_AXES, sizes))} are invalid: use positive '
                     'sizes, with at most one -1 (fill the remaining devices).')
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f'mesh {dict(zip(MESH_AXES, sizes))} does not divide the {num_devices} '
                       'devices; choose sizes whose product divides the device count.')
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(f'mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices but '
                     f'{num_devices} are available; set the sizes so their product is '
                     f'{num_devices} (or use -1 for one axis).')
  return tuple(sizes)


def make_mesh(mesh_config: ml_collections.ConfigDict) -> Mesh:
  devices = jax.devices()
  shape = mesh_shape(mesh_config, len(devices))
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def data_parallel_size(mesh: Mesh) -> int:
  return math.prod(mesh.shape[a] for a in BATCH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over the data-parallel axes."""
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
