"""Long Range Arena-style byte-level IMDB text classification at 1k and 4k bytes, the LRA
text config (4 layers, 256 wide, 4 heads, MLP 1024, CLS pooling, batch 32). Needs prepared
`imdb_reviews` TFDS data (see `python -m data.prepare --help`) and an accelerator.

  python ablate.py --config=projects/lra/configs/ablation_text.py --workdir=runs/lra_text \
      --config.data.data_dir=/path/to/tensorflow_datasets
"""

from experiments import ablation
import models
from training import config as run_config


def get_config():
  c = run_config.defaults()
  c.ablation = a = ablation.group()
  # The main job's grid (configs/ablation/probes.py: every scheme and p-RoPE, one rate, 10
  # seeds) on IMDB at 1k and 4k bytes.
  a.update(positions=','.join(models.SCHEMES), variants='p_rope:rotary:rope.p=0.75',
           learning_rates='3e-3', workers=2, num_seeds=10, datasets='imdb_reviews',
           max_lengths='1000,4000')
  # The `small` preset on real text (configs/ablation/glue_news.py), BERT's init and dropout.
  c.model.update(size='small', hidden_size=32, num_heads=2, mlp_dim=64, init_std=0.02,
                 dropout_rate=0.1, max_length=256, pooling='cls')
  c.data.max_length = 256
  c.train.update(num_steps=20000, batch_size=32, eval_every=2000, checkpoint_every=2000,
                 log_every=60, skip_nonfinite=True, eval_batch_size=250)
  c.optim.update(learning_rate=5e-4, warmup_steps=1000, position_lr_multiplier=30.0)
  return c
