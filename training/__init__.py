"""Training library: ``train_and_evaluate(config, workdir)`` and what it is made of.

The names below are imported on first use, so that ``from training import cli`` (or
``config_checks``) does not load TensorFlow: the entry points check their flags and config in
seconds, before the data pipeline is imported.
"""

import importlib

_LAZY = {'Experiment': 'training.trainer', 'NonFiniteLossError': 'training.trainer',
         'setup_runtime': 'training.trainer', 'train_and_evaluate': 'training.trainer',
         'load_config': 'training.config_checks'}

__all__ = sorted(_LAZY)


def __getattr__(name):
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
