"""Default config: a tiny RoFormer classifier on the embedded position probes.

Every field is declared, with its default, comment and role, once, in its group's dataclass:
``model``: models/config.py (ModelSettings), ``rope``: rope/config.py (RopeConfig), ``data``:
data/config.py (DataConfig), ``optim``, ``train`` and ``mesh``: training/config.py. This is the
ConfigDict generated from them, which ``--config.<group>.<field>=`` overrides; list-valued
fields are comma-separated text here (``--config.data.eval_lengths=256,512``).

Run:
  python train.py --config=configs/default.py --workdir=/tmp/run \
      --config.model.position=alibi --config.train.num_steps=500
"""

import ml_collections

from training import config


def get_config() -> ml_collections.ConfigDict:
  return config.defaults()
