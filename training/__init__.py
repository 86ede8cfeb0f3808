"""Training library: ``trainer.train_and_evaluate(config, workdir)`` and what it is made of (see
the README's layout section for one line per module)."""
