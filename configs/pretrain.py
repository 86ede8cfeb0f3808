"""Pre-training as RoFormer does: masked language modelling on the embedded ``docs`` corpus (the
Python documentation and the Linux man pages, 15.8 MB, offline), WordPiece trained here,
documents packed into rows of 128 tokens. A small encoder that a 2-core CPU pre-trains in
minutes; fine-tune it with ``--config.train.init_from=<this workdir>``.

  python train.py --config=configs/pretrain.py --workdir=runs/pretrain

``--config.train.task=clm`` trains a causal language model instead (every scheme runs causally).
"""

from configs import default


def get_config():
  c = default.get_config()
  c.train.task = 'mlm'  # BERT's masked language modelling (data.mask_rate, 80/10/10).
  c.data.name = 'docs'  # Embedded: apt-get install python3-doc manpages manpages-dev.
  c.data.tokenizer = 'wordpiece'  # Trained on the training split, cached in the workdir.
  c.data.sp_vocab_size = 8000  # WordPiece vocabulary.
  c.data.max_length = 128  # Tokens per packed row (the training length).
  c.data.eval_lengths = '256,512,1024'  # Perplexity beyond the training length.
  c.data.eval_tokens = 32768  # Tokens of each evaluation split (the same text at every length).
  c.model.size = 'tiny'  # 2 layers, narrowed/widened below.
  c.model.hidden_size = 128
  c.model.num_heads = 4
  c.model.mlp_dim = 512
  c.model.dropout_rate = 0.0  # Well under one epoch of 3.5M tokens: no overfitting to guard.
  c.model.max_length = 128  # `learned` has embeddings for the training length only (as BERT).
  c.model.t5_max_distance = 128  # T5's furthest bucket at the training length.
  c.train.batch_size = 32  # 4,096 tokens a step.
  c.train.update(num_steps=600, eval_every=50, log_every=25, checkpoint_every=300,
                 eval_batch_size=32)
  c.optim.update(learning_rate=1e-3, warmup_steps=60, weight_decay=0.01)
  return c
