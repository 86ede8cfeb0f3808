"""How busy the machine was around a benchmark: the 1-minute load average and the share of the
cores that other processes used, read from ``/proc/stat`` and ``/proc/loadavg``.

``run_all.py`` takes a ``Snapshot`` before and after each benchmark (and watches a second of the
idle machine on either side), and marks the benchmark's figures as measured under load when
other processes used more than ``UNDER_LOAD_SHARE`` of the cores at any of those times.

Only the CPU share decides: the load average also counts the benchmark's own threads (XLA runs
one per core, so a benchmark alone on a 2-core machine shows a load near 2) and is a one-minute
moving average that lags behind; it is recorded for context.
"""

from __future__ import annotations

import os
import time
from typing import Callable, NamedTuple, TypeVar

# Other processes above 10% of all cores mark a figure: an idle machine's daemons use ~1%, one
# busy process on a 2-core machine 50%. A benchmark's XLA threads fill every core, so any other
# work takes time from it, and not evenly from the two sides of a ratio (the same fine-tuning
# figure read 0.78x under load and 0.99x on a quiet machine, issue 32).
UNDER_LOAD_SHARE = 0.10
# /proc/stat's cpu line: user nice system idle iowait irq softirq steal (guest time is already
# in user and nice); idle and iowait are the idle ones. Steal is time the hypervisor gave to
# other machines: load too.
_STAT_FIELDS = 8
_IDLE_FIELDS = (3, 4)
T = TypeVar('T')


class Snapshot(NamedTuple):
  """Counters at one instant; differences between two give the load between them."""

  busy_s: float  # CPU-seconds all cores spent busy since boot
  total_s: float  # CPU-seconds all cores existed since boot (busy + idle)
  own_s: float  # CPU-seconds of this process and of its finished (waited-for) children
  load1: float  # 1-minute load average


def parse_stat(text: str, clock_ticks: int) -> tuple[float, float]:
  """(busy, total) CPU-seconds of all cores from the text of ``/proc/stat``."""
  for line in text.splitlines():
    fields = line.split()
    if fields and fields[0] == 'cpu':
      ticks = [int(x) for x in fields[1:1 + _STAT_FIELDS]]
      idle = sum(ticks[i] for i in _IDLE_FIELDS if i < len(ticks))
      return (sum(ticks) - idle) / clock_ticks, sum(ticks) / clock_ticks
  raise ValueError('no aggregate "cpu" line in /proc/stat')


def parse_loadavg(text: str) -> float:
  """The 1-minute load average from the text of ``/proc/loadavg``."""
  return float(text.split()[0])


def snapshot() -> Snapshot | None:
  """This machine's counters now, or None where ``/proc`` is not readable (not Linux)."""
  try:
    with open('/proc/stat') as f:
      busy, total = parse_stat(f.read(), os.sysconf('SC_CLK_TCK'))
    with open('/proc/loadavg') as f:
      load1 = parse_loadavg(f.read())
  except (OSError, ValueError):
    return None
  t = os.times()
  return Snapshot(busy, total, t.user + t.system + t.children_user + t.children_system, load1)


def others_share(before: Snapshot, after: Snapshot) -> float:
  """Share of all cores' time between two snapshots used by processes other than this one and
  its children (0 when nothing else ran, 1 when others kept every core busy)."""
  total = after.total_s - before.total_s
  if total <= 0:
    return 0.0
  others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
  return min(1.0, max(0.0, others / total))


def record(first: Snapshot | None, start: Snapshot | None, end: Snapshot | None,
           last: Snapshot | None) -> dict[str, float] | None:
  """The load around one benchmark that ran from ``start`` to ``end``, with idle windows
  ``first``..``start`` and ``end``..``last``: the load average at its start and end, and the
  others' share of the cores before, while and after it ran (None if a snapshot is missing)."""
  if None in (first, start, end, last):
    return None
  return {'load1_before': start.load1, 'load1_after': end.load1,
          'others_before': others_share(first, start), 'others_during': others_share(start, end),
          'others_after': others_share(end, last)}


def watch(fn: Callable[[], T], idle_s: float = 1.0) -> tuple[T, dict[str, float] | None]:
  """(``fn()``, its ``record``), with ``idle_s`` seconds of the idle machine watched before and
  after it (only ``fn`` and its children count as ours; nothing of ours runs in the windows)."""
  first = snapshot()
  time.sleep(idle_s)
  start = snapshot()
  result = fn()
  end = snapshot()
  time.sleep(idle_s)
  return result, record(first, start, end, snapshot())


def under_load(load: dict[str, float] | None) -> bool | None:
  """Whether a benchmark ran under load (None: not recorded)."""
  if not load:
    return None
  return others_peak(load) > UNDER_LOAD_SHARE


def others_peak(load: dict[str, float]) -> float:
  """The largest share of the cores others used before, during or after a benchmark."""
  return max(load['others_before'], load['others_during'], load['others_after'])


def describe(load: dict[str, float] | None) -> str:
  """One line for the README."""
  if not load:
    return 'Machine load: not recorded.'
  verdict = '**under load**' if under_load(load) else 'quiet'
  return (f'Machine load: {verdict}; other processes used {load["others_before"]:.0%} of the '
          f'cores in the second before, {load["others_during"]:.0%} while it ran and '
          f'{load["others_after"]:.0%} in the second after (threshold '
          f'{UNDER_LOAD_SHARE:.0%}); 1-minute load average {load["load1_before"]:.2f} at the '
          f'start, {load["load1_after"]:.2f} at the end.')
