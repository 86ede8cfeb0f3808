"""Each setting is declared once, with its role: the ConfigDict, the typed groups, and the checks
that ask what a field is for (resume, ablation staleness, init_from, evaluation) all follow from
the declarations."""

import dataclasses

import pytest

import settings
from configs import default
from configs.ablation import probes
from experiments import ablation
from projects.extend import grid as extend
from training import config as config_lib
from training import evaluation

P, R, T = settings.Role.PARAMETERS, settings.Role.RESULTS, settings.Role.RUNTIME
GROUPS = {**settings.groups(config_lib.RunConfig), 'ablation': ablation.AblationConfig,
          'extend': extend.ExtendConfig}


@pytest.mark.parametrize('name', GROUPS)
def test_every_field_of_every_group_has_a_role(name):
  group = GROUPS[name]
  fields = dataclasses.fields(group)
  if name == 'model':  # ModelConfig adds the non-settings; the group itself is all settings
    assert not [f.name for f in fields if 'role' not in f.metadata]
  for f in settings.declared(group):
    assert isinstance(f.metadata['role'], settings.Role), f.name
    assert f.metadata['items'] is None or isinstance(f.default, tuple), f.name
  assert settings.declared(group) == list(fields)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Extra:
  shape: int = settings.setting(8, P)
  outcome: float = settings.setting(0.5, R)
  stretch: float = settings.setting(1.0, R, evaluation=True)
  steps: int = settings.setting(10, R, resume=True)
  where: str = settings.setting('here', T)
  sizes: tuple[int, ...] = settings.setting((1, 2), R, items=int, example='1,2')


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Run(config_lib.RunConfig):
  extra: _Extra = dataclasses.field(default_factory=_Extra)


def test_a_field_added_with_a_role_reaches_every_derived_check():
  derived = config_lib.derived(_Run)
  assert {p for p in derived['parameters'] if p.startswith('extra.')} == {'extra.shape'}
  assert {p for p in derived['evaluation'] if p.startswith('extra.')} == {'extra.stretch'}
  assert {p for p in derived['results'] if p.startswith('extra.')} == {
      'extra.shape', 'extra.outcome', 'extra.stretch', 'extra.steps', 'extra.sizes'}
  assert {p for p in derived['fixed_on_resume'] if p.startswith('extra.')} == {
      'extra.shape', 'extra.outcome', 'extra.stretch', 'extra.sizes'}
  # Without the new group, the run config's own derivations are unchanged.
  assert all(set(config_lib.derived()[k]) == {p for p in v if not p.startswith('extra.')}
             for k, v in derived.items())
  flags = settings.config_dict(_Run)
  assert flags.extra.sizes == '1,2'  # a list is text on the command line
  flags.extra.sizes = '3, 4'
  assert settings.build(_Run, flags).extra.sizes == (3, 4)


def test_the_roles_give_the_lists_they_replaced():
  """The derived sets are the hand-kept lists they replace, but train.members (vmap or loop
  changes only the rounding, like model.attention_impl) no longer makes a finished ablation
  cell stale."""
  every = set(settings.paths(config_lib.RunConfig, lambda m: True))
  assert every - set(config_lib.FIXED_ON_RESUME) == {
      'train.num_steps', 'train.eval_every', 'train.log_every', 'train.checkpoint_every',
      'train.keep_checkpoints', 'train.eval_batch_size', 'train.compilation_cache_dir',
      'train.skip_nonfinite', 'data.data_dir', 'train.eval_max_length', 'train.test_lengths',
      'train.members',
      'data.prefetch', 'mesh.data', 'mesh.fsdp', 'mesh.tensor', 'mesh.dcn_data', 'mesh.dcn_fsdp',
      'mesh.dcn_tensor', 'mesh.rules', 'model.attention_impl', 'model.attention_chunk_size',
      'train.init_from', 'train.init_head', 'model.remat', 'train.profile_steps',
      'train.wandb_project', 'train.projects'}
  assert every - set(config_lib.RESULT_FIELDS) == {
      'train.log_every', 'train.checkpoint_every', 'train.keep_checkpoints',
      'train.eval_batch_size', 'train.compilation_cache_dir', 'data.data_dir', 'data.prefetch',
      'mesh.data', 'mesh.fsdp', 'mesh.tensor', 'mesh.dcn_data', 'mesh.dcn_fsdp',
      'mesh.dcn_tensor', 'mesh.rules', 'model.remat', 'model.attention_impl',
      'model.attention_chunk_size', 'train.profile_steps', 'train.wandb_project',
      'train.members', 'train.projects'}


@pytest.mark.parametrize('field', ['rope.layout', 'rope.rotary_dim', 'rope.rotary_value',
                                   'rope.base', 'rope.xpos', 'model.position', 'data.name'])
def test_fields_that_read_the_weights_cannot_change_at_evaluation(field):
  with pytest.raises(ValueError, match=f'{field} cannot change at evaluation'):
    evaluation.parse_overrides([f'{field}=1'])


def test_overrides_are_typed_as_their_fields_declare():
  assert evaluation.parse_overrides(['rope.scaling=none', 'rope.scaling_factor=2',
                                     'data.max_length=128']) == {
      'rope.scaling': 'none', 'rope.scaling_factor': 2.0, 'data.max_length': 128}
  with pytest.raises(ValueError, match='takes a int'):
    evaluation.parse_overrides(['data.max_length=long'])


def test_lists_are_tuples_inside_and_text_on_the_command_line():
  c = default.get_config()
  assert c.data.eval_lengths == '' and c.optim.learning_rates == ''
  c.data.eval_lengths, c.mesh.rules = '256, 512', 'vocab=,embed=fsdp+tensor'
  run = config_lib.run_config(c)
  assert run.data.eval_lengths == (256, 512)
  assert run.mesh.rules == ('vocab=', 'embed=fsdp+tensor')
  assert config_lib.run_config(settings.to_dict(run)) == run  # config.json round trip
  c.optim.learning_rates = '1e-3,0.001'
  with pytest.raises(ValueError, match='more than once'):
    config_lib.run_config(c)


def test_a_field_that_is_not_a_setting_is_refused_and_a_saved_one_dropped():
  c = default.get_config().to_dict()
  c['train']['num_step'] = 5
  with pytest.raises(ValueError, match='config.train has no field num_step'):
    config_lib.run_config(c)
  assert config_lib.run_config(c, strict=False) == config_lib.RunConfig()


def test_presets_are_resolved_in_one_place():
  run = config_lib.RunConfig()
  assert run.model.num_layers is None  # the group keeps what was given
  sizes = run.model.sizes()
  cfg = run.model_config()
  assert {k: getattr(cfg, k) for k in sizes} == sizes == {
      'num_layers': 2, 'hidden_size': 64, 'num_heads': 4, 'mlp_dim': 128, 'embedding_size': 64}


def test_the_config_travels_one_way_through_a_run(run_config, csv_file, tmp_path):
  """Each module that reads the config reads it while it holds it: after the checks, the
  placement and the data fingerprint travel on, not the config back to validation."""
  from scripts import config_walk  # pylint: disable=import-outside-toplevel
  config = run_config(**{'data.name': 'files', 'data.train_files': csv_file,
                         'train.num_steps': 2, 'train.eval_every': 2,
                         'train.checkpoint_every': 2})
  calls = config_walk.walk(config, str(tmp_path / 'run'))
  assert config_walk.summary(calls)['returns_off_stack'] == 0, calls
  config.train.init_from = str(tmp_path / 'run')  # a fine-tune: the source is checked once
  calls = config_walk.walk(config, str(tmp_path / 'fine_tune'))
  assert ('training/init_from.py', 'check_source') in [c[:2] for c in calls]
  assert config_walk.summary(calls)['returns_off_stack'] == 0, calls


def test_a_variant_reads_true_and_false_and_a_text_bool_is_refused():
  """A variant's `model.fire_shared=false` is False (not the truthy text 'false'), and a bool
  field given text by a dict (a saved config, a grid's cell) is refused by name."""
  c = probes.get_config()
  c.ablation.positions = 'fire'
  c.ablation.variants = 'fire_s:fire:model.fire_shared=true,fire_l:fire:model.fire_shared=False'
  shared = [ablation.cell_config(c, x).model.fire_shared for x in ablation.check_grid(c)]
  assert shared == [False, True, False]
  with pytest.raises(ValueError, match='config.model.fire_shared is true or false'):
    config_lib.run_config({**probes.get_config().to_dict(),
                           'model': {'fire_shared': 'false'}})
