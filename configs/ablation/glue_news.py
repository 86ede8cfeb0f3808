"""SST-2 and AG News with the `small` preset at 256 bytes (prepared TFDS data needed).

  python ablate.py --config=configs/ablation/glue_news.py --workdir=runs/glue_news \
      --config.data.data_dir=/path/to/tensorflow_datasets
"""

from configs.ablation import probes


def get_config():
  c = probes.get_config()
  c.ablation.datasets = 'glue/sst2,ag_news_subset'
  c.model.size = 'small'
  c.model.init_std = 0.02  # BERT init at this width.
  c.model.dropout_rate = 0.1  # Real text, many epochs.
  c.data.max_length = 256
  c.model.max_length = 256  # `learned`: the training length.
  c.train.update(num_steps=10000, eval_every=1000, checkpoint_every=1000, test_lengths='')
  c.optim.update(learning_rate=5e-4, warmup_steps=500)
  return c
