"""Schemes as their authors define them, in the settings the main job runs (docs/model.md's
fidelity table): FIRE's threshold follows the training length and its interpolation engages
beyond it; KERPLE's r1, r2 are clamped after each update, as chijames/KERPLE does; CoPE's npos
follows the training length."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from configs.ablation import probes
import models
from models import positions
import settings
from training import trainer
from training import validation
from training.config import FIXED_ON_RESUME
from training.config import run_config as typed


def test_fire_interpolates_beyond_the_main_jobs_training_length():
  """The main job trains at 64 tokens and tests up to 8x: L starts at 64, so the normaliser is
  constant inside the trained window (the bias is relative there), varies with the query's
  position beyond it, and every MLP input stays in [-1, 1] at 512 tokens."""
  config = probes.get_config()
  config.model.position = positions.Fire.name
  cfg = typed(config).model_config()
  assert cfg.fire_threshold == config.data.max_length == 64
  length = 8 * config.data.max_length
  pos_1xL = jnp.arange(length)[None]
  x_LxL = positions.fire_inputs(0.1, cfg.fire_threshold, positions.relative_positions(pos_1xL),
                                pos_1xL)[0]
  assert float(jnp.abs(x_LxL).max()) <= 1.0
  assert x_LxL[40, 10] == x_LxL[63, 33]  # distance 30, queries inside the window: relative
  far = [float(x_LxL[q, q - 30]) for q in (100, 200, 400, 511)]
  assert all(a > b for a, b in zip(far, far[1:]))  # same distance, later query: smaller input
  assert float(x_LxL[511, 0]) == pytest.approx(1.0, abs=1e-5)


def test_fires_learned_c_and_l_are_recorded_per_member_and_layer(run_config):
  """What summary.json records (``positions.learned``, the trainer's summary): c and L of each
  layer's FIRE, [members][layers]; FIRE-S: one FIRE."""
  for shared, fires in ((False, 2), (True, 1)):
    config = run_config(**{'model.position': 'fire', 'model.fire_shared': shared})
    cfg = typed(config).model_config()
    params = nnx.to_pure_dict(models.init(cfg, jax.random.PRNGKey(0))[1])
    members = jax.tree.map(lambda x: jnp.stack([x, 2 * x]), params)  # two members
    learned = positions.learned(cfg, members)
    assert np.asarray(learned['fire_c']) == pytest.approx(np.array([[0.1] * fires, [0.2] * fires]))
    assert np.asarray(learned['fire_threshold']) == pytest.approx(
        np.array([[64.0] * fires, [128.0] * fires]))


@pytest.mark.parametrize('scheme, upper', [(positions.KerpleLog, np.inf),
                                           (positions.KerplePower, 2.0)])
def test_kerple_moves_at_adams_rate_at_its_bounds_and_stays_inside(scheme, upper):
  """Projected as the authors clamp: a parameter at its bound moves away by Adam's full first
  step (the learning rate), not the 0.01x a softplus parametrisation gives there, and an update
  that crosses a bound stops at it."""
  tx, rate = optax.adam(0.05), 0.05
  r = jnp.asarray([[0.01, 0.01], [0.01, min(upper, 2.0)]])
  params = {'positions': {'r': r}}
  grads = {'positions': {'r': jnp.asarray([[-1.0, 1.0], [-1.0, -1.0]])}}
  updates, _ = tx.update(grads, tx.init(params), params)
  moved = np.asarray(scheme.project(optax.apply_updates(params, updates))['positions']['r'])
  assert moved[0, 0] == pytest.approx(0.01 + rate, rel=1e-4) and moved[0, 1] == pytest.approx(0.01)
  assert moved[1, 0] == pytest.approx(0.01 + rate, rel=1e-4)
  assert moved[1, 1] == pytest.approx(min(upper, 2.0 + rate), rel=1e-4)


def test_kerple_stays_in_its_bounds_through_training(tmp_path, run_config):
  """A learning rate that throws r far out: every recorded r1, r2 ends inside the bounds."""
  config = run_config(**{'model.position': 'kerple_power', 'model.attention_impl': 'explicit',
                         'train.num_steps': 3,
                         'train.eval_every': 3, 'train.checkpoint_every': 3,
                         'optim.learning_rate': 3.0, 'optim.warmup_steps': 0})
  r = np.asarray(trainer.train_and_evaluate(config, str(tmp_path / 'kerple'))['kerple_r'])
  r = r.astype(np.float32)
  assert r.shape[1] == 2 and (r >= np.float32(0.01)).all() and (r[:, 1] <= 2.0).all()
  assert (r == np.float32(0.01)).any() or (r[:, 1] == 2.0).any()  # the clamp engaged


@pytest.mark.parametrize('length, npos, expected', [(64, 0, 65), (128, 0, 129), (128, 33, 33)])
def test_cope_npos_follows_the_training_length_unless_set(run_config, length, npos, expected):
  config = run_config(**{'model.position': 'cope', 'data.max_length': length,
                         'model.cope_npos': npos})
  assert typed(config).model_config().cope_npos == expected


def test_changed_defaults_of_other_schemes_leave_a_run_resumable(run_config):
  """A run saved before fire_threshold and cope_npos followed the training length (512, 65)
  resumes, and its ablation cell stays finished, unless it is a FIRE (CoPE) run."""
  now = typed(run_config())
  saved = settings.replace(now, {'model.fire_threshold': 512.0, 'model.cope_npos': 65})
  assert validation.config_differences(saved, now, FIXED_ON_RESUME) == []
  as_fire = lambda c: settings.replace(c, {'model.position': 'fire'})
  assert validation.config_differences(as_fire(saved), as_fire(now), FIXED_ON_RESUME) == [
      'model.fire_threshold: saved 512.0 vs now 0.0']
