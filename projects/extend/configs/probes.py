"""Length extension without fine-tuning (issue 17): rotary trained on the order probe at 64
tokens (the main job's rotary cell), then evaluated at 2x-16x under each RoPE scaling variant,
set at evaluation time on the same weights.

  python ablate.py --config=projects/extend/configs/probes.py --workdir=runs/extend
"""

from projects.extend import grid as extend
from training import config as run_config


def get_config():
  c = run_config.defaults()
  # The main job's cell (configs/ablation/probes.py) as it was when docs/extend was made:
  # evaluated every 30 steps, every test length kept (the study picks its own), tables at 10x
  # (rotary has none).
  c.model.update(size='tiny', hidden_size=32, num_heads=2, mlp_dim=64, init_std=0.1,
                 dropout_rate=0.0, max_length=64)
  c.train.update(num_steps=300, batch_size=32, checkpoint_every=300, eval_every=30,
                 log_every=30, skip_nonfinite=True, eval_batch_size=250)
  c.optim.update(learning_rate=1e-3, warmup_steps=30, position_lr_multiplier=10.0)
  c.model.position = 'rotary'
  c.data.name = 'position_probes/order'
  c.extend = e = extend.group()
  e.variants = 'none,linear,ntk,dynamic_ntk,yarn,llama3'  # rope.scaling kinds, set at evaluation.
  e.lengths = '128,256,512,1024'  # Evaluation lengths (the probe's test splits): 2x to 16x.
  e.learning_rates = '1e-3,3e-3'  # As the main job; the rate is chosen on validation.
  # Seeds, trained together; every variant is evaluated on all of them. 16, not the main job's 8:
  # with 8 the smallest exact sign-flip p is 1/128, above 0.05 after Holm over the 40 comparisons.
  e.num_seeds = 16
  return c
