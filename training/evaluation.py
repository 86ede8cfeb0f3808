"""Evaluating a finished (or running) workdir, including at lengths beyond training."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Sequence

import numpy as np

from training import checkpoints
from training import config_checks

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
  if not lengths or any(n <= 1 for n in lengths):
    raise ValueError(f'--eval_lengths={text!r}: every length must be an integer > 1 (tokens, '
                     '[CLS] included), e.g. --eval_lengths=128,256.')
  return lengths


def parse_checkpoint(text: str) -> str | int:
  """--checkpoint: 'best', 'latest' or a step number."""
  text = str(text).strip()
  if text in ('best', 'latest'):
    return text
  if text.isdigit():
    return int(text)
  raise ValueError(f"--checkpoint={text!r} is not valid: give 'best' (by validation accuracy), "
                   "'latest' or a step number, e.g. --checkpoint=best.")


def _restore(ckpt: checkpoints.Checkpointer, which: str | int, abstract_state: Any
             ) -> tuple[int, Any]:
  """Restores the chosen checkpoint; for 'best'/'latest', the next intact one if it is corrupt."""
  if isinstance(which, int):
    return which, ckpt.restore(which, abstract_state)
  steps = ckpt.all_steps()
  if which == 'best':
    order = sorted(steps, key=lambda s: (ckpt.accuracy(s) is not None, ckpt.accuracy(s) or 0.0,
                                         s), reverse=True)
  else:
    order = sorted(steps, reverse=True)
  reasons = {}
  for step in order:
    try:
      return step, ckpt.restore(step, abstract_state)
    except checkpoints.CorruptCheckpointError as e:
      reasons[step] = e.reason
      print(f'Checkpoint {step} is corrupt ({e.reason}); using the next one.', file=sys.stderr,
            flush=True)
  raise checkpoints.NoIntactCheckpointError(
      f'No intact checkpoint in {ckpt.directory} ('
      + '; '.join(f'step {s}: {r}' for s, r in sorted(reasons.items()))
      + '). Rerun train.py on this workdir (it sets corrupt checkpoints aside and resumes from '
      'the newest intact one, or says none is left).')


def evaluate_workdir(workdir: str, *, checkpoint: str = 'best', split: str = 'test',
                     eval_lengths: Sequence[int] = ()) -> dict[str, Any]:
  """Loads the config and a checkpoint of ``workdir`` and evaluates it.

  Nothing in the workdir is changed except ``eval.json`` (a corrupt checkpoint is skipped, not
  moved), so a running workdir can be evaluated.

  Args:
    workdir: a train.py workdir.
    checkpoint: 'best' (by validation accuracy), 'latest', or a step number.
    split: the split evaluated at the training length.
    eval_lengths: extra lengths; each uses the dataset's split for that length (the probes'
      extrapolation splits, or ``split`` truncated/padded there for text datasets).
  Returns:
    A dict (also written to ``workdir/eval.json``) with per-seed accuracies.
  Raises:
    ValueError, FileNotFoundError, checkpoints.CheckpointError: with a message naming the
      problem and the fix, before anything is compiled where possible.
  """
  workdir = os.path.abspath(os.path.expanduser(workdir))
  which = parse_checkpoint(checkpoint)
  config = config_checks.load_config(workdir)
  model_max_length = config.model.max_length or config.data.max_length
  too_long = [n for n in eval_lengths if n > model_max_length]
  if config.model.position == 'learned' and too_long:
    raise ValueError(f'This model (model.position=learned) has position embeddings for '
                     f'{model_max_length} tokens (model.max_length), so it cannot be evaluated at '
                     f'{", ".join(map(str, too_long))}. Evaluate at lengths <= {model_max_length}, '
                     'or train with a larger --config.model.max_length; schemes without a '
                     'length limit (e.g. rotary, alibi) extrapolate.')
  ckpt = checkpoints.Checkpointer(workdir, config.train.keep_checkpoints, read_only=True)
  steps = ckpt.all_steps()
  if not steps:
    raise FileNotFoundError(f'No checkpoint in {workdir!r} yet: train first (train.py '
                            f'--workdir={workdir}), or wait for its first checkpoint '
                            f'(train.checkpoint_every={config.train.checkpoint_every} steps).')
  if isinstance(which, int) and which not in steps:
    raise ValueError(f'--checkpoint={which}: there is no checkpoint of step {which} in '
                     f'{workdir}; available: {", ".join(map(str, steps))} (or best, latest).')
  import data as data_lib  # pylint: disable=g-import-not-at-top  (TensorFlow: after the checks)
  from training import partitioning  # pylint: disable=g-import-not-at-top
  from training import trainer  # pylint: disable=g-import-not-at-top
  config.mesh = partitioning.fit_to_devices(config.mesh)  # other hardware than in training
  exp = trainer.Experiment(config, workdir)
  valid_splits = list(exp.info.eval_splits)
  if split not in valid_splits:
    raise ValueError(f'--split={split!r} is not a split of {config.data.name}; valid: '
                     f'{", ".join(valid_splits)}.')
  splits = [(split, config.data.max_length)]
  for length in eval_lengths:
    try:
      splits.append((data_lib.eval_split_for_length(exp.info, length), length))
    except ValueError as e:
      lengths = sorted({n for k, n in exp.info.eval_splits.items() if k.startswith('test')})
      raise ValueError(f'--eval_lengths: {e}. {config.data.name} is evaluated beyond training '
                       f'only at the lengths of its test splits: use --eval_lengths among '
                       f'{", ".join(map(str, lengths))}.') from None
  step, state = _restore(ckpt, which, exp.abstract_with_shardings())
  results = {'workdir': workdir, 'step': int(step), 'seeds': exp.seeds,
             'position': config.model.position, 'attention': config.model.attention,
             'train_length': config.data.max_length,
             'eval': exp.evaluate_lengths(state.params, splits)}
  path = os.path.join(workdir, EVAL_FILE)
  tmp = f'{path}.tmp.{os.getpid()}'
  with open(tmp, 'w') as f:
    json.dump(results, f, indent=2, sort_keys=True)
  os.replace(tmp, path)
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
