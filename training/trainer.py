"""``train_and_evaluate(config, workdir)``: the whole training run, resumable from the workdir."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from typing import Any, Iterable, Iterator, Sequence

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging
import numpy as np
from flax import nnx

import data as data_lib
import models
from training import checkpoints
from training import config_checks
from training import metrics as metrics_lib
from training import optim
from training import partitioning
from training import preemption
from training import steps as steps_lib
from training import workdir as workdir_lib

SUMMARY_FILE = 'summary.json'


class NonFiniteLossError(RuntimeError):
  """The loss or the gradients became NaN/Inf."""


def setup_runtime(config: ml_collections.ConfigDict, *, quiet: bool = True) -> None:
  """Process-wide settings for the entry points.

  The persistent compilation cache (identical shapes compile once, across processes and runs);
  with ``quiet``, library INFO logs (TFDS, orbax) and progress bars are silenced so the console
  shows this project's progress lines.
  """
  if quiet:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    logging.set_verbosity(logging.WARNING)
    tfds.disable_progress_bar()
  if config.train.compilation_cache_dir:
    path = os.path.expanduser(config.train.compilation_cache_dir)
    jax.config.update('jax_compilation_cache_dir', path)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)


class Experiment:
  """Everything a run derives from its config once: data info, model, mesh, steps, shardings."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str,
               devices: Sequence[jax.Device] | None = None):
    """``devices``: the devices of the mesh (default: all of them)."""
    config_checks.validate_config(config)
    self.config = config
    self.workdir = workdir
    self.info = data_lib.get_info(config.data, workdir=workdir)
    self.model_config = models.ModelConfig.from_config(
        config, vocab_size=self.info.vocab_size, num_classes=self.info.num_classes)
    self.mesh = config_checks.check_devices(config, devices)
    self.seeds = [config.train.seed + i for i in range(config.train.num_seeds)]
    self.num_updates = config.train.num_steps // config.optim.grad_accum_steps
    self.tx, self.schedule = optim.make_optimizer(config.optim, self.num_updates)
    abstract_model = lambda cfg: jax.eval_shape(functools.partial(models.init, cfg),
                                                jax.random.PRNGKey(0))
    train_graphdef, abstract_params = abstract_model(self.model_config)
    eval_graphdef = abstract_model(self.model_config.replace(deterministic=True))[0]
    train_step, eval_step = steps_lib.make_step_fns(
        train_graphdef, eval_graphdef, self.tx, self.schedule,
        config.optim.grad_accum_steps, config.train.skip_nonfinite)
    self.rules = partitioning.logical_rules(config.mesh)
    self.abstract_state = jax.eval_shape(self._init, self._seed_keys())
    self.state_sharding = partitioning.state_shardings(
        self.abstract_state, abstract_params, self.tx, self.mesh, self.rules)
    self.batch_sharding = partitioning.batch_sharding(self.mesh)
    self.train_step, self.eval_step = steps_lib.jit_steps(
        train_step, eval_step, self.state_sharding, self.batch_sharding,
        partitioning.replicated(self.mesh), self.rules)

  def _seed_keys(self) -> jax.Array:
    return jnp.stack([jax.random.PRNGKey(s) for s in self.seeds])

  def _init(self, keys_Sx2: jax.Array) -> steps_lib.TrainState:
    def init_one(key):
      init_key, dropout_key = jax.random.split(key)
      params = nnx.to_pure_dict(models.init(self.model_config, init_key)[1])
      return steps_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                  opt_state=self.tx.init(params), key=dropout_key,
                                  skipped=jnp.zeros((), jnp.int32))
    return jax.vmap(init_one)(keys_Sx2)

  def init_state(self) -> steps_lib.TrainState:
    """Parameters and optimizer state born with their shardings (never whole on one device)."""
    return jax.jit(self._init, out_shardings=self.state_sharding)(self._seed_keys())

  def abstract_with_shardings(self):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        self.abstract_state, self.state_sharding)

  def data_shard(self, global_batch_size: int) -> dict[str, int]:
    """The rows of each global batch this process loads (``process_index/process_count`` of the
    data iterators)."""
    index, count = partitioning.process_rows(self.mesh, global_batch_size)
    return {'process_index': index, 'process_count': count}

  def global_batch(self, local: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """Assembles the global batch from this process's rows (multi-host)."""
    return {k: jax.make_array_from_process_local_data(self.batch_sharding, v)
            for k, v in local.items()}

  def evaluate(self, params, batches: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-seed loss and accuracy over every example of ``batches`` (sums reduced on host)."""
    totals = None
    for local in batches:
      sums = jax.device_get(self.eval_step(params, self.global_batch(local)))
      totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
    if totals is None:
      raise ValueError('The evaluation split is empty.')
    count = np.maximum(totals['count'], 1.0)
    return {'loss': totals['loss_sum'] / count, 'accuracy': totals['correct_sum'] / count,
            'count': totals['count']}

  def eval_batches(self, split: str, max_length: int | None = None
                   ) -> Iterator[dict[str, np.ndarray]]:
    return data_lib.eval_iterator(
        self.config.data, split, workdir=self.workdir,
        global_batch_size=self.config.train.eval_batch_size, max_length=max_length,
        **self.data_shard(self.config.train.eval_batch_size))

  def evaluate_lengths(self, params, splits: Iterable[tuple[str, int]]
                       ) -> dict[str, dict[str, Any]]:
    """Evaluates (split, length) pairs; a scheme that cannot run at a length says so.

    Results are keyed by the split name, or ``split@length`` when the length is not the
    split's natural one (text datasets evaluated at several lengths).
    """
    results = {}
    for split, length in splits:
      key = split if self.info.eval_splits.get(split) == length else f'{split}@{length}'
      try:
        m = self.evaluate(params, self.eval_batches(split, length))
        results[key] = {'split': split, 'length': length, 'accuracy': m['accuracy'].tolist(),
                        'loss': m['loss'].tolist(), 'count': float(m['count'][0])}
      except models.LengthError as e:
        results[key] = {'split': split, 'length': length, 'not_applicable': str(e)}
    return results


def _write_json(path: str, obj: Any) -> None:
  if jax.process_index() != 0:
    return
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def _format_eta(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  return f'{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}'


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains, evaluates periodically, checkpoints, resumes; returns the run summary.

  The summary (also ``workdir/summary.json``) holds per-seed final validation accuracy and the
  accuracy on every evaluation split (the probes' extrapolation splits included). The workdir is
  locked for the run's duration: a second run on it refuses to start.
  """
  workdir = os.path.abspath(os.path.expanduser(workdir))
  os.makedirs(workdir, exist_ok=True)
  with workdir_lib.lock(workdir, jax.process_index()), contextlib.ExitStack() as stack:
    return _train_and_evaluate(config, workdir, stack)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                        stack: contextlib.ExitStack) -> dict[str, Any]:
  """The run; ``stack`` closes the checkpointer (waiting for its saves) and writers on any exit."""
  config_checks.check_resume_compatible(config, workdir)
  exp = Experiment(config, workdir)
  t = config.train

  ckpt = checkpoints.Checkpointer(workdir, t.keep_checkpoints)
  stack.callback(ckpt.close)
  start, state = ckpt.restore_latest(exp.abstract_with_shardings())
  # Written once the workdir's checkpoints are accepted: a refused workdir is left as it was.
  _write_json(os.path.join(workdir, config_checks.CONFIG_FILE),
              json.loads(config.to_json_best_effort()))
  if start:
    metrics_lib.console(f'Resumed from step {start} in {workdir}.')
  else:
    state = exp.init_state()
  num_params = models.count_params(exp.abstract_state.params) // len(exp.seeds)
  metrics_lib.console(f'{exp.model_config.position}/{exp.model_config.attention} model, '
                      f'{num_params:,} parameters, {len(exp.seeds)} seed(s), '
                      f'{jax.process_count()} process(es), {jax.device_count()} device(s), '
                      f'mesh {dict(exp.mesh.shape)}.')
  writer = metrics_lib.MetricWriter(workdir, exp.seeds, resume_step=start)
  stack.callback(writer.close)
  train_iter = data_lib.train_iterator(
      config.data, workdir=workdir, seed=config.data.seed, global_batch_size=t.batch_size,
      start_step=start, **exp.data_shard(t.batch_size))

  window: dict[str, np.ndarray] = {}
  timing = {'t0': time.perf_counter(), 'steps': 0, 'step_time_sum': 0.0, 'timed_steps': 0}
  last_eval: dict[str, np.ndarray] | None = None

  def consume(step: int, m: dict[str, np.ndarray]) -> None:
    """Host-side handling of step ``step``'s metrics (fetched one step late)."""
    if not np.all(m['finite']) and not t.skip_nonfinite:
      raise NonFiniteLossError(
          f'Loss or gradients became NaN/Inf at step {step} (seeds '
          f'{[s for s, f in zip(exp.seeds, m["finite"]) if not f]}). The last good checkpoint '
          f'(step {ckpt.latest_step()}) is untouched. Lower optim.learning_rate, enable '
          'optim.grad_clip_norm, or set train.skip_nonfinite=True to skip such updates.')
    for k in ('loss_sum', 'correct_sum', 'count', 'grad_norm'):
      window[k] = window.get(k, 0.0) + m[k]
    window['n'] = window.get('n', 0) + 1
    if step % t.log_every == 0 or step == t.num_steps:
      elapsed = time.perf_counter() - timing['t0']
      rate = timing['steps'] / max(elapsed, 1e-9)
      count = np.maximum(window['count'], 1.0)
      per_seed = {'train/loss': window['loss_sum'] / count,
                  'train/accuracy': window['correct_sum'] / count,
                  'train/grad_norm': window['grad_norm'] / window['n'],
                  'train/learning_rate': m['learning_rate'],
                  'train/skipped_updates': m['skipped'].astype(np.float64)}
      writer.write(step, per_seed, {'perf/steps_per_sec': rate,
                                    'perf/examples_per_sec': rate * t.batch_size})
      metrics_lib.console(
          f'step {step}/{t.num_steps}  loss {per_seed["train/loss"].mean():.4f}  '
          f'acc {per_seed["train/accuracy"].mean():.3f}  {rate:.2f} steps/s  '
          f'{rate * t.batch_size:.0f} ex/s  ETA {_format_eta((t.num_steps - step) / max(rate, 1e-9))}')
      window.clear()
      timing.update(t0=time.perf_counter(), steps=0)

  pending = None
  watcher = stack.enter_context(preemption.Watcher())
  for step in range(start + 1, t.num_steps + 1):
    t_iter = time.perf_counter()
    batch = exp.global_batch(next(train_iter))
    state, step_metrics = exp.train_step(state, batch)
    if pending is not None:
      consume(*jax.device_get(pending))  # the previous step: no wait on the step just launched
    pending = (step, step_metrics)
    if step - start > 2:  # steady state (after compilation): one iteration ~ one step
      timing['step_time_sum'] += time.perf_counter() - t_iter
      timing['timed_steps'] += 1
    timing['steps'] += 1
    is_last = step == t.num_steps
    if watcher.reached(step):
      consume(*jax.device_get(pending))
      ckpt.save(step, state)
      ckpt.wait()
      metrics_lib.console(f'Preempted: saved step {step} in {workdir}; the next start resumes '
                          'from it.')
      raise preemption.Preempted(step)
    if step % t.eval_every == 0 or step % t.checkpoint_every == 0 or is_last:
      consume(*jax.device_get(pending))
      pending = None
    evaluated = step % t.eval_every == 0 or is_last
    if evaluated:
      last_eval = exp.evaluate(state.params, exp.eval_batches('validation'))
      writer.write(step, {'validation/loss': last_eval['loss'],
                          'validation/accuracy': last_eval['accuracy']})
      metrics_lib.console(f'step {step}: validation accuracy '
                          f'{np.round(last_eval["accuracy"], 4).tolist()}')
    if step % t.checkpoint_every == 0 or is_last:
      # Rank the checkpoint by validation accuracy only if it was evaluated at this step.
      ckpt.save(step, state, float(np.mean(last_eval['accuracy'])) if evaluated else None)
    if step % t.eval_every == 0 or step % t.checkpoint_every == 0:
      timing.update(t0=time.perf_counter(), steps=0)  # throughput excludes eval and saving
  if pending is not None:
    consume(*jax.device_get(pending))
  ckpt.wait()

  if last_eval is None:  # resumed at the end: evaluate what was restored
    last_eval = exp.evaluate(state.params, exp.eval_batches('validation'))
  splits = [(k, v) for k, v in exp.info.eval_splits.items() if k != 'validation']
  summary = {
      'position': exp.model_config.position,
      'attention': exp.model_config.attention,
      'dataset': config.data.name,
      'seeds': exp.seeds,
      'num_steps': t.num_steps,
      'num_params': num_params,
      'validation_accuracy': last_eval['accuracy'].tolist(),
      'validation_loss': last_eval['loss'].tolist(),
      'eval': exp.evaluate_lengths(state.params, splits),
      'step_time_s': (timing['step_time_sum'] / timing['timed_steps']
                      if timing['timed_steps'] else None),
      'skipped_updates': np.asarray(jax.device_get(state.skipped)).tolist(),
  }
  _write_json(os.path.join(workdir, SUMMARY_FILE), summary)
  return summary
