"""The full embedded ablation: the main job's protocol (all schemes and p-RoPE, one rate, 10 seeds
each) on the three position probes, ListOps and the fortunes topic dataset (real human-written
text), all offline, every test split evaluated.

  python ablate.py --config=configs/ablation/embedded.py --workdir=runs/embedded
"""

from configs.ablation import probes


def get_config():
  c = probes.get_config()
  c.ablation.datasets = ('position_probes/order,position_probes/distance,'
                         'position_probes/nearest,listops/small,fortunes')
  c.train.projects = 'lra'  # ListOps' generator lives in projects/lra
  c.data.max_length = 128  # Long enough for ListOps (small) and most fortunes.
  c.model.max_length = 128  # `learned`: the training length.
  c.model.dropout_rate = 0.1  # fortunes has 3.3k training texts: ~10 epochs at this budget.
  c.train.num_steps = 1000
  c.train.eval_every = 100  # 10 points per learning curve
  c.train.checkpoint_every = 1000
  c.train.test_lengths = ''  # every dataset's own test lengths
  return c
