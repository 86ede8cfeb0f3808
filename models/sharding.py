"""Logical axis names for parameters and activations.

Models name the axes of their parameters and key activations with the *logical* names below and
never mention mesh axes. The training side maps logical names to mesh axes with a rules table
(``training/partitioning.py``: ``LOGICAL_RULES``) and a mesh:

    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
      ...

Parameters carry their names as ``out_sharding`` metadata on each ``nnx.Param`` (the current
flax equivalent of ``nnx.with_partitioning``), so ``nnx.get_partition_spec(params)`` under the
rules gives the ``PartitionSpec`` tree. The rules table must name every logical axis (map unused
ones to None): names without a rule are passed to the mesh verbatim.

Activations are annotated with ``constrain(x, names)``, a no-op unless logical-axis rules *and*
a mesh are active.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
from flax.core import spmd as flax_spmd
from jax.sharding import PartitionSpec

BATCH = 'batch'
LENGTH = 'length'
EMBED = 'embed'
HEADS = 'heads'
KV = 'kv'
MLP = 'mlp'
VOCAB = 'vocab'
CLASSES = 'classes'

LOGICAL_AXES = (BATCH, LENGTH, EMBED, HEADS, KV, MLP, VOCAB, CLASSES)

LogicalNames = tuple[str | None, ...]


def _check_names(names: Sequence[str | None]) -> LogicalNames:
  unknown = [n for n in names if n is not None and n not in LOGICAL_AXES]
  if unknown:
    raise ValueError(f'Unknown logical axis names {unknown}; valid names: '
                     f'{", ".join(LOGICAL_AXES)} (or None).')
  return tuple(names)


def active() -> bool:
  """Whether logical-axis rules and a mesh (``jax.set_mesh``) are both active."""
  return bool(flax_spmd.get_logical_axis_rules()) and not jax.sharding.get_abstract_mesh().empty


def logical_to_mesh(names: Sequence[str | None]) -> PartitionSpec:
  """The mesh ``PartitionSpec`` of logical ``names`` under the active rules: flax's renaming
  (``nnx.logical_axis_rules``), then ``distinct_axes``."""
  return distinct_axes(flax_spmd.apply_rules(PartitionSpec(*_check_names(names)), None))


def distinct_axes(spec: PartitionSpec) -> PartitionSpec:
  """``spec`` with each mesh axis used at most once: a later dimension whose mesh axes include
  one already used is replicated (None)."""
  used: set[str] = set()
  out = []
  for mesh_axes in spec:
    axes = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes or ())
    out.append(None if used.intersection(axes) else mesh_axes)
    used.update(axes)
  return PartitionSpec(*out)


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """Constrains the sharding of x to the logical axes ``names`` (one per dimension of x).

  A no-op unless logical-axis rules and a mesh are active.
  """
  if len(names) != x.ndim:
    raise ValueError(f'{len(names)} logical names {tuple(names)} for an array of shape {x.shape}.')
  if not active():
    return x
  spec = logical_to_mesh(names)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.are_all_axes_explicit:
    return jax.sharding.reshard(x, spec)
  return jax.lax.with_sharding_constraint(x, spec)


def param_metadata(names: Sequence[str | None]) -> Mapping[str, Any]:
  """``nnx.Param`` metadata naming the logical axes of a parameter (one name per dimension).

  Parameters are sharded when created (flax's eager sharding) only while logical-axis rules and
  a mesh are active, so models can be built with or without a mesh.
  """
  return {'out_sharding': _check_names(names), 'eager_sharding': active()}
