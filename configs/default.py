"""Default config: a tiny RoFormer classifier on the embedded position probes. Every field is
declared once, with its default and comment, in its group's dataclass (``model``: models/config.py,
``rope``: rope/config.py, ``data``: data/config.py, ``optim``, ``train``, ``mesh``:
training/config.py); list fields are comma-separated text here.

  python train.py --config=configs/default.py --workdir=/tmp/run --config.model.position=alibi
"""

import ml_collections

from training import config


def get_config() -> ml_collections.ConfigDict:
  return config.defaults()
