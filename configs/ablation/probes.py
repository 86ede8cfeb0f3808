"""The README's main job: every position scheme on the embedded order probe, 10 seeds
trained together, evaluated at the training length and at 2x, 4x and 8x of it (length
extrapolation, seen and unseen distances).

  python ablate.py --config=configs/ablation/probes.py --workdir=runs/probes
"""

from configs import default
from experiments import ablation


def get_config():
  c = default.get_config()
  c.ablation = a = ablation.group()
  a.positions = ('none,sinusoidal,learned,shaw,t5,alibi,rotary,kerple_log,kerple_power,fire,'
                 'cope')
  # FIRE-S: the paper's FIRE shared by all layers (the scheme table's other form of `fire`). No
  # p-RoPE row: at head_dim 16 the two frequencies that p = 0.75 zeroes turn at most 0.51 rad
  # over 512 tokens, so the row could not differ from rotary by construction; p-RoPE's own
  # setting (long causal contexts) is docs/extend_p_rope/.
  a.variants = 'fire_s:fire:model.fire_shared=true'
  # One rate: of 1e-3, 3e-3, 1e-2 and 3e-2, 3e-3 is the best for every table scheme and 1e-3
  # was never chosen (docs/ablation_probes/diagnostic); one rate buys twice the steps.
  a.learning_rates = '3e-3'
  a.workers = 2  # two runs at a time: this CPU machine's compiles overlap the other run's steps
  # Seeds per run, paired across schemes: with 11 compared with rotary, the smallest Holm p is
  # 11 x 2 / 2^10 = 0.021 (8 seeds: 0.086).
  a.num_seeds = 10

  # 2 layers, narrowed so that 12 rows x 10 members x 300 steps fit 15 min (2 runs at a time).
  c.model.update(size='tiny', hidden_size=32, num_heads=2, mlp_dim=64)
  # N(0, 0.02) (BERT) leaves this model at chance for 300+ steps; with 0.1 every scheme that can
  # solve the probes does within ~200, so the comparison is about positions, not the plateau.
  c.model.init_std = 0.1
  c.model.dropout_rate = 0.0  # 300 x 32 examples is under one epoch of the 20k: no overfitting.
  c.model.max_length = 64  # `learned` has embeddings for the training length only (as BERT).
  c.train.update(num_steps=300, batch_size=32, checkpoint_every=300, log_every=60)
  c.train.eval_every = 60  # 5 points per learning curve
  # 2x, 4x and 8x the training length, on seen (_near) and unseen (_far) distances: 1.5x, 3x
  # and 16x too would cost 3 more compiles and 40% more evaluation per scheme.
  c.train.test_lengths = '64,128,256,512'
  c.train.skip_nonfinite = True  # a diverging rate of the sweep is skipped, not fatal
  c.train.eval_batch_size = 250  # Divides the probes' 500-example evaluation splits.
  c.optim.update(learning_rate=3e-3, warmup_steps=30)
  # Learned position tables (learned, t5, shaw, KERPLE, FIRE, CoPE) move slowly: their gradient
  # on the chance plateau is ~1e-4; at 1x no seed of shaw or t5 leaves it, at 30x 7 of 8 of t5's
  # do (docs/ablation_probes/diagnostic). Applied to every scheme alike.
  c.optim.position_lr_multiplier = 30.0
  return c
