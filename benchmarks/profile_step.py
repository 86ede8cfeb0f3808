"""Profiles one train step: where its time goes, by XLA op and by model part.

  python benchmarks/profile_step.py [--size=small] [--position=rotary] [--length=512]
      [--batch_size=2] [--steps=5] [--out=/tmp/profile_step] [--compare=none]

Compiles the project's train step (forward, backward, AdamW; as training builds it), writes the
optimised HLO (``OUT/<position>/train_step.hlo.txt``), records ``--steps`` steps with
``jax.profiler`` (``OUT/<position>/trace``: open it with TensorBoard's profile plugin, xprof or
Perfetto), then reads the trace back (``jax.profiler.ProfileData``) and prints

* the time per step of each part of the step (QKV projection, position scheme, softmax
  attention, feed-forward, LayerNorm, dropout, optimizer, ...), attributed through the
  ``jax.named_scope`` names that the model and the train step put on their ops (they survive
  into the HLO metadata of every op, forward and backward), and
* the most expensive ops.

Times are summed over XLA's CPU threads (thread-seconds per step), so parts add up to the step's
CPU time, not its wall time. ``--compare=none`` profiles a second position scheme the same way
and prints the two side by side with the difference per part: what a scheme costs, and where.
"""

from __future__ import annotations

import collections
import functools
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
from absl import app, flags

from benchmarks import common

flags.DEFINE_string('size', 'small', 'Model preset.')
flags.DEFINE_string('position', 'rotary', 'Position scheme to profile.')
flags.DEFINE_string('compare', '', 'A second position scheme profiled the same way (e.g. none).')
flags.DEFINE_integer('length', 512, 'Sequence length.')
flags.DEFINE_integer('batch_size', 2, 'Batch size.')
flags.DEFINE_integer('steps', 5, 'Steps recorded (after 2 warm-up steps).')
flags.DEFINE_integer('top', 15, 'Most expensive ops listed.')
flags.DEFINE_string('out', '/tmp/profile_step', 'Output directory (HLO text and traces).')
flags.DEFINE_string('json', None, 'Write the figures here (for run_all.py).')
FLAGS = flags.FLAGS

# The name scopes the model and the train step put on their ops (``jax.named_scope``: they are
# in every op's HLO metadata, forward and backward) and the part of the step each one names.
SCOPES = {
    'embeddings': 'embeddings',
    'positions': 'position scheme (rope, bias, tables)',
    'qkv_projection': 'QKV projection',
    'softmax_attention': 'softmax attention',
    'linear_attention': 'linear attention',
    'output_projection': 'attention output projection',
    'feed_forward': 'feed-forward',
    'layer_norm': 'layer norm',
    'dropout': 'dropout (incl. random bits)',
    'head': 'classification head',
    'loss': 'loss',
    'optimizer': 'optimizer (AdamW, grad norm)',
}
UNSCOPED = 'other (residual adds, copies, unscoped)'


def _scope(op_name: str) -> str | None:
  """The innermost of ``SCOPES`` named in an op's path, e.g. '.../positions/mul' -> positions."""
  found = None
  for component in re.split(r'[/()]', op_name):
    if component in SCOPES:
      found = component
  return found


def _parse_hlo(text: str) -> dict[str, tuple[str, str]]:
  """instruction name -> (opcode, part) for every instruction of the optimised HLO. A fusion's
  part is the most frequent scope among the instructions inside it (and the computations those
  call)."""
  computations: dict[str, list[str]] = {}
  current = None
  for line in text.splitlines():
    header = re.match(r'^(?:ENTRY )?%?([\w.\-]+) .*\{$', line)
    if header:
      current = header.group(1)
      computations[current] = []
    elif current is not None and line.startswith('  '):
      computations[current].append(line)

  @functools.cache
  def scopes_in(computation: str) -> tuple[str, ...]:
    found = []
    for line in computations.get(computation, ()):
      found += [s for s in map(_scope, re.findall(r'op_name="([^"]*)"', line)) if s]
      for called in re.findall(r'(?:calls|body|condition|to_apply)=%?([\w.\-]+)', line):
        found += scopes_in(called)
    return tuple(found)

  ops = {}
  for lines in computations.values():
    for line in lines:
      m = re.match(r'\s+(?:ROOT )?%?([\w.\-]+) = .*? ([\w\-]+)\(', line)
      if not m:
        continue
      found = [s for s in map(_scope, re.findall(r'op_name="([^"]*)"', line)) if s]
      for called in re.findall(r'(?:calls|body|condition|to_apply)=%?([\w.\-]+)', line):
        found += scopes_in(called)
      scope = collections.Counter(found).most_common(1)[0][0] if found else None
      ops[m.group(1)] = (m.group(2), SCOPES[scope] if scope else UNSCOPED)
  return ops


def _op_times(trace_dir: str, steps: int) -> dict[str, float]:
  """Seconds per step of every executed XLA op (summed over threads)."""
  files = sorted(glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'), recursive=True),
                 key=os.path.getmtime)
  data = jax.profiler.ProfileData.from_file(files[-1])
  totals: dict[str, float] = collections.defaultdict(float)
  for plane in data.planes:
    for line in plane.lines:
      if 'XLA' not in line.name:  # XLA's executor threads
        continue
      for event in line.events:
        name = event.name
        if name.startswith('end:') or '::' in name:  # markers and runtime waits, not ops
          continue
        totals[name] += event.duration_ns * 1e-9 / steps
  return totals


def profile(position: str) -> dict:
  """Compiles, traces and attributes the train step of one position scheme."""
  c = common.get_config(**{'model.size': FLAGS.size, 'model.position': position,
                           'data.max_length': FLAGS.length})
  batch = common.synthetic_batch(FLAGS.batch_size, FLAGS.length)
  step = common.our_train_step(c, batch, name=position)
  out = os.path.join(FLAGS.out, position)
  os.makedirs(out, exist_ok=True)
  hlo = step.compiled.as_text()
  with open(os.path.join(out, 'train_step.hlo.txt'), 'w') as f:
    f.write(hlo)
  for _ in range(2):
    jax.block_until_ready(step.run())
  trace_dir = os.path.join(out, 'trace')
  with jax.profiler.trace(trace_dir):
    for _ in range(FLAGS.steps):
      result = step.run()
    jax.block_until_ready(result)
  ops = _parse_hlo(hlo)
  times = _op_times(trace_dir, FLAGS.steps)
  parts: dict[str, float] = collections.defaultdict(float)
  rows = []
  for name, seconds in times.items():
    opcode, part = ops.get(name, ('?', UNSCOPED))
    parts[part] += seconds
    rows.append((seconds, name, opcode, part))
  print(f'{position}: HLO in {out}/train_step.hlo.txt, trace in {trace_dir}', flush=True)
  return {'parts': dict(parts), 'rows': sorted(rows, reverse=True), 'total': sum(times.values())}


def _ms(seconds: float) -> str:
  return f'{seconds * 1e3:.1f}'


def main(_):
  positions = [FLAGS.position] + ([FLAGS.compare] if FLAGS.compare else [])
  results = {p: profile(p) for p in positions}
  print(f'\nmachine: {common.machine()}')
  print(f'{FLAGS.size} preset, batch {FLAGS.batch_size} x length {FLAGS.length}, float32 train '
        f'step; thread-ms per step, mean of {FLAGS.steps} traced steps\n')
  names = sorted({k for r in results.values() for k in r['parts']},
                 key=lambda k: -results[positions[0]]['parts'].get(k, 0.0))
  header = ['part'] + [f'{p} ms' for p in positions] + [f'{p} %' for p in positions]
  if len(positions) == 2:
    header.append(f'{positions[0]} - {positions[1]} ms')
  rows = []
  for k in names + ['total']:
    vals = [results[p]['total'] if k == 'total' else results[p]['parts'].get(k, 0.0)
            for p in positions]
    row = [k] + [_ms(v) for v in vals] + [
        f'{100 * v / results[p]["total"]:.1f}' for v, p in zip(vals, positions)]
    if len(positions) == 2:
      row.append(f'{(vals[0] - vals[1]) * 1e3:+.1f}')
    rows.append(row)
  common.print_table(header, rows)
  first = results[positions[0]]
  share = first['parts'].get(SCOPES['positions'], 0.0) / first['total']
  figures = [common.figure(f'position-scheme share of the {positions[0]} step (thread time)',
                           share * 100, unit='%', detail='ops under the `positions` scope')]
  common.write_json(FLAGS.json, {
      'title': 'Where the train step\'s time goes (jax.profiler trace, by named scope)',
      'setup': (f'`{FLAGS.size}` preset, batch {FLAGS.batch_size} x length {FLAGS.length}, '
                f'float32 train step; thread-milliseconds per step (summed over XLA\'s CPU '
                f'threads), mean of {FLAGS.steps} traced steps; parts are the `jax.named_scope`s '
                'that the model and train step put on their ops, forward and backward'),
      'figures': figures, 'header': header, 'rows': rows})
  for p in positions:
    print(f'\n{p}: the {FLAGS.top} most expensive ops')
    common.print_table(['ms/step', 'op', 'opcode', 'part'],
                       [[_ms(s), n, o, part] for s, n, o, part in results[p]['rows'][:FLAGS.top]])


if __name__ == '__main__':
  app.run(main)
