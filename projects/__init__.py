"""Studies that are one protocol each, beside the core (big_vision's ``proj/``): each lives in
``projects/<name>/`` with its data, configs, report code and page, and registers what it adds
(datasets, task kinds, report sections, grid kinds) with the core's registries when imported.
Its config files import it; a run's ``train.projects`` names it, so that a saved run finds it
again (eval.py, predict.py, an ablation's worker processes). The core imports no project.
"""
