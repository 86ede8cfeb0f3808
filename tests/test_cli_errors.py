"""Bad input through the real command line: train.py, eval.py, ablate.py.

Every case must end with exit status 2 and one paragraph on stderr (``<program>: error: ...``)
holding the case's key phrase, with no traceback, and must leave whatever was already in the
workdir unchanged. docs/reliability.md lists the cases.

The cases, and the runs below that must stay correct, run the entry point in this process
(helpers/entry.py: the same argv, exit status and output, without a Python, JAX and TensorFlow
start-up each). Real subprocesses: one case per entry point (train.py and eval.py: the start-up
test), the cases that need a simulated device count ($XLA_FLAGS), the finished ablation the
'ablation_done' cases copy and one predict.py run.
"""

import dataclasses
import gzip
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time

import pytest

from configs import tiny
from helpers import entry
from training import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = ('train.py', '--config=configs/tiny.py', '--workdir={W}', '--config.data.data_dir={D}')
# The command that trained the workdir the 'trained' cases copy (F: its CSV file).
TRAINED = ('train.py', '--config=configs/tiny.py', '--workdir={W}', '--config.data.name=files',
           '--config.data.train_files={F}')
EVAL = ('eval.py', '--workdir={W}')
PREDICT = ('predict.py', '--workdir={W}', '--output={T}/out.jsonl')
ABLATE = ('ablate.py', '--config=configs/ablation/probes.py', '--workdir={W}',
          '--config.data.data_dir={D}')
# The command that ran the ablation the 'ablation_done' cases copy.
ABLATED = ABLATE + ('--config.ablation.positions=none,alibi', '--config.ablation.variants=',
                    '--config.ablation.workers=1', '--config.ablation.num_seeds=1',
                    '--config.ablation.learning_rates=1e-3', '--config.train.num_steps=20',
                    '--config.optim.warmup_steps=2', '--config.train.eval_max_length=128')
FILES = TRAIN + ('--config.data.name=files',)
# train.py with the fortune files looked for in a directory that does not exist (they are
# installed on this machine and in CI): Case.no_fortunes points the builder there first.
FORTUNES_MISSING = ('train.py', '--config=configs/tiny.py', '--workdir={W}',
                    '--config.data.data_dir={T}/fresh_tfds', '--config.data.name=fortunes')


@dataclasses.dataclass(frozen=True)
class Case:
  id: str
  argv: tuple[str, ...]
  phrase: str  # what the error paragraph must contain
  # new | empty | file | trained | trained_no_config | trained_learned | trained_other_data |
  # trained_eval_dir | config_only | ablation_done
  workdir: str = 'new'
  env: tuple[tuple[str, str], ...] = ()  # $XLA_FLAGS: run as a subprocess
  subprocess: bool = False  # a real process: its entry point's smoke test
  no_fortunes: bool = False  # the fortune files looked for in a folder that does not exist


CASES = [
    # ---------------------------------------------------------------- model options (train.py)
    Case('unknown_position', TRAIN + ('--config.model.position=rotray',),
         "model.position='rotray' is not valid"),
    Case('unknown_attention', TRAIN + ('--config.model.attention=sparse',),
         "model.attention='sparse' is not valid"),
    Case('bias_scheme_with_linear_attention',
         TRAIN + ('--config.model.position=alibi', '--config.model.attention=linear'),
         'adds to the attention logits'),
    Case('odd_head_dim_with_rotary',
         TRAIN + ('--config.model.hidden_size=36', '--config.model.num_heads=4'),
         'RoPE needs an even head_dim'),
    Case('rotary_dim_above_head_dim', TRAIN + ('--config.rope.rotary_dim=32',),
         'rotary_dim=32 is larger than head_dim=16'),
    Case('hidden_size_not_divisible_by_heads', TRAIN + ('--config.model.hidden_size=66',),
         'model.hidden_size=66 is not divisible by model.num_heads=4'),
    Case('unknown_model_size', TRAIN + ('--config.model.size=huge',),
         "model.size='huge' is not valid"),
    Case('dropout_out_of_range', TRAIN + ('--config.model.dropout_rate=1.5',),
         'model.dropout_rate must be in [0, 1)'),
    Case('learned_shorter_than_data', TRAIN + ('--config.model.position=learned',
                                               '--config.model.max_length=32'),
         'model.max_length=32 is shorter than data.max_length=64'),
    Case('random_positions_below_the_length', TRAIN + ('--config.data.random_positions=32',),
         'data.random_positions=32 must be 0 (off) or at least the longest length'),
    Case('random_positions_below_a_test_split', TRAIN + ('--config.data.random_positions=64',),
         'data.random_positions=64 draws positions from 0 .. 63, but position_probes/order is '
         'trained or evaluated at up to 128 tokens'),
    # ---------------------------------------------------------------- lengths, steps, optimizer
    Case('non_positive_max_length', TRAIN + ('--config.data.max_length=0',),
         'data.max_length must be > 1'),
    Case('zero_steps', TRAIN + ('--config.train.num_steps=0',), 'train.num_steps must be > 0'),
    Case('negative_batch_size', TRAIN + ('--config.train.batch_size=-4',),
         'exactly one of train.batch_size'),
    Case('zero_seeds', TRAIN + ('--config.train.num_seeds=0',), 'train.num_seeds must be > 0'),
    Case('warmup_longer_than_training', TRAIN + ('--config.optim.warmup_steps=100',),
         'optim.warmup_steps=100 must be between 0 and the number of optimizer updates (20)'),
    Case('negative_learning_rate', TRAIN + ('--config.optim.learning_rate=-0.001',),
         'optim.learning_rate must be a finite number > 0'),
    # ---------------------------------------------------------------- devices
    Case('batch_not_divisible_by_devices', TRAIN + ('--config.train.batch_size=6',),
         'train.batch_size=6 is not divisible by the 4 data-parallel devices',
         env=(('XLA_FLAGS', '--xla_force_host_platform_device_count=4'),)),
    Case('mesh_larger_than_devices', TRAIN + ('--config.mesh.data=8',),
         'needs 8 devices but 1 are available'),
    # ---------------------------------------------------------------- data
    Case('unknown_dataset', TRAIN + ('--config.data.name=imbd_reviews',),
         "data.name='imbd_reviews' is not valid"),
    Case('tfds_dataset_not_prepared',
         ('train.py', '--config=configs/tiny.py', '--workdir={W}', '--config.data.name=imdb_reviews',
          '--config.data.data_dir={T}/empty_tfds'),
         "TFDS dataset 'imdb_reviews' is not prepared"),
    Case('fortune_files_missing', FORTUNES_MISSING, 'apt-get install fortunes', no_fortunes=True),
    Case('user_data_file_missing',
         TRAIN + ('--config.data.name=files', '--config.data.train_files={T}/nope.csv'),
         "nope.csv' not found"),
    Case('user_data_label_out_of_range',
         TRAIN + ('--config.data.name=files', '--config.data.train_files={T}/train.csv',
                  '--config.data.validation_files={T}/bad_labels.csv'),
         'label 5 is outside the class range [0, 2)'),
    # ---------------------------------------------------------------- config files and flags
    Case('config_file_missing', ('train.py', '--config=configs/nope.py', '--workdir={W}'),
         'Failed loading config file'),
    Case('config_file_without_get_config', ('train.py', '--config={T}/no_get_config.py',
                                            '--workdir={W}'),
         "has no attribute 'get_config'"),
    Case('override_wrong_type', TRAIN + ('--config.train.num_steps=abc',),
         '--config.train.num_steps=abc'),
    Case('override_misspelt', TRAIN + ('--config.model.positon=alibi',),
         'Did you mean "position" instead of "positon"?'),
    Case('unknown_flag', TRAIN + ('--num_stepz=3',), "Unknown command line flag 'num_stepz'"),
    # ---------------------------------------------------------------- existing workdirs
    Case('resume_with_other_config', TRAINED + ('--config.model.position=alibi',),
         "holds a run with a different config (model.position: saved 'rotary' vs now 'alibi')",
         workdir='trained'),
    Case('checkpoint_of_other_config', TRAINED + ('--config.model.hidden_size=128',),
         'was written by a different model or run config', workdir='trained_no_config'),
    # ---------------------------------------------------------------- eval.py
    Case('eval_missing_workdir', EVAL, 'does not exist'),
    Case('eval_empty_workdir', EVAL, 'No config.json in', workdir='empty'),
    Case('eval_workdir_without_checkpoint', EVAL, 'yet: train first', workdir='config_only'),
    Case('eval_malformed_lengths', EVAL + ('--eval_lengths=12a,x',),
         "--eval_lengths='12a,x' is malformed", workdir='trained'),
    Case('eval_non_positive_length', EVAL + ('--eval_lengths=0',),
         'every length must be an integer > 1', workdir='trained'),
    Case('eval_learned_beyond_max_length', EVAL + ('--eval_lengths=128',),
         'has position embeddings for 64 tokens', workdir='trained_learned'),
    Case('eval_bad_checkpoint_argument', EVAL + ('--checkpoint=newest',),
         "--checkpoint='newest' is not valid", workdir='trained'),
    Case('eval_missing_checkpoint_step', EVAL + ('--checkpoint=999',),
         'there is no checkpoint of step 999', workdir='trained'),
    Case('eval_unknown_split', EVAL + ('--split=dev',), "--split='dev' is not a split of files",
         workdir='trained'),
    Case('eval_override_changes_parameters', EVAL + ('--override=model.hidden_size=32',),
         'model.hidden_size cannot change at evaluation', workdir='trained'),
    Case('eval_override_malformed', EVAL + ('--override=rope.scaling',),
         "--override='rope.scaling' is malformed", workdir='trained'),
    Case('eval_override_wrong_type', EVAL + ('--override=rope.scaling_factor=four',),
         'rope.scaling_factor takes a float', workdir='trained'),
    # ---------------------------------------------------------------- ablate.py
    Case('ablate_only_matches_nothing', ABLATE + ('--only=*/rotray',),
         "--only='*/rotray' matches no run", subprocess=True),
    Case('ablate_unknown_position', ABLATE + ('--config.ablation.positions=rotary,rotray',),
         "ablation.positions names 'rotray'"),
    Case('ablate_not_an_ablation_config', ('ablate.py', '--config=configs/tiny.py',
                                           '--workdir={W}'),
         'has no `ablation` group'),
    # ---------------------------------------------------------------- nothing silently wrong
    Case('ablate_reuses_no_stale_result', ABLATED + ('--config.optim.learning_rate=0.05',),
         'made with another config or data than the grid gives now', workdir='ablation_done'),
    Case('ablate_report_of_stale_results', ABLATED + ('--config.optim.learning_rate=0.05',
                                                      '--report_only'),
         'made with another config or data than the grid gives now', workdir='ablation_done'),
    Case('ablate_only_selects_nothing', ABLATE + ('--only=5:5',), "--only='5:5' matches no run"),
    Case('ablate_report_only_of_a_missing_workdir', ABLATE + ('--report_only',),
         'does not exist, so it holds no finished runs'),
    Case('changed_data_on_resume', TRAINED + ('--config.train.num_steps=4',),
         'changed since it started', workdir='trained_other_data'),
    Case('empty_workdir', ('train.py', '--config=configs/tiny.py', '--workdir= '),
         '--workdir is empty'),
    Case('workdir_is_a_file', TRAIN, 'is a file, not a folder', workdir='file'),
    Case('nan_learning_rate', TRAIN + ('--config.optim.learning_rate=nan',),
         'optim.learning_rate must be a finite number > 0'),
    Case('beta_out_of_range', TRAIN + ('--config.optim.b2=1.0',), 'optim.b2 must be'),
    Case('unknown_schedule', TRAIN + ('--config.optim.schedule=cosine_restarts',),
         "Unknown optim.schedule 'cosine_restarts'"),
    Case('config_returns_a_dict', ('train.py', '--config={T}/dict_config.py', '--workdir={W}'),
         'returned a dict'),
    Case('config_lacks_a_group', ('train.py', '--config={T}/no_mesh.py', '--workdir={W}'),
         'has no mesh group'),
    Case('too_few_rows_to_hold_out', FILES + ('--config.data.train_files={T}/tiny.csv',),
         'The validation split is empty'),
    Case('id_like_integer_labels', FILES + ('--config.data.train_files={T}/ids.csv',),
         'looks like an ID column'),
    Case('unclosed_quote', FILES + ('--config.data.train_files={T}/quote.csv',),
         'not valid CSV'),
    Case('null_label', FILES + ('--config.data.train_files={T}/null.jsonl',), 'the label null'),
    Case('zip_file', FILES + ('--config.data.train_files={T}/train.csv.zip',), 'Decompress'),
    Case('dual_encoder_without_pairs', TRAIN + ('--config.model.dual_encoder=True',),
         'set data.text_b_column, or model.dual_encoder=False'),
    Case('pairs_without_token_types', FILES + ('--config.data.train_files={T}/train.csv',
                                               '--config.data.text_b_column=label'),
         'need model.type_vocab_size >= 2'),
    Case('eval_length_beyond_memory', EVAL + ('--eval_lengths=100000',),
         'Evaluating at 100000 tokens needs about', workdir='trained'),
    Case('eval_results_unwritable', EVAL, 'The results are printed above',
         workdir='trained_eval_dir'),
    Case('predict_empty_input', PREDICT + ('--input={T}/empty.txt',), 'holds no examples',
         workdir='trained'),
    Case('predict_missing_input', PREDICT + ('--input={T}/missing.csv',), 'not found',
         workdir='trained', subprocess=True),
    Case('predict_input_without_the_text_column', PREDICT + ('--input={T}/no_text.csv',),
         "no column 'text'", workdir='trained'),
    # ---------------------------------------------------------------- round three (issue 28)
    *[Case(f'eval_override_misreads_weights_{field}', EVAL + (f'--override=rope.{field}={value}',),
           f'rope.{field} cannot change at evaluation', workdir='trained')
      for field, value in (('layout', 'half'), ('rotary_dim', '8'), ('rotary_value', 'true'))],
    Case('eval_override_zero_eval_batch_size', EVAL + ('--override=train.eval_batch_size=0',),
         'train.eval_batch_size must be > 0', workdir='trained'),
    Case('eval_override_given_twice', EVAL + ('--override=rope.scaling=yarn',
                                              '--override=rope.scaling=ntk'),
         'gives rope.scaling twice', workdir='trained'),
    Case('eval_workdir_holding_a_hf_config', EVAL, 'is a Hugging Face config',
         workdir='trained_hf_config'),
    Case('eval_output_over_a_run_file', EVAL + ('--output={W}/config.json',), 'is a file of',
         workdir='trained'),
    Case('export_into_the_run_workdir', ('scripts/export_hf.py', '--workdir={W}', '--out={W}'),
         'is a file of', workdir='trained'),
    Case('export_into_a_file', ('scripts/export_hf.py', '--workdir={W}', '--out={T}/train.csv'),
         'is a file; name the folder', workdir='trained'),
    Case('predict_output_is_the_input', ('predict.py', '--workdir={W}', '--input={T}/train.csv',
                                         '--output={T}/train.csv'), 'is the input',
         workdir='trained'),
    Case('predict_output_is_a_folder', ('predict.py', '--workdir={W}', '--input={T}/train.csv',
                                        '--output={T}'), 'is a folder', workdir='trained'),
    Case('ablate_scheme_given_twice', ABLATE + ('--config.ablation.positions=rotary,rotary',),
         'names rotary more than once'),
    Case('learning_rate_given_twice', TRAIN + ('--config.optim.learning_rates=1e-3,0.001',),
         'more than once'),
    # 256 simulated devices share this machine's memory: a 1024-token test split cannot be
    # evaluated, which is refused before training (was: after it, as 'the 0 GiB of a device').
    Case('final_evaluation_beyond_memory', TRAIN + (
        '--config.train.batch_size=0', '--config.train.per_device_batch_size=1',
        '--config.train.eval_max_length=0'), 'Evaluating at 1024 tokens needs about',
         env=(('XLA_FLAGS', '--xla_force_host_platform_device_count=256'),)),
]


@pytest.fixture(scope='session')
def ablation_workdir(tmp_path_factory, tfds_dir):
  """A finished tiny ablation (none and alibi, one seed, 20 steps) run by ``ABLATED``."""
  workdir = str(tmp_path_factory.mktemp('ablation') / 'run')
  argv = [a.format(W=workdir, D=tfds_dir) for a in ABLATED]
  proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip().splitlines()[-1].startswith('Wall time: ')  # the terminal's last line
  return workdir


def test_ablate_prints_the_results_table_and_the_reports_path_not_the_config(ablation_workdir,
                                                                             tfds_dir):
  argv = [a.format(W=ablation_workdir, D=tfds_dir) for a in ABLATED] + ['--report_only']
  proc = entry.run(argv)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  assert lines[-1].endswith(os.path.join(ablation_workdir, 'report.md'))
  assert any(line.startswith('| alibi |') for line in lines)
  assert '"position"' not in proc.stdout and '## Config' not in proc.stdout


def snapshot(path: str) -> dict[str, str]:
  """Relative path -> SHA-256 of every file under ``path`` (the lock file excluded)."""
  out = {}
  for root, _, names in os.walk(path):
    for name in names:
      full = os.path.join(root, name)
      rel = os.path.relpath(full, path)
      if rel != 'lock':
        with open(full, 'rb') as f:
          out[rel] = hashlib.sha256(f.read()).hexdigest()
  return out


def make_workdir(kind: str, workdir: str, trained: str) -> None:
  if kind == 'new':
    return
  if kind in ('empty', 'file'):
    os.makedirs(workdir if kind == 'empty' else os.path.dirname(workdir), exist_ok=True)
    if kind == 'file':
      with open(workdir, 'w') as f:
        f.write('not a folder\n')
    return
  if kind == 'config_only':
    os.makedirs(workdir)
    shutil.copy(os.path.join(trained, 'config.json'), workdir)
    return
  shutil.copytree(trained, workdir)
  if kind == 'trained_no_config':
    os.remove(os.path.join(workdir, 'config.json'))
  elif kind == 'trained_other_data':  # as if the CSV had been edited since the run started
    path = os.path.join(workdir, 'data_fingerprint.json')
    with open(path) as f:
      fingerprint = json.load(f)
    for entry in fingerprint.values():
      entry['sha256'] = '0' * 64
    with open(path, 'w') as f:
      json.dump(fingerprint, f)
  elif kind == 'trained_eval_dir':  # eval.json cannot be written: a folder has its name
    os.makedirs(os.path.join(workdir, 'eval.json'))
  elif kind == 'trained_hf_config':  # as export_hf.py --out=WORKDIR once left it
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      json.dump({'model_type': 'roformer', 'hidden_size': 64}, f)
  elif kind == 'trained_learned':
    path = os.path.join(workdir, 'config.json')
    with open(path) as f:
      config = json.load(f)
    config['model'].update(position='learned', max_length=64)
    with open(path, 'w') as f:
      json.dump(config, f)


def write_inputs(tmp: str) -> None:
  with open(os.path.join(tmp, 'train.csv'), 'w') as f:
    f.write('text,label\n' + ''.join(f'example {i},{i % 2}\n' for i in range(20)))
  with open(os.path.join(tmp, 'bad_labels.csv'), 'w') as f:
    f.write('text,label\nfine,1\nwrong,5\n')
  with open(os.path.join(tmp, 'no_get_config.py'), 'w') as f:
    f.write('import ml_collections\n\nCONFIG = ml_collections.ConfigDict()\n')
  with open(os.path.join(tmp, 'dict_config.py'), 'w') as f:
    f.write('def get_config():\n  return {"train": {}}\n')
  with open(os.path.join(tmp, 'no_mesh.py'), 'w') as f:
    f.write('from configs import tiny\n\n\ndef get_config():\n  c = tiny.get_config()\n'
            '  del c.mesh\n  return c\n')
  rows = ''.join(f'example {i},{i % 2}\n' for i in range(20))
  files = {'tiny.csv': 'text,label\na,0\nb,1\n',
           'ids.csv': 'text,label\n' + ''.join(f'row {i},{10**12 + i}\n' for i in range(20)),
           'quote.csv': 'text,label\n' + rows + '"an open quote,1\n' + rows,
           'null.jsonl': '{"text": "a", "label": 0}\n{"text": "b", "label": null}\n',
           'train.csv.zip': 'PK', 'empty.txt': '',
           'no_text.csv': 'sentence\nhello\n'}
  for name, content in files.items():
    with open(os.path.join(tmp, name), 'w') as f:
      f.write(content)
  os.makedirs(os.path.join(tmp, 'empty_tfds'), exist_ok=True)


@pytest.mark.parametrize('case', CASES, ids=[c.id for c in CASES])
def test_bad_input_is_answered_clearly(case, tmp_path, tfds_dir, request, monkeypatch):
  trained, data_file = '', ''
  if case.workdir == 'ablation_done':
    trained = request.getfixturevalue('ablation_workdir')
  elif case.workdir not in ('new', 'empty', 'file'):
    trained, data_file = request.getfixturevalue('trained_workdir')
  tmp = str(tmp_path)
  workdir = os.path.join(tmp, 'work')
  write_inputs(tmp)
  make_workdir(case.workdir, workdir, trained)
  before = snapshot(workdir) if os.path.isdir(workdir) else None
  argv = [a.format(W=workdir, D=tfds_dir, T=tmp, F=data_file) for a in case.argv]
  if case.no_fortunes:
    from data import fortunes  # pylint: disable=g-import-not-at-top
    monkeypatch.setattr(fortunes.Fortunes.BUILDER_CONFIGS[0], 'directory', '/nonexistent/fortunes')
  t0 = time.monotonic()
  if case.subprocess or case.env:
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, **dict(case.env)), timeout=300)
  else:
    proc = entry.run(argv)
  elapsed = time.monotonic() - t0
  program = os.path.basename(argv[0])
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
  assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  errors = [line for line in proc.stderr.splitlines() if line.startswith(f'{program}: error: ')]
  assert len(errors) == 1, proc.stderr[-3000:]
  assert case.phrase in errors[0], errors[0]
  # Nothing already in the workdir changed; a new workdir holds nothing (at most the lock).
  if before is not None:
    after = snapshot(workdir)
    assert {k: v for k, v in after.items() if k in before} == before
    assert set(after) - set(before) <= {'config.json'}, set(after) - set(before)
  elif os.path.isdir(workdir):
    assert snapshot(workdir) == {}, os.listdir(workdir)
  for name in ('lock', 'config.json', 'checkpoints', 'metrics.jsonl'):  # never the repository
    assert not os.path.exists(os.path.join(ROOT, name)), name
  if case.id == 'tfds_dataset_not_prepared':
    assert elapsed < 60, elapsed  # imports included; the check itself takes well under a second


# ---------------------------------------------------------------- runs that must stay correct
def run(argv, **fmt):
  """``python *argv``, run in this process (helpers/entry.py)."""
  return entry.run([a.format(**fmt) for a in argv])


def spawn(argv, **fmt):
  """``python *argv`` in a real process: the start-up test and predict.py's smoke test."""
  return subprocess.run([sys.executable, *[a.format(**fmt) for a in argv]], cwd=ROOT,
                        capture_output=True, text=True, timeout=600)


def test_fresh_moves_stale_results_aside_and_reruns(ablation_workdir, tmp_path, tfds_dir):
  workdir = str(tmp_path / 'ablation')
  shutil.copytree(ablation_workdir, workdir)
  proc = run(ABLATED + ('--config.optim.learning_rate=0.05', '--only=*/none', '--fresh'),
             W=workdir, D=tfds_dir)
  assert proc.returncode == 0, proc.stderr[-3000:]
  stale = os.path.join(workdir, 'position_probes-order', 'none.stale-1')
  assert os.path.isfile(os.path.join(stale, 'summary.json'))  # kept, never deleted
  with open(os.path.join(workdir, 'position_probes-order', 'none', 'config.json')) as f:
    assert json.load(f)['optim']['learning_rate'] == 0.05


def test_eval_output_elsewhere_leaves_the_workdir_unchanged(trained_workdir, tmp_path):
  workdir = str(tmp_path / 'work')
  shutil.copytree(trained_workdir[0], workdir)
  before = snapshot(workdir)
  proc = run(EVAL + ('--output={O}',), W=workdir, O=str(tmp_path / 'out' / 'eval.json'))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'test' in proc.stdout and os.path.isfile(tmp_path / 'out' / 'eval.json')
  assert snapshot(workdir) == before


def test_resume_repairs_and_reports_a_damaged_workdir(trained_workdir, tmp_path):
  """A deleted metrics.jsonl is reported, a deleted manifest rewritten after its checkpoint
  restored; a corrupt checkpoint without a manifest costs one line, not orbax's logs."""
  workdir, data_file = str(tmp_path / 'work'), trained_workdir[1]
  shutil.copytree(trained_workdir[0], workdir)
  os.remove(os.path.join(workdir, 'metrics.jsonl'))
  manifest = os.path.join(workdir, 'checkpoints', '2', '_SHA256_MANIFEST.json')
  os.remove(manifest)
  proc = run(TRAINED + ('--config.train.num_steps=4', '--config.train.checkpoint_every=4'),
             W=workdir, F=data_file)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'metrics.jsonl is missing' in proc.stderr and os.path.isfile(manifest)
  # Checkpoint 4 loses its manifest and is garbled: set aside in one line, resumed from 2.
  os.remove(os.path.join(workdir, 'checkpoints', '4', '_SHA256_MANIFEST.json'))
  chunks = os.path.join(workdir, 'checkpoints', '4', 'state', 'ocdbt.process_0', 'd')
  for name in os.listdir(chunks):  # every array chunk: many reads fail at once
    with open(os.path.join(chunks, name), 'r+b') as f:
      garbled = bytearray(f.read())
      garbled[100::7] = bytes((b * 31 + 7) % 256 for b in garbled[100::7])
      f.seek(0)
      f.write(garbled)
  proc = run(TRAINED + ('--config.train.num_steps=6', '--config.train.checkpoint_every=4'),
             W=workdir, F=data_file)
  assert proc.returncode == 0, proc.stderr[-3000:]
  ours = [line for line in proc.stderr.splitlines() if 'heckpoint' in line]
  assert any('Checkpoint 4 is corrupt' in line for line in ours), proc.stderr[-3000:]
  assert len(ours) <= 3 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]


def test_skip_nonfinite_keeps_no_nan_weights(trained_workdir, tmp_path):
  """The issue's repro: every update overflows; each is skipped, the run stays finite."""
  workdir = str(tmp_path / 'skip')
  proc = run(TRAINED + ('--config.optim.learning_rate=1e38', '--config.optim.grad_clip_norm=0',
                        '--config.train.skip_nonfinite=True', '--config.train.num_steps=4'),
             W=workdir, F=trained_workdir[1])
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(workdir, 'summary.json')) as f:
    summary = json.load(f)
  assert summary['skipped_updates'] == [3]  # step 1's warmup update is 0 (lr 0): finite
  assert all(map(math.isfinite, summary['validation_loss']))


def test_spreadsheet_and_compressed_files_train(tmp_path):
  """A gzipped CSV with a byte-order mark and a 200 KiB field trains as written."""
  path = tmp_path / 'train.csv.gz'
  with gzip.open(path, 'wb') as f:
    f.write(b'\xef\xbb\xbftext,label\n"' + b'x' * 200_000 + b'",1\n' +
            b''.join(f'example {i},{i % 2}\n'.encode() for i in range(30)))
  proc = run(FILES + ('--config.data.train_files={F}', '--config.train.num_steps=2'),
             W=str(tmp_path / 'run'), D='', F=str(path))
  assert proc.returncode == 0, proc.stderr[-3000:]


def test_lra_retrieval_config_trains_on_release_format_files(tmp_path):
  """projects/lra/configs/retrieval.py, shrunk, trains and tests on headerless AAN-format pair
  files."""
  path = tmp_path / 'new_aan_pairs.train.tsv'
  path.write_text(''.join(f'{i % 2}\tid{i}\tid{i + 1}\tpaper {i} text\tpaper {i % 2} cited\n'
                          for i in range(40)))
  proc = run(('train.py', '--config=projects/lra/configs/retrieval.py', '--workdir={W}',
              '--config.data.train_files={F}', '--config.data.max_length=24',
              '--config.model.max_length=24', '--config.model.size=tiny',
              '--config.model.num_layers=1', '--config.model.hidden_size=16',
              '--config.model.mlp_dim=32', '--config.model.num_heads=2',
              '--config.model.attention_chunk_size=8', '--config.train.num_steps=4',
              '--config.train.batch_size=8', '--config.train.eval_every=4',
              '--config.train.checkpoint_every=4', '--config.optim.warmup_steps=8'),
             W=str(tmp_path / 'run'), F=str(path))
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / 'run' / 'summary.json') as f:
    summary = json.load(f)
  assert 0 <= summary['eval']['test']['accuracy'][0] <= 1 and summary['eval']['test']['count'] == 4


def test_predict_reads_every_format_and_keeps_the_order(trained_workdir, tmp_path):
  """The same texts as .txt, .jsonl, .csv and .tsv give the same predictions, in input order,
  with probabilities over the run's classes; predict.py writes them as JSON lines."""
  from training import prediction  # pylint: disable=g-import-not-at-top
  workdir, _ = trained_workdir
  texts = [f'example number {i}' for i in (3, 8, 1)] + ['a text, with "quotes"']
  inputs = {'in.txt': ''.join(t + '\n' for t in texts),
            'in.jsonl': ''.join(json.dumps({'text': t}) + '\n' for t in texts),
            'in.csv': 'text\n' + ''.join(f'"{t.replace(chr(34), chr(34) * 2)}"\n' for t in texts),
            'in.tsv': 'id\ttext\n' + ''.join(f'{i}\t{t}\n' for i, t in enumerate(texts))}
  results = {}
  for name, content in inputs.items():
    (tmp_path / name).write_text(content)
    results[name] = list(prediction.predict(workdir, str(tmp_path / name), batch_size=3))
  first = results['in.txt']
  assert len(first) == 4 and all(r == first for r in results.values())
  for p in first:
    assert set(p['probabilities']) == {'0', '1'}
    assert abs(sum(p['probabilities'].values()) - 1) < 1e-5
    assert p['label'] == max(p['probabilities'], key=p['probabilities'].get)
  (tmp_path / 'reversed.txt').write_text(''.join(t + '\n' for t in texts[::-1]))
  assert list(prediction.predict(workdir, str(tmp_path / 'reversed.txt'))) == first[::-1]
  proc = spawn(('predict.py', '--workdir={W}', '--input={I}', '--output={O}',
                '--checkpoint=latest'), W=workdir, I=str(tmp_path / 'in.jsonl'),
               O=str(tmp_path / 'out' / 'p.jsonl'))
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = (tmp_path / 'out' / 'p.jsonl').read_text().splitlines()
  assert [json.loads(line) for line in lines] == first


# ------------------------------------------------------- round three (issue 28): stay correct
RESUMED = ('train.py', '--config=configs/tiny.py', '--workdir={W}', '--config.data.data_dir={D}',
           '--config.train.num_steps=12', '--config.optim.warmup_steps=2',
           '--config.train.eval_every=6', '--config.train.checkpoint_every=6')  # log_every 5


def test_resume_between_log_steps_is_bitwise(tmp_path, tfds_dir):
  """The issue's repro: a run resumed from step 6 (log_every 5, so inside an averaging window)
  writes the same metrics.jsonl, byte for byte, and ends in the same state as one that ran
  through; the last line of a run gives its test result."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  a, b = str(tmp_path / 'a'), str(tmp_path / 'b')
  first = run(RESUMED, W=a, D=tfds_dir)
  assert first.returncode == 0, first.stderr[-3000:]
  assert first.stdout.strip().splitlines()[-1].split(' ', 1)[1].startswith('Done: test accuracy')
  shutil.copytree(a, b)
  shutil.rmtree(os.path.join(b, 'checkpoints', '12'))
  os.remove(os.path.join(b, 'summary.json'))
  second = run(RESUMED, W=b, D=tfds_dir)
  assert second.returncode == 0 and 'Resumed from step 6' in second.stdout, second.stderr[-3000:]
  with open(os.path.join(a, 'metrics.jsonl'), 'rb') as fa, open(
      os.path.join(b, 'metrics.jsonl'), 'rb') as fb:
    assert fa.read() == fb.read()
  spec = importlib.util.spec_from_file_location('soak', os.path.join(ROOT, 'scripts', 'soak.py'))
  soak = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(soak)
  assert soak.final_states_equal(a, b, 12)[0]


def test_eval_scaling_defaults_to_the_training_length(trained_workdir, tmp_path):
  """YaRN switched on at evaluation without rope.original_max_length takes the run's training
  length (64), not the field's default (512); eval.json records it."""
  workdir, _ = trained_workdir
  out = str(tmp_path / 'eval.json')
  proc = run(EVAL + ('--override=rope.scaling=yarn', '--override=rope.scaling_factor=2',
                     '--output={O}'), W=workdir, O=out)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(out) as f:
    overrides = json.load(f)['overrides']
  assert overrides == {'rope.scaling': 'yarn', 'rope.scaling_factor': 2.0,
                       'rope.original_max_length': 64}


def test_predict_never_writes_over_its_input(trained_workdir, tmp_path):
  """--output naming the input itself, a symbolic link to it or a hard link to it is refused
  before anything runs, and the input is unchanged."""
  workdir, _ = trained_workdir
  source = tmp_path / 'in.txt'
  source.write_text('first text\nsecond text\n')
  os.symlink(source, tmp_path / 'symlink.txt')
  os.link(source, tmp_path / 'hardlink.txt')
  for output in ('in.txt', 'symlink.txt', 'hardlink.txt'):
    proc = entry.run(['predict.py', f'--workdir={workdir}', f'--input={source}',
                      f'--output={tmp_path / output}'])
    assert proc.returncode == 2 and 'is the input' in proc.stderr, proc.stderr[-2000:]
    assert source.read_text() == 'first text\nsecond text\n'


def test_start_up_prints_only_the_error(tmp_path):
  """No TensorFlow or absl start-up lines: a user error is the only line on stderr."""
  for argv in (TRAIN + ('--config.model.position=rotray',), EVAL):
    proc = spawn(argv, W=str(tmp_path / 'missing'), D=str(tmp_path / 'tfds'))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ''


@pytest.fixture(scope='module')
def two_seed_source(tmp_path_factory, csv_file):
  """A finished tiny run with two seeds, and its export as a Hugging Face directory."""
  root = tmp_path_factory.mktemp('source')
  config = tiny.get_config()
  config.data.name, config.data.train_files = 'files', csv_file
  config.train.num_steps = config.train.eval_every = config.train.checkpoint_every = 2
  config.train.num_seeds = 2
  trainer.train_and_evaluate(config, str(root / 'run'))
  proc = run(('scripts/export_hf.py', '--workdir={W}', '--out={O}'), W=str(root / 'run'),
             O=str(root / 'hf'))
  assert proc.returncode == 0, proc.stderr[-3000:]
  return str(root / 'run'), str(root / 'hf')


def test_init_from_refusals_leave_a_new_workdir_empty(two_seed_source, tmp_path, csv_file):
  """Refused fine-tuning starts: too few source members for the seeds (members would repeat),
  a truncated model.safetensors, a source whose checkpoints are all corrupt. Each exits 2 with
  one paragraph, before or during the setup, and the new workdir is left empty."""
  run_dir, hf_dir = two_seed_source
  broken_hf, broken_run = str(tmp_path / 'hf'), str(tmp_path / 'run')
  shutil.copytree(hf_dir, broken_hf)
  weights = os.path.join(broken_hf, 'model.safetensors')
  os.truncate(weights, os.path.getsize(weights) // 2)
  shutil.copytree(run_dir, broken_run)
  for root, _, names in os.walk(os.path.join(broken_run, 'checkpoints')):
    for name in names:
      if name not in ('_SHA256_MANIFEST.json', 'commit_success.txt', '_CHECKPOINT_METADATA'):
        with open(os.path.join(root, name), 'r+b') as f:
          f.write(b'garbled')
  base = ('train.py', '--config=configs/tiny.py', '--workdir={W}', '--config.data.name=files',
          f'--config.data.train_files={csv_file}', '--config.train.num_steps=2',
          '--config.train.init_from={S}')
  for i, (source, extra, phrase) in enumerate((
      (run_dir, ('--config.train.num_seeds=3',), 'too few for train.num_seeds=3'),
      (broken_hf, ('--config.model.type_vocab_size=1',), 'the file is truncated, damaged'),
      (broken_run, (), 'has no usable checkpoint'))):
    workdir = tmp_path / f'new{i}'
    workdir.mkdir()
    proc = entry.run([a.format(W=workdir, S=source) for a in base + extra])
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    assert phrase in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
    assert set(os.listdir(workdir)) <= {'lock'}, os.listdir(workdir)  # the lock it held
