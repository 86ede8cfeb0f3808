"""The paper's claim (d) with power (issue 31): RoFormer fine-tuned at 1024 tokens beats BERT
(learned positions) at 512 after pre-training. Every scheme is pre-trained by MLM on the man
pages' texts at 512 bytes, then fine-tuned (and, as the control, trained from scratch) at 512,
1024 and 2048 bytes; 8 seeds, so the exact sign-flip test can reach p < 0.05 after Holm's
correction. ``learned`` has no positions beyond its pre-trained 512 and is not applicable there.

  python ablate.py --config=projects/long_documents/configs/two_stage.py \
      --workdir=runs/long_documents_two_stage

The report adds "longer context against learned at 512": each pre-trained scheme at each longer
length, paired with learned at 512 (``two_stage.length_baseline``). Byte-level, as the
single-stage comparison (projects/long_documents/configs/ablation.py).
"""

from projects.long_documents.configs import ablation as long_documents
from projects.two_stage.configs import manpages as two_stage_config

PRETRAIN_LENGTH = 512


def get_config():
  c = long_documents.get_config()  # the fine-tuning: tiny byte-level model, chunked attention
  c.ablation.report_memory = False  # not reported by a two-stage grid
  c.ablation.positions = 'rotary,learned,alibi,none'
  c.ablation.attentions = 'softmax'
  c.ablation.max_lengths = '512,1024,2048'  # Fine-tuning lengths.
  c.ablation.num_seeds = 8  # The smallest sign-flip p is 2/2^8.
  c.two_stage = two_stage_config.get_config().two_stage
  c.two_stage.length_baseline = 'learned'  # BERT at the shortest length.

  c.pretrain = p = long_documents.get_config()
  del p.ablation
  p.train.task = 'mlm'
  p.data.name = 'manpages'  # In-domain: the pages' texts.
  p.data.max_length = PRETRAIN_LENGTH
  p.data.eval_lengths = '1024,2048'
  p.data.eval_tokens = 32768
  p.model.update(max_length=PRETRAIN_LENGTH, t5_max_distance=PRETRAIN_LENGTH)
  p.train.update(num_steps=600, batch_size=8, eval_every=50, log_every=50,
                 checkpoint_every=300, eval_batch_size=8)
  p.optim.update(learning_rate=3e-3, warmup_steps=60)
  return c
