"""Runs a position-scheme ablation grid and writes the report (report.md, results.csv/json,
plots) into the workdir.

  python ablate.py --config=configs/ablation/probes.py --workdir=runs/probes
  python ablate.py --config=projects/extend/configs/probes.py --workdir=runs/extend  # RoPE scaling

A config with a ``pretrain`` group (``projects/two_stage/configs/manpages.py``) pre-trains every scheme,
fine-tunes each and trains it from scratch as the control (``projects/two_stage/grid.py``).

A config with an ``extend`` group (``projects/extend/configs/probes.py``) trains one rotary model and
evaluates it at longer lengths under each RoPE scaling variant (``projects/extend/grid.py``).

Finished runs are skipped, so rerunning the same command resumes an interrupted sweep (a finished
run made with another config or data is an error, or with --fresh is moved aside and rerun);
--only=... runs a slice (glob patterns over run names, or i:j); --report_only rebuilds the
report from finished runs without training. A bad config or argument ends with status 2 and one
paragraph naming the problem and the fix (experiments/cli.py), before any run starts.
"""

import os
import shlex
import sys
import time

from absl import flags
from ml_collections import config_flags

from experiments import ablation
from experiments import cli
from experiments import report
import storage
from training import distributed
from training import trainer

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', 'configs/ablation/probes.py', 'Ablation config.',
                                lock_config=True)
flags.DEFINE_string('workdir', None, 'Directory for all runs and the report.', required=True)
flags.DEFINE_string('only', '', "Run only these cells: glob patterns ('*/rotary,*/alibi') or "
                    "a slice ('0:7').")
flags.DEFINE_bool('report_only', False, 'Rebuild the report from finished runs; no training.')
flags.DEFINE_bool('fresh', False, 'Train again the finished runs whose config or data changed '
                  '(their folders are moved aside to <run>.stale-N); without it they are an error.')
distributed.define_flags()


def main(_):
  command = 'python ' + ' '.join(shlex.quote(a) for a in sys.argv)
  if FLAGS.report_only and not storage.exists(FLAGS.workdir):  # a typo would write an empty report
    raise ValueError(f'--report_only: {FLAGS.workdir} does not exist, so it holds no finished '
                     'runs to report; check the path (nothing was written).')
  grid = ablation.grid_kind(FLAGS.config)  # a project's (two-stage, extension) or the ablation
  cells = grid.cells(FLAGS.config, FLAGS.workdir, FLAGS.only)
  distributed.initialize_from_flags()
  if FLAGS.report_only and grid.report:
    md = grid.report(FLAGS.config, FLAGS.workdir, cells, command=command)
    print(report.terminal_summary(md, os.path.join(FLAGS.workdir, 'report.md')))
    return
  trainer.setup_runtime(FLAGS.config, quiet=not FLAGS['verbosity'].present)
  started = time.perf_counter()
  md = grid.run(FLAGS.config, FLAGS.workdir, cells, command=command, fresh=FLAGS.fresh)
  print(report.terminal_summary(md, os.path.join(FLAGS.workdir, 'report.md'),
                                time.perf_counter() - started))


if __name__ == '__main__':
  cli.run(main)
