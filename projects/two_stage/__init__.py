"""The two-stage study (the paper's regime): pre-train every scheme, fine-tune each, and train
it from scratch as the control (``grid.py``; configs in ``configs/``; docs/pretraining.md).
Importing it registers its grid kind with ablate.py (configs with a ``pretrain`` or
``two_stage`` group)."""

from experiments import ablation
from projects.two_stage import grid

ablation.register_grid(('two_stage', 'pretrain'), ablation.Grid(
    lambda config, workdir, only: grid.select(grid.check_grid(config, workdir), only),
    grid.run_grid, grid.build_report))
