"""Long Range Arena ListOps (Tay et al. 2021) from the official release files, LRA's recipe.

The LRA release (``lra_release.gz``) holds ``listops-1000/basic_{train,val,test}.tsv``: a
header, then ``Source<TAB>Target`` rows (a space-separated expression, its value 0-9). They are
read as local files:

  python train.py --config=projects/lra/configs/listops.py --workdir=runs/lra_listops \
      --config.data.train_files=/path/to/lra_release/listops-1000/basic_train.tsv \
      --config.data.validation_files=/path/to/lra_release/listops-1000/basic_val.tsv \
      --config.data.test_files=/path/to/lra_release/listops-1000/basic_test.tsv

LRA's recipe (``lra_benchmarks/listops/configs/base_listops_config.py``): batch 32, 5,000 steps,
learning rate 0.05 x linear warmup (1,000 steps) x rsqrt decay, i.e. a peak of 0.05 / sqrt(1000),
weight decay 0.1, Adam b2 0.98, eps 1e-9, inputs up to 2,000 tokens, 6 layers, width 512, 8
heads, MLP 2,048, CLS pooling. Published Transformer accuracy: 36.37% (LRA, Table 1).
Differences, said plainly: tokens here are bytes (LRA: one id per space-separated token, so
its 2,000 tokens are about 4,000 bytes here), and the position scheme is ``model.position``
(rotary by default; LRA's Transformer used learned absolute embeddings).
"""

from projects.lra.configs import common as lra
from training import config as run_config


def get_config():
  c = run_config.defaults()
  c.data.name = 'files'
  c.data.text_column = 'Source'
  c.data.label_column = 'Target'
  lra.lra_encoder(c, num_layers=6, hidden_size=512, num_heads=8, mlp_dim=2048,
                  max_length=4000)  # bytes + [CLS]: LRA's 2,000 tokens
  lra.lra_training(c, num_steps=5000, eval_every=500)
  lra.lra_optimizer(c, warmup_steps=1000)
  return c
