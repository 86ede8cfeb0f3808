"""Training library: ``train_and_evaluate(config, workdir)`` and what it is made of."""

from training.config_checks import load_config
from training.trainer import (Experiment, NonFiniteLossError, setup_runtime,
                              train_and_evaluate)

__all__ = ['Experiment', 'NonFiniteLossError', 'load_config', 'setup_runtime',
           'train_and_evaluate']
