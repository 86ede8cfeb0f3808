"""Runs every CPU benchmark and rewrites ``benchmarks/README.md`` with their figures.

  python benchmarks/run_all.py                 # full sizes (~20 min on a quiet 2-core CPU, ~30 shared)
  python benchmarks/run_all.py --quick         # small sizes (~10 min); writes to a temp file
  python benchmarks/run_all.py --only=scheme_cost,hf_compare   # rerun some, keep the others

Each benchmark runs in its own process (a fresh JAX, nothing shared between them) and writes its
figures as JSON; the results of all benchmarks are kept in ``benchmarks/results.json`` (with
``--only``, the others' previous results are kept) and rendered to the README: a summary table
(figure, goal, met or not) and a table per benchmark, with the machine, library versions and the
exact command. A benchmark that fails is reported as failed, with the end of its output.
Around each benchmark the machine's load is recorded (``machine_load``: the 1-minute load
average, the other processes' share of the cores before, during and after it); figures measured
under load are marked in the README, which names them and the command that reruns them.
``gpu.sh`` needs an accelerator; here it is run with ``--smoke`` (tiny sizes, CPU) only to check
that it works.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from absl import app, flags  # pylint: disable=g-import-not-at-top

from benchmarks import machine_load  # pylint: disable=g-import-not-at-top

flags.DEFINE_bool('quick', False, 'Smaller sizes, fewer rounds (minutes); writes the README to '
                  'a temp file unless --out is given.')
flags.DEFINE_list('only', [], 'Run only these benchmarks (names below); keep the others\' '
                  'previous results from --results.')
flags.DEFINE_string('out', None, 'README to write (default: benchmarks/README.md; with --quick '
                    'a temp file).')
flags.DEFINE_string('results', None, 'JSON of all results (default: benchmarks/results.json; '
                    'with --quick next to --out).')
flags.DEFINE_integer('timeout', 1800, 'Seconds allowed per benchmark.')
FLAGS = flags.FLAGS

# name -> (script, full arguments, quick arguments)
BENCHMARKS = {
    'scheme_cost': ('scheme_cost.py', ['--rounds=21', '--repeats=2'],
                    ['--size=tiny', '--length=128', '--batch_size=8', '--rounds=3']),
    'attention_impl': ('attention_impl.py', ['--rounds=21'],
                       ['--size=tiny', '--length=128', '--batch_size=8', '--rounds=3']),
    'hf_compare': ('hf_compare.py', ['--rounds=11'],
                   ['--size=tiny', '--lengths=128,256', '--tokens=1024', '--rounds=3']),
    'finetune': ('finetune.py', ['--rounds=3'],
                 ['--size=tiny', '--length=128', '--batch_size=4', '--rounds=2']),
    'pretrain': ('pretrain.py', ['--rounds=9'],
                 ['--size=tiny', '--length=128', '--batch_size=4', '--vocab=2000', '--rounds=2']),
    'input_pipeline': ('input_pipeline.py', [],
                       ['--lengths=128', '--batch_sizes=8', '--size=tiny', '--documents=200',
                        '--batches=10', '--rounds=2']),
    'length_scaling': ('length_scaling.py', ['--rounds=5'], ['--lengths=256,1024', '--rounds=2']),
    'compile_time': ('compile_time.py', ['--repeats=1'], ['--sizes=tiny,small', '--repeats=1']),
    'rope_bench': ('rope_bench.py', ['--rounds=15'],
                   ['--shape=2,128,4,64', '--layers=2', '--rounds=2']),
    'seeds_bench': ('seeds_bench.py', ['--seeds=8'],
                    ['--batch_size=8', '--length=64', '--repeats=2']),
    'profile_step': ('profile_step.py', ['--compare=none', '--top=0'],
                     ['--size=tiny', '--length=64', '--steps=2', '--compare=none', '--top=0']),
    'roofline': ('roofline.py', [], ['--quick']),
    'accelerator_smoke': ('accelerator.py', ['--smoke'], ['--smoke']),
    # Before: the tree before the member loop ran the train step unbatched (issue 32, item 3).
    'main_job': ('main_job.py', ['--rounds=2', '--before=b7498f4'],
                 ['--schemes=none', '--rounds=1', '--overrides=' + ','.join([
                     'train.num_steps=2', 'ablation.num_seeds=1', 'train.eval_every=2',
                     'train.checkpoint_every=2', 'optim.warmup_steps=0'])]),
}


def _run_script(args: list[str]) -> tuple[str, str, int, float]:
  """(stdout, stdout + stderr, exit code (-1: timed out), wall seconds) of one benchmark."""
  start = time.perf_counter()
  try:
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=FLAGS.timeout,
                          check=False)
    stdout, output, returncode = proc.stdout, proc.stdout + proc.stderr, proc.returncode
  except subprocess.TimeoutExpired as e:
    stdout = (e.stdout or b'').decode() if isinstance(e.stdout, bytes) else (e.stdout or '')
    output = stdout + f'\nTIMEOUT after {FLAGS.timeout} s'
    returncode = -1
  return stdout, output, returncode, time.perf_counter() - start


def run_one(name: str, quick: bool, json_dir: str) -> dict:
  script, full, short = BENCHMARKS[name]
  json_path = os.path.join(json_dir, f'{name}.json')
  args = [sys.executable, os.path.join('benchmarks', script)] + (short if quick else full)
  command = ' '.join(['python'] + args[1:])
  print(f'=== {name}: {command}', flush=True)
  (stdout, output, returncode, wall), load = machine_load.watch(
      lambda: _run_script(args + [f'--json={json_path}']))
  print(stdout if returncode == 0 else output[-4000:], flush=True)
  print(machine_load.describe(load), flush=True)
  result = {'name': name, 'command': command, 'wall_s': wall, 'returncode': returncode,
            'load': load, 'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}
  if returncode == 0 and os.path.exists(json_path):
    with open(json_path) as f:
      result.update(json.load(f))
    result['command'] = command  # without the temp --json path
  else:
    result['error'] = output[-3000:]
  print(f'=== {name}: {"ok" if returncode == 0 else "FAILED"} in {wall:.0f} s', flush=True)
  return result


def fmt_value(fig: dict) -> str:
  v, unit = fig['value'], fig.get('unit', 'x')
  if unit in ('yes', 'no', 'does not fit'):
    return unit
  if unit == 'x':
    return f'{v:.3f}x' if v < 10 else f'{v:,.0f}x'
  if unit == '%':
    return f'{v:.1f}%'
  if unit == 's':
    return f'{v:.1f} s'
  if unit == 'ms':
    return f'{v:.1f} ms'
  return f'{v:,.0f} {unit}'


def met_text(fig: dict) -> str:
  if fig.get('met') is None:
    return '—'
  return '**met**' if fig['met'] else '**not met**'


_ACCELERATORS = (
    '`benchmarks/gpu.sh` (which runs `benchmarks/accelerator.py` and `benchmarks/roofline.py`) '
    'reports step time, tokens/s and MFU of the `base` train step at length 512 in bfloat16 '
    'with cuDNN fused attention, against the vendor peak and against the bf16 matmul FLOP/s '
    'and bandwidth it measures. It has not been run on a GPU for this file (no accelerator was '
    'available); `accelerator_smoke` above is its `--smoke` run on this CPU, which only shows '
    'that the script works.\n\n'
    'The Pallas TPU attention kernels (`model.attention_impl=splash` and `pallas_flash`) are only '
    'validated in Pallas interpret mode on CPU here, for agreement with `explicit` '
    '(`tests/test_pallas.py`); no TPU was available, so their speed is not measured.')


def load_text(result: dict) -> str:
  """The summary's `measured` cell of a benchmark's figures."""
  loaded = machine_load.under_load(result.get('load'))
  if loaded is None:
    return 'load not recorded'
  if not loaded:
    return 'quiet'
  return f'**under load** ({machine_load.others_peak(result["load"]):.0%} of the cores to others)'


def load_note(results: dict) -> list[str]:
  """README lines naming the benchmarks measured under load, with the command that reruns them
  (none when every one ran on a quiet machine)."""
  loaded = [name for name, r in results.items() if machine_load.under_load(r.get('load'))]
  if not loaded:
    return []
  return [f'**Measured under load: {", ".join(f"`{n}`" for n in loaded)}** (other processes '
          f'used more than {machine_load.UNDER_LOAD_SHARE:.0%} of the cores before, during or '
          'after them; `measured` column below). Their figures are not the reference ones: '
          'rerun them on a quiet machine with',
          '', '```bash', f'python benchmarks/run_all.py --only={",".join(loaded)}', '```', '']


def render(results: dict, quick: bool, total_s: float | None) -> str:
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  ok = [r for r in results.values() if 'error' not in r]
  machine = ok[0]['machine'] if ok else common.machine()
  versions = max((r['versions'] for r in ok), key=len) if ok else ''
  now = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')
  lines = [
      '# Benchmarks',
      '',
      'Every script prints ratios measured side by side in one run (round-robin or alternating '
      'rounds, medians), so slow drifts of a shared machine hit both sides alike. Regenerate '
      'this file with',
      '',
      '```bash',
      'python benchmarks/run_all.py            # all CPU benchmarks (~20 min on a quiet 2-core CPU)',
      'python benchmarks/run_all.py --quick    # small sizes, writes to a temp file',
      'bash benchmarks/gpu.sh                  # on a GPU machine: base, bf16, cuDNN attention, MFU',
      '```',
      '',
      f'Generated {now}{" (QUICK sizes: not the reference figures)" if quick else ""}'
      + (f'; total wall time {total_s / 60:.1f} min' if total_s else
         '; some sections rerun (--only): each says when it ran, those without a date are '
         'from an earlier generation') + '.',
      f'Machine: {machine}, {common.gib(common.mem_total_bytes())} RAM.',
      f'Versions: {versions}.',
      '',
      'Ratios are measured side by side in one process, so load from other processes on the '
      'shared 2-core machine mostly cancels; absolute times do not. `profile_step` shows where '
      'a step\'s time goes (`python benchmarks/profile_step.py --compare=none` also writes the '
      'HLO and a trace for TensorBoard/Perfetto).',
      '',
  ] + load_note(results) + [
      '## Summary',
      '',
      '| benchmark | figure | value | goal | status | detail | measured |',
      '|---|---|---|---|---|---|---|',
  ]
  for name, r in results.items():
    if 'error' in r:
      lines.append(f'| `{name}` | (failed) | | | **failed** | see below | |')
      continue
    for fig in r.get('figures', []):
      lines.append(f'| `{name}` | {fig["name"]} | {fmt_value(fig)} | {fig.get("goal", "")} | '
                   f'{met_text(fig)} | {fig.get("detail", "")} | {load_text(r)} |')
  for name, r in results.items():
    lines += ['', f'## `{name}`: {r.get("title", "")}', '', '```bash', r['command'], '```', '']
    if 'error' in r:
      lines += [f'Failed (exit code {r["returncode"]}):', '', '```', r['error'], '```']
      continue
    lines += [(f'Run {r["date"]}. ' if r.get('date') else '') + r.get('setup', '')
              + f'. Wall time {r["wall_s"]:.0f} s. '
              + machine_load.describe(r.get('load')), '']
    header, rows = r.get('header'), r.get('rows', [])
    if header:
      lines.append('| ' + ' | '.join(map(str, header)) + ' |')
      lines.append('|' + '---|' * len(header))
      for row in rows:
        lines.append('| ' + ' | '.join(map(str, row)) + ' |')
    if r.get('notes'):
      lines += [''] + [f'* {n}' for n in r['notes']]
  lines += ['', '## GPU', '', _ACCELERATORS, '']
  return '\n'.join(lines)


def main(_):
  names = FLAGS.only or list(BENCHMARKS)
  unknown = [n for n in names if n not in BENCHMARKS]
  if unknown:
    raise app.UsageError(f'Unknown benchmarks {unknown}; valid: {", ".join(BENCHMARKS)}')
  if FLAGS.out:
    out = FLAGS.out
  elif FLAGS.quick:
    out = os.path.join(tempfile.gettempdir(), 'roformer_benchmarks_quick.md')
  else:
    out = os.path.join(HERE, 'README.md')
  results_path = FLAGS.results or (
      os.path.join(HERE, 'results.json') if out == os.path.join(HERE, 'README.md')
      else os.path.splitext(out)[0] + '.json')
  previous = {}
  if FLAGS.only and os.path.exists(results_path):
    with open(results_path) as f:
      previous = json.load(f)
  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as json_dir:
    fresh = {name: run_one(name, FLAGS.quick, json_dir) for name in names}
  total = time.perf_counter() - start
  results = {name: fresh.get(name, previous.get(name)) for name in BENCHMARKS
             if name in fresh or name in previous}
  with open(results_path, 'w') as f:
    json.dump(results, f, indent=1)
  with open(out, 'w') as f:
    f.write(render(results, FLAGS.quick, None if FLAGS.only else total))
  failed = [n for n, r in fresh.items() if 'error' in r]
  print(f'wrote {out} and {results_path} ({total / 60:.1f} min)'
        + (f'; FAILED: {", ".join(failed)}' if failed else ''))
  return 1 if failed else 0


if __name__ == '__main__':
  app.run(main)
