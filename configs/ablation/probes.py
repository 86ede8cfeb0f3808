"""The README's main job: all seven position schemes x 3 seeds on the embedded position probes,
evaluated at the training length and at 2x and 4x (length extrapolation). ~15 min on 2 CPU cores.

  python ablate.py --config=configs/ablation/probes.py --workdir=runs/probes
"""

import ml_collections

from configs import default

ALL_SCHEMES = 'none,sinusoidal,learned,shaw,t5,alibi,rotary'


def get_config():
  c = default.get_config()
  c.ablation = a = ml_collections.ConfigDict()
  a.positions = ALL_SCHEMES  # The field under study: model.position values (comma-separated).
  a.datasets = 'position_probes/order'  # data.name values, one table each.
  a.attentions = 'softmax'  # model.attention values (e.g. 'softmax,linear').
  a.max_lengths = ''  # data.max_length values ('' = data.max_length).
  a.num_seeds = 3  # Seeds per run, trained together in one vmapped step.
  a.reference = 'rotary'  # Scheme the others are compared with (difference, CI, p-value).

  c.model.size = 'tiny'
  # N(0, 0.02) (BERT) leaves a 64-wide model on the probes' initial plateau (chance accuracy)
  # for 300+ steps at this batch size; 0.1 lets every scheme that can solve them do so within
  # ~200 steps, so the comparison is about positions, not about escaping the plateau.
  c.model.init_std = 0.1
  c.model.dropout_rate = 0.0  # 300 x 32 examples is under one epoch of the 20k: no overfitting.
  c.model.max_length = 64  # `learned` has embeddings for the training length only (as BERT).
  c.train.num_steps = 300
  c.train.batch_size = 32
  c.train.eval_every = 100
  c.train.eval_batch_size = 250  # Divides the probes' 1,000-example evaluation splits.
  c.train.checkpoint_every = 300
  c.train.log_every = 50
  c.optim.learning_rate = 1e-3
  c.optim.warmup_steps = 30
  return c
