"""interop/: Hugging Face RoFormer checkpoints reproduce HF's outputs exactly.

Tiny randomly initialised HF models (PyTorch and Flax) are saved locally, converted and compared
on padded inputs with token types: last_hidden_state and classification logits to 1e-5.
Weights are drawn with std 0.2 (HF's default 0.02 makes attention nearly uniform, which would
hide position bugs), and a layout mix-up is shown to fail the same comparison.
"""

from __future__ import annotations

import functools
import json
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
from configs.default import get_config
from interop import export, hf
from interop.converted import load_converted
from training import checkpoints
from training import validation

torch = pytest.importorskip('torch')
with pytest.MonkeyPatch.context() as _mp:
  _mp.setenv('USE_TF', '0')  # importing TensorFlow through transformers costs ~20 s
  transformers = pytest.importorskip('transformers')

ATOL = 1e-5
BATCH, LENGTH, VOCAB, CLASSES = 3, 16, 100, 3
TINY = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
            hidden_dropout_prob=0.0, initializer_range=0.2, num_labels=CLASSES)


# The fields HF RoFormer does not define come from configs/default.py.
BASE = validation.model_config(get_config(), vocab_size=VOCAB, num_classes=CLASSES)


def hf_config(**changes) -> transformers.RoFormerConfig:
  return transformers.RoFormerConfig(**{**TINY, **changes})


def make_inputs() -> dict[str, np.ndarray]:
  """Random ids with right padding (rows 1, 2) and random token types at real tokens."""
  rng = np.random.default_rng(0)
  mask = np.ones((BATCH, LENGTH), np.int64)
  mask[1, 11:] = 0
  mask[2, 5:] = 0
  ids = rng.integers(1, VOCAB, (BATCH, LENGTH)) * mask
  types = rng.integers(0, 2, (BATCH, LENGTH)) * mask
  return {'input_ids': ids, 'attention_mask': mask, 'token_type_ids': types}


INPUTS = make_inputs()


def hf_outputs(model, inputs=INPUTS) -> tuple[np.ndarray, np.ndarray | None]:
  """(last_hidden_state, logits or None) of a torch RoFormer model."""
  tensors = {k: torch.tensor(v) for k, v in inputs.items()}
  with torch.no_grad():
    if isinstance(model, transformers.RoFormerForSequenceClassification):
      out = model(**tensors, output_hidden_states=True)
      return out.hidden_states[-1].numpy(), out.logits.numpy()
    return model(**tensors).last_hidden_state.numpy(), None


def our_outputs(result: hf.HFRoFormer, inputs=INPUTS) -> tuple[np.ndarray, np.ndarray]:
  model = result.model()
  ids = jnp.asarray(inputs['input_ids'])
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)  # HF: 0 .. L-1
  args = (ids, positions, jnp.asarray(inputs['attention_mask']),
          None if inputs.get('token_type_ids') is None else jnp.asarray(inputs['token_type_ids']))
  return np.asarray(model.encode(*args)), np.asarray(model(*args))


def assert_close(ours, expected, *, name: str) -> float:
  diff = float(np.abs(ours - expected).max())
  assert diff < ATOL, f'{name}: max abs difference {diff:.2e} >= {ATOL}'
  return diff


def check_matches(result: hf.HFRoFormer, model, inputs=INPUTS) -> None:
  (hidden, logits), (expected_hidden, expected_logits) = our_outputs(result, inputs), hf_outputs(
      model, inputs)
  assert_close(hidden, expected_hidden, name='last_hidden_state')
  if expected_logits is not None:
    assert_close(logits, expected_logits, name='logits')


def save(model, directory, *, safe: bool = True) -> str:
  model.save_pretrained(str(directory), safe_serialization=safe)
  return str(directory)


@functools.cache
def torch_model(**changes):
  """A tiny eval-mode RoFormerForSequenceClassification (cached per config)."""
  torch.manual_seed(sum(map(ord, repr(sorted(changes.items())))))
  return transformers.RoFormerForSequenceClassification(hf_config(**changes)).eval()


@pytest.fixture(scope='module')
def classifier_dir(tmp_path_factory) -> str:
  return save(torch_model(), tmp_path_factory.mktemp('hf_classifier'))


@pytest.fixture(scope='module')
def rotary_value_dir(tmp_path_factory) -> str:
  return save(torch_model(rotary_value=True), tmp_path_factory.mktemp('hf_rotary_value'))


# ------------------------------------------------------------------ PyTorch checkpoints


def test_sequence_classifier_safetensors(classifier_dir):
  assert os.path.isfile(os.path.join(classifier_dir, 'model.safetensors'))
  result = hf.load_hf_roformer(classifier_dir, BASE, deterministic=True)
  assert result.has_head and result.unused_keys == ()
  assert result.cfg.num_classes == CLASSES and result.cfg.type_vocab_size == 2
  check_matches(result, torch_model())


def test_pytorch_bin_equals_safetensors(classifier_dir, tmp_path):
  bin_dir = save(torch_model(), tmp_path, safe=False)
  assert os.listdir(bin_dir) and not os.path.exists(os.path.join(bin_dir, 'model.safetensors'))
  assert os.path.isfile(os.path.join(bin_dir, 'pytorch_model.bin'))
  from_bin = hf.load_hf_roformer(bin_dir, BASE, deterministic=True)
  from_safetensors = hf.load_hf_roformer(classifier_dir, BASE, deterministic=True)
  jax.tree.map(np.testing.assert_array_equal, from_bin.params, from_safetensors.params)
  check_matches(from_bin, torch_model())


def test_base_model_without_prefix_gets_fresh_head(tmp_path):
  base = torch_model().roformer  # RoFormerModel: keys without the 'roformer.' prefix
  directory = save(base, tmp_path)
  assert not any(k.startswith('roformer.') for k in hf.load_state_dict(directory))
  key = jax.random.key(3, impl='rbg')  # compiles faster than threefry on CPU
  result = hf.load_hf_roformer(directory, BASE, num_classes=5, key=key, deterministic=True)
  assert not result.has_head and result.cfg.num_classes == 5
  fresh_head = nnx.to_pure_dict(models.init(result.cfg, key)[1])['head']
  jax.tree.map(np.testing.assert_array_equal, result.params['head'], fresh_head)
  hidden, logits = our_outputs(result)
  assert_close(hidden, hf_outputs(base)[0], name='last_hidden_state')
  assert logits.shape == (BATCH, 5) and np.isfinite(logits).all()


def test_embedding_projection(tmp_path):
  model = torch_model(embedding_size=16)
  result = hf.load_hf_roformer(save(model, tmp_path), BASE, deterministic=True)
  assert result.cfg.embedding_size == 16 and 'embeddings_project' in result.params
  check_matches(result, model)


def test_rotary_value(rotary_value_dir):
  result = hf.load_hf_roformer(rotary_value_dir, BASE, deterministic=True)
  assert result.cfg.rope.rotary_value
  check_matches(result, torch_model(rotary_value=True))


@pytest.mark.parametrize('rotary_value', [False, True])
def test_half_layout_with_permuted_weights(rotary_value, classifier_dir, rotary_value_dir):
  directory = rotary_value_dir if rotary_value else classifier_dir
  model = torch_model(rotary_value=True) if rotary_value else torch_model()
  half = hf.load_hf_roformer(directory, BASE, layout='half', deterministic=True)
  assert half.cfg.rope.layout == 'half' and half.overrides['rope.layout'] == 'half'
  check_matches(half, model)
  # The permutation is what makes it exact: interleaved weights run in the half layout differ.
  interleaved = hf.load_hf_roformer(directory, BASE, deterministic=True)
  query = lambda r: r.params['layers'][0]['attention']['query']['kernel']
  assert not np.array_equal(query(half), query(interleaved))
  unpermuted = hf.HFRoFormer(half.cfg, interleaved.params, half.overrides, True, ())
  assert np.abs(our_outputs(unpermuted)[0] - hf_outputs(model)[0]).max() > 1e-3


def test_no_token_types_folds_type_zero(classifier_dir):
  result = hf.load_hf_roformer(classifier_dir, BASE, type_vocab_size=0, deterministic=True)
  assert 'token_type_embeddings' not in result.params['embeddings']
  inputs = {**INPUTS, 'token_type_ids': None}
  hidden, logits = our_outputs(result, inputs)
  expected_hidden, expected_logits = hf_outputs(torch_model(), {**INPUTS, 'token_type_ids':
                                                               np.zeros_like(INPUTS['input_ids'])})
  assert_close(hidden, expected_hidden, name='last_hidden_state')
  assert_close(logits, expected_logits, name='logits')


# ------------------------------------------------------------------ Flax checkpoint


def test_flax_checkpoint(tmp_path):
  """FlaxRoFormerForSequenceClassification (flax_model.msgpack), with rotary_value."""
  flax_cls = getattr(transformers, 'FlaxRoFormerForSequenceClassification', None)
  if flax_cls is None:
    pytest.skip('transformers has no Flax RoFormer')
  config = hf_config(rotary_value=True)
  model = flax_cls(config, _do_init=False)  # random params below: no slow jitted init
  shapes = jax.eval_shape(functools.partial(model.init_weights, input_shape=(1, 1)),
                          jax.random.PRNGKey(0))
  rng = np.random.default_rng(1)

  def draw(path, s):
    scale = getattr(path[-1], 'key', None) == 'scale'  # LayerNorm scales around 1
    return (float(scale) + rng.normal(0, 0.2, s.shape)).astype(np.float32)

  params = jax.tree_util.tree_map_with_path(draw, shapes)
  model.save_pretrained(str(tmp_path), params=params)
  assert os.path.isfile(tmp_path / 'flax_model.msgpack')
  out = model(**INPUTS, params=params, output_hidden_states=True)
  result = hf.load_hf_roformer(str(tmp_path), BASE, deterministic=True)
  assert result.has_head and result.unused_keys == ()
  hidden, logits = our_outputs(result)
  assert_close(hidden, np.asarray(out.hidden_states[-1]), name='last_hidden_state')
  assert_close(logits, np.asarray(out.logits), name='logits')


# ------------------------------------------------------------------ config, saving, errors


def test_overrides_rebuild_the_config(classifier_dir):
  """The printed overrides make configs/default.py describe exactly the converted model."""
  result = hf.load_hf_roformer(classifier_dir, BASE, layout='half')
  config = get_config()
  config.update_from_flattened_dict(result.overrides)
  assert validation.model_config(config, vocab_size=VOCAB, num_classes=CLASSES) == result.cfg


def _convert_script():
  path = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'scripts', 'convert_hf.py')
  spec = importlib.util.spec_from_file_location('convert_hf', path)
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  return script


def test_convert_script_round_trip(classifier_dir, tmp_path, capsys):
  out = str(tmp_path / 'converted')
  _convert_script().main(['--hf_dir', classifier_dir, '--out', out, '--layout', 'half'])
  assert '--config.rope.layout=half' in capsys.readouterr().out
  restored = load_converted(out, deterministic=True)
  direct = hf.load_hf_roformer(classifier_dir, BASE, layout='half', deterministic=True)
  assert restored.cfg == direct.cfg and restored.has_head
  jax.tree.map(np.testing.assert_array_equal, restored.params, direct.params)


def test_bfloat16_safetensors(tmp_path):
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
  x = torch.randn(3, 4)
  save_file({'w': x.to(torch.bfloat16)}, str(tmp_path / 'model.safetensors'))
  loaded = hf.load_state_dict(str(tmp_path))['w']
  np.testing.assert_array_equal(np.asarray(loaded, np.float32), x.to(torch.bfloat16).float())


def test_errors_name_the_problem(classifier_dir, tmp_path):
  sd = hf.load_state_dict(classifier_dir)
  cfg = hf.model_config(hf.load_hf_config(classifier_dir), BASE)
  bad = dict(sd)
  bad['roformer.encoder.layer.1.attention.self.query.weight'] = np.zeros((32, 30), np.float32)
  with pytest.raises(ValueError, match=r'encoder\.layer\.1\.attention\.self\.query\.weight'):
    hf.convert_state_dict(bad, cfg)
  missing = {k: v for k, v in sd.items() if 'layer.1.output.LayerNorm' not in k}
  with pytest.raises(KeyError, match=r'encoder\.layer\.1\.output\.LayerNorm\.weight'):
    hf.convert_state_dict(missing, cfg)
  headless = {k: v for k, v in sd.items() if not k.startswith('classifier.')}
  with pytest.raises(ValueError, match='no classification head'):
    hf.convert_state_dict(headless, cfg)
  table = dict(sd)
  table['roformer.encoder.embed_positions.weight'] = sd[
      'roformer.encoder.embed_positions.weight'] * 2
  with pytest.raises(ValueError, match='sinusoidal'):
    hf.convert_state_dict(table, cfg)
  with pytest.raises(ValueError, match='hidden_act'):
    hf.model_config({**hf.load_hf_config(classifier_dir), 'hidden_act': 'relu'}, BASE)
  with pytest.raises(ValueError, match='num_classes=7'):
    hf.load_hf_roformer(classifier_dir, BASE, num_classes=7)
  with pytest.raises(FileNotFoundError):
    hf.load_hf_roformer(str(tmp_path / 'nowhere'), BASE)


# ------------------------------------------------------------------ fine-tuning from a checkpoint


def _checkpoint_with_tokenizer(directory) -> str:
  """The tiny HF classifier saved with a BERT WordPiece tokenizer of its 100 tokens."""
  save(torch_model(), directory)
  vocab = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + [f'w{i}' for i in range(VOCAB - 5)]
  (directory / 'vocab.txt').write_text('\n'.join(vocab) + '\n')
  transformers.BertTokenizerFast(vocab_file=str(directory / 'vocab.txt')).save_pretrained(
      str(directory))
  return str(directory)


def _fine_tune_config(tmp_path, hf_dir, **changes):
  from configs import tiny  # pylint: disable=g-import-not-at-top
  rows = ''.join(f'w{i} w{i + 1} w{i % 7},{i % 2}\n' for i in range(40))
  (tmp_path / 'train.csv').write_text('text,label\n' + rows)
  config = tiny.get_config()
  config.update_from_flattened_dict(hf.load_hf_roformer(hf_dir, BASE).overrides)
  config.update_from_flattened_dict({
      'data.name': 'files', 'data.train_files': str(tmp_path / 'train.csv'),
      'data.tokenizer': 'huggingface', 'data.max_length': 16, 'train.init_from': hf_dir,
      'train.num_steps': 1, 'optim.warmup_steps': 1, 'train.eval_every': 1,
      'train.checkpoint_every': 1, 'train.eval_max_length': 16, **changes})
  return config


def _check_predict_then_export(workdir: str, tmp_path) -> None:
  """predict.py's probabilities equal those of the export loaded in transformers, tokenized by
  AutoTokenizer, on the same texts."""
  from training import prediction  # pylint: disable=g-import-not-at-top
  texts = ['w1 w2 w3', 'W5 w9 unknown words', 'w3']
  (tmp_path / 'texts.txt').write_text(''.join(t + '\n' for t in texts))
  ours = list(prediction.predict(workdir, str(tmp_path / 'texts.txt'), checkpoint='latest'))
  out = str(tmp_path / 'exported')
  spec = importlib.util.spec_from_file_location('export_hf', os.path.join(
      os.path.dirname(os.path.dirname(__file__)), 'scripts', 'export_hf.py'))
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  script.main(['--workdir', workdir, '--out', out, '--checkpoint', 'latest'])
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  model = transformers.RoFormerForSequenceClassification.from_pretrained(out).eval()
  inputs = tokenizer(texts, padding='max_length', max_length=16, truncation=True,
                     return_tensors='pt')
  with torch.no_grad():
    theirs = torch.softmax(model(**inputs).logits, -1).numpy()
  labels = [model.config.id2label[i] for i in range(theirs.shape[1])]
  ours = np.array([[p['probabilities'][name] for name in labels] for p in ours])
  assert_close(ours, theirs, name='probabilities')


@pytest.mark.slow  # ~35 s: converts, tokenizes and fine-tunes; the conversions are tested above
def test_fine_tune_from_a_hf_checkpoint_with_its_tokenizer(tmp_path):
  """train.init_from=<HF directory>: the encoder is the checkpoint's (the head is new: 2 classes
  here, 3 there), the tokenizer is the checkpoint's, and freeze_encoder keeps the encoder."""
  from training import init_from, trainer  # pylint: disable=g-import-not-at-top
  hf_dir = _checkpoint_with_tokenizer(tmp_path / 'hf')
  expected = hf.load_hf_roformer(hf_dir, BASE).params
  read = lambda w, step: checkpoints.Checkpointer(w, 1, read_only=True).restore_raw(step)['params']
  flat = lambda p: {jax.tree_util.keystr(k, simple=True, separator='/'): v for k, v in
                    jax.tree_util.tree_flatten_with_path(p)[0]}

  def check_encoder(params):
    for key, value in flat(params).items():
      if not key.startswith('head/'):
        np.testing.assert_allclose(value[0], flat(expected)[key], atol=1e-6, err_msg=key)

  trainer.train_and_evaluate(_fine_tune_config(tmp_path, hf_dir), str(tmp_path / 'a'))
  fresh = read(str(tmp_path / 'a'), 1)  # step 1's rate is 0: as initialised
  check_encoder(fresh)
  assert fresh['head']['out_proj']['kernel'].shape[-1] == 2
  with open(tmp_path / 'a' / 'tokenizer.json') as f:
    assert '"w94"' in f.read()
  converted = str(tmp_path / 'converted')  # convert, then fine-tune: the same start
  _convert_script().main(['--hf_dir', hf_dir, '--out', converted])
  trainer.train_and_evaluate(_fine_tune_config(tmp_path, hf_dir, **{
      'train.init_from': converted}), str(tmp_path / 'e'))
  check_encoder(read(str(tmp_path / 'e'), 1))
  config = _fine_tune_config(tmp_path, hf_dir, **{'optim.freeze_encoder': True,
                                                  'train.num_steps': 3})
  trainer.train_and_evaluate(config, str(tmp_path / 'b'))
  frozen = read(str(tmp_path / 'b'), 3)
  check_encoder(frozen)
  assert not np.allclose(frozen['head']['out_proj']['kernel'], fresh['head']['out_proj']['kernel'])
  _check_predict_then_export(str(tmp_path / 'b'), tmp_path)
  with pytest.raises(init_from.InitFromError, match='--config.model.hidden_size=32'):
    trainer.train_and_evaluate(_fine_tune_config(tmp_path, hf_dir, **{'model.hidden_size': 64}),
                               str(tmp_path / 'c'))
  with pytest.raises(init_from.InitFromError, match='vocabulary of 100 tokens'):
    trainer.train_and_evaluate(_fine_tune_config(tmp_path, hf_dir, **{'data.tokenizer': 'byte'}),
                               str(tmp_path / 'd'))


def test_export_round_trip_matches_transformers(classifier_dir, tmp_path):
  """HF checkpoint -> this model -> export -> transformers: the same logits as the original
  (both layouts), and the refusal of a model HF cannot express names the field."""
  original = torch_model()
  for layout in ('interleaved', 'half'):
    result = hf.load_hf_roformer(classifier_dir, BASE, layout=layout)
    out = tmp_path / layout
    out.mkdir()
    from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
    save_file(export.export_state_dict(result.params, result.cfg, 64),
              str(out / 'model.safetensors'), metadata={'format': 'pt'})
    (out / 'config.json').write_text(json.dumps(export.export_config(
        result.cfg, ('a', 'b', 'c'), 64, 0)))
    exported = transformers.RoFormerForSequenceClassification.from_pretrained(str(out)).eval()
    assert_close(hf_outputs(exported)[1], hf_outputs(original)[1], name=f'logits ({layout})')
    assert exported.config.id2label == {0: 'a', 1: 'b', 2: 'c'}
  with pytest.raises(ValueError, match="model.position='alibi'"):
    export.check_exportable(BASE.replace(position='alibi'))


@pytest.mark.parametrize('task', ['mlm', 'clm'])
def test_language_model_export_matches_transformers(tmp_path, task):
  """A pre-trained language model (random weights, std 0.2) exported as RoFormerForMaskedLM /
  RoFormerForCausalLM gives the same vocabulary logits at every real position."""
  cfg = BASE.replace(task=task, type_vocab_size=2, init_std=0.2, dropout_rate=0.0,
                     deterministic=True)
  graphdef, params = models.init(cfg, jax.random.key(3))
  model = nnx.merge(graphdef, params)
  ids = jnp.asarray(INPUTS['input_ids'])
  positions = jnp.broadcast_to(jnp.arange(LENGTH), ids.shape)
  mask = jnp.asarray(INPUTS['attention_mask'])
  ours = np.asarray(model(ids, positions, mask, jnp.asarray(INPUTS['token_type_ids'])))
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  save_file(export.export_state_dict(nnx.to_pure_dict(params), cfg, 64),
            str(tmp_path / 'model.safetensors'), metadata={'format': 'pt'})
  (tmp_path / 'config.json').write_text(json.dumps(export.export_config(cfg, (), 64, 0)))
  exported = getattr(transformers, export.architecture(cfg)).from_pretrained(str(tmp_path)).eval()
  with torch.no_grad():
    theirs = exported(**{k: torch.tensor(v) for k, v in INPUTS.items()}).logits.numpy()
  real = INPUTS['attention_mask'].astype(bool)
  np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4)
  assert exported.config.is_decoder == (task == 'clm')
