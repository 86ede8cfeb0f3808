"""Long Range Arena Retrieval (Tay et al. 2021) from the official release files, LRA's recipe.

Does one ACL Anthology Network paper cite the other? The LRA release (``lra_release.gz``) holds
``lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv``: no header, tab-separated
``label, id1, id2, text1, text2`` rows. Each paper is read as bytes up to 4,000 and encoded on
its own by the shared encoder (``model.dual_encoder``: two towers, as LRA's dual encoder); the
head reads [u, v, u*v, u-v] of the two CLS vectors:

  python train.py --config=projects/lra/configs/retrieval.py --workdir=runs/lra_retrieval \
      --config.data.train_files=/path/to/lra_release/tsv_data/new_aan_pairs.train.tsv \
      --config.data.validation_files=/path/to/lra_release/tsv_data/new_aan_pairs.eval.tsv \
      --config.data.test_files=/path/to/lra_release/tsv_data/new_aan_pairs.test.tsv

LRA's recipe (``lra_benchmarks/matching/configs/base_match_config.py``): batch 32, 5,000 steps,
learning rate 0.05 x linear warmup (8,000 steps, longer than the run: the rate only rises) x
rsqrt decay, weight decay 0.1, Adam b2 0.98, eps 1e-9, 4 layers, width 128, 4 heads, MLP 512,
CLS pooling, bytes. Published Transformer accuracy: 57.46% (LRA, Table 1). Differences, said
plainly: LRA's head is two ReLU layers (512, 256) on the pair features, ours one GELU layer
(128) as the single-text head; the position scheme is ``model.position`` (rotary by default;
LRA's Transformer used learned absolute embeddings); [CLS] is one of the 4,000 tokens here.
"""

from projects.lra.configs import common as lra
from training import config as run_config


def get_config():
  c = run_config.defaults()
  c.data.name = 'files'
  c.data.columns = 'label,id1,id2,text1,text2'  # the release files have no header
  c.data.text_column = 'text1'
  c.data.text_b_column = 'text2'
  c.data.label_column = 'label'
  c.model.dual_encoder = True
  lra.lra_encoder(c, num_layers=4, hidden_size=128, num_heads=4, mlp_dim=512,
                  max_length=4000)  # per paper: [CLS] + 3,999 bytes
  lra.lra_training(c, num_steps=5000, eval_every=500)
  lra.lra_optimizer(c, warmup_steps=8000)
  return c
