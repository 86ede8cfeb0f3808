"""List-valued config fields and flags ('a,b,c'), split, typed and checked by one parser. A
repeated entry is refused, naming the field: a grid would report one run twice, seeds or rates
would train identical members, files would count the same rows twice."""

from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar('T')


def parse(text: object, field: str, kind: Callable[[str], T] = str, *,
          example: str = 'a,b') -> list[T]:
  """``'a, b,,c'`` -> ``[kind('a'), kind('b'), kind('c')]`` (empty entries dropped);
  ValueError naming ``field`` for an entry ``kind`` refuses, or for one given twice."""
  items = [x.strip() for x in str(text if text is not None else '').split(',') if x.strip()]
  try:
    values = [kind(x) for x in items]
  except (TypeError, ValueError):
    name = getattr(kind, '__name__', 'value')
    raise ValueError(f'{field}={text!r} is malformed: give comma-separated {name} values, '
                     f'e.g. {example} (or empty).') from None
  repeated = {values.index(v): i for i, v in enumerate(values) if values.index(v) != i}
  if repeated:
    names = ', '.join(items[first] if items[first] == items[again] else
                      f'{items[first]} and {items[again]} (the same value)'
                      for first, again in sorted(repeated.items()))
    raise ValueError(f'{field}={text!r} names {names} more than once; give each entry once.')
  return values
