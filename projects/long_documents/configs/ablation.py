"""Long documents (issue 17): does more context help, for which scheme, with softmax or linear
attention? The embedded man pages (``data.name=manpages``: system call, library function or
other; median page 4,718 bytes), byte-level, trained and tested at each of
``ablation.max_lengths`` tokens (a page is cut at that length).

  python ablate.py --config=projects/long_documents/configs/ablation.py --workdir=runs/long_documents

Softmax attention is computed in blocks (``model.attention_impl=chunked``: memory linear in the
length, and faster than the written-out form on CPU beyond ~1k tokens, benchmarks/README.md).
The defaults fit a 2-core CPU in about half an hour (512 and 2048 tokens, 2 seeds). The committed
run (README) adds 1024 and 4096 tokens with ``--config.ablation.max_lengths=512,1024,2048,4096``,
softmax at 4096 for rotary only (``--only``); the paper's question needs more seeds.
"""

from experiments import ablation
from training import config as run_config


def get_config():
  c = run_config.defaults()
  c.ablation = a = ablation.group()
  a.positions = 'none,learned,alibi,rotary'  # model.position values.
  a.datasets = 'manpages'  # data.name values.
  a.attentions = 'softmax,linear'  # softmax vs RoFormer's eq. 19 (absolute schemes and rotary).
  a.max_lengths = '512,2048'  # Training and test lengths in tokens (bytes + [CLS]).
  a.learning_rates = '3e-3'  # One rate: the main job chose 3e-3 for every scheme.
  a.num_seeds = 2  # Seeds per run, paired across schemes.
  # The report adds each run's compiled train-step memory (its step is compiled again when the
  # report is built: about 5 s a run here).
  a.report_memory = True

  c.model.update(size='tiny', hidden_size=32, num_heads=2, mlp_dim=64)  # narrowed as the main job
  c.model.init_std = 0.1  # As the main job: off the initial plateau quickly.
  c.model.dropout_rate = 0.0
  c.model.attention_impl = 'chunked'
  c.model.attention_chunk_size = 512
  c.data.tokenizer = 'byte'
  # 150 x 8 = 1,200 pages, about 2 epochs of the 569 training pages.
  c.train.update(num_steps=150, batch_size=8, eval_every=50, eval_batch_size=8,
                 checkpoint_every=150, log_every=50)
  c.optim.update(learning_rate=3e-3, warmup_steps=15)
  return c
