"""The entry points' error handling: a problem the user can fix is one paragraph on stderr.

``cli.run(main)`` replaces ``absl.app.run(main)``. Bad flags, a config file that is missing, is not
valid Python or defines no ``get_config``, an override of the wrong type or a misspelt one, and
the errors this project raises for bad input or a failed run (``ValueError``, ``OSError`` such as
a missing file or a full disk, a busy workdir, an unusable checkpoint, a NaN loss) end the program
with ``EXIT_STATUS`` (2) and ``<program>: error: <message>``, a message that names the problem and
the fix, without a traceback. ``--verbosity=1`` (or higher) also prints the traceback. Anything
else (a bug) keeps its traceback. A preempted run (SIGTERM) still exits 0.
"""

from __future__ import annotations

import ast
import errno
import os
import sys
import traceback
from typing import Callable, NoReturn, Sequence

from absl import app
from absl import flags

EXIT_STATUS = 2
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OUR_PACKAGES = ('training', 'data', 'models', 'rope', 'analysis')
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _program() -> str:
  return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else 'python'


def paragraph(text: object) -> str:
  """``text`` on one line (a message that spans lines, as library messages do, is joined)."""
  return ' '.join(str(text).split())


def fail(message: object) -> NoReturn:
  """Prints ``<program>: error: <message>`` (one paragraph) on stderr and exits with status 2."""
  sys.stdout.flush()
  print(f'{_program()}: error: {paragraph(message)}', file=sys.stderr, flush=True)
  sys.exit(EXIT_STATUS)


# ---------------------------------------------------------------------------- config files
def _config_paths(argv: Sequence[str], names: Sequence[str]) -> list[tuple[str, str]]:
  """(flag, path) of every ``--<name>=PATH[:args]`` or ``--<name> PATH`` in argv."""
  out = []
  for i, arg in enumerate(argv):
    for name in names:
      for prefix in (f'--{name}=', f'-{name}='):
        if arg.startswith(prefix):
          out.append((name, arg[len(prefix):]))
      if arg in (f'--{name}', f'-{name}') and i + 1 < len(argv):
        out.append((name, argv[i + 1]))
  return [(name, value.split(':', 1)[0]) for name, value in out]


def _defines_get_config(tree: ast.Module) -> bool:
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == 'get_config':
      return True
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      if any((a.asname or a.name) == 'get_config' for a in node.names):
        return True
      if isinstance(node, ast.ImportFrom) and any(a.name == '*' for a in node.names):
        return True  # cannot tell; let the loader decide
    if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == 'get_config'
                                            for t in node.targets):
      return True
  return False


def check_config_files(argv: Sequence[str], names: Sequence[str] = ('config',)) -> None:
  """Fails clearly on a config file that does not exist, is not Python or lacks get_config().

  Checked without running the file (it is Python, and runs as code when the flags are parsed).
  """
  for name, path in _config_paths(argv, names):
    if not path:
      fail(f'--{name} is empty: pass a config file, e.g. --{name}=configs/default.py.')
    if not os.path.isfile(path):
      fail(f'The config file {path!r} (--{name}) does not exist (looked in {os.getcwd()}). Pass '
           f'an existing file, e.g. --{name}=configs/default.py; configs/ has the presets.')
    try:
      with open(path, 'rb') as f:
        tree = ast.parse(f.read(), filename=path)
    except (SyntaxError, ValueError) as e:
      where = f' (line {e.lineno})' if getattr(e, 'lineno', None) else ''
      fail(f'The config file {path} (--{name}) is not valid Python{where}: '
           f'{getattr(e, "msg", e)}. Fix it; configs/default.py shows the expected form.')
    except OSError as e:
      fail(f'The config file {path} (--{name}) cannot be read: {e}.')
    if not _defines_get_config(tree):
      fail(f'The config file {path} (--{name}) does not define get_config(). A config file is '
           'a Python module whose get_config() returns an ml_collections.ConfigDict; see '
           'configs/default.py.')


def _last_line(text: str) -> str:
  lines = [line.strip() for line in str(text).splitlines() if line.strip()]
  return lines[-1] if lines else ''


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing with the config files checked first and one-paragraph errors."""
  check_config_files(argv)
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    if 'Error whilst parsing config file' in str(e):
      fail(f'The config file raised {_last_line(e)} in get_config(); fix it (configs/default.py '
           'shows the expected form).')
    fail(f'{_last_line(e) if "Traceback" in str(e) else e}. Run {_program()} --helpfull for the '
         'flags; config fields are overridden as --config.<group>.<field>=<value>, with a value '
         'of the field\'s type (see configs/default.py).')
  except Exception as e:  # pylint: disable=broad-except  (an override or the config file)
    if 'Traceback' in str(e):
      detail = _last_line(e)
    elif isinstance(e, (KeyError, AttributeError)) and e.args:  # e.g. a misspelt field name
      text = e.args[0]
      while isinstance(text, BaseException) and text.args:
        text = text.args[0]
      if isinstance(text, str) and len(text) > 1 and text[0] == text[-1] and text[0] in '"\'':
        try:
          text = ast.literal_eval(text)
        except (ValueError, SyntaxError):
          pass
      detail = f'{type(e).__name__}: {paragraph(text)}'
    else:
      detail = f'{type(e).__name__}: {paragraph(e)}'
    fail(f'Loading the config failed ({detail}). Each --config.<group>.<field>=<value> override '
         'must name an existing field (configs are locked; see configs/default.py) with a value '
         'of its type; otherwise fix the config file.')


# ---------------------------------------------------------------------------- run
def _is_ours(e: BaseException) -> bool:
  """Raised by this project's code (its message was written for users), not deep in a library."""
  if type(e).__module__.split('.')[0] in _OUR_PACKAGES:
    return True
  frames = traceback.extract_tb(e.__traceback__)
  if not frames:
    return False
  last = os.path.abspath(frames[-1].filename)
  return last.startswith(ROOT + os.sep) and '/site-packages/' not in last


def describe(e: BaseException) -> str:
  """The user-facing paragraph for a handled error."""
  message = paragraph(e) or type(e).__name__
  if isinstance(e, OSError) and e.errno in _DISK_ERRNOS:
    return (f'{message}. The disk (or quota) is full or read-only: free space and rerun the '
            'same command; a training run resumes from its newest intact checkpoint.')
  if isinstance(e, OSError) and not _is_ours(e):
    return f'{type(e).__name__}: {message}.'
  if not _is_ours(e):
    return (f'{type(e).__name__}: {message} (raised inside a library; rerun with --verbosity=1 '
            'for the traceback).')
  return message


def handled(e: BaseException) -> bool:
  """Errors turned into a message: ValueError, OSError, and this project's RuntimeErrors."""
  if isinstance(e, (ValueError, OSError)):
    return True
  return isinstance(e, RuntimeError) and type(e).__module__.split('.')[0] in _OUR_PACKAGES


def _verbose() -> bool:
  try:
    return flags.FLAGS['verbosity'].present and flags.FLAGS.verbosity >= 1
  except (KeyError, flags.Error):
    return False


def run(main: Callable[[list[str]], object]) -> None:
  """``absl.app.run(main)`` with the error handling of this module."""

  def wrapped(argv: list[str]) -> object:
    try:
      return main(argv)
    except KeyboardInterrupt:
      print(f'{_program()}: interrupted. Rerun the same command to resume.', file=sys.stderr,
            flush=True)
      sys.exit(130)
    except Exception as e:  # pylint: disable=broad-except
      if not handled(e):
        raise
      if _verbose():
        traceback.print_exc()
      fail(describe(e))

  app.run(wrapped, flags_parser=parse_flags)
