"""Evaluating a finished (or running) workdir, including at lengths beyond training."""

from __future__ import annotations

import dataclasses
import os
import typing
from typing import Any, Sequence

import jax
import numpy as np

import models
import rope
import settings
import storage
from data import datasets
from settings import lists
from training import checkpoints
from training import optim
from training import partitioning
from training import validation
from training.config import EVALUATION_FIELDS, RunConfig
from training.experiment import Experiment

EVAL_FILE = 'eval.json'


def parse_lengths(text: str) -> list[int]:
  """'512,1024' -> [512, 1024]."""
  if not text:
    return []
  lengths = lists.parse(text, '--eval_lengths', int, example='128,256')
  if not lengths or any(n <= 1 for n in lengths):
    raise ValueError(f'--eval_lengths={text!r}: every length must be an integer > 1 (tokens, '
                     '[CLS] included), e.g. --eval_lengths=128,256.')
  return lengths


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
  """['rope.scaling=yarn', ...] -> {'rope.scaling': 'yarn', ...}, typed; only the fields an
  evaluation may change (not the parameters, how they are read, or what was trained)."""
  overrides = {}
  for item in items:
    key, sep, value = item.partition('=')
    key = key.strip()
    if not sep or not key:
      raise ValueError(f'--override={item!r} is malformed: give group.field=value, e.g. '
                       '--override=rope.scaling=yarn.')
    if key in overrides:
      raise ValueError(f'--override gives {key} twice ({overrides[key]!r} and {value.strip()!r}): '
                       'give each field once.')
    if key not in EVALUATION_FIELDS:
      why = ('is part of how the trained query/key (or value) weights are read, so a model '
             'evaluated with another value is misread (to stretch the trained frequencies, use '
             'rope.scaling, e.g. ntk)' if key.startswith('rope.') else
             'would change the parameters or what was trained')
      raise ValueError(f'--override={item!r}: {key} cannot change at evaluation: it {why}. An '
                       f'evaluation may override {", ".join(EVALUATION_FIELDS)}; retrain (or '
                       'fine-tune) for anything else.')
    overrides[key] = _typed(key, value.strip())
  return overrides


def _typed(key: str, text: str) -> Any:
  group, _, field = key.partition('.')
  group_cls = settings.groups(RunConfig)[group]
  meta = next(f.metadata for f in settings.declared(group_cls) if f.name == field)
  if meta['items']:  # a list field: comma-separated, as on the command line
    return tuple(lists.parse(text, f'--override={key}', meta['items'], example=meta['example']))
  hint = typing.get_type_hints(group_cls)[field]
  kind = next(k for k in typing.get_args(hint) or (hint,) if k is not type(None))
  if text.lower() in ('none', 'null') and kind is not hint:  # an optional field
    return None
  if kind is bool:
    if text.lower() not in ('true', 'false'):
      raise ValueError(f'--override={key}={text}: {key} is true or false.')
    return text.lower() == 'true'
  try:
    return kind(text)
  except ValueError:
    raise ValueError(f'--override={key}={text}: {key} takes a {kind.__name__}.') from None


def apply_overrides(config: RunConfig, overrides: dict[str, Any]
                    ) -> tuple[RunConfig, dict[str, Any]]:
  """The config with the typed overrides, checked, and the overrides as applied: a scaling that
  reads rope.original_max_length, switched on here, gets the training length unless given."""
  typed = dict(overrides)
  if (typed.get('rope.scaling', config.rope.scaling) in rope.SCALINGS_WITH_LENGTH
      and config.rope.scaling not in rope.SCALINGS_WITH_LENGTH):
    typed.setdefault('rope.original_max_length', config.data.max_length)
  config = settings.replace(config, typed)
  config.check_model()
  return config, typed


def parse_checkpoint(text: str) -> str | int:
  text = str(text).strip()
  if text in ('best', 'latest'):
    return text
  if text.isdigit():
    return int(text)
  raise ValueError(f"--checkpoint={text!r} is not valid: give 'best' (by validation accuracy), "
                   "'latest' or a step number, e.g. --checkpoint=best.")


def evaluate_workdir(workdir: str, *, checkpoint: str = 'best', split: str = 'test',
                     eval_lengths: Sequence[int] = (), overrides: dict[str, Any] | None = None,
                     members: Sequence[int] | None = None) -> dict[str, Any]:
  """Evaluates a checkpoint ('best', 'latest' or a step) of ``workdir``: ``split`` at the training
  length, then the splits of ``eval_lengths``, with ``overrides``, of ``members`` (default: a
  sweep's rate chosen on validation, without the overrides). The workdir is not changed (a
  corrupt checkpoint is skipped, not moved), so a running one can be evaluated."""
  workdir = validation.check_workdir(workdir)
  which = parse_checkpoint(checkpoint)
  config = validation.load_config(workdir)
  if members is None and overrides and len(set(optim.learning_rates(config.optim))) > 1:
    # A sweep's rate is chosen as in training, on validation without the overrides.
    members = evaluate_workdir(workdir, checkpoint=checkpoint, split='validation')['members']
  config, applied = apply_overrides(config, overrides or {})
  _check_lengths(config, eval_lengths)
  ckpt = checkpoints.Checkpointer(workdir, config.train.keep_checkpoints, read_only=True)
  _check_checkpoint(ckpt, which, workdir, config)
  config = dataclasses.replace(config, mesh=partitioning.fit_to_devices(config.mesh))
  exp = Experiment(config, workdir)
  splits = _splits(exp, split, eval_lengths)
  abstract = exp.abstract_with_shardings()
  if isinstance(which, int):
    step, state = which, ckpt.restore(which, abstract)
  else:
    step, state = ckpt.restore_first_intact(ckpt.ranked_steps(which), abstract)
  if members is None:
    chosen, params = exp.chosen_members(state.params)
  else:
    chosen = list(members)
    params = jax.tree.map(lambda x: x[np.asarray(chosen)], state.params)
  return {'workdir': workdir, 'step': int(step), 'seeds': [exp.seeds[i] for i in chosen],
          'members': chosen, 'learning_rate': exp.learning_rates[chosen[0]],
          'position': config.model.position,
          'attention': config.model.attention, 'train_length': exp.info.train_length,
          'overrides': applied, 'eval': exp.evaluate_lengths(params, splits)}


def write_results(results: dict[str, Any], path: str | None) -> str:
  """Writes ``results`` to ``path`` (default: the workdir's eval.json); returns it."""
  path = storage.canonical(path or os.path.join(results['workdir'], EVAL_FILE))
  try:
    storage.makedirs(os.path.dirname(path))
    storage.write_json(path, results)
  except OSError as e:
    raise ValueError(f'The results are printed above, but writing them to {path} failed '
                     f'({type(e).__name__}: {e}); pass --output=PATH to write them elsewhere.'
                     ) from None
  return path


def _check_lengths(config: RunConfig, eval_lengths: Sequence[int]) -> None:
  positions = config.data.random_positions
  if positions and max(eval_lengths, default=0) > positions:
    raise ValueError(f'This model was trained with data.random_positions={positions}: positions '
                     f'are drawn from 0 .. {positions - 1}, so it cannot be evaluated at '
                     f'{max(eval_lengths)} tokens. Evaluate at lengths <= {positions}.')
  model = config.model
  too_long = [n for n in eval_lengths if n > model.max_length]
  if models.has_max_length(model.position) and too_long:
    raise ValueError(f'This model (model.position={model.position}) has position embeddings for '
                     f'{model.max_length} tokens (model.max_length), so it cannot be '
                     f'evaluated at {", ".join(map(str, too_long))}. Evaluate at lengths <= '
                     f'{model.max_length}, or train with a larger --config.model.max_length;'
                     ' schemes without a length limit (e.g. rotary, alibi) extrapolate.')


def _check_checkpoint(ckpt: checkpoints.Checkpointer, which: str | int, workdir: str,
                      config: RunConfig) -> None:
  if not (steps := ckpt.all_steps()):
    raise FileNotFoundError(f'No checkpoint in {workdir!r} yet: train first (train.py '
                            f'--workdir={workdir}), or wait for its first checkpoint '
                            f'(train.checkpoint_every={config.train.checkpoint_every} steps).')
  if isinstance(which, int) and which not in steps:
    raise ValueError(f'--checkpoint={which}: there is no checkpoint of step {which} in '
                     f'{workdir}; available: {", ".join(map(str, steps))} (or best, latest).')


def _splits(exp: Experiment, split: str, eval_lengths: Sequence[int]) -> list[tuple[str, int]]:
  """(split, length) pairs: ``split`` at the training length, then one per extra length."""
  if split not in exp.info.eval_splits:
    raise ValueError(f'--split={split!r} is not a split of {exp.info.name}; valid: '
                     f'{", ".join(exp.info.eval_splits)}.')
  splits = [(split, exp.info.train_length)]
  for length in eval_lengths:
    try:
      splits += [(name, length) for name in datasets.eval_splits_for_length(
          exp.info, length, any_length=exp.kind.language_model)]
    except ValueError as e:
      lengths = sorted({n for k, n in exp.info.eval_splits.items() if k.startswith('test')})
      raise ValueError(f'--eval_lengths: {e}. {exp.info.name} is evaluated beyond training '
                       f'only at the lengths of its test splits: use --eval_lengths among '
                       f'{", ".join(map(str, lengths))}.') from None
  return splits


def format_table(results: dict[str, Any]) -> str:
  """A plain-text table: split, length, the metric (mean +- std over seeds) or why not."""
  metric = next((m for r in results['eval'].values() for m in ('perplexity', 'pearson',
                                                               'accuracy') if m in r), 'accuracy')
  rows = [f'{results["position"]}/{results["attention"]} (step {results["step"]}, '
          f'trained at length {results["train_length"]})',
          f'{"split":<12} {"length":>7}  {metric}']
  for split, r in results['eval'].items():
    if 'not_applicable' in r:
      value = f'n/a: {r["not_applicable"]}'
    else:
      acc = np.asarray(r[metric])
      value = f'{acc.mean():.4f}' + (f' +- {acc.std(ddof=1):.4f} ({acc.size} seeds)'
                                      if acc.size > 1 else '')
    rows.append(f'{split:<12} {r["length"]:>7}  {value}')
  return '\n'.join(rows)
