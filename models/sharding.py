"""Logical axis names for parameters and activations; models never mention mesh axes.

``training/partitioning.py``'s ``LOGICAL_RULES`` map them to mesh axes and must name every one
(names without a rule reach the mesh verbatim). Parameters carry theirs as ``out_sharding``
metadata, so ``nnx.get_partition_spec(params)`` gives the ``PartitionSpec`` tree.
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


def _check_names(names: Sequence[str | None]) -> tuple[str | None, ...]:
  unknown = [n for n in names if n is not None and n not in LOGICAL_AXES]
  if unknown:
    raise ValueError(f'Unknown logical axis names {unknown}; valid names: '
                     f'{", ".join(LOGICAL_AXES)} (or None).')
  return tuple(names)


def active() -> bool:
  """Whether logical-axis rules and a mesh (``jax.set_mesh``) are both active."""
  return bool(flax_spmd.get_logical_axis_rules()) and not jax.sharding.get_abstract_mesh().empty


def logical_to_mesh(names: Sequence[str | None]) -> PartitionSpec:
  """The mesh ``PartitionSpec`` of logical ``names`` under the active rules."""
  return distinct_axes(flax_spmd.apply_rules(PartitionSpec(*_check_names(names)), None))


def distinct_axes(spec: PartitionSpec) -> PartitionSpec:
  """``spec`` with a later dimension whose mesh axes were already used replicated (None)."""
  used: set[str] = set()
  out = []
  for mesh_axes in spec:
    axes = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes or ())
    out.append(None if used.intersection(axes) else mesh_axes)
    used.update(axes)
  return PartitionSpec(*out)


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """Constrains x's sharding to logical ``names`` (one per dimension); no-op unless ``active()``."""
  if len(names) != x.ndim:
    raise ValueError(f'{len(names)} logical names {tuple(names)} for an array of shape {x.shape}.')
  if not active():
    return x
  spec = logical_to_mesh(names)
  if jax.sharding.get_abstract_mesh().are_all_axes_explicit:
    return jax.sharding.reshard(x, spec)
  return jax.lax.with_sharding_constraint(x, spec)


def param_metadata(names: Sequence[str | None]) -> Mapping[str, Any]:
  """``nnx.Param`` metadata naming a parameter's logical axes; sharded eagerly iff ``active()``."""
  return {'out_sharding': _check_names(names), 'eager_sharding': active()}
