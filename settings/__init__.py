"""How a run's settings are declared, once each: every group of a run config is a frozen, typed
dataclass whose fields carry their default and ``Role``. The ConfigDict that ``config_flags``
overrides is generated from the groups (``config_dict``) and read back (``build``); which fields
may change on resume, evaluation, across an ablation or a fine-tune follows from the roles
(``paths``). A list field is a tuple, comma-separated on the command line (``settings.lists``).
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Any, Callable, Mapping

import ml_collections
from ml_collections import config_dict as config_dict_lib

from settings import lists


class Role(enum.Enum):
  """What a field is for."""

  PARAMETERS = 'shapes the parameters'  # a fine-tune's source must agree (train.init_from)
  RESULTS = 'changes results'  # runs an ablation compares must agree
  RUNTIME = 'run-time only'  # where and how a run executes, logs and saves


def setting(default: Any, role: Role, *, evaluation: bool = False, resume: bool | None = None,
            items: Callable[[str], Any] | None = None, example: str = 'a,b') -> Any:
  """A field of a config group. ``evaluation``: may change in ``eval.py --override``; ``resume``:
  may change when a run resumes (default: run-time fields only); ``items``: the field is a tuple
  of these (comma-separated on the command line, like ``example``)."""
  meta = {'role': role, 'evaluation': evaluation, 'items': items, 'example': example,
          'resume': role is Role.RUNTIME if resume is None else resume}
  return dataclasses.field(default=default, metadata=meta)


def groups(config_cls: type) -> dict[str, type]:
  """The run config's groups: field name -> group class."""
  hints = typing.get_type_hints(config_cls)
  return {f.name: hints[f.name] for f in dataclasses.fields(config_cls)
          if dataclasses.is_dataclass(hints[f.name])}


def declared(group_cls: type) -> list[dataclasses.Field]:
  """The fields of a group that are settings (a group may also hold derived fields)."""
  return [f for f in dataclasses.fields(group_cls) if 'role' in f.metadata]


def paths(config_cls: type, keep: Callable[[Mapping[str, Any]], bool]) -> tuple[str, ...]:
  """'group.field' of every setting whose declaration ``keep`` accepts."""
  return tuple(f'{name}.{f.name}' for name, group in groups(config_cls).items()
               for f in declared(group) if keep(f.metadata))


def _flag_value(f: dataclasses.Field, kind: Any) -> Any:
  if f.metadata['items']:
    return ','.join(map(str, f.default))
  if f.default is None:
    inner = [k for k in typing.get_args(kind) if k is not type(None)]
    return config_dict_lib.placeholder(inner[0])
  return f.default


def group_dict(group_cls: type) -> ml_collections.ConfigDict:
  """The ConfigDict of one group's defaults."""
  hints = typing.get_type_hints(group_cls)
  return ml_collections.ConfigDict(
      {f.name: _flag_value(f, hints[f.name]) for f in declared(group_cls)})


def config_dict(config_cls: type) -> ml_collections.ConfigDict:
  """The ConfigDict of a run config's defaults, one group per dataclass group."""
  return ml_collections.ConfigDict({name: group_dict(group)
                                    for name, group in groups(config_cls).items()})


def _value(group: str, f: dataclasses.Field, value: Any) -> Any:
  items = f.metadata['items']
  if isinstance(f.default, bool) and not isinstance(value, bool):  # 'false' would be truthy
    raise ValueError(f'config.{group}.{f.name} is true or false, not {value!r}.')
  if not items:
    return value
  text = value if isinstance(value, str) else ','.join(map(str, value or ()))
  return tuple(lists.parse(text, f'{group}.{f.name}', items, example=f.metadata['example']))


def build(config_cls: type, values: Mapping[str, Any], *, strict: bool = True) -> Any:
  """The typed run config of ``values`` (a ConfigDict or a saved config.json's dict). ``strict``:
  an unknown field is an error (a typo), else dropped (a saved run's field since removed)."""
  return config_cls(**{name: build_group(group, values.get(name) or {}, name, strict=strict)
                        for name, group in groups(config_cls).items()})


def build_group(group_cls: type, values: Mapping[str, Any], name: str, *,
                strict: bool = True) -> Any:
  """One group of ``build``, from its ``values``."""
  given = dict(values)
  fields = {f.name: f for f in declared(group_cls)}
  unknown = sorted(set(given) - set(fields))
  if unknown and strict:
    raise ValueError(f'config.{name} has no field {", ".join(unknown)}: the fields of the '
                     f'{name} group are {", ".join(fields)} (a typo in the config file?).')
  return group_cls(**{k: _value(name, fields[k], v) for k, v in given.items() if k in fields})


def to_dict(config: Any) -> dict[str, Any]:
  """A typed config as plain JSON-able values (tuples as lists)."""
  plain = lambda value: list(value) if isinstance(value, tuple) else value
  return {name: {f.name: plain(getattr(getattr(config, name), f.name))
                 for f in declared(type(getattr(config, name)))}
          for name in groups(type(config))}


def replace(config: Any, changes: Mapping[str, Any]) -> Any:
  """A copy of a typed run config with dotted ``changes`` ({'rope.scaling': 'yarn'})."""
  by_group: dict[str, dict[str, Any]] = {}
  for path, value in changes.items():
    group, _, name = path.partition('.')
    by_group.setdefault(group, {})[name] = value
  return dataclasses.replace(config, **{
      g: dataclasses.replace(getattr(config, g), **c) for g, c in by_group.items()})
