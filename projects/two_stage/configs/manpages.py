"""The paper's regime as one command (issue 31): pre-train every position scheme by masked
language modelling on the man pages' own texts (in-domain, a WordPiece vocabulary trained on
them), fine-tune each pre-trained encoder to classify the pages (system call, library function,
other), and train the same models from scratch as the control.

  python ablate.py --config=projects/two_stage/configs/manpages.py --workdir=runs/two_stage

Runs: ``pretrain/manpages/<scheme>``, ``finetune/manpages/<scheme>``, ``scratch/manpages/<scheme>``
(``projects/two_stage/grid.py``); seed i of a fine-tune starts from seed i of its pre-training.
The report: perplexity by length and steps to a loss threshold of the pre-training, accuracy
pre-trained and from scratch side by side with their paired differences, paired differences with
rotary (Holm-corrected), learning curves. ``--config.pretrain.train.task=clm`` pre-trains causal
language models instead; ``--config.pretrain.<group>.<field>=`` changes the pre-training,
``--config.<group>.<field>=`` the fine-tuning (the model's shape is the pre-training's).

Your own texts: ``--config.data.name=files --config.data.train_files=train.csv`` (and
``test_files``) fine-tunes on your labelled set; with ``--config.pretrain.data.name=files`` the
pre-training reads the same files' texts (or ``--config.pretrain.data.train_files=corpus.txt``,
any .txt/.csv/.jsonl), and its vocabulary is trained on them (docs/pretraining.md).
"""

from experiments import ablation
from projects.two_stage import grid as two_stage
from training import config as run_config

LENGTH = 256  # WordPiece tokens per row / per page, in both stages


def get_config():
  c = run_config.defaults()  # the fine-tuning
  c.ablation = a = ablation.group()
  a.positions = 'rotary,learned,alibi,t5,none'  # model.position values; none is required.
  a.datasets = 'manpages'  # Fine-tuning datasets (data.name values).
  a.attentions = 'softmax'  # model.attention values.
  a.max_lengths = ''  # Fine-tuning lengths ('' = data.max_length).
  a.learning_rates = '1e-3'  # Fine-tuning rates (the pre-training's: pretrain.optim).
  a.num_seeds = 5  # Seeds, paired across schemes and stages.
  a.reference = 'rotary'  # Scheme the others are compared with.
  c.two_stage = two_stage.group()

  # configs/pretrain.py's pre-training (MLM, WordPiece trained on the corpus), on the man pages.
  c.pretrain = p = run_config.defaults()
  p.train.task = 'mlm'
  p.data.update(tokenizer='wordpiece', eval_tokens=32768)
  p.model.size = 'tiny'
  p.optim.weight_decay = 0.01
  p.data.name = 'manpages'  # In-domain: the fine-tuning set's texts (labels unused).
  p.data.sp_vocab_size = 8000  # WordPiece vocabulary, trained on the man pages' training split.
  p.data.max_length = LENGTH
  p.data.eval_lengths = f'{2 * LENGTH},{4 * LENGTH}'  # Perplexity beyond the training length.
  p.model.update(hidden_size=64, num_heads=4, mlp_dim=256, max_length=LENGTH,
                 t5_max_distance=LENGTH, dropout_rate=0.1)
  p.train.update(num_steps=600, batch_size=16, eval_every=50, log_every=25,
                 checkpoint_every=300, eval_batch_size=16)
  p.optim.update(learning_rate=1e-3, warmup_steps=60)

  c.data.max_length = LENGTH
  c.model.update(dropout_rate=0.1, t5_max_distance=LENGTH)
  # 400 x 16 = 6,400 pages, about 11 epochs of the 569 training pages.
  c.train.update(num_steps=400, batch_size=16, eval_every=25, log_every=25,
                 checkpoint_every=400, eval_batch_size=16)
  c.optim.update(learning_rate=1e-3, warmup_steps=40)
  return c
