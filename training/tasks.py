"""Task kinds: what a run trains its model to do, one registration each (the core's: classify,
sentence pairs, MLM and CLM; a project registers its own). The run picks its kind from its
config (``of``): nothing outside this registry asks which kind or dataset class it has."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import data
from data import batches
from data import datasets
from training import metrics as metrics_lib

# (model, batch, rngs) -> logits [R, C], labels [R], weights [R] and the rows the accuracy
# scores [R] (None: as the weights).
Forward = Callable[[Any, Any, nnx.Rngs | None],
                   tuple[jax.Array, jax.Array, jax.Array, jax.Array | None]]


@dataclasses.dataclass(frozen=True)
class TaskKind:
  """One kind of task; ``dataset_kind``: the dataset kind that always trains it."""

  name: str
  batch: type
  forward: Forward
  metrics: Callable[[dict[str, np.ndarray], list[dict]], dict[str, np.ndarray]]
  # (data config, workdir, pair layout 'joint' or 'dual') -> the dataset, with Dataset's methods.
  load: Callable[[Any, str | None, str], Any]
  language_model: bool = False
  dataset_kind: str | None = None
  # (experiment) -> summary entries before the results (e.g. a language model's packing).
  describe: Callable[[Any], dict[str, Any]] = lambda exp: {}
  # (experiment, every member's params, workdir) -> summary entries after the results.
  final: Callable[[Any, Any, str], dict[str, Any]] = lambda exp, params, workdir: {}
  # (experiment) -> the (split, length) pairs evaluated at the end; None: the config's.
  final_splits: Callable[[Any], list[tuple[str, int]]] | None = None
  # (experiment, lengths) -> the lengths in tokens a batch of each has (query tokens added).
  tokens: Callable[[Any, list[int]], list[int]] = lambda exp, lengths: lengths
  # (summary) -> what the run's closing line adds after its test result.
  closing: Callable[[dict[str, Any]], str] = lambda summary: ''
  # Why predict.py, which classifies texts, cannot serve this kind ('' = it can); {workdir}
  # and {config} are filled in.
  unpredictable: str = ''

  def loss(self, logits_BxC, label_B, weight_B, regression=False, scored_B=None):
    return loss_and_metrics(logits_BxC, label_B, weight_B, regression, scored_B)


KINDS: dict[str, TaskKind] = {}


def register(kind: TaskKind) -> TaskKind:
  if KINDS.get(kind.name, kind) is not kind:
    raise ValueError(f'Task kind {kind.name!r} is registered twice.')
  KINDS[kind.name] = kind
  return kind


def of(config) -> TaskKind:
  """``train.task``; else the kind owning the dataset's kind, else classify or pairs."""
  if config.train.task != 'classify':
    return KINDS[config.train.task]
  dataset_kind = data.DATASETS[config.data.name].kind
  owner = [k for k in KINDS.values() if k.dataset_kind == dataset_kind]
  return owner[0] if owner else KINDS['pairs' if config.data.pairs else 'classify']


def loss_and_metrics(logits_BxC: jax.Array, label_B: jax.Array, weight_B: jax.Array,
                     regression: bool = False, scored_B: jax.Array | None = None
                     ) -> tuple[jax.Array, dict]:
  """Weighted mean loss (cross-entropy; ``regression``: squared error) and metric sums (binary
  tasks: F1's, class 1 positive). The accuracy and F1 count the rows ``scored_B`` weighs
  (default: as the loss; a Chomsky task's outputs after a termination token are not scored)."""
  weight_B = weight_B.astype(jnp.float32)
  scored_B = weight_B if scored_B is None else scored_B.astype(jnp.float32)
  logits_BxC = logits_BxC.astype(jnp.float32)
  sums = {}
  if regression:
    losses_B = jnp.square(logits_BxC[:, 0] - label_B.astype(jnp.float32))
    correct_B = jnp.zeros_like(losses_B)
  else:
    losses_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxC, label_B)
    predicted_B = jnp.argmax(logits_BxC, -1)
    correct_B = (predicted_B == label_B).astype(jnp.float32)
    if logits_BxC.shape[-1] == 2:
      positive, truly = predicted_B == 1, label_B == 1
      sums = {name: (cases.astype(jnp.float32) * scored_B).sum() for name, cases in (
          ('true_positive_sum', positive & truly), ('false_positive_sum', positive & ~truly),
          ('false_negative_sum', ~positive & truly))}
  denom = jnp.maximum(weight_B.sum(), 1.0)
  sums.update(loss_sum=(losses_B * weight_B).sum(), correct_sum=(correct_B * scored_B).sum(),
              count=weight_B.sum(), scored=scored_B.sum())
  return (losses_B * weight_B).sum() / denom, sums


def _classify_forward(model, batch: batches.Classification, rngs=None):
  return (model(batch.inputs, batch.positions, batch.mask, batch.token_types, rngs=rngs),
          batch.label, batch.weight, None)


def _lm_forward(model, batch: batches.LanguageModel, rngs=None):
  logits_BxMxV = model(batch.inputs, batch.positions, batch.mask, rngs=rngs,
                       segments_BxL=batch.segments, target_positions_BxM=batch.target_positions)
  return (logits_BxMxV.reshape(-1, logits_BxMxV.shape[-1]), batch.targets.reshape(-1),
          batch.target_weights.reshape(-1), None)


def _base_metrics(totals: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  count = np.maximum(totals['count'], 1.0)
  return {'loss': totals['loss_sum'] / count, 'count': totals['count']}


def _accuracy(totals: dict[str, np.ndarray]) -> np.ndarray:
  return totals['correct_sum'] / np.maximum(totals['scored'], 1.0)


def classifier_metrics(totals: dict[str, np.ndarray], examples: list[dict]
                       ) -> dict[str, np.ndarray]:
  """Loss and accuracy (+ F1 with two classes), or for regression (``examples``: each batch's
  predictions) Pearson's and Spearman's r; ``score`` ranks checkpoints."""
  results = _base_metrics(totals)
  if examples:
    results.update(metrics_lib.correlations(
        *(np.concatenate([e[k] for e in examples], axis=1)
          for k in ('prediction', 'target', 'weight'))))
    results['score'] = results['pearson']
    return results
  results['accuracy'] = results['score'] = _accuracy(totals)
  if 'true_positive_sum' in totals:
    tp, fp, fn = (totals[f'{k}_sum'] for k in ('true_positive', 'false_positive', 'false_negative'))
    results['f1'] = 2 * tp / np.maximum(2 * tp + fp + fn, 1.0)
  return results


def _lm_metrics(totals: dict[str, np.ndarray], examples: list[dict]) -> dict[str, np.ndarray]:
  """Token accuracy and perplexity per predicted token; minus the loss ranks checkpoints."""
  del examples
  results = _base_metrics(totals)
  results.update(accuracy=_accuracy(totals), score=-results['loss'],
                 perplexity=np.exp(results['loss']))
  return results


def _load_documents(data_config, workdir: str | None, pair_layout: str, *, task: str,
                    masked: bool):
  del pair_layout  # one text per document
  return datasets.load_language_model(data_config, workdir, task, masked)


def _packing(exp) -> dict[str, Any]:
  return {'packing_efficiency': exp.dataset.packing_efficiency()}


_LM_PREDICT = ('{workdir} holds a language model (train.task={config.train.task}); predict.py '
               'runs classifiers. Fine-tune it first: train.py with '
               '--config.train.init_from={workdir}.')

for _name in ('classify', 'pairs'):
  register(TaskKind(_name, batches.Classification, _classify_forward, classifier_metrics,
                    datasets.load_classifier))
for _name, _masked in (('mlm', True), ('clm', False)):
  register(TaskKind(_name, batches.LanguageModel, _lm_forward, _lm_metrics,
                    functools.partial(_load_documents, task=_name, masked=_masked),
                    language_model=True,
                    describe=_packing, unpredictable=_LM_PREDICT))
