"""One Chomsky task, trained and evaluated by train.py (the model and training of
configs/default.py; projects/chomsky/README.md gives the papers' settings):

  python train.py --config=projects/chomsky/configs/task.py --workdir=/tmp/parity \
      --config.data.name=chomsky/parity_check --config.model.position=rotary
"""

from projects.chomsky import tasks  # the package registers the tasks (train.projects)
from training import config as run_config


def get_config():
  c = run_config.defaults()
  c.train.projects = 'chomsky'
  c.data.name = f'chomsky/{next(iter(tasks.TASKS))}'
  return c
