"""Drives a Cloud TPU VM slice (or several: multi-slice) from your laptop through ``gcloud``.

  python scripts/tpu.py create  --name=NAME --zone=ZONE --accelerator_type=v5litepod-16 [--spot]
                                [--queued] [--num_slices=N] [--runtime_version=...]
  python scripts/tpu.py copy    --name=NAME --zone=ZONE [--allow_dirty]
  python scripts/tpu.py install --name=NAME --zone=ZONE [--python=python3]
  python scripts/tpu.py run     --name=NAME --zone=ZONE --workdir=gs://BUCKET/run \
                                [--config=configs/default.py] -- --config.model.size=base ...
  python scripts/tpu.py logs    --name=NAME --zone=ZONE --workdir=gs://BUCKET/run [--worker=0]
  python scripts/tpu.py delete  --name=NAME --zone=ZONE [--queued]
  python scripts/tpu.py all     ...   # create, (wait,) copy, install, run

Every step prints its commands (``shlex.join``: copy and paste them) and runs them; with
``--dry_run`` it only prints them, and then needs neither gcloud nor anything of the TPU (it
reads the commit with ``git rev-parse HEAD`` and checks ``git status``). ``--project`` is passed
on; the flags a step does not use are ignored, so one set of flags serves every step.

* create: ``tpu-vm create`` (the Create Node API: it fails at once when there is no capacity), or
  with ``--queued`` a queued resource that waits for capacity. ``--num_slices=N`` (N > 1:
  multi-slice, always queued) makes nodes ``NAME-0`` ... ``NAME-<N-1>``, and every later step
  targets all of them. The runtime defaults to the TPU software version Google lists for JAX on
  the generation (``RUNTIMES``); ``--runtime_version`` overrides it.
* copy: the same commit on every worker: ``git archive`` of HEAD (a tree with uncommitted
  changes is refused without ``--allow_dirty``: those would not be copied), copied to every worker
  and unpacked into ``~/roformer-jax``, replacing what was there, with the commit in
  ``~/roformer-jax/COMMIT``.
* install: ``pip install -r requirements-tpu.txt`` on every worker. The pinned JAX needs Python
  >= 3.11: on an image whose ``python3`` is older, install one and pass ``--python`` (it is checked
  first, with a message).
* run: ``train.py`` started detached (``nohup``) on every worker, so that it outlives the ssh
  session; the arguments after ``--`` are passed on to train.py. Each worker writes stdout and
  stderr to ``worker-<hostname>.log``: with a ``gs://`` workdir in ``~/roformer-jax/logs/`` on
  the worker, copied to ``WORKDIR/logs/`` (``gcloud storage cp``) when train.py ends, however it
  ends; with a local workdir (absolute or ``~/...``, outside ``~/roformer-jax``, which ``copy``
  replaces) directly in ``WORKDIR/logs/``.
* logs: follows one worker's log (``--worker``, default 0; ``--slice`` for multi-slice).
* delete: deletes the TPU VM, or the queued resource with its nodes.

A user error (unknown accelerator type, a dirty tree, a relative local workdir, gcloud missing)
ends with status 2 and one paragraph; a gcloud command that fails ends the step with its status.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from typing import NoReturn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REMOTE_DIR = '~/roformer-jax'
# https://cloud.google.com/tpu/docs/runtimes: the TPU software version for PyTorch and JAX.
RUNTIMES = {'v4': 'tpu-ubuntu2204-base', 'v5p': 'v2-alpha-tpuv5',
            'v5litepod': 'v2-alpha-tpuv5-lite', 'v6e': 'v2-alpha-tpuv6e'}
ACCELERATOR = re.compile(r'^(v4|v5p|v5litepod|v6e)-([1-9][0-9]*)$')
MIN_PYTHON = (3, 11)  # jax 0.10 (requirements.txt)
POLL_S = 30
EXIT_STATUS = 2
STEPS = ('create', 'copy', 'install', 'run', 'logs', 'delete', 'all')
Command = list[str]


class UsageError(Exception):
  """Bad flags or a state of the repository the step cannot work from."""


def fail(message: object) -> NoReturn:
  """experiments/cli.py's one-paragraph format, not imported from there: that would import JAX,
  which the laptop that drives the TPU need not have."""
  sys.stdout.flush()
  print(f'tpu.py: error: {" ".join(str(message).split())}', file=sys.stderr, flush=True)
  sys.exit(EXIT_STATUS)


def parse_args(argv: list[str]) -> argparse.Namespace:
  extra = argv[argv.index('--') + 1:] if '--' in argv else []
  argv = argv[:argv.index('--')] if '--' in argv else argv
  common = argparse.ArgumentParser(add_help=False)
  add = common.add_argument
  add('--name', required=True, help='TPU VM (or queued resource) name; multi-slice: node prefix.')
  add('--zone', required=True, help='Zone, e.g. us-central2-b.')
  add('--project', default=None, help="Google Cloud project (default: gcloud's).")
  add('--accelerator_type', default=None,
      help='v4-N, v5litepod-N (v5e), v5p-N or v6e-N, e.g. v5litepod-16 (create, all).')
  add('--runtime_version', default=None, help='TPU software version (default: per generation).')
  add('--spot', action='store_true', help='Spot TPU VMs (cheaper, preemptible).')
  add('--queued', action='store_true', help='Create through a queued resource.')
  add('--num_slices', type=int, default=1, help='Slices (> 1: multi-slice, queued).')
  add('--workdir', default=None, help='train.py --workdir: gs://... or an absolute path.')
  add('--config', default='configs/default.py', help='train.py --config.')
  add('--python', default='python3', help='Python on the workers (>= 3.11).')
  add('--allow_dirty', action='store_true', help='Copy HEAD although the tree has changes.')
  add('--repo', default=ROOT, help='The git repository to copy (default: this one).')
  add('--worker', default='0', help='logs: the worker whose log to follow.')
  add('--slice', type=int, default=0, help='logs: the slice (multi-slice).')
  add('--dry_run', action='store_true', help='Only print the commands.')
  parser = argparse.ArgumentParser(prog='tpu.py', description=__doc__.split('\n')[0],
                                   epilog='Arguments after -- are passed on to train.py.')
  steps = parser.add_subparsers(dest='step', required=True, metavar='{' + ','.join(STEPS) + '}')
  for step in STEPS:
    steps.add_parser(step, parents=[common])
  args = parser.parse_args(argv)
  args.train_args = extra
  if extra and args.step not in ('run', 'all'):
    raise UsageError(f'the arguments after -- ({shlex.join(extra)}) are for train.py: only the '
                     f'steps run and all take them, not {args.step}.')
  if args.num_slices < 1:
    raise UsageError(f'--num_slices={args.num_slices}: a slice count is at least 1.')
  args.queued = args.queued or args.num_slices > 1  # multi-slice exists only as queued resources
  return args


def runtime_version(args: argparse.Namespace) -> str:
  match = ACCELERATOR.match(args.accelerator_type or '')
  if not match:
    raise UsageError(
        f'unknown accelerator type {args.accelerator_type!r}: give --accelerator_type as '
        'v4-<cores>, v5litepod-<chips> (TPU v5e), v5p-<cores> or v6e-<chips>, e.g. v4-32, '
        'v5litepod-16, v5p-8, v6e-8 (`gcloud compute tpus accelerator-types list --zone=ZONE` '
        'lists what a zone offers).')
  return args.runtime_version or RUNTIMES[match.group(1)]


def gcloud(args: argparse.Namespace, *words: str) -> Command:
  project = [f'--project={args.project}'] if args.project else []
  return ['gcloud', 'compute', 'tpus', *words, f'--zone={args.zone}', *project]


def nodes(args: argparse.Namespace) -> list[str]:
  """The TPU VMs: a multi-slice queued resource names its nodes <prefix>-0, <prefix>-1, ..."""
  if args.num_slices > 1:
    return [f'{args.name}-{i}' for i in range(args.num_slices)]
  return [args.name]


def ssh(args: argparse.Namespace, node: str, command: str, worker: str = 'all') -> Command:
  return gcloud(args, 'tpu-vm', 'ssh', node, f'--worker={worker}', f'--command={command}')


def create_commands(args: argparse.Namespace) -> list[Command]:
  runtime = runtime_version(args)
  spot = ['--spot'] if args.spot else []
  if not args.queued:
    return [gcloud(args, 'tpu-vm', 'create', args.name,
                   f'--accelerator-type={args.accelerator_type}', f'--version={runtime}', *spot)]
  if args.num_slices > 1:
    target = [f'--node-count={args.num_slices}', f'--node-prefix={args.name}']
  else:
    target = [f'--node-id={args.name}']
  return [gcloud(args, 'queued-resources', 'create', args.name, *target,
                 f'--accelerator-type={args.accelerator_type}', f'--runtime-version={runtime}',
                 *spot)]


def wait_until_active(args: argparse.Namespace) -> None:
  """A queued resource is created at once but its nodes only once capacity is found: the steps
  after create need them."""
  describe = gcloud(args, 'queued-resources', 'describe', args.name, '--format=value(state.state)')
  print(f'{shlex.join(describe)}  # every {POLL_S} s until it prints ACTIVE', flush=True)
  if args.dry_run:
    return
  last = None
  while True:
    result = run_command(describe, capture=True)
    state = result.stdout.strip()
    if state != last:
      print(f'{args.name}: {state}', flush=True)
      last = state
    if state == 'ACTIVE':
      return
    if state in ('FAILED', 'SUSPENDING', 'SUSPENDED'):
      shown = shlex.join(c for c in describe if not c.startswith('--format'))
      sys.exit(f'tpu.py: queued resource {args.name} is {state}: see `{shown}`')
    time.sleep(POLL_S)


def git(args: argparse.Namespace, *words: str) -> str:
  try:
    result = subprocess.run(['git', '-C', args.repo, *words], capture_output=True, text=True)
  except FileNotFoundError:
    raise UsageError('git is not installed: copy sends a git commit.') from None
  if result.returncode:
    raise UsageError(f'`git {" ".join(words)}` in {args.repo} failed ({result.stderr.strip()}): '
                     'copy sends a commit of a git repository (--repo).')
  return result.stdout.strip()


def copy_commands(args: argparse.Namespace) -> list[Command]:
  changes = git(args, 'status', '--porcelain')
  if changes and not args.allow_dirty:
    raise UsageError(
        f'{args.repo} has uncommitted changes ({len(changes.splitlines())} files, e.g. '
        f'{changes.splitlines()[0].strip()!r}): copy sends the commit HEAD only, so the workers '
        'would not run what is on your disk. Commit (or stash) them, or pass --allow_dirty to '
        'send HEAD anyway.')
  sha = git(args, 'rev-parse', 'HEAD')
  archive = f'/tmp/roformer-{sha}.tar.gz'
  remote = f'~/roformer-{sha}.tar.gz'
  unpack = (f'rm -rf {REMOTE_DIR} && mkdir -p {REMOTE_DIR} && tar -xzf {remote} -C {REMOTE_DIR} '
            f'&& rm {remote} && echo {sha} > {REMOTE_DIR}/COMMIT')
  commands = [['git', '-C', args.repo, 'archive', '--format=tar.gz', '-o', archive, sha]]
  for node in nodes(args):
    commands.append(gcloud(args, 'tpu-vm', 'scp', archive, f'{node}:', '--worker=all'))
    commands.append(ssh(args, node, unpack))
  return commands


def install_commands(args: argparse.Namespace) -> list[Command]:
  python = shell_path(args.python)
  # Fails with a message (not pip's 'no matching distribution') on an image's older python3.
  check = shlex.quote(f'import sys; sys.exit(sys.version_info < {MIN_PYTHON} and "tpu.py: '
                      f'requirements-tpu.txt needs Python >= {".".join(map(str, MIN_PYTHON))}, '
                      f'this is " + sys.version + ": install one and pass --python")')
  command = (f'cd {REMOTE_DIR} && {python} -c {check} && '
             f'{python} -m pip install -r requirements-tpu.txt')
  return [ssh(args, node, command) for node in nodes(args)]


def shell_path(path: str) -> str:
  """A path for the worker's shell: quoted, with a leading ~/ as $HOME (a ~ after = is expanded
  by some shells only)."""
  if path.startswith('~/'):
    return '"$HOME"/' + shlex.quote(path[2:])
  return shlex.quote(path)


def log_dir(args: argparse.Namespace) -> str:
  """Where the workers write their logs (a shell word): a local workdir's logs/, else beside the
  code (a gs:// workdir is no file a shell can append to)."""
  if not args.workdir:
    raise UsageError(f'{args.step} needs --workdir (gs://BUCKET/run, or an absolute path on the '
                     'workers).')
  if '://' in args.workdir:
    return shell_path(f'{REMOTE_DIR}/logs')
  if not args.workdir.startswith(('/', '~/')):
    raise UsageError(f'--workdir={args.workdir} is relative: on the workers it would be inside '
                     f'{REMOTE_DIR}, which copy replaces. Give gs://BUCKET/run, or an absolute '
                     'path or one under ~/ outside it.')
  return shell_path(args.workdir.rstrip('/') + '/logs')


def run_commands(args: argparse.Namespace) -> list[Command]:
  logs = log_dir(args)
  train = ' '.join([shell_path(args.python), 'train.py', shlex.quote(f'--config={args.config}'),
                    '--workdir=' + shell_path(args.workdir),
                    *map(shlex.quote, args.train_args)])
  job = f'{train} > "$LOG" 2>&1'
  if '://' in args.workdir:
    # Also after a failure or a preemption's clean exit: that log is the one worth reading.
    target = shlex.quote(args.workdir.rstrip('/') + '/logs/')
    job += f'; status=$?; gcloud storage cp "$LOG" {target}; exit $status'
  # nohup and no open stdin/stdout: the job survives the end of the ssh session.
  command = (f'cd {REMOTE_DIR} && mkdir -p {logs} && export LOG={logs}/worker-"$(hostname)".log '
             f'|| exit 1; nohup bash -c {shlex.quote(job)} > /dev/null 2>&1 < /dev/null & '
             'echo "$(hostname): train.py started (COMMIT $(cat COMMIT)), log $LOG"')
  return [ssh(args, node, command) for node in nodes(args)]


def logs_commands(args: argparse.Namespace) -> list[Command]:
  if not 0 <= args.slice < args.num_slices:
    raise UsageError(f'--slice={args.slice}: there are {args.num_slices} slices (0 to '
                     f'{args.num_slices - 1}).')
  log = f'{log_dir(args)}/worker-"$(hostname)".log'
  return [ssh(args, nodes(args)[args.slice], f'tail -n +1 -f {log}', worker=args.worker)]


def delete_commands(args: argparse.Namespace) -> list[Command]:
  if args.queued:  # --force: its nodes too
    return [gcloud(args, 'queued-resources', 'delete', args.name, '--force', '--quiet')]
  return [gcloud(args, 'tpu-vm', 'delete', args.name, '--quiet')]


def run_command(command: Command, capture: bool = False) -> subprocess.CompletedProcess:
  try:
    result = subprocess.run(command, capture_output=capture, text=True)
  except FileNotFoundError:
    raise UsageError(f'{command[0]} is not installed (or not on PATH): install the Google Cloud '
                     'CLI (https://cloud.google.com/sdk/docs/install) and run `gcloud auth '
                     'login`, or pass --dry_run to only print the commands.') from None
  if result.returncode:
    if capture:
      sys.stderr.write(result.stderr)
    print(f'tpu.py: `{shlex.join(command)[:300]}` failed with status {result.returncode}.',
          file=sys.stderr, flush=True)
    sys.exit(result.returncode)
  return result


def execute(commands: list[Command], dry_run: bool) -> None:
  for command in commands:
    print(shlex.join(command), flush=True)
    if not dry_run:
      run_command(command)


def main(argv: list[str]) -> None:
  args = parse_args(argv)
  # Checked before anything runs: a flag error never leaves a TPU half set up.
  plans = {'create': create_commands, 'copy': copy_commands, 'install': install_commands,
           'run': run_commands, 'logs': logs_commands, 'delete': delete_commands}
  if args.step != 'all':
    execute(plans[args.step](args), args.dry_run)
    return
  create, copy = create_commands(args), copy_commands(args)
  install, run = install_commands(args), run_commands(args)
  execute(create, args.dry_run)
  if args.queued:
    wait_until_active(args)
  for commands in (copy, install, run):
    execute(commands, args.dry_run)


if __name__ == '__main__':
  try:
    main(sys.argv[1:])
  except UsageError as e:
    fail(e)
