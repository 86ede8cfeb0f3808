"""The paper's claim (e), RoPE converges faster in pre-training (its Figure 3), as one command:
MLM pre-training of every position scheme at matched compute (same steps, batch, model, data
order and initial shared parameters per seed) on the embedded ``docs`` corpus, then perplexity
at the training length and beyond it.

  python ablate.py --config=configs/ablation/pretrain.py --workdir=runs/pretrain_ablation
"""

from configs import pretrain
from experiments import ablation


def get_config():
  c = pretrain.get_config()
  c.ablation = a = ablation.group()
  a.positions = ('rotary,learned,sinusoidal,t5,alibi,none,kerple_log,kerple_power,fire,'
                 'cope')  # model.position values.
  a.variants = 'p_rope:rotary:rope.p=0.75'  # p-RoPE (Barbero et al. 2025), as in the main job.
  a.datasets = 'docs'  # data.name values.
  a.learning_rates = '1e-3'  # One rate for every scheme: matched compute.
  # Seeds per run, paired across schemes: a difference on every seed survives Holm over the 10
  # comparisons (10 x 2/2^10 = 0.020; 8 seeds: 0.078).
  a.num_seeds = 10
  a.workers = 2  # two runs at a time: one run's compiles overlap the other's steps

  # Narrower and shorter than configs/pretrain.py: 11 rows x 10 seeds took 1 h 52 min on 2 cores.
  c.model.hidden_size = 64
  c.model.mlp_dim = 256
  c.train.num_steps = 300  # 1.2M tokens, a third of an epoch.
  c.train.eval_every = 25  # 12 points per convergence curve
  c.train.checkpoint_every = 300
  c.optim.warmup_steps = 30
  return c
