"""The README's main job: all seven position schemes on the embedded order probe, each with a
learning-rate sweep x seeds trained together (the rate chosen on validation), evaluated at the
training length and from 1.5x to 16x of it (length extrapolation, seen and unseen distances).

  python ablate.py --config=configs/ablation/probes.py --workdir=runs/probes
"""

from configs import default
from experiments import ablation


def get_config():
  c = default.get_config()
  c.ablation = a = ablation.group()
  # Its defaults: every position scheme on the order probe. Two rates, the better one chosen.
  a.learning_rates = '1e-3,3e-3'
  a.num_seeds = 8  # Seeds per run; seed i of every scheme shares data order and shared init.

  # 2 layers, narrowed so that 7 schemes x 16 members fit 15 min.
  c.model.update(size='tiny', hidden_size=32, num_heads=2, mlp_dim=64)
  # N(0, 0.02) (BERT) leaves a 64-wide model on the probes' initial plateau (chance accuracy)
  # for 300+ steps at this batch size; 0.1 lets every scheme that can solve them do so within
  # ~200 steps, so the comparison is about positions, not about escaping the plateau.
  c.model.init_std = 0.1
  c.model.dropout_rate = 0.0  # 300 x 32 examples is under one epoch of the 20k: no overfitting.
  c.model.max_length = 64  # `learned` has embeddings for the training length only (as BERT).
  c.train.update(num_steps=300, batch_size=32, checkpoint_every=300, log_every=30)
  c.train.eval_every = 30  # 10 points per learning curve
  c.train.skip_nonfinite = True  # a diverging rate of the sweep is skipped, not fatal
  c.train.eval_batch_size = 250  # Divides the probes' 500-example evaluation splits.
  c.optim.update(learning_rate=1e-3, warmup_steps=30)
  # Learned position tables (learned, t5, shaw) move slowly: at 1x, shaw's relative table stays
  # near its initial values within 300 steps and shaw near chance. Applied to every scheme alike.
  c.optim.position_lr_multiplier = 10.0
  return c
