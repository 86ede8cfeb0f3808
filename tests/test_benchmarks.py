"""Smoke tests of the benchmark scripts (tiny sizes; they check that the scripts run, not speed)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(name, *args, tmp_path):
  out = os.path.join(str(tmp_path), f'{name}.json')
  proc = subprocess.run([sys.executable, os.path.join('benchmarks', name), *args, f'--json={out}'],
                        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
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
  proc = subprocess.run(
      [sys.executable, os.path.join('benchmarks', 'profile_step.py'), '--size=tiny',
       '--length=32', '--batch_size=2', '--steps=1', '--compare=none', f'--out={tmp_path}'],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  rows = {line.split('  ')[0]: line.split() for line in proc.stdout.splitlines()}
  position = rows['position scheme (rope, bias, tables)']
  assert float(position[-5]) > 0 and float(position[-4]) == 0  # rotary ms, none ms
  for part in ('softmax attention', 'feed-forward', 'QKV projection', 'optimizer (AdamW, grad norm)'):
    assert part in rows, proc.stdout
  assert os.path.exists(tmp_path / 'rotary' / 'train_step.hlo.txt')
