"""Predictions of a trained workdir on new texts (``predict.py``): read as the run's data was,
tokenized at the training length and run through one member of the checkpoint (the first of the
rate the run chose); one JSON line per example: the class and its probabilities, or the value.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from typing import Any, Iterator

import jax
import numpy as np
import tqdm
from flax import nnx

import models
from data import batches as batches_lib
from data import datasets
from data import files
from data import pipeline
import storage
from training import checkpoints
from training import evaluation
from training import tasks
from training import trainer
from training import validation


def load_params(workdir: str, checkpoint: str, keep: int) -> tuple[int, Any]:
  """(step, one member's parameters) of the checkpoint ``checkpoint`` names."""
  which = evaluation.parse_checkpoint(checkpoint)
  ckpt = checkpoints.Checkpointer(workdir, keep, read_only=True)
  steps = [which] if isinstance(which, int) else ckpt.ranked_steps(which)
  if not steps or steps[0] not in ckpt.all_steps():
    raise FileNotFoundError(f'No checkpoint {checkpoint!r} in {workdir}: train first, or give '
                            f'--checkpoint among best, latest, {ckpt.all_steps()}.')
  params = ckpt.restore_raw(steps[0])['params']
  summary = os.path.join(workdir, trainer.SUMMARY_FILE)  # none before the run finished: member 0
  member = int(storage.read_json(summary).get('chosen_members', [0])[0]
               if storage.is_file(summary) else 0)
  return steps[0], jax.tree.map(lambda x: x[member], params)


def describe(workdir: str) -> tuple[Any, datasets.DatasetInfo, models.ModelConfig]:
  """(config, dataset info, model config) of a trained workdir."""
  config = validation.load_config(workdir)
  info = datasets.saved_info(workdir) or tasks.of(config).load(config.data, workdir, 'joint').info
  cfg = config.model_config(vocab_size=info.vocab_size, num_classes=info.num_classes)
  return config, info, cfg


def predict(workdir: str, input_path: str, *, checkpoint: str = 'best',
            batch_size: int = 64) -> Iterator[dict[str, Any]]:
  """One dict per example of ``input_path``, in order."""
  workdir = validation.check_workdir(workdir)
  config, info, cfg = describe(workdir)
  if why := tasks.of(config).unpredictable:  # e.g. a language model
    raise ValueError(why.format(workdir=workdir, config=config))
  texts = files.read_inputs(input_path, files.Columns.of(config.data))
  tokenizer = datasets.load_tokenizer(config.data, workdir)
  _, params = load_params(workdir, checkpoint, config.train.keep_checkpoints)
  regression, names = config.data.regression, info.class_names
  graphdef = jax.eval_shape(functools.partial(models.init, cfg.replace(deterministic=True)),
                            jax.random.PRNGKey(0))[0]

  @jax.jit
  def run(params, *features):  # class probabilities, or the regression value
    logits = nnx.merge(graphdef, params)(*features)
    return logits[:, 0] if regression else jax.nn.softmax(logits, axis=-1)

  num_batches = math.ceil(len(texts) / batch_size)
  make = pipeline.maker(texts, np.zeros(len(texts), np.int32), tokenizer,
                        length=config.data.max_length,
                        pair_layout='dual' if cfg.dual_encoder else 'joint')
  batches = batches_lib.evaluate(make, batch_size=batch_size, num_batches=num_batches, prefetch=2)
  if config.data.random_positions:  # as the run evaluated: drawn per example
    draw = batches_lib.RandomPositions(config.data.random_positions, config.data.seed)
    batches = (draw.evaluation(batch, 'predict', i * batch_size + np.arange(batch_size))
               for i, batch in enumerate(batches))
  done = 0
  for batch in tqdm.tqdm(batches, total=num_batches, unit='batch', file=sys.stderr,
                         disable=num_batches < 10):
    outputs = np.asarray(run(params, batch.inputs, batch.positions, batch.mask, batch.token_types))
    for output in outputs[:len(texts) - done]:
      yield {'value': float(output)} if regression else {
          'label': names[int(output.argmax())],
          'probabilities': {name: float(q) for name, q in zip(names, output)}}
    done += len(outputs)


def write_predictions(predictions: Iterator[dict[str, Any]], output_path: str) -> int:
  """Writes JSON lines atomically; returns the count."""
  lines = [json.dumps(p) + '\n' for p in predictions]
  storage.makedirs(os.path.dirname(storage.canonical(output_path)))
  storage.write_atomically(output_path, ''.join(lines))
  return len(lines)
