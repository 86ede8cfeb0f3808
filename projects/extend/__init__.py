"""RoPE length extension at evaluation: one rotary model trained, then evaluated at longer
lengths under each ``rope.scaling`` variant on the same weights (``grid.py``; docs/extend).
Importing it registers its grid kind with ablate.py (configs with an ``extend`` group); it has
no separate report step (--report_only runs it, finished work is kept)."""

from experiments import ablation
from projects.extend import grid

ablation.register_grid(('extend',), ablation.Grid(
    lambda config, workdir, only: grid.check(config),
    lambda config, workdir, cells, *, command, fresh: grid.run(config, workdir, command=command),
    None))
