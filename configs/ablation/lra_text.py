"""Long Range Arena-style byte-level IMDB text classification at 1k and 4k bytes, the LRA
text config (4 layers, 256 wide, 4 heads, MLP 1024, CLS pooling, batch 32). Needs prepared
`imdb_reviews` TFDS data (see `python -m data.prepare --help`) and an accelerator.

  python ablate.py --config=configs/ablation/lra_text.py --workdir=runs/lra_text \
      --config.data.data_dir=/path/to/tensorflow_datasets
"""

from configs.ablation import glue_news


def get_config():
  c = glue_news.get_config()  # the `small` preset on real text
  c.ablation.datasets = 'imdb_reviews'
  c.ablation.max_lengths = '1000,4000'
  c.model.pooling = 'cls'
  c.train.batch_size = 32
  c.train.num_steps = 20000
  c.train.eval_every = 2000
  c.train.checkpoint_every = 2000
  c.optim.warmup_steps = 1000
  return c
