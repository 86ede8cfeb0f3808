"""Evaluates a trained workdir, optionally at lengths beyond training.

  python eval.py --workdir=/tmp/run --eval_lengths=128,256
  python eval.py --workdir=/tmp/run --eval_lengths=256,1024 --override=rope.scaling=yarn \
      --override=rope.scaling_factor=16 --override=rope.original_max_length=64

A bad argument or workdir ends with status 2 and one paragraph naming the problem and the fix
(experiments/cli.py). The results are printed, then written to ``eval.json`` in the workdir (or
``--output``): the only file written, so a read-only or running workdir can be evaluated.
"""

from absl import flags
from absl import logging

from experiments import cli
from training import distributed
from training import evaluation
from training import outputs

FLAGS = flags.FLAGS
flags.DEFINE_string('workdir', None, 'The train.py workdir to evaluate.', required=True)
flags.DEFINE_string('checkpoint', 'best', "'best' (validation accuracy), 'latest' or a step.")
flags.DEFINE_string('split', 'test', 'Split evaluated at the training length.')
flags.DEFINE_string('eval_lengths', '', 'Comma-separated lengths to evaluate at, e.g. 128,256.')
flags.DEFINE_multi_string('override', [], 'group.field=value, repeatable: a config field that '
                          'leaves the parameters and how they are read alone (RoPE scaling: '
                          'rope.scaling, rope.scaling_factor, rope.original_max_length, ...; '
                          'data.max_length, model.attention_impl, train.eval_batch_size), e.g. '
                          'RoPE scaling for evaluation beyond the training length.')
flags.DEFINE_string('output', None, 'Where to write the results (default: WORKDIR/eval.json).')
distributed.define_flags()


def main(_):
  lengths = evaluation.parse_lengths(FLAGS.eval_lengths)  # before anything is loaded
  overrides = evaluation.parse_overrides(FLAGS.override)
  if FLAGS.output:
    outputs.check([FLAGS.output], '--output', workdir=FLAGS.workdir, own=(evaluation.EVAL_FILE,))
  distributed.initialize_from_flags()
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # library INFO logs (TFDS, orbax) off
  results = evaluation.evaluate_workdir(
      FLAGS.workdir, checkpoint=FLAGS.checkpoint, split=FLAGS.split, eval_lengths=lengths,
      overrides=overrides)
  print(evaluation.format_table(results), flush=True)
  print(f'wrote {evaluation.write_results(results, FLAGS.output)}')


if __name__ == '__main__':
  cli.run(main)
