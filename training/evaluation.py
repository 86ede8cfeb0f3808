"""Evaluating a finished (or running) workdir, including at lengths beyond training."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np

import data as data_lib
from training import checkpoints
from training import config_checks
from training import trainer

EVAL_FILE = 'eval.json'


def parse_lengths(text: str) -> list[int]:
  """'512,1024' -> [512, 1024], with a clear error for anything else."""
  if not text:
    return []
  try:
    lengths = [int(x) for x in text.split(',') if x.strip()]
  except ValueError:
    raise ValueError(f'--eval_lengths={text!r} is malformed: give comma-separated positive '
                     'integers, e.g. --eval_lengths=128,256.') from None
  if any(n <= 1 for n in lengths):
    raise ValueError(f'--eval_lengths={text!r}: every length must be > 1.')
  return lengths


def evaluate_workdir(workdir: str, *, checkpoint: str = 'best', split: str = 'test',
                     eval_lengths: Sequence[int] = ()) -> dict[str, Any]:
  """Loads the config and a checkpoint of ``workdir`` and evaluates it.

  Args:
    workdir: a train.py workdir.
    checkpoint: 'best' (by validation accuracy), 'latest', or a step number.
    split: the split evaluated at the training length.
    eval_lengths: extra lengths; each uses the dataset's split for that length (the probes'
      extrapolation splits, or ``split`` truncated/padded there for text datasets).
  Returns:
    A dict (also written to ``workdir/eval.json``) with per-seed accuracies.
  """
  workdir = os.path.abspath(os.path.expanduser(workdir))
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f'Workdir {workdir!r} does not exist; pass the --workdir of a '
                            'train.py run.')
  config = config_checks.load_config(workdir)
  exp = trainer.Experiment(config, workdir)
  ckpt = checkpoints.Checkpointer(workdir, config.train.keep_checkpoints)
  if checkpoint == 'best':
    step = ckpt.best_step() or ckpt.latest_step()
  elif checkpoint == 'latest':
    step = ckpt.latest_step()
  else:
    step = int(checkpoint)
  if step is None:
    raise FileNotFoundError(f'No checkpoint in {workdir!r} yet: train first (train.py '
                            f'--workdir={workdir}).')
  state = ckpt.restore(step, exp.abstract_with_shardings())
  ckpt.close()
  splits = [(split, config.data.max_length)]
  for length in eval_lengths:
    splits.append((data_lib.eval_split_for_length(exp.info, length), length))
  results = {'workdir': workdir, 'step': int(step), 'seeds': exp.seeds,
             'position': config.model.position, 'attention': config.model.attention,
             'train_length': config.data.max_length,
             'eval': exp.evaluate_lengths(state.params, splits)}
  with open(os.path.join(workdir, EVAL_FILE), 'w') as f:
    json.dump(results, f, indent=2, sort_keys=True)
  return results


def format_table(results: dict[str, Any]) -> str:
  """A plain-text table: split, length, accuracy (mean +- std over seeds) or why not."""
  rows = [f'{results["position"]}/{results["attention"]} (step {results["step"]}, '
          f'trained at length {results["train_length"]})',
          f'{"split":<12} {"length":>7}  accuracy']
  for split, r in results['eval'].items():
    if 'not_applicable' in r:
      value = f'n/a: {r["not_applicable"]}'
    else:
      acc = np.asarray(r['accuracy'])
      value = f'{acc.mean():.4f}' + (f' +- {acc.std(ddof=1):.4f} ({acc.size} seeds)'
                                      if acc.size > 1 else '')
    rows.append(f'{split:<12} {r["length"]:>7}  {value}')
  return '\n'.join(rows)
