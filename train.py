"""Trains a RoFormer classifier.

  python train.py --config=configs/default.py --workdir=/tmp/run --config.model.position=alibi

Resumes automatically from the newest checkpoint in --workdir. A bad config or flag ends with
status 2 and one paragraph naming the problem and the fix (experiments/cli.py), before the
workdir is touched.
"""

from absl import flags
from ml_collections import config_flags

from experiments import cli
from training import carry
from training import distributed
from training import trainer
from training.config import run_config

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', 'configs/default.py', 'Training config file.',
                                lock_config=True)
flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics and logs.',
                    required=True)
distributed.define_flags()


def main(_):
  distributed.initialize_from_flags()
  # The flags' ConfigDict, with the model fields of train.init_from's run that the command line
  # does not set (training/carry.py), typed and checked.
  config = run_config(carry.with_source_model(
      FLAGS.config, config_flags.get_override_values(FLAGS['config'])))
  trainer.setup_runtime(config, quiet=not FLAGS['verbosity'].present)
  trainer.train_and_evaluate(config, FLAGS.workdir)


if __name__ == '__main__':
  cli.run(main)
