"""Runs a trained workdir on new texts and writes one JSON line per example.

  python predict.py --workdir=runs/finetune --input=texts.txt --output=predictions.jsonl

The input is text (one example a line; pairs: the two texts separated by a tab), JSONL, CSV or
TSV (the run's ``data.text_column`` / ``data.text_b_column``). Each output line holds the
predicted ``label`` and the ``probabilities`` of every class, in input order
(training/prediction.py). A bad argument ends with status 2 and one paragraph (experiments/cli.py).
"""

from absl import flags
from absl import logging

from experiments import cli
from training import outputs
from training import prediction

FLAGS = flags.FLAGS
flags.DEFINE_string('workdir', None, 'The train.py workdir to predict with.', required=True)
flags.DEFINE_string('input', None, 'Texts: .txt, .jsonl, .csv or .tsv (optionally .gz).',
                    required=True)
flags.DEFINE_string('output', None, 'Where to write the JSON lines.', required=True)
flags.DEFINE_string('checkpoint', 'best', "'best' (validation accuracy), 'latest' or a step.")
flags.DEFINE_integer('batch_size', 64, 'Examples per batch.')


def main(_):
  if FLAGS.batch_size <= 0:
    raise ValueError(f'--batch_size={FLAGS.batch_size} must be > 0.')
  outputs.check([FLAGS.output], '--output', inputs=[FLAGS.input], workdir=FLAGS.workdir)
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  count = prediction.write_predictions(
      prediction.predict(FLAGS.workdir, FLAGS.input, checkpoint=FLAGS.checkpoint,
                         batch_size=FLAGS.batch_size), FLAGS.output)
  print(f'wrote {count} predictions to {FLAGS.output}')


if __name__ == '__main__':
  cli.run(main)
