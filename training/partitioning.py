"""The device mesh and the one table from the model's logical axis names to mesh axes: ``data``
splits the batch; ``fsdp`` the batch and the parameters and optimizer state over ``embed``;
``tensor`` heads, MLP units and the vocabulary (``mesh.dcn_<axis>``: across TPU slices)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, NamedTuple, Sequence

import jax
import numpy as np
import optax
from absl import logging
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from models import sharding as model_sharding
from training.config import MeshConfig

MESH_AXES = ('data', 'fsdp', 'tensor')
BATCH_AXES = ('data', 'fsdp')  # the batch is split over both data-parallel axes
Rules = tuple[tuple[str, Any], ...]  # logical axis -> mesh axes
# Logical axis -> mesh axes. Every logical name of models/sharding.py has an entry.
LOGICAL_RULES: Rules = (
    ('batch', BATCH_AXES), ('length', None), ('embed', 'fsdp'), ('heads', 'tensor'),
    ('kv', None), ('mlp', 'tensor'), ('vocab', 'tensor'), ('classes', None))
assert {name for name, _ in LOGICAL_RULES} == set(model_sharding.LOGICAL_AXES)


class Placement(NamedTuple):
  """Where a run's arrays live (``validation.check_devices``), and its global batch sizes."""

  mesh: Mesh
  rules: Rules
  batch_size: int
  eval_batch_size: int


def logical_rules(mesh_config: MeshConfig) -> Rules:
  """``LOGICAL_RULES`` with the overrides of ``mesh.rules``, e.g. 'vocab=,embed=fsdp+tensor'."""
  rules, given = dict(LOGICAL_RULES), set()
  for item in mesh_config.rules:
    name, sep, axes = item.partition('=')
    name, axes = name.strip(), tuple(a.strip() for a in axes.split('+') if a.strip())
    if name in given:
      raise ValueError(f'mesh.rules sets {name!r} more than once: give each logical axis once.')
    given.add(name)
    if not sep or name not in rules:
      raise ValueError(f'mesh.rules entry {item!r} must be <logical>=<mesh axes>, with <logical> '
                       f'one of {", ".join(rules)} and mesh axes from {", ".join(MESH_AXES)} '
                       "joined by '+' (empty = replicated).")
    if unknown := [a for a in axes if a not in MESH_AXES]:
      raise ValueError(f'mesh.rules entry {item!r} names unknown mesh axes {unknown}; valid: '
                       f'{", ".join(MESH_AXES)}.')
    rules[name] = None if not axes else axes[0] if len(axes) == 1 else axes
  return tuple(rules.items())


def _sizes(mesh_config: MeshConfig, prefix: str) -> list[int]:
  return [int(getattr(mesh_config, prefix + a)) for a in MESH_AXES]


def mesh_shape(mesh_config: MeshConfig, num_devices: int) -> tuple[int, ...]:
  """The within-slice (data, fsdp, tensor) sizes over ``num_devices``, a -1 filled in."""
  sizes = _sizes(mesh_config, '')
  given = dict(zip(MESH_AXES, sizes))
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f'mesh sizes {given} are invalid: use positive sizes, with at most one -1 '
                     '(fill the remaining devices).')
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f'mesh {given} does not divide the {num_devices} devices; choose sizes '
                       'whose product divides the device count.')
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(f'mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices but '
                     f'{num_devices} are available; set the sizes so their product is '
                     f'{num_devices} (or use -1 for one axis).')
  return tuple(sizes)


def make_mesh(mesh_config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """The (data, fsdp, tensor) mesh over ``devices`` (default: all), topology-aware on TPU."""
  devices = list(jax.devices() if devices is None else devices)
  dcn = _sizes(mesh_config, 'dcn_')
  if any(s <= 0 for s in dcn) or len(devices) % math.prod(dcn):
    raise ValueError(f'mesh.dcn_* sizes {dict(zip(MESH_AXES, dcn))} must be positive and their '
                     f'product must divide the {len(devices)} devices (one factor per slice).')
  ici = mesh_shape(mesh_config, len(devices) // math.prod(dcn))
  if math.prod(dcn) > 1:
    # The DCN factors apply across TPU slices; elsewhere across processes.
    slices = {getattr(d, 'slice_index', 0) for d in devices}
    array = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices,
                                                 process_is_granule=len(slices) == 1)
  else:
    try:
      array = mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=True)
    except (ValueError, NotImplementedError, AssertionError):
      # No known physical topology (e.g. a subset of TPU chips): plain order, as on CPU/GPU.
      array = np.asarray(devices).reshape(ici)
  return Mesh(array, MESH_AXES)


def fit_to_devices(mesh_config: MeshConfig, num_devices: int | None = None) -> MeshConfig:
  """``mesh_config`` if it fits the devices, else pure data parallelism."""
  num_devices = jax.device_count() if num_devices is None else num_devices
  slices = math.prod(_sizes(mesh_config, 'dcn_'))
  with contextlib.suppress(ValueError):  # mesh_shape raises if the mesh does not fit
    if num_devices % slices == 0 and mesh_shape(mesh_config, num_devices // slices):
      return mesh_config
  fitted = dataclasses.replace(mesh_config, data=-1, fsdp=1, tensor=1, dcn_data=1, dcn_fsdp=1,
                               dcn_tensor=1)
  logging.warning('The mesh %s does not fit the %d devices; using %s.', mesh_config, num_devices,
                  fitted)
  return fitted


def data_parallel_size(mesh: Mesh) -> int:
  return math.prod(mesh.shape[a] for a in BATCH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def process_rows(mesh: Mesh, global_batch_size: int) -> tuple[int, int]:
  """(shard index i, shard count n): this process feeds rows ``[i * B / n, (i + 1) * B / n)``
  of its devices, so processes whose devices hold the same rows load the same examples."""
  index_map = batch_sharding(mesh).addressable_devices_indices_map((global_batch_size,))
  bounds = [idx[0].indices(global_batch_size)[:2] for idx in index_map.values()]
  start, stop = min(b[0] for b in bounds), max(b[1] for b in bounds)
  rows = stop - start
  if global_batch_size % rows or start % rows:
    raise ValueError(f'The batch rows [{start}, {stop}) of process {jax.process_index()} are not '
                     'one of equal contiguous blocks; use a mesh whose data-parallel axes are '
                     'laid out by process.')
  return start // rows, global_batch_size // rows


def param_specs(abstract_params: nnx.State, mesh: Mesh,
                rules: Sequence[tuple[str, Any]]) -> dict[str, Any]:
  """PartitionSpecs of the parameters from their logical names; a mesh axis is used once per
  parameter, and a dimension its mesh axes do not divide is replicated."""
  with nnx.logical_axis_rules(rules):
    specs = nnx.to_pure_dict(nnx.get_partition_spec(abstract_params))
  shapes = nnx.to_pure_dict(abstract_params)

  def fit(path, spec: P, shape) -> P:
    spec = list(model_sharding.distinct_axes(spec)) + [None] * (len(shape.shape) - len(spec))
    for i, (axes, dim) in enumerate(zip(spec, shape.shape)):
      size = math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes or ()))
      if size > 1 and dim % size:
        logging.info('%s: dimension %d (%d) is not divisible by mesh axes %s (%d); replicated.',
                     jax.tree_util.keystr(path), i, dim, axes, size)
        spec[i] = None
    return P(*spec)

  return jax.tree_util.tree_map_with_path(fit, specs, shapes, is_leaf=lambda x: isinstance(x, P))


def state_shardings(abstract_state: Any, abstract_params: nnx.State, tx: Any, mesh: Mesh,
                    rules: Sequence[tuple[str, Any]]) -> Any:
  """NamedShardings of a ``TrainState``: optimizer moments follow their parameters."""
  is_spec = lambda x: isinstance(x, P)
  specs = jax.tree.map(lambda s: P(None, *s), param_specs(abstract_params, mesh, rules),
                       is_leaf=is_spec)
  opt_specs = optax.tree_map_params(tx, lambda _, s: s, abstract_state.opt_state, specs,
                                    transform_non_params=lambda _: P(), is_leaf=is_spec)
  state_specs = abstract_state.replace(
      step=P(), params=specs, opt_state=opt_specs, key=P(), skipped=P())
  return jax.tree.map(lambda s: NamedSharding(mesh, s), state_specs, is_leaf=is_spec)
