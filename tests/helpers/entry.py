"""Runs a script of this repository (train.py, eval.py, ablate.py, predict.py, scripts/export_hf.py,
a benchmark) in the test process, as ``python <argv>`` would from the repository root: the same
argv, exit status, stdout and stderr, in a fraction of the time (no Python, JAX and TensorFlow
start-up per run).

The script runs as ``__main__`` through runpy, so its flags are defined and ``cli.run(main)``
parses them and handles its errors exactly as in a real process. What a process would throw away
at its exit is undone afterwards: the flags the script defined are deleted and absl's FLAGS
unparsed (two entry points define the same names), and sys.argv, the working directory,
os.environ, sys.path, the logging handlers and levels, JAX's compilation cache settings and
sys.unraisablehook are restored. Flags that modules of this repository imported by the tests
define (benchmarks/run_all.py) are set aside for the run. Output is captured at the file
descriptors (C++ logs included).

What differs from a real process: the modules the test process imported already are not
imported again, so import-time faults (a circular import) show only in the subprocess smoke
tests, one per entry point; JAX has started already, so $XLA_FLAGS (a simulated device count)
cannot take effect (cases that need one stay subprocesses); ``cli._exit`` does not wait for (or
``os._exit`` past) threads still running, which would end the test process; absl's one-time
start-up does not rename the process or re-enable faulthandler. An exception other than
SystemExit is printed as a traceback on the captured stderr with status 1, as Python would.
"""
# pylint: disable=protected-access  (absl's one-time start-up state, cli._exit)

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import runpy
import sys
import tempfile
import traceback
from typing import Iterator, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Result:
  """What subprocess.run(..., capture_output=True, text=True) gives, for the assertions."""
  returncode: int
  stdout: str
  stderr: str


@contextlib.contextmanager
def _captured() -> Iterator[list[str]]:
  """Redirects file descriptors 1 and 2 (and sys.stdout, sys.stderr onto them) to temporary
  files; yields a list that holds [stdout, stderr] once the block ends."""
  out: list[str] = []
  for stream in (sys.stdout, sys.stderr):
    stream.flush()
  saved_streams = sys.stdout, sys.stderr
  saved_fds = os.dup(1), os.dup(2)
  files = tempfile.TemporaryFile(), tempfile.TemporaryFile()
  try:
    os.dup2(files[0].fileno(), 1)
    os.dup2(files[1].fileno(), 2)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, 'w', closefd=False), encoding='utf-8',
                                  line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, 'w', closefd=False), encoding='utf-8',
                                  errors='backslashreplace', line_buffering=True)
    yield out
  finally:
    for stream in (sys.stdout, sys.stderr):
      with contextlib.suppress(Exception):
        stream.flush()
    sys.stdout, sys.stderr = saved_streams
    os.dup2(saved_fds[0], 1)
    os.dup2(saved_fds[1], 2)
    for fd in saved_fds:
      os.close(fd)
    for f in files:
      f.seek(0)
      out.append(f.read().decode('utf-8', errors='replace'))
      f.close()


@contextlib.contextmanager
def _restored(argv: Sequence[str], env: dict[str, str] | None) -> Iterator[None]:
  """The process state a run changes, put back as it was afterwards (see the module docstring)."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from experiments import cli  # pylint: disable=g-import-not-at-top

  fv = flags.FLAGS
  # Flags that a module of this repository defined when this process imported it (the tests
  # import benchmarks/run_all.py): another script's process would not have them, and may define
  # the same names (--only, --out). Set aside for the run.
  aside = [(module, flag) for module, flag_list in fv.flags_by_module_dict().items()
           if (getattr(sys.modules.get(module), '__file__', None) or '').startswith(ROOT + os.sep)
           for flag in flag_list]
  for _, flag in aside:
    delattr(fv, flag.name)
  defined = set(fv)
  saved = dict(
      argv=sys.argv, path=sys.path[:], cwd=os.getcwd(), environ=dict(os.environ),
      hook=sys.unraisablehook,
      handlers=logging.root.handlers[:], root_level=logging.root.level,
      absl_level=logging.getLogger('absl').level,
      absl_stream=absl_logging.get_absl_handler().python_handler.stream,
      jax={name: getattr(jax.config, name) for name in (
          'jax_compilation_cache_dir', 'jax_persistent_cache_min_compile_time_secs')},
      app=(app._run_init.done, app._register_and_parse_flags_with_usage.done),
      faulthandler=app.faulthandler, rename=app.command_name.make_process_name_useful,
      exit=cli._exit, was_parsed=fv.is_parsed())

  def exit_now(status: int):
    for stream in (sys.stdout, sys.stderr):
      stream.flush()
    sys.exit(status)

  # ml_collections loads a config file as the module '<flag>_config' with the deprecated
  # load_module(), which executes it into the module of that name if there is one: a file
  # without get_config() would get the previous file's.
  config_modules = lambda: [name for name in sys.modules if name.endswith('_config')
                            and '.' not in name]
  try:
    for name in config_modules():
      del sys.modules[name]
    sys.argv = list(argv)
    os.chdir(ROOT)
    if env:
      os.environ.update(env)
    # A real process's first and only app.run: the one-time set-up runs (absl's handler, its
    # help flags, verbosity 0 when not given), bar renaming the process and faulthandler.
    app._run_init.done = app._register_and_parse_flags_with_usage.done = False
    app.faulthandler = None
    app.command_name.make_process_name_useful = lambda: None
    absl_logging.get_absl_handler().python_handler.stream = sys.stderr
    cli._exit = exit_now
    yield
  finally:
    cli._exit = saved['exit']
    for name in config_modules():
      del sys.modules[name]
    app.faulthandler, app.command_name.make_process_name_useful = (saved['faulthandler'],
                                                                  saved['rename'])
    app._run_init.done, app._register_and_parse_flags_with_usage.done = saved['app']
    for name in set(fv) - defined:
      with contextlib.suppress(AttributeError):
        delattr(fv, name)
    fv.unparse_flags()
    for module, flag in aside:
      fv[flag.name] = flag
      fv.register_flag_by_module(module, flag)
    if saved['was_parsed']:
      fv.mark_as_parsed()
    for name, value in saved['jax'].items():
      if getattr(jax.config, name) != value:
        jax.config.update(name, value)
    absl_logging.get_absl_handler().python_handler.stream = saved['absl_stream']
    logging.root.handlers[:] = saved['handlers']
    logging.root.setLevel(saved['root_level'])
    logging.getLogger('absl').setLevel(saved['absl_level'])
    sys.unraisablehook = saved['hook']
    os.environ.clear()
    os.environ.update(saved['environ'])
    os.chdir(saved['cwd'])
    sys.argv = saved['argv']
    sys.path[:] = saved['path']


def run(argv: Sequence[str], env: dict[str, str] | None = None) -> Result:
  """``python *argv`` from the repository root, in this process; ``argv[0]`` is the script's path
  relative to the root. ``env`` is added to os.environ for the run (not $XLA_FLAGS: JAX has
  started)."""
  if env and 'XLA_FLAGS' in env:
    raise ValueError('$XLA_FLAGS cannot take effect in this process: run a subprocess')
  status = 0
  with _captured() as out:
    with _restored(argv, env):
      try:
        runpy.run_path(argv[0], run_name='__main__')  # the working directory is ROOT
      except SystemExit as e:
        if e.code is None:
          status = 0
        elif isinstance(e.code, int):
          status = e.code
        else:  # sys.exit('message'): printed, status 1
          print(e.code, file=sys.stderr)
          status = 1
      except BaseException:  # pylint: disable=broad-except  (as the interpreter would end)
        traceback.print_exc()
        status = 1
  return Result(status, out[0], out[1])
