"""`pip install -e .` on a clean copy of the tracked files works, and the installed packages import
from anywhere."""

import os
import shutil
import site
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pip_install_editable_on_a_clean_copy(tmp_path):
  tracked = subprocess.run(['git', 'ls-files', '-z'], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split('\0')
  clone = tmp_path / 'clone'
  for name in filter(None, tracked):
    if os.path.isfile(os.path.join(ROOT, name)):
      os.makedirs(clone / os.path.dirname(name), exist_ok=True)
      shutil.copy2(os.path.join(ROOT, name), clone / name)
  # A new venv that sees this interpreter's packages (the dependencies, also when this
  # interpreter is itself a venv's) through a .pth file.
  subprocess.run([sys.executable, '-m', 'venv', str(tmp_path / 'venv')], check=True)
  python = str(tmp_path / 'venv' / 'bin' / 'python')
  venv_site = subprocess.run([python, '-c', 'import site; print(site.getsitepackages()[0])'],
                             capture_output=True, text=True, check=True).stdout.strip()
  with open(os.path.join(venv_site, 'outer.pth'), 'w') as f:
    f.write('\n'.join(site.getsitepackages()) + '\n')
  # Offline: the dependencies are checked by importing below, not fetched.
  install = subprocess.run([python, '-m', 'pip', 'install', '-q', '--no-build-isolation',
                            '--no-deps', '--no-index', '--disable-pip-version-check', '-e',
                            str(clone)], capture_output=True, text=True, timeout=600)
  assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
  check = subprocess.run(
      [python, '-c', 'import importlib.util, train, rope, models, data, training, experiments, '
       'configs.ablation.probes, projects.chomsky, projects.lra.configs.text; '
       'print(rope.__file__); '
       'assert all(importlib.util.find_spec(m) for m in ("eval", "ablate", "predict"))'],
      cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert check.returncode == 0, check.stderr[-3000:]
  assert check.stdout.strip().startswith(str(clone))
