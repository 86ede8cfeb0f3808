"""``Experiment``: what a run derives from its config, once: the dataset, the model, the
optimizer, the mesh, the jitted steps and their shardings."""

from __future__ import annotations

import functools
import math
import os
from typing import Any, Iterable, Iterator

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

import models
from models import positions
from data import batches
from data import sources
from training import optim
from training import partitioning
from training import steps as steps_lib
from training import tasks
from training import validation
from training.config import RunConfig, run_config


def _device_memory() -> float:
  """Bytes of memory of one local device (host RAM shared by the CPU devices)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if 'bytes_limit' in stats:
    return float(stats['bytes_limit'])
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / jax.local_device_count()


def _gib(num_bytes: float) -> str:
  return f'{num_bytes / 2**30:.3g} GiB'


class Experiment:
  """A run's data, model, steps and shardings by its ``placement``."""

  def __init__(self, config: RunConfig | ml_collections.ConfigDict, workdir: str,
               placement: partitioning.Placement | None = None):
    self.config = config = run_config(config)
    self.workdir = workdir
    self.placement = placement or validation.check_devices(config)
    self.mesh = mesh = self.placement.mesh
    self.batch_size = self.placement.batch_size  # global, every process
    self.kind = tasks.of(config)
    self.dataset = self.kind.load(config.data, workdir,
                                  'dual' if config.model.dual_encoder else 'joint')
    self.info = self.dataset.info
    self.random_positions = (batches.RandomPositions(config.data.random_positions,
                                                     config.data.seed)
                             if config.data.random_positions else None)
    self._check_random_positions()
    self.model_config = config.model_config(vocab_size=self.info.vocab_size,
                                            num_classes=self.info.num_classes)
    # The members: every (peak learning rate, seed) pair, seeds innermost.
    seeds = [config.train.seed + i for i in range(config.train.num_seeds)]
    rates = optim.learning_rates(config.optim)
    self.seeds = [seed for _ in rates for seed in seeds]
    self.learning_rates = [rate for rate in rates for _ in seeds]
    num_updates = config.train.num_steps // config.optim.grad_accum_steps
    self.tx, schedule = optim.make_optimizer(config.optim, num_updates)
    abstract_model = lambda cfg: jax.eval_shape(functools.partial(models.init, cfg),
                                                jax.random.PRNGKey(0))
    train_graphdef, abstract_params = abstract_model(self.model_config)
    eval_graphdef = abstract_model(self.model_config.replace(deterministic=True))[0]
    self.static = steps_lib.Static(
        train_graphdef, eval_graphdef, self.tx, schedule, self.kind,
        config.optim.grad_accum_steps, config.train.skip_nonfinite, config.data.regression,
        positions.projection(self.model_config))
    rules = self.placement.rules
    self.abstract_state = jax.eval_shape(self._init, *self._member_inputs())
    self.state_sharding = partitioning.state_shardings(
        self.abstract_state, abstract_params, self.tx, mesh, rules)
    self.batch_sharding = partitioning.batch_sharding(mesh)
    self.member_mode = config.train.members
    if self.member_mode == 'auto':
      self.member_mode = 'loop' if mesh.devices.flat[0].platform == 'cpu' else 'vmap'
    self.train_step, self.eval_step = steps_lib.jit_steps(
        self.static, self.state_sharding, self.batch_sharding, partitioning.replicated(mesh),
        rules, loop=self.member_mode == 'loop')

  @property
  def members(self) -> list[dict[str, float]]:
    """Each member's seed, and its peak learning rate when the run trains several."""
    if len(set(self.learning_rates)) == 1:
      return [{'seed': seed} for seed in self.seeds]
    return [{'seed': seed, 'peak_learning_rate': rate}
            for seed, rate in zip(self.seeds, self.learning_rates)]

  def chosen_members(self, params, validation: dict | None = None) -> tuple[list[int], Any]:
    """The members (and their parameters) of the peak learning rate with the best mean validation
    score over seeds (ties: the lower mean loss, then the smaller rate); ``validation``: its
    results, evaluated here when None."""
    if len(set(self.learning_rates)) == 1:
      return list(range(len(self.seeds))), params
    if validation is None:
      validation = self.evaluate(params, self.eval_batches('validation'))
    at = lambda rate: [i for i, r in enumerate(self.learning_rates) if r == rate]
    best = max(set(self.learning_rates), key=lambda r: (
        np.mean(validation['score'][at(r)]), -np.mean(validation['loss'][at(r)]), -r))
    chosen = at(best)
    return chosen, jax.tree.map(lambda x: x[np.asarray(chosen)], params)

  @property
  def num_params(self) -> int:  # of one member's model
    return models.count_params(self.abstract_state.params) // len(self.seeds)

  def _member_inputs(self) -> tuple[jax.Array, jax.Array]:
    """Each member's PRNG key (from its seed: the same at every rate) and peak rate."""
    return (jnp.stack([jax.random.PRNGKey(s) for s in self.seeds]),
            jnp.asarray(self.learning_rates, jnp.float32))

  def _init(self, keys_Nx2: jax.Array, rates_N: jax.Array) -> steps_lib.TrainState:
    def init_one(key, rate):
      init_key, dropout_key = jax.random.split(key)
      params = nnx.to_pure_dict(models.init(self.model_config, init_key)[1])
      opt_state = optim.with_peak_learning_rate(self.tx.init(params), rate)
      return steps_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                  opt_state=opt_state, key=dropout_key,
                                  skipped=jnp.zeros((), jnp.int32))
    return jax.vmap(init_one)(keys_Nx2, rates_N)

  def init_state(self) -> steps_lib.TrainState:
    """The state born with its shardings (never whole on one device)."""
    return jax.jit(self._init, out_shardings=self.state_sharding)(*self._member_inputs())

  def abstract_with_shardings(self) -> Any:
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        self.abstract_state, self.state_sharding)

  def _shard(self, global_batch_size: int) -> dict[str, int]:  # the rows this process loads
    index, count = partitioning.process_rows(self.mesh, global_batch_size)
    return {'process_index': index, 'process_count': count}

  def step_memory(self) -> int:
    """Bytes XLA allocates for one train step (less what is donated), by static analysis."""
    local = next(self.train_batches(0))
    rows = self.batch_size
    batch = jax.tree.map(lambda v: jax.ShapeDtypeStruct((rows,) + v.shape[1:], v.dtype,
                                                        sharding=self.batch_sharding), local)
    m = self.train_step.lower(self.abstract_with_shardings(), batch).compile().memory_analysis()
    return int(m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
               - m.alias_size_in_bytes)

  def global_batch(self, local: batches.Batch) -> batches.Batch:
    return jax.tree.map(
        lambda v: jax.make_array_from_process_local_data(self.batch_sharding, v), local)

  def train_batches(self, start_step: int) -> Iterator[batches.Batch]:
    """This process's rows of the training batches from ``start_step`` on."""
    shard = self._shard(self.batch_size)
    local = self.dataset.train_batches(seed=self.config.data.seed,
                                       global_batch_size=self.batch_size, start_step=start_step,
                                       **shard)
    if self.random_positions is None:
      return local
    local_size = self.batch_size // shard['process_count']
    rows = shard['process_index'] * local_size + np.arange(local_size)
    return (self.random_positions.training(batch, step, rows)
            for step, batch in enumerate(local, start_step))

  def eval_batches(self, split: str, max_length: int | None = None,
                   batch_size: int | None = None) -> Iterator[batches.Batch]:
    """This process's part of ``split`` at ``max_length`` (default: the split's), in global batches
    of ``batch_size`` (where the grouping matters: a Chomsky task's accuracy is a mean over
    batches) or as few and as small as fit the memory (random positions drawn from (seed, split,
    length, the example's number in the split))."""
    length = max_length or self.info.eval_splits.get(split, self.info.train_length)
    num, unit, size = self.dataset.num_examples(split, max_length), self._eval_unit(), batch_size
    if batch_size is None:
      size = self.eval_batch_size(length)
      # As few batches as at this size, as small as they can be: no batch of mostly padding.
      size = min(size, math.ceil(num / max(1, math.ceil(num / size)) / unit) * unit)
    elif batch_size % unit:
      raise ValueError(f'An evaluation batch of {batch_size} examples cannot be shared by {unit} '
                       f'devices and processes: use a multiple of {unit} '
                       '(data.chomsky_eval_batch_size).')
    shard = self._shard(size)
    local = self.dataset.eval_batches(split, global_batch_size=size, max_length=max_length, **shard)
    if self.random_positions is None:
      return local
    first = sources.shard_bounds(num, shard['process_index'], shard['process_count'])[0]
    rows = size // shard['process_count']
    return (self.random_positions.evaluation(batch, f'{split}@{length}',
                                             first + i * rows + np.arange(rows))
            for i, batch in enumerate(local))

  def final_splits(self) -> list[tuple[str, int]]:
    """The (split, length) pairs evaluated at the end: all but validation, to
    ``train.eval_max_length``, at ``train.test_lengths`` if given (and the training length)."""
    if self.kind.final_splits:  # e.g. a task kind that scores its own test lengths
      return self.kind.final_splits(self)
    t, splits = self.config.train, self.info.eval_splits
    if unknown := sorted(set(t.test_lengths) - set(splits.values())):
      raise ValueError(f'train.test_lengths names {unknown}, lengths {self.info.name} has no test '
                       f'split of; its splits are {sorted(set(splits.values()))} tokens long.')
    limit = t.eval_max_length or max(splits.values())
    return [(k, v) for k, v in splits.items() if k != 'validation' and v <= limit
            and (k == 'test' or not t.test_lengths or v in t.test_lengths)]

  def _check_random_positions(self) -> None:
    """Refuses a length this run trains or evaluates at beyond ``data.random_positions``."""
    n, lengths = self.config.data.random_positions, [self.info.train_length]
    if not n:
      return
    lengths += [v for split, v in self.info.eval_splits.items() if split == 'validation']
    lengths += [v for _, v in self.final_splits()]
    lengths = self.kind.tokens(self, lengths)  # e.g. a kind's query tokens and test lengths
    if max(lengths) > n:
      raise ValueError(f'data.random_positions={n} draws positions from 0 .. {n - 1}, but '
                       f'{self.info.name} is trained or evaluated at up to {max(lengths)} tokens '
                       f'(splits {self.info.eval_splits}). Set data.random_positions >= '
                       f'{max(lengths)} (the paper uses 2048) or lower train.eval_max_length.')

  def _eval_unit(self) -> int:  # every device and process gets rows of an evaluation batch
    return math.lcm(partitioning.data_parallel_size(self.mesh), jax.process_count())

  def eval_batch_size(self, length: int) -> int:
    """``train.eval_batch_size``, halved while a batch's activations at ``length`` tokens would
    take more than half a device's memory; ValueError if one example per device does not fit."""
    cfg, devices = self.model_config, partitioning.data_parallel_size(self.mesh)
    unit = self._eval_unit()
    per_token = 16 * cfg.hidden_size + cfg.mlp_dim  # hidden states and feed-forward, float32
    if cfg.attention == 'softmax':  # logits, probabilities and a temporary per head
      per_token += 3 * cfg.num_heads * length
    if cfg.language_model:  # logits over the vocabulary
      per_token += cfg.vocab_size
    live = 1 if self.member_mode == 'loop' else len(self.seeds)  # members computed at once
    per_example = 4 * live * length * per_token * (2 if cfg.dual_encoder else 1)
    size = self.placement.eval_batch_size
    while size > unit and size // devices * per_example > _device_memory() / 2:
      size = max(unit, size // 2 // unit * unit)
    if size // devices * per_example > _device_memory() / 2:
      raise ValueError(
          f'Evaluating at {length} tokens needs about {_gib(per_example)} per example '
          f'({cfg.attention} attention, {live} member(s) at once), more than half of the '
          f'{_gib(_device_memory())} of a device here. Evaluate at shorter lengths (a training '
          'run: train.eval_max_length), on fewer or larger devices, or train with '
          'model.attention=linear, whose memory grows linearly with the length.')
    return size

  def evaluate(self, params, local_batches: Iterable[batches.Batch]) -> dict[str, np.ndarray]:
    """Per-seed metrics over every example (sums reduced on host); ``score`` ranks checkpoints."""
    totals, examples = None, []
    for local in local_batches:
      sums = jax.device_get(self.eval_step(params, self.global_batch(local)))
      if 'prediction' in sums:
        examples.append({k: sums.pop(k) for k in ('prediction', 'target', 'weight')})
      totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
    if totals is None:
      raise ValueError('The evaluation split is empty.')
    return self.kind.metrics(totals, examples)

  def evaluate_lengths(self, params, splits: Iterable[tuple[str, int]]
                       ) -> dict[str, dict[str, Any]]:
    """Results keyed ``split`` (``split@length`` off its length); a scheme may be not applicable."""
    results = {}
    for split, length in splits:
      key = split if self.info.eval_splits.get(split) == length else f'{split}@{length}'
      try:
        m = self.evaluate(params, self.eval_batches(split, length))
        results[key] = {'split': split, 'length': length, 'count': float(m['count'][0]),
                        **{k: v.tolist() for k, v in m.items() if k != 'count'}}
      except models.LengthError as e:
        results[key] = {'split': split, 'length': length, 'not_applicable': str(e)}
    return results
