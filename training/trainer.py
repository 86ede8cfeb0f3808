"""``train_and_evaluate(config, workdir)``: the guards, ``_setup``, the loop over
``steps.train_step`` (``_Loop.after_step``: log, evaluate, save, preemption), ``_summarize``."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from data import datasets
from models import positions
import settings
import storage
from training import checkpoints
from training import guards
from training import init_from
from training import metrics as metrics_lib
from training import validation
from training import workdir as workdir_lib
from training.config import RunConfig, run_config
from training.experiment import Experiment
from training.metrics import console

SUMMARY_FILE = 'summary.json'
_SUMMED = ('loss_sum', 'correct_sum', 'count', 'scored', 'grad_norm')


class NonFiniteLossError(RuntimeError):
  """The loss or the gradients became NaN/Inf."""


# Under the user's XLA_FLAGS (which win): XLA's default CPU scheduler makes the train step slower
# and larger in peak memory here (benchmarks/README.md, finetune).
XLA_FLAG_DEFAULTS = ('--xla_cpu_enable_concurrency_optimized_scheduler=false',)


def default_xla_flags() -> None:
  """Adds ``XLA_FLAG_DEFAULTS`` that $XLA_FLAGS does not set (before JAX starts its backends)."""
  given = os.environ.get('XLA_FLAGS', '')
  names = {f.split('=')[0] for f in given.split()}
  added = [f for f in XLA_FLAG_DEFAULTS if f.split('=')[0] not in names]
  os.environ['XLA_FLAGS'] = ' '.join([given, *added]).strip()


def setup_runtime(config: RunConfig, *, quiet: bool = True) -> None:
  """The persistent compilation cache and, with ``quiet``, no library INFO logs or progress bars."""
  if quiet:
    logging.set_verbosity(logging.WARNING)
    tfds.disable_progress_bar()
  if jax.process_index() > 0:  # one log per run (process 0's); errors still reach every log
    logging.set_verbosity(logging.ERROR)
  if cache := config.train.compilation_cache_dir:
    jax.config.update('jax_compilation_cache_dir', os.path.expanduser(cache))
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)


@dataclasses.dataclass
class _Run:
  config: RunConfig
  workdir: str
  exp: Experiment
  ckpt: checkpoints.Checkpointer
  writer: metrics_lib.RunWriter
  profiler: metrics_lib.Profiler
  held: workdir_lib.Held  # the workdir lock, checked before each save
  start: int
  seconds: dict[str, float] = dataclasses.field(  # wall time of this process's phases
      default_factory=lambda: {'validation_eval': 0.0, 'test_eval': 0.0})


def train_and_evaluate(config: RunConfig | ml_collections.ConfigDict,
                       workdir: str) -> dict[str, Any]:
  """Trains, evaluates, checkpoints, resumes; returns the run summary (also ``summary.json``)."""
  config = run_config(config)
  with guards.guarded(config, workdir) as guard:  # every check, the lock, the signal watcher
    began = time.perf_counter()
    with guard.refusable():
      run, state = _setup(config, guard)
    run.seconds['setup'] = time.perf_counter() - began
    train_step = run.exp.train_step  # steps.train_step over the members, jitted once
    batches, loop, began = run.exp.train_batches(run.start), _Loop(run), time.perf_counter()
    for step in range(run.start + 1, config.train.num_steps + 1):
      run.profiler.before(step)
      with jax.profiler.StepTraceAnnotation('train', step_num=step):
        state, metrics = train_step(state, run.exp.global_batch(next(batches)))
      run.profiler.after(step, state)
      loop.after_step(step, state, metrics, guard.watcher, began)
    run.ckpt.wait()  # the last step is always saved, so no metrics are pending
    run.seconds['train_loop'] = time.perf_counter() - began  # validation and saves included
    return _summarize(run, state, loop.last_eval)


def _setup(config: RunConfig, guard: guards.Guard) -> tuple[_Run, Any]:
  """The run and its newest intact checkpoint, or its initial state."""
  workdir, validated, source, stack = guard.workdir, guard.validated, guard.source, guard.stack
  exp, mesh = Experiment(config, workdir, validated.placement), validated.placement.mesh
  for _, length in exp.final_splits():  # a final evaluation that cannot fit is refused now
    exp.eval_batch_size(length)
  ckpt = checkpoints.Checkpointer(workdir, config.train.keep_checkpoints)
  stack.callback(ckpt.close)
  start, state = ckpt.restore_latest(exp.abstract_with_shardings())
  # Written once the workdir's checkpoints are accepted: a refused workdir is left as it was.
  config_dict = settings.to_dict(config)
  validation.save_config(config_dict, workdir, None if start else validated.fingerprint)
  if jax.process_index() == 0:
    datasets.save_info(exp.info, workdir)
  if start:
    console(f'Resumed from step {start} in {workdir}.')
  else:
    state = exp.init_state()
    if source:
      state = init_from.initial_state(state, exp, source)
  if exp.model_config.language_model:
    tokens = sum(int(rows['mask'].sum()) for rows in exp.dataset.train_rows())
    console(f'{exp.info.name}: {tokens:,} training tokens (this process\'s shards) packed '
            f'into rows of {exp.info.train_length} at '
            f'{100 * exp.dataset.packing_efficiency():.2f}% efficiency (real tokens / slots).')
  console(f'{exp.model_config.position}/{exp.model_config.attention} model, '
          f'{exp.num_params:,} parameters, {len(exp.seeds)} member(s) ({exp.member_mode}), '
          f'{jax.process_count()} process(es), {jax.device_count()} device(s), '
          f'mesh {dict(mesh.shape)}.')
  t = config.train
  writer = metrics_lib.RunWriter(workdir, exp.members, num_steps=t.num_steps, resume_step=start,
                                 log_every=t.log_every, hparams=hparams(config_dict),
                                 wandb_project=t.wandb_project)
  stack.callback(writer.close)
  profiler = metrics_lib.Profiler(config.train.profile_steps, workdir)
  stack.callback(profiler.close)
  return _Run(config, workdir, exp, ckpt, writer, profiler, guard.held, start), state


def hparams(config_dict: dict[str, Any]) -> dict[str, Any]:
  """A config's dict as flat 'group.field' -> scalar (a list as its command-line text)."""
  flat = validation.flatten(config_dict)
  return {k: v if isinstance(v, (bool, int, float, str)) else
          ','.join(map(str, v)) if isinstance(v, list) else str(v) for k, v in flat.items()}


class _Loop:
  """The host's work after each step. Metrics are fetched one step late (the host never waits on
  the step just launched), at once where an evaluation or a save needs them; the window averaged
  every ``train.log_every`` steps is saved with each checkpoint, so a resume writes the same
  records."""

  def __init__(self, run: _Run):
    self.run, self.pending, self.last_eval = run, None, None  # the last validation's results
    saved = run.ckpt.restored_train_log or {'num': 0, 'sums': {}}  # None: a fresh start
    self.sums: dict[str, np.ndarray] = {k: np.asarray(v['values'], v['dtype'])
                                        for k, v in saved['sums'].items()}
    self.num = int(saved['num'])

  def saved(self) -> dict[str, Any]:
    """The window as JSON (float32 sums are exact as Python floats)."""
    return {'num': self.num, 'sums': {k: {'values': np.asarray(v).tolist(),
                                          'dtype': str(np.asarray(v).dtype)}
                                      for k, v in self.sums.items()}}

  def add(self, step: int, m: dict[str, np.ndarray]) -> None:
    run, t = self.run, self.run.config.train
    if not np.all(m['finite']) and not t.skip_nonfinite:
      steps = run.ckpt.all_steps()
      raise NonFiniteLossError(
          f'Loss, gradients or updated parameters became NaN/Inf at step {step} (members '
          f'{[s for s, f in zip(run.exp.members, m["finite"]) if not f]}). The last good '
          f'checkpoint (step {steps[-1] if steps else None}) is untouched. Lower '
          'optim.learning_rate, enable optim.grad_clip_norm, or set train.skip_nonfinite=True '
          'to skip such updates.')
    self.sums = {k: self.sums.get(k, 0.0) + m[k] for k in _SUMMED}
    self.num += 1
    if step % t.log_every and step != t.num_steps:
      return
    count = np.maximum(self.sums['count'], 1.0)
    run.writer.write(step, {'train/loss': self.sums['loss_sum'] / count,
                            'train/accuracy': self.sums['correct_sum']
                            / np.maximum(self.sums['scored'], 1.0),
                            'train/grad_norm': self.sums['grad_norm'] / self.num,
                            'train/learning_rate': m['learning_rate'],
                            'train/skipped_updates': m['skipped'].astype(np.float64)})
    self.sums, self.num = {}, 0

  def flush(self, began: float) -> None:
    if self.pending is not None:
      self.add(*jax.device_get(self.pending))
      self.run.seconds.setdefault('first_step', time.perf_counter() - began)  # mostly compiling
      self.pending = None

  def after_step(self, step: int, state: Any, step_metrics: dict, watcher: guards.Watcher,
                 began: float) -> None:
    run, t = self.run, self.run.config.train
    self.flush(began)
    self.pending = (step, step_metrics)
    run.writer.progress(step)
    preempted = watcher.reached(step)
    evaluated = step % t.eval_every == 0 or step == t.num_steps
    saved = step % t.checkpoint_every == 0 or step == t.num_steps
    if preempted or evaluated or saved:
      self.flush(began)
    if preempted:
      run.ckpt.save(step, state, train_log=self.saved())
      run.ckpt.wait()
      console(f'Preempted: saved step {step} in {run.workdir}; the next start resumes from it.')
      raise guards.Preempted(step)
    if evaluated:
      eval_began = time.perf_counter()
      self.last_eval = run.exp.evaluate(state.params, run.exp.eval_batches('validation'))
      run.seconds['validation_eval'] += time.perf_counter() - eval_began
      run.writer.write(step, {f'validation/{k}': v for k, v in self.last_eval.items()
                              if k not in ('count', 'score')})
    if saved:  # a candidate for the best only if evaluated at this step, with a finite loss
      run.held.check()
      last = self.last_eval
      score = float(np.mean(last['score'])) if evaluated else np.nan
      finite = np.isfinite(score) and np.all(np.isfinite(last['loss']))
      run.ckpt.save(step, state, score if finite else None, self.saved())


def _summarize(run: _Run, state: Any, last_eval: dict | None) -> dict[str, Any]:
  """Chooses the learning rate on validation, evaluates its members, writes summary.json."""
  exp = run.exp
  if last_eval is None:  # resumed at the end: evaluate what was restored
    last_eval = exp.evaluate(state.params, exp.eval_batches('validation'))
  chosen, params = exp.chosen_members(state.params, last_eval)
  began = time.perf_counter()
  results = exp.evaluate_lengths(params, exp.final_splits())  # the chosen members, in order
  final = exp.kind.final(exp, state.params, run.workdir)  # every member (a kind may score all)
  run.seconds['test_eval'] = time.perf_counter() - began
  summary = {
      **{k: getattr(exp.model_config, k) for k in ('position', 'attention', 'task')},
      **exp.kind.describe(exp),
      'dataset': run.config.data.name,
      'seeds': exp.seeds,
      'learning_rates': exp.learning_rates,
      'chosen_members': chosen,
      'members': exp.member_mode,
      'learning_rate': exp.learning_rates[chosen[0]],
      'num_steps': run.config.train.num_steps,
      'num_params': exp.num_params,
      **{f'validation_{k}': v.tolist() for k, v in last_eval.items()
         if k not in ('count', 'score')},
      'eval': results,
      **final,
      'step_time_s': run.writer.step_time(),
      'seconds': run.seconds,
      'skipped_updates': np.asarray(jax.device_get(state.skipped)).tolist(),
      **positions.learned(exp.model_config, state.params),  # reads only its own leaves
  }
  if jax.process_index() == 0:
    storage.write_json(os.path.join(run.workdir, SUMMARY_FILE), summary)
  console(closing_line(summary, os.path.join(run.workdir, SUMMARY_FILE), exp.kind.closing(summary)))
  return summary


def closing_line(summary: dict[str, Any], path: str, extra: str = '') -> str:
  """The run's last line: the final state's test result (and the kind's ``extra``), and ``path``."""
  test = summary['eval'].get('test', {})
  metric = next((m for m in ('perplexity', 'pearson', 'accuracy') if m in test), None)
  if metric is None:
    return f'Done at step {summary["num_steps"]}; results in {path}.'
  values = np.asarray(test[metric])
  spread = f' +- {values.std(ddof=1):.4f} over {values.size} seeds' if values.size > 1 else ''
  return (f'Done: test {metric} {values.mean():.4f}{spread} at length {test["length"]}'
          f'{extra}, of the final step {summary["num_steps"]} (eval.py and predict.py '
          'default to the best checkpoint by validation; --checkpoint=latest is this one). All '
          f'results: {path}.')
