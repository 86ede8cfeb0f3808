"""Long Range Arena Text (Tay et al. 2021): byte-level IMDB at 4,000 bytes, LRA's recipe.

LRA reads IMDB through TFDS (``imdb_reviews``; prepare it where there is internet, see
``python -m data.prepare --name=imdb_reviews``, and copy the data_dir):

  python train.py --config=projects/lra/configs/text.py --workdir=runs/lra_text \
      --config.data.data_dir=/path/to/tensorflow_datasets

LRA's recipe (``lra_benchmarks/text_classification/configs/base_tc_config.py``): batch 32, 20,000
steps, learning rate 0.05 x linear warmup (8,000 steps) x rsqrt decay, weight decay 0.1, 4
layers, width 256, 4 heads, MLP 1,024. Inputs: 4,000 bytes, as the paper's Table 1 (its config
file says 1,000: ``--config.data.max_length=1000``). Published Transformer accuracy: 64.27%
(LRA, Table 1). Our validation split is the last 10% of IMDB's training split (LRA evaluates on
the test split during training).
"""

from projects.lra.configs import common as lra
from training import config as run_config


def get_config():
  c = run_config.defaults()
  c.data.name = 'imdb_reviews'
  lra.lra_encoder(c, num_layers=4, hidden_size=256, num_heads=4, mlp_dim=1024,
                  max_length=4000)
  lra.lra_training(c, num_steps=20000, eval_every=2000)
  lra.lra_optimizer(c, warmup_steps=8000)
  return c
