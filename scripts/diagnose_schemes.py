"""Why some seeds of the learned-table schemes (shaw, t5, learned) stay at chance on the main
job's order probe: controlled runs of the main job's cell, instrumented (issue 30, item 7).

  python scripts/diagnose_schemes.py --time_members  # every run in RUNS, then the report
  python scripts/diagnose_schemes.py --runs=t5-rates,shaw-base  # some runs only
  python scripts/diagnose_schemes.py --report_only  # rebuilds report.md and runs.csv

Each run is one cell of ``configs/ablation/probes.py`` (its ``get_config`` and
``experiments.ablation.cell_config``: the main job's model, data, batch, warmup and multiplier)
with only the run's overrides (``RUNS``) changed, all its (rate, seed) members trained together
with the real ``Experiment.train_step``. Every ``--every`` steps it records per member: the
training loss of that step, validation accuracy, the gradient norm of the position tables and of
all other parameters (one extra gradient on that step's batch: the library is not changed), and
the tables' state (T5: the mean bias after minus before the query, per head; Shaw: the row norms
and the same after-minus-before contrast of q-independent row means). A run's JSON is written to
``--out``/runs/ as it finishes, so an interrupted diagnosis resumes; the report is rebuilt from
all of them.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import optax  # pylint: disable=g-import-not-at-top
from flax import nnx  # pylint: disable=g-import-not-at-top

import models  # pylint: disable=g-import-not-at-top
from models import positions  # pylint: disable=g-import-not-at-top
from configs.ablation import probes  # pylint: disable=g-import-not-at-top
from experiments import ablation  # pylint: disable=g-import-not-at-top
from training import optim  # pylint: disable=g-import-not-at-top
from training import tasks  # pylint: disable=g-import-not-at-top
from training import trainer  # pylint: disable=g-import-not-at-top
from training.experiment import Experiment  # pylint: disable=g-import-not-at-top

BASE_RATE = (3e-3,)
# name -> (scheme, config overrides, table init: 'default' (the library's N(0, init_std)),
# 'zero' (every bucket or distance starts equal) or 'x10' (N(0, 10 init_std) = N(0, 1): a
# position signal as large as the logits' at init), set here after init; the factor varied).
RUNS = {
    f'{p}-rates': (p, {'optim.learning_rates': (3e-3, 1e-2, 3e-2)}, 'default', 'rate')
    for p in ('t5', 'shaw', 'learned')}
RUNS.update({  # the main job's budget again, with the per-distance accuracy
    f'{p}-base': (p, {'optim.learning_rates': BASE_RATE}, 'default', 'baseline')
    for p in ('t5', 'shaw', 'learned')})
RUNS.update({
    f'{p}-mult{m}': (p, {'optim.learning_rates': BASE_RATE, 'optim.position_lr_multiplier': m},
                     'default', 'multiplier')
    for p in ('t5', 'shaw', 'learned') for m in (1.0, 30.0)})
RUNS.update({
    f'{p}-zero': (p, {'optim.learning_rates': BASE_RATE}, 'zero', 'init')
    for p in ('t5', 'shaw', 'learned')})
RUNS.update({
    f'{p}-x10': (p, {'optim.learning_rates': BASE_RATE}, 'x10', 'init')
    for p in ('t5', 'shaw', 'learned')})
RUNS.update({
    f'{p}-steps{n}': (p, {'optim.learning_rates': BASE_RATE, 'train.num_steps': n}, 'default',
                      'steps')
    for p in ('t5', 'shaw', 'learned') for n in (600, 1000)})
RUNS['shaw-k64'] = ('shaw', {'optim.learning_rates': BASE_RATE, 'model.shaw_max_distance': 64},
                    'default', 'clip distance')
RUNS['t5-buckets128'] = ('t5', {'optim.learning_rates': BASE_RATE, 'model.t5_num_buckets': 128},
                         'default', 'buckets')
# Bins of the markers' distance |B - A| for the final per-distance accuracy; shaw's default
# model.shaw_max_distance (16) is a bin edge.
DISTANCE_BINS = ((1, 16), (17, 32), (33, 62))
MARKER_IDS = (ord('A') + 4, ord('B') + 4)  # byte tokens: id = byte + 4 (data/tokenizers.py)
# Candidates for the main job: the relative tables at N(0, 1) through the library's field, and
# twice the steps at one rate (8 members x 600 steps: the main job's 16 x 300 member-steps).
RUNS.update({
    f'{p}-rel1-steps600': (p, {'optim.learning_rates': BASE_RATE, 'train.num_steps': 600,
                               'model.relative_init_std': 1.0}, 'default', 'candidate')
    for p in ('t5', 'shaw')})
RUNS.update({  # the same with the existing knob: the position tables' rate at 30x
    f'{p}-mult30-steps600': (p, {'optim.learning_rates': BASE_RATE, 'train.num_steps': 600,
                                 'optim.position_lr_multiplier': 30.0}, 'default', 'candidate')
    for p in ('t5', 'shaw', 'learned')})
SOLVED = 0.95  # validation accuracy a seed must reach to count as converged
ESCAPED = 0.6  # validation accuracy that marks leaving the chance plateau
SPLIT_STEPS = (25, 50, 100, 150, 200, 300, 600, 1000)  # rows of the solved-vs-stuck tables
# Written from the committed runs (the tables below are regenerated; this text is not).
FINDINGS = """## Findings

1. **No bug in our implementation.** `optim.position_lr_multiplier` reaches every table (paths
   below: shaw's two per-layer `key_table`s, t5's and learned's `embedding`); no table's
   gradient is ever zero (runs.csv; the smallest are on converged seeds); t5's buckets put keys
   after the query in the upper half, as Hugging Face's `T5Attention._relative_position_bucket`
   does (`relative_position > 0` adds `num_buckets // 2`), so A-before-B and B-before-A never
   share a bucket.
2. **The split is when a seed leaves the chance plateau.** Every seed starts at loss 0.69 (a
   position-free model is exactly at chance on this probe: the order signal is the product of a
   position contrast and content attention between the markers, both ~0 at init, a saddle). On
   the plateau the tables' gradient norm is ~1e-4, 100-1000x below the rest's (solved vs stuck
   table below). Seeds leave it at different steps (t5 at 3e-3: 75-175; shaw: 50-225), then
   converge within ~100 steps; the cosine schedule reaches 0 at step 300, so a seed not out by
   ~200 stays at chance. "Stuck" seeds are late, not different: with 1000 steps every seed of
   t5 (8/8, the last leaving at step 500) and shaw (8/8) converges.
3. **Which seeds are late is set by the shared init and data order, not by the table's
   values**: t5's seeds 0, 2, 4 are the stuck ones at 3e-3, at 1e-2 and with the table
   zero-initialised (t5-zero: 5/8; shaw-zero 3/8: zero init is no fix).
4. **A higher rate is worse**: 1e-2 converges t5 1/8, shaw 0/8, learned 0/8; 3e-2 0/8 for all
   three. 3e-3 is the best of {1e-3 (the main job), 3e-3, 1e-2, 3e-2}: "chosen at the top of the
   grid" is an artefact of the 2-rate grid, and a grid with 1e-2 makes it interior.
5. **The table's own step size (or starting size) decides the escape**: t5 with the multiplier
   at 1x: 0/8 (no seed leaves), 10x (the main job): 4/8, 30x: 7/8 (the eighth 0.90); shaw 1x:
   0/8, 30x: 4/8 but no seed at chance (0.73-0.83). The same tables started 10x larger,
   N(0, 1) (`x10`, now `model.relative_init_std=1.0`): t5 7/8 (the eighth 0.93), every seed out
   by step 75; shaw 5/8, no seed at chance.
6. **Shaw's ~0.73 seeds sit on a second plateau**: they have solved the pairs further apart than
   the clip distance 16 (accuracy 0.87-0.89 for |B - A| in 33-62), through the two clipped rows
   that 55% of the pairs share, but not yet the near pairs (0.64-0.68 for 1-16), each with a row
   of its own; seeds that converge pass through it (0.71 at step 100, 1.00 by 200). Clipping at
   64 instead (every distance its own row): 5/8 vs 4/8, not the cause. t5's one late seed
   (seed 1, 0.92) has the same shape: 1.00 beyond 16, 0.83 within (t5-base).
7. **T5's bucket layout is not the cause**: from [CLS] the markers share a bucket in 12% of the
   examples with 32 buckets; with 128 buckets (never shared) only 1/8 converges: more buckets,
   each trained on fewer pairs, escape later.
8. **learned is the scheme, not the budget**: no setting tried converges its seeds (3e-3: 1/8;
   1000 steps: 1/8; multiplier 1x: 1/8, 30x: 0/8; N(0, 1) table: 0/8, it drowns the N(0, 0.1)
   tokens).
   Its seeds do leave the plateau, then fall back: at 1000 steps seeds 3, 4 and 7 show the
   table's norm jump from ~8 to ~17 while the loss stays at 0.69, and seed 7 goes from 0.74
   back to 0.50. It must learn an order over 63 separately trained rows; mark its row.

## Recommendation for the main job

* **Rates**: `3e-3` alone (8 members, not 16): every scheme chose it, and for the three learned
  tables 1e-2 and 3e-2 are worse (finding 4); the freed members pay for twice the steps. With
  one rate the report chooses nothing: cite these runs for the table schemes; sinusoidal, alibi,
  rotary (and new schemes) were not run at 1e-2 here.
* **Steps**: `train.num_steps=600` (warmup 30, eval every 60 keeps 10 points per curve).
* **Tables**: `optim.position_lr_multiplier=30` (an existing knob), or equivalently
  `model.relative_init_std=1.0` (new field, default 0 = unchanged; shaw and t5 only, learned
  keeps N(0, init_std)) with the multiplier left at 10. Measured, 8 seeds at 3e-3 and 600
  steps: t5 8/8 with either; shaw 7/8 with either, its seed 1 still on the second plateau
  (0.73 with 30x, 0.75 with the init); every other seed >= 0.97.
* Only 1000 steps made every shaw seed converge (8/8, as t5): 8 x 1000 member-steps, 1.67x
  the main job's 16 x 300 (about +45-60 s of training per scheme on a quiet machine): over the
  15-minute budget with ~12 schemes, so the report should instead mark shaw's one late seed.
* **learned**: no budget tried converges its seeds; the report should mark its row with
  finding 8 and the README's conclusions should not rest on it.

Cost: 8 members x 600 steps is the main job's 16 x 300 member-steps; with `train.members=loop`
(CPU) a step's time grows with the members (timed below), and the validation passes (every 60
steps x 8 members vs every 30 x 16) and the final test passes (the 8 chosen members either way)
are the same, so the cost per scheme is the main job's (its report: 300 steps x 0.19-0.30 s =
56-91 s of training and 13-61 s of evaluation per scheme, plus compiling), the training part
scaled by the step-time ratio below.
"""


def run_config(name: str, num_seeds: int):
  """The main job's cell for the run's scheme, with the run's overrides."""
  position, overrides, _, _ = RUNS[name]
  config = diagnosed_main_job()
  config.ablation.num_seeds = num_seeds
  config.ablation.learning_rates = ','.join(
      f'{r:g}' for r in overrides.get('optim.learning_rates', BASE_RATE))
  for key, value in overrides.items():
    if key != 'optim.learning_rates':
      group, field = key.split('.')
      config[group][field] = value
  return ablation.cell_config(config, ablation.Cell('position_probes/order', position,
                                                    'softmax', None))


def diagnosed_main_job():
  """configs/ablation/probes.py as it was when it was diagnosed (commit 6359638: 8 seeds, rates
  1e-3 and 3e-3, 300 steps evaluated every 30, position tables at 10x): every run changes that."""
  config = probes.get_config()
  config.ablation.update(variants='', workers=1, num_seeds=8)
  config.train.update(num_steps=300, log_every=30, eval_every=30, test_lengths='')
  config.optim.update(learning_rate=1e-3, position_lr_multiplier=10.0)
  return config


def scale_tables(state, factor: float):
  """The state with every position-table parameter times ``factor`` (the optimizer's moments
  are still zero, so this is a different init, nothing else)."""
  mask = optim.position_mask(state.params)
  params = jax.tree.map(lambda p, m: p * factor if m else p, state.params, mask)
  return state.replace(params=params)


def table_stats(position: str, params) -> dict[str, np.ndarray]:
  """Per member: the position tables' norm and their after-minus-before-the-query contrast."""
  tables = [v for k, v in jax.tree_util.tree_leaves_with_path(params)
            if 'positions' in jax.tree_util.keystr(k)]
  out = {'table_norm': np.sqrt(sum(np.sum(np.square(t), axis=tuple(range(1, t.ndim)))
                                   for t in tables))}
  if position == 't5':  # [N, buckets, heads]: the bias for keys after minus before the query
    emb_NxKxH = tables[0]
    half = emb_NxKxH.shape[1] // 2
    out['after_minus_before'] = emb_NxKxH[:, half:].mean(1) - emb_NxKxH[:, :half].mean(1)
    out['bias_NxKxH'] = emb_NxKxH
  elif position == 'shaw':  # [N, 2k+1, head_dim] per layer: rows for j > i minus j < i
    k = tables[0].shape[1] // 2
    out['after_minus_before'] = np.stack(
        [np.linalg.norm(t[:, k + 1:].mean(1) - t[:, :k].mean(1), axis=-1) for t in tables], 1)
    out['row_norm_NxLxR'] = np.stack([np.linalg.norm(t, axis=-1) for t in tables], 1)
  return out


def make_grad_norms(exp: Experiment):
  """jitted (params [N, ...], batch) -> per-member gradient norm of the position tables and of
  the rest, on the same loss as the train step."""
  graphdef = models.init(exp.model_config, jax.random.PRNGKey(0))[0]

  def norms(params, batch):
    def loss_fn(p):
      logits, label, weight, scored = exp.kind.forward(nnx.merge(graphdef, p), batch)
      return tasks.loss_and_metrics(logits, label, weight, scored_B=scored)[0]
    grads = jax.grad(loss_fn)(params)
    mask = optim.position_mask(grads)
    pick = lambda keep: jax.tree.map(lambda g, m: g if m == keep else jnp.zeros_like(g),
                                     grads, mask)
    return optax.global_norm(pick(True)), optax.global_norm(pick(False))
  return jax.jit(jax.vmap(norms, in_axes=(0, None)))


def make_predictions(exp: Experiment):
  """jitted (params [N, ...], batch) -> each member's predicted classes [N, B]."""
  graphdef = models.init(exp.model_config, jax.random.PRNGKey(0))[0]
  predict = lambda params, batch: jnp.argmax(
      exp.kind.forward(nnx.merge(graphdef, params), batch)[0], -1)
  return jax.jit(jax.vmap(predict, in_axes=(0, None)))


def accuracy_by_distance(exp: Experiment, params) -> list[list[float]]:
  """Validation accuracy [member][bin] by the markers' distance (``DISTANCE_BINS``)."""
  predict, correct, distance = make_predictions(exp), [], []
  for local in exp.eval_batches('validation'):
    batch = exp.global_batch(local)
    predicted_NxB = np.asarray(predict(params, batch))
    keep_B = np.asarray(local.weight) > 0
    correct.append((predicted_NxB == np.asarray(local.label))[:, keep_B])
    a_B, b_B = (np.argmax(np.asarray(local.inputs) == t, axis=1) for t in MARKER_IDS)
    distance.append(np.abs(b_B - a_B)[keep_B])
  correct_NxB, distance_B = np.concatenate(correct, 1), np.concatenate(distance)
  return [[float(np.mean(c[(distance_B >= lo) & (distance_B <= hi)])) for lo, hi in DISTANCE_BINS]
          for c in correct_NxB]


def _record(exp, position, state, batch, step_metrics, grad_norms, step) -> dict:
  m = jax.device_get(step_metrics)
  val = exp.evaluate(state.params, exp.eval_batches('validation'))
  g_pos, g_rest = jax.device_get(grad_norms(state.params, batch))
  stats = table_stats(position, jax.device_get(state.params))
  return {'step': step, 'train_loss': (m['loss_sum'] / np.maximum(m['count'], 1)).tolist(),
          'val_accuracy': val['accuracy'].tolist(), 'val_loss': val['loss'].tolist(),
          'grad_norm_tables': np.asarray(g_pos).tolist(),
          'grad_norm_rest': np.asarray(g_rest).tolist(),
          **{k: np.asarray(v).tolist() for k, v in stats.items()}}


def train_run(name: str, num_seeds: int, every: int, workdir: str) -> dict:
  """Trains one run and returns its record (members, curves, timings)."""
  position, overrides, init, factor = RUNS[name]
  rc = run_config(name, num_seeds)
  trainer.setup_runtime(rc)
  began = time.perf_counter()
  exp = Experiment(rc, workdir)
  state = exp.init_state()
  if init != 'default':
    state = scale_tables(state, {'zero': 0.0, 'x10': 10.0}[init])
  grad_norms, batches = make_grad_norms(exp), exp.train_batches(0)
  curve, seconds, num_steps = [], [], rc.train.num_steps
  for step in range(1, num_steps + 1):
    batch = exp.global_batch(next(batches))
    t0 = time.perf_counter()
    state, step_metrics = exp.train_step(state, batch)
    jax.block_until_ready(step_metrics)
    seconds.append(time.perf_counter() - t0)  # the first includes compiling
    if step % every == 0 or step == num_steps:
      curve.append(_record(exp, position, state, batch, step_metrics, grad_norms, step))
  return {'name': name, 'position': position, 'factor': factor, 'init': init,
          'overrides': {k: list(v) if isinstance(v, tuple) else v for k, v in overrides.items()},
          'num_steps': num_steps, 'seeds': exp.seeds, 'learning_rates': exp.learning_rates,
          'position_lr_multiplier': rc.optim.position_lr_multiplier,
          'wall_s': time.perf_counter() - began, 'first_step_s': seconds[0],
          'median_step_s': float(np.median(seconds[1:] or seconds)),
          'load_average': os.getloadavg()[0], 'curve': curve,
          'accuracy_by_distance': accuracy_by_distance(exp, state.params)}


CSV_FIELDS = ('run', 'factor', 'position', 'learning_rate', 'position_lr_multiplier', 'init',
              'num_steps', 'seed', 'step', 'train_loss', 'val_accuracy', 'grad_norm_tables',
              'grad_norm_rest', 'table_norm', 'after_minus_before')


def csv_rows(record: dict) -> list[dict]:
  """One row per (member, recorded step); the contrast is the largest over heads or layers."""
  rows = []
  for point in record['curve']:
    for i, (seed, rate) in enumerate(zip(record['seeds'], record['learning_rates'])):
      rows.append({
          'run': record['name'], 'factor': record['factor'], 'position': record['position'],
          'learning_rate': rate, 'position_lr_multiplier': record['position_lr_multiplier'],
          'init': record['init'], 'num_steps': record['num_steps'], 'seed': seed,
          'step': point['step'],
          **{k: f'{point[k][i]:.4g}' for k in CSV_FIELDS[9:14]},
          'after_minus_before': (f'{np.max(np.abs(point["after_minus_before"][i])):.4g}'
                                 if 'after_minus_before' in point else '')})
  return rows


def load_records(out: str) -> list[dict]:
  """The finished runs, in ``RUNS`` order."""
  paths = {n: os.path.join(out, 'runs', f'{n}.json') for n in RUNS}
  records = []
  for name, path in paths.items():
    if os.path.exists(path):
      with open(path) as f:
        records.append(json.load(f))
  return records


def first_steps(record: dict, members: np.ndarray, level: float) -> str:
  """Per member, the first recorded step with validation accuracy >= level ('-': never)."""
  acc_TxN = np.asarray([p['val_accuracy'] for p in record['curve']])[:, members]
  steps = [p['step'] for p in record['curve']]
  return ' '.join(str(steps[int(np.argmax(a >= level))]) if np.any(a >= level) else '-'
                  for a in acc_TxN.T)


def summary_table(records: list[dict]) -> list[str]:
  """One row per (run, rate): per-seed final validation accuracy, the converged count and
  when each seed left the chance plateau."""
  lines = ['| run | varied | scheme | rate | pos. mult. | table init | steps | validation '
           f'accuracy per seed (final) | converged | first step >= {ESCAPED} per seed | '
           's/step | run wall s |', '|---|---|---|---|---|---|---|---|---|---|---|---|']
  for r in records:
    acc, rates = final_accuracy(r), np.asarray(r['learning_rates'])
    std = r['overrides'].get('model.relative_init_std')
    init = r['init'] if std is None else f'relative_init_std={std:g}'
    for rate in sorted(set(r['learning_rates'])):
      a = acc[rates == rate]
      lines.append(f'| {r["name"]} | {r["factor"]} | {r["position"]} | {rate:g} | '
                   f'{r["position_lr_multiplier"]:g} | {init} | {r["num_steps"]} | '
                   + ' '.join(f'{x:.2f}' for x in a)
                   + f' | {int(np.sum(a >= SOLVED))}/{len(a)} | '
                   f'{first_steps(r, np.flatnonzero(rates == rate), ESCAPED)} | '
                   f'{r["median_step_s"]:.3f} | {r["wall_s"]:.0f} |')
  return lines


def split_table(record: dict, rate: float) -> list[str]:
  """Solved vs stuck seeds of one run at one rate: mean curves of what was recorded."""
  rates = np.asarray(record['learning_rates'])
  members = np.flatnonzero(rates == rate)
  final = final_accuracy(record)[members]
  groups = {'solved': members[final >= SOLVED], 'stuck': members[final < SOLVED]}
  lines = [f'**{record["position"]}** at rate {rate:g}: solved seeds '
           f'{[record["seeds"][i] for i in groups["solved"]]}, not solved '
           f'{[record["seeds"][i] for i in groups["stuck"]]}.', '',
           '| step | group | val. acc. | train loss | grad norm tables | grad norm rest | '
           'table norm | after-minus-before |', '|---|---|---|---|---|---|---|---|']
  for point in record['curve']:
    if point['step'] not in SPLIT_STEPS:
      continue
    for group, idx in groups.items():
      if not len(idx):
        continue
      mean = lambda k: float(np.mean(np.asarray(point[k])[idx]))
      contrast = (f'{np.mean(np.max(np.abs(np.asarray(point["after_minus_before"])[idx]), 1)):.3f}'
                  if 'after_minus_before' in point else '')
      lines.append(f'| {point["step"]} | {group} | {mean("val_accuracy"):.2f} | '
                   f'{mean("train_loss"):.3f} | {mean("grad_norm_tables"):.2e} | '
                   f'{mean("grad_norm_rest"):.2e} | {mean("table_norm"):.2f} | {contrast} |')
  return lines



def mask_paths() -> list[str]:
  """Per scheme, the parameters ``optim.position_mask`` gives the position rate multiplier."""
  lines = []
  for position in ('learned', 'shaw', 't5'):
    rc = run_config(f'{position}-zero', 1)
    mc = rc.model_config(vocab_size=260, num_classes=2)
    params = nnx.to_pure_dict(jax.eval_shape(lambda: models.init(mc, jax.random.PRNGKey(0)))[1])
    paths = [jax.tree_util.keystr(k) for k, m in
             jax.tree_util.tree_leaves_with_path(optim.position_mask(params)) if m]
    lines.append(f'- {position}: ' + ', '.join(f'`{p}`' for p in paths))
  return lines


def bucket_layout(num_buckets: int, max_distance: int = 64) -> str:
  """Which T5 buckets [CLS] (position 0) sees the markers' positions 1..63 in, and how often the
  two markers of an order example share one (every distinct pair equally likely, as the data)."""
  d = np.arange(1, 64)
  after = np.asarray(positions.t5_buckets(jnp.asarray(d)[None, None], num_buckets,
                                          max_distance))[0, 0]
  before = np.asarray(positions.t5_buckets(-jnp.asarray(d)[None, None], num_buckets,
                                           max_distance))[0, 0]
  same = (after[:, None] == after[None, :]).sum() - len(d)
  runs = {}
  for dist, bucket in zip(d, after):
    runs.setdefault(int(bucket), []).append(int(dist))
  spans = ', '.join(f'{b}: {v[0]}' + (f'-{v[-1]}' if len(v) > 1 else '') for b, v in runs.items()
                    if len(v) > 1)
  return (f'- {num_buckets} buckets, max distance {max_distance}: keys after the query at '
          f'distances 1-63 fall in {len(runs)} buckets, one per distance except (bucket: '
          f'distances) {spans}; before it -> buckets {before.min()}-{before.max()} '
          f'(never shared with after). The two markers share a bucket as seen from [CLS] in '
          f'{same / (len(d) * (len(d) - 1)):.0%} of the order examples; the sign of B - A '
          'always falls in different halves.')


def timing_lines(out: str) -> list[str]:
  """The 16- vs 8-member step times (``--time_members``), if measured."""
  path = os.path.join(out, 'timing.json')
  if not os.path.exists(path):
    return []
  with open(path) as f:
    t = json.load(f)
  sixteen, eight = t['16_members_step_s'], t['8_members_step_s']
  return ['## Step time: 16 vs 8 members', '',
          f'{t["position"]}, the main job\'s cell, timed side by side in one process (1-min load '
          f'average {t["load_average"]:.1f}): 16 members (2 rates x 8 seeds) {sixteen:.3f} s per '
          f'step, 8 members (1 rate) {eight:.3f} s, ratio {eight / sixteen:.2f}: 8 x 600 steps '
          f'costs {2 * eight / sixteen:.2f}x the training time of 16 x 300.', '']


def write_report(out: str, command: str) -> str:
  """Writes runs.csv and report.md from the finished runs; returns the report."""
  records = load_records(out)
  with open(os.path.join(out, 'runs.csv'), 'w', newline='') as f:
    writer = csv.DictWriter(f, CSV_FIELDS)
    writer.writeheader()
    for r in records:
      writer.writerows(csv_rows(r))
  wall = sum(r['wall_s'] for r in records)
  load = np.mean([r['load_average'] for r in records]) if records else 0.0
  lines = [f'# Why seeds of shaw, t5 and learned split on the order probe (issue 30, item 7)',
           '', f'Regenerate: `{command}` (runs already in runs/ are skipped: delete them to '
           'train again; `--report_only` rebuilds this page and runs.csv only). '
           f'{len(records)} runs, {wall / 60:.0f} min of wall time summed over runs (they ran '
           '1-5 at a time on a 2-core machine shared with other jobs; mean 1-min load average at '
           f'the end of a run: {load:.1f}); per-step times below are under that load.', '',
           FINDINGS, '',
           '## Implementation checks', '',
           'Parameters that get `optim.position_lr_multiplier` (`optim.position_mask`):', '',
           *mask_paths(), '', 'T5 bucket layout on the probe (length 64, [CLS] at 0):', '',
           bucket_layout(32), bucket_layout(128), '', *timing_lines(out), '## Runs', '',
           f'Converged: final validation accuracy >= {SOLVED}. Each run is the main job\'s cell '
           '(configs/ablation/probes.py) with only the listed field changed; 8 seeds per rate, '
           'seeds 0-7 as in the main job (same data order and shared init).', '',
           *summary_table(records), '', '## Solved vs stuck seeds at the main job\'s budget', '',
           'Means over each group (final validation accuracy >= or < the converged mark). '
           'after-minus-before: t5, the largest over heads of |mean bias of the buckets after '
           'the query - of those before|; shaw, the largest over layers of the norm of (mean row '
           'after - mean row before). Gradient norms on that step\'s batch.', '']
  for r in records:
    if r['factor'] == 'rate':
      lines += [*split_table(r, 3e-3), '']
  text = '\n'.join(lines)
  with open(os.path.join(out, 'report.md'), 'w') as f:
    f.write(text)
  return text


def time_members(position: str, rounds: int = 3, steps: int = 10) -> dict[str, float]:
  """Median train-step seconds of the main job's 16 members (2 rates x 8 seeds) and of the
  candidates' 8 (one rate), built side by side and timed in alternating rounds (one load)."""
  runs, times = {}, {16: [], 8: []}
  for members, rates in ((16, '1e-3,3e-3'), (8, '3e-3')):
    config = diagnosed_main_job()
    config.ablation.learning_rates = rates
    rc = ablation.cell_config(config, ablation.Cell('position_probes/order', position,
                                                    'softmax', None))
    exp = Experiment(rc, tempfile.mkdtemp())
    batch = exp.global_batch(next(exp.train_batches(0)))
    runs[members] = [exp.train_step.lower(exp.init_state(), batch).compile(), exp.init_state(),
                     batch]
  for _ in range(rounds):
    for members, run in runs.items():
      for _ in range(steps):
        t0 = time.perf_counter()
        run[1], m = run[0](run[1], run[2])
        jax.block_until_ready(m)
        times[members].append(time.perf_counter() - t0)
  return {f'{k}_members_step_s': float(np.median(v)) for k, v in times.items()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--runs', default=','.join(RUNS),
                      help=f'Comma-separated runs among: {", ".join(RUNS)}.')
  parser.add_argument('--seeds', type=int, default=8, help='Seeds per rate (the main job: 8).')
  parser.add_argument('--every', type=int, default=25, help='Record every this many steps.')
  parser.add_argument('--out', default='docs/ablation_probes/diagnostic',
                      help='Runs (runs/<name>.json), runs.csv and report.md go here.')
  parser.add_argument('--report_only', action='store_true', help='Rebuild the report only.')
  parser.add_argument('--time_members', action='store_true',
                      help='Also time 16 vs 8 members per step (t5) for the cost estimate.')
  return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  names = [n for n in args.runs.split(',') if n]
  unknown = [n for n in names if n not in RUNS]
  if unknown:
    raise SystemExit(f'--runs names {unknown}; valid: {", ".join(RUNS)}.')
  os.makedirs(os.path.join(args.out, 'runs'), exist_ok=True)
  timing_path = os.path.join(args.out, 'timing.json')
  if args.time_members and not args.report_only and not os.path.exists(timing_path):
    with open(timing_path, 'w') as f:
      json.dump({'position': 't5', 'load_average': os.getloadavg()[0], **time_members('t5')}, f)
  for name in [] if args.report_only else names:
    path = os.path.join(args.out, 'runs', f'{name}.json')
    if os.path.exists(path):
      continue
    with tempfile.TemporaryDirectory() as workdir:
      record = train_run(name, args.seeds, args.every, workdir)
    with open(path, 'w') as f:
      json.dump(rounded(record), f)
    print(f'{name}: {record["wall_s"]:.0f} s', summary_line(record), flush=True)
  write_report(args.out, 'python scripts/diagnose_schemes.py --time_members')


def rounded(value):
  """``value`` with every float to 4 significant digits (the runs' JSON stays small)."""
  if isinstance(value, float):
    return float(f'{value:.4g}')
  if isinstance(value, dict):
    return {k: rounded(v) for k, v in value.items()}
  if isinstance(value, list):
    return [rounded(v) for v in value]
  return value


def final_accuracy(record: dict) -> np.ndarray:
  return np.asarray(record['curve'][-1]['val_accuracy'])


def summary_line(record: dict) -> str:
  acc, rates = final_accuracy(record), np.asarray(record['learning_rates'])
  return '; '.join(f'{r:g}: ' + ' '.join(f'{a:.2f}' for a in acc[rates == r])
                   for r in sorted(set(rates)))


if __name__ == '__main__':
  main()
