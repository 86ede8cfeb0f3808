"""Smoke tests of the benchmark scripts (tiny sizes; they check that the scripts run, not speed),
in this process (helpers/entry.py) bar the slow ones."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import entry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(name, *args, tmp_path):
  """``python benchmarks/<name> *args --json=...``, run in this process (helpers/entry.py)."""
  out = os.path.join(str(tmp_path), f'{name}.json')
  proc = entry.run([os.path.join('benchmarks', name), *args, f'--json={out}'])
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  with open(out) as f:
    return json.load(f), proc.stdout


@pytest.mark.slow  # ~30 s on a quiet 2-core CPU (a compile of the train step); run_all runs it too
def test_accelerator_smoke_runs_on_cpu(tmp_path):
  result, stdout = run_script('accelerator.py', '--smoke', tmp_path=tmp_path)
  assert 'tokens/s' in stdout and 'MFU' in stdout
  names = [f['name'] for f in result['figures']]
  assert 'step time' in names and 'tokens/s' in names
  assert result['machine'] and result['command'].startswith('python')


def test_rope_bench_runs_at_a_tiny_shape(tmp_path):
  result, _ = run_script('rope_bench.py', '--shape=1,16,2,8', '--layers=2', '--rounds=1',
                         tmp_path=tmp_path)
  assert len(result['figures']) == 3 and all(f['value'] > 0 for f in result['figures'])


@pytest.mark.slow  # ~50 s on a quiet 2-core CPU: compiles of the train and eval steps
def test_attention_impl_times_the_eval_step_chunked_and_written_out(tmp_path):
  result, _ = run_script('attention_impl.py', '--size=tiny', '--length=32', '--batch_size=2',
                         '--eval_batch_size=2', '--eval_lengths=16,32', '--rounds=1',
                         '--repeats=1', '--schemes=rotary',
                         tmp_path=tmp_path)
  figures = {f['name']: f for f in result['figures']}
  assert figures['rotary: chunked eval step / explicit eval step at 32']['goal']
  assert figures['rotary: chunked eval step / explicit eval step at 16']['value'] > 0
  assert [r[0] for r in result['rows']] == ['rotary', 'rotary eval at 16', 'rotary eval at 32']


@pytest.mark.slow  # ~50 s: builds and times both our model and Hugging Face's
def test_finetune_reports_speed_memory_and_what_remat_buys(tmp_path):
  pytest.importorskip('transformers')
  result, _ = run_script('finetune.py', '--size=tiny', '--length=32', '--batch_size=2',
                         '--rounds=1', tmp_path=tmp_path)
  figures = {f['name']: f for f in result['figures']}
  assert figures['fine-tuning peak memory, ours / HF (both without remat)']['goal'] == '<= 1.0x'
  assert 0 < figures['remat: peak memory of the step, with / without']['value']
  assert 0 < figures['remat: step time, with / without']['value']


def test_run_all_renders_results():
  sys.path.insert(0, ROOT)
  from benchmarks import run_all  # pylint: disable=g-import-not-at-top
  results = {
      'scheme_cost': {'command': 'python benchmarks/scheme_cost.py', 'wall_s': 1.0,
                      'title': 'T', 'setup': 'S', 'machine': 'm', 'versions': 'v',
                      'header': ['a', 'b'], 'rows': [[1, 2]],
                      'figures': [{'name': 'rotary / none', 'value': 1.01, 'unit': 'x',
                                   'goal': '<= 1.03', 'met': True, 'detail': ''}]},
      'hf_compare': {'command': 'python benchmarks/hf_compare.py', 'wall_s': 1.0,
                     'returncode': 1, 'error': 'Traceback ...'},
  }
  text = run_all.render(results, quick=False, total_s=60.0)
  assert '| `scheme_cost` | rotary / none | 1.010x | <= 1.03 | **met** |' in text
  assert '**failed**' in text and 'Traceback ...' in text


def test_profile_step_attributes_time_to_model_parts(tmp_path):
  """The profiler script traces the train step and attributes op time to the model's named
  scopes: rotary spends time in the position scheme, `none` spends none there."""
  proc = entry.run([os.path.join('benchmarks', 'profile_step.py'), '--size=tiny', '--length=32',
                    '--batch_size=2', '--steps=1', '--compare=none', f'--out={tmp_path}'])
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  rows = {line.split('  ')[0]: line.split() for line in proc.stdout.splitlines()}
  position = rows['position scheme (rope, bias, tables)']
  assert float(position[-5]) > 0 and float(position[-4]) == 0  # rotary ms, none ms
  for part in ('softmax attention', 'feed-forward', 'QKV projection', 'optimizer (AdamW, grad norm)'):
    assert part in rows, proc.stdout
  assert os.path.exists(tmp_path / 'rotary' / 'train_step.hlo.txt')


def _dot_flops(jaxpr) -> int:
  """2 x multiply-adds of every dot_general in a jaxpr and the jaxprs inside it."""
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      (lhs_contract, rhs_contract), (_, rhs_batch) = eqn.params['dimension_numbers']
      lhs, rhs = (v.aval.shape for v in eqn.invars)
      rhs_free = [n for i, n in enumerate(rhs) if i not in rhs_contract and i not in rhs_batch]
      total += 2 * int(np.prod(lhs)) * int(np.prod(rhs_free))
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        inner = getattr(sub, 'jaxpr', sub)
        if hasattr(inner, 'eqns'):
          total += _dot_flops(inner)
  return total


@pytest.mark.parametrize('pooling', ['cls', 'mean'])
def test_model_flops_count_the_forward_matmuls_three_times(pooling):
  """MaxText's count is 3 x the forward's matmul FLOPs: the same number as every dot_general
  traced in the classifier's forward pass (no position scheme: rotary adds an exact identity
  matmul, a fusion barrier, that no count includes). With CLS pooling the last layer computes
  one query."""
  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, ROOT)
  from benchmarks import common, model_flops  # pylint: disable=g-import-not-at-top
  import models  # pylint: disable=g-import-not-at-top
  c = common.get_config(**{'model.size': 'tiny', 'model.position': 'none',
                           'model.pooling': pooling, 'data.max_length': 16})
  cfg = common.model_config(c).replace(deterministic=True)
  batch = common.synthetic_batch(2, 16)
  graphdef, params = models.init(cfg, jax.random.key(0))
  forward = lambda p: nnx.merge(graphdef, p)(batch.inputs, batch.positions, batch.mask)
  traced = _dot_flops(jax.make_jaxpr(forward)(params).jaxpr)
  counted = model_flops.train_step(cfg, 2, 16)
  assert counted['total'] == 3 * traced
  assert counted['total'] == counted['weights'] + counted['attention']


def _stat(user, nice, system, idle, iowait, steal):
  return (f'cpu  {user} {nice} {system} {idle} {iowait} 0 0 {steal} 7 7\n'
          f'cpu0 1 2 3 4 5 0 0 0 0 0\nintr 12345 6 7\n')


def test_machine_load_share_of_the_other_processes():
  """From two synthetic /proc/stat snapshots (100 ticks/s) and this process's own CPU seconds:
  the share of all cores that other processes used; guest ticks (already in user) not twice."""
  sys.path.insert(0, ROOT)
  from benchmarks import machine_load  # pylint: disable=g-import-not-at-top
  assert machine_load.parse_loadavg('3.25 1.10 0.50 4/321 9876\n') == 3.25
  busy, total = machine_load.parse_stat(_stat(1000, 50, 200, 5000, 100, 10), 100)
  assert (busy, total) == pytest.approx((12.6, 63.6))  # (1000+50+200+10) / 100, all 8 fields / 100
  before = machine_load.Snapshot(*machine_load.parse_stat(_stat(1000, 50, 200, 5000, 100, 10),
                                                          100), own_s=2.0, load1=0.5)
  # 4 s on 2 cores = 800 ticks: 500 busy (of which ours 3.0 s = 300 ticks), 300 idle.
  after = machine_load.Snapshot(*machine_load.parse_stat(_stat(1400, 50, 290, 5250, 150, 20),
                                                         100), own_s=5.0, load1=2.5)
  assert machine_load.others_share(before, after) == pytest.approx(200 / 800)
  load = machine_load.record(before, after, after, after)
  assert load['others_before'] == pytest.approx(0.25) and load['others_during'] == 0.0
  assert load['load1_before'] == 2.5 and machine_load.under_load(load)
  quiet = dict(load, others_before=0.05)
  assert not machine_load.under_load(quiet) and machine_load.under_load(None) is None
  with pytest.raises(ValueError):
    machine_load.parse_stat('intr 1 2\n', 100)


def test_run_all_marks_figures_measured_under_load():
  sys.path.insert(0, ROOT)
  from benchmarks import run_all  # pylint: disable=g-import-not-at-top
  figure = {'name': 'speed-up', 'value': 1.2, 'unit': 'x', 'goal': '', 'met': None, 'detail': ''}
  load = {'load1_before': 1.0, 'load1_after': 1.0, 'others_before': 0.0, 'others_during': 0.4,
          'others_after': 0.0}
  result = lambda load: {'command': 'c', 'wall_s': 1.0, 'title': 'T', 'setup': 'S',
                         'machine': 'm', 'versions': 'v', 'figures': [figure], 'load': load}
  text = run_all.render({'hf_compare': result(load),
                         'finetune': result(dict(load, others_during=0.02)),
                         'pretrain': result(None)}, quick=False, total_s=1.0)
  rows = {line.split(' | ')[0]: line for line in text.splitlines() if '| speed-up |' in line}
  assert rows['| `hf_compare`'].endswith('| **under load** (40% of the cores to others) |')
  assert rows['| `finetune`'].endswith('| quiet |')
  assert rows['| `pretrain`'].endswith('| load not recorded |')
  assert 'python benchmarks/run_all.py --only=hf_compare\n' in text


def test_roofline_quick_runs(tmp_path):
  """The roofline script measures the matmul, the bandwidth and the step side by side and
  reports MFU and the elementwise parts' bandwidth fractions (tiny shapes: not a timed test)."""
  result, stdout = run_script('roofline.py', '--quick', '--dtypes=float32', tmp_path=tmp_path)
  names = [f['name'] for f in result['figures']]
  assert 'attainable float32 matmul' in names and 'memory bandwidth (x * a + b)' in names
  mfu = next(f for f in result['figures'] if f['name'].startswith('MFU'))
  assert 0 < mfu['value'] < 100 and mfu['unit'] == '%'
  step = result['steps']['tiny/32 float32']
  assert step['flops']['total'] > 0 and step['xla_flops'] > 0
  assert 'MFU' in stdout and 'softmax / bandwidth' in stdout


@pytest.mark.slow  # ~60 s: compiles the accelerator's and the roofline's tiny steps
def test_gpu_sh_smoke_runs_on_cpu(tmp_path):
  proc = subprocess.run(['bash', os.path.join('benchmarks', 'gpu.sh'), '--smoke'], cwd=ROOT,
                        env=dict(os.environ, OUT=str(tmp_path)), capture_output=True, text=True,
                        timeout=600, check=False)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  for name in ('accelerator.json', 'roofline.json'):
    with open(tmp_path / name) as f:
      assert json.load(f)['figures']
  assert 'tiny/32 bfloat16' in proc.stdout


# ~3 min: three 2-step runs of the main job's `none` cell (prepare; before, HEAD exported with
# git archive; after, the working tree)
@pytest.mark.slow
def test_main_job_times_its_phases_before_and_after(tmp_path):
  sys.path.insert(0, ROOT)
  from benchmarks import run_all  # pylint: disable=g-import-not-at-top
  script, _, quick = run_all.BENCHMARKS['main_job']
  out = tmp_path / 'main_job.json'
  proc = subprocess.run([sys.executable, os.path.join('benchmarks', script), *quick,
                         f'--json={out}'], cwd=ROOT, capture_output=True, text=True,
                        timeout=900, check=False)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  result = json.loads(out.read_text())
  assert [r[:2] for r in result['rows']] == [['none', 'before'], ['none', 'after']]
  assert all(float(c) >= 0 for r in result['rows'] for c in r[2:])
  assert all(f['value'] > 0 for f in result['figures']) and len(result['figures']) == 3
