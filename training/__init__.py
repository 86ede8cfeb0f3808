"""Training library: ``trainer.train_and_evaluate(config, workdir)`` and what it is made of.

  validation   every check of a run's config, once, before anything heavy
  experiment   the data, model, optimizer, mesh and jitted steps a config gives
  trainer      train_and_evaluate: setup, loop, summary
  steps        the pure train and eval steps
  checkpoints  orbax checkpoints with content manifests
  metrics      metrics.jsonl, TensorBoard and console lines (clu writers)
  evaluation   evaluating a workdir (eval.py)
  optim, partitioning, distributed, preemption, workdir
"""
