"""Runs a position-scheme ablation grid and writes the report (report.md, results.csv/json,
plots) into the workdir.

  python ablate.py --config=configs/ablation/probes.py --workdir=runs/probes

Finished runs are skipped, so rerunning the same command resumes an interrupted sweep;
--only=... runs a slice (glob patterns over run names, or i:j); --report_only rebuilds the
report from finished runs without training. A bad config or argument ends with status 2 and one
paragraph naming the problem and the fix (``training/cli.py``), before any run starts.
"""

import shlex
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from training import cli
from training import distributed

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', 'configs/ablation/probes.py', 'Ablation config.',
                                lock_config=True)
flags.DEFINE_string('workdir', None, 'Directory for all runs and the report.', required=True)
flags.DEFINE_string('only', '', "Run only these cells: glob patterns ('*/rotary,*/alibi') or "
                    "a slice ('0:7').")
flags.DEFINE_bool('report_only', False, 'Rebuild the report from finished runs; no training.')

distributed.define_flags()


def check_grid(config) -> None:
  """Names in ``config.ablation`` that are not datasets, schemes or attention kinds: an error
  (a typo must not become a 'not applicable' row of the report)."""
  if 'ablation' not in config:
    raise ValueError('The --config file has no `ablation` group, so it is not an ablation config: '
                     'use one of configs/ablation/*.py (train.py trains a single model).')
  import data  # pylint: disable=g-import-not-at-top
  import models  # pylint: disable=g-import-not-at-top
  from models import config as model_config  # pylint: disable=g-import-not-at-top
  from training import ablation  # pylint: disable=g-import-not-at-top
  from training import config_checks  # pylint: disable=g-import-not-at-top
  a = config.ablation
  for field, value, valid in (
      ('datasets', a.datasets, data.DATASET_NAMES),
      ('positions', a.positions, tuple(models.SCHEMES)),
      ('attentions', a.attentions, model_config.ATTENTION_KINDS)):
    names = ablation._split(value)  # pylint: disable=protected-access
    if not names:
      raise ValueError(f'ablation.{field} is empty: list at least one of {", ".join(valid)}.')
    unknown = [n for n in names if n not in valid]
    if unknown:
      raise ValueError(f'ablation.{field} names {", ".join(map(repr, unknown))}, not among '
                       f'the valid {", ".join(valid)}; fix --config.ablation.{field}.')
  try:
    [int(x) for x in ablation._split(a.max_lengths)]  # pylint: disable=protected-access
  except ValueError:
    raise ValueError(f'ablation.max_lengths={a.max_lengths!r} must be comma-separated integers '
                     '(or empty).') from None
  # The fields all runs share (steps, batch, optimizer, data): an error here is the config's,
  # not a 'not applicable' cell.
  for cell in ablation.grid(config):
    config_checks.validate_run_fields(ablation.cell_config(config, cell))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  check_grid(FLAGS.config)
  import training  # pylint: disable=g-import-not-at-top
  from training import ablation  # pylint: disable=g-import-not-at-top
  cells = ablation.select(ablation.grid(FLAGS.config), FLAGS.only)  # a bad --only fails here
  distributed.initialize_from_flags()
  command = 'python ' + ' '.join(shlex.quote(a) for a in sys.argv)
  if FLAGS.report_only:
    print(ablation.build_report(FLAGS.config, FLAGS.workdir, cells, command=command))
    return
  training.setup_runtime(FLAGS.config, quiet=not FLAGS['verbosity'].present)
  print(ablation.run_grid(FLAGS.config, FLAGS.workdir, only=FLAGS.only, command=command))


if __name__ == '__main__':
  cli.run(main)
