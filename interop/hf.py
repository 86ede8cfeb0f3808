"""Hugging Face RoFormer checkpoints -> this codebase's ``Classifier`` (exact, no torch needed).

  result = interop.hf.load_hf_roformer('path/to/hf_checkpoint_dir', base, deterministic=True)
  logits = result.model()(ids, positions, attention_mask, token_type_ids)  # positions 0 .. L-1

Reads ``RoFormerModel`` and ``RoFormerForSequenceClassification`` checkpoints: safetensors (also
sharded), torch ``.bin`` (``weights_only=True``, never plain pickle) or Flax msgpack, one to one
(``models/encoder.py`` mirrors HF's module order). A checkpoint without a classification head gets
a fresh one; other heads (MLM, QA) go to ``unused_keys``. ``layout='half'`` permutes the rotated
projections to the GPT-NeoX/LLaMA layout; ``type_vocab_size=0`` folds token type 0's embedding
into the word embeddings.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.flax
from flax import nnx, serialization

import rope
import storage
from data import tokenizers
from models.config import ModelConfig
from models.encoder import Classifier, init
from models.positions import Rotary

CONFIG_NAME = 'config.json'
WEIGHT_NAMES = ('model.safetensors', 'model.safetensors.index.json', 'pytorch_model.bin',
                'pytorch_model.bin.index.json', 'flax_model.msgpack')
HF_LAYOUT = 'interleaved'  # HF RoFormer rotates pairs (2i, 2i+1)
HF_ROPE_BASE = 10000.0
EXACT_GELU = ('gelu', 'gelu_python')
_HEAD_KEYS = ('classifier.dense.weight', 'classifier.dense.bias', 'classifier.out_proj.weight',
              'classifier.out_proj.bias')


def _weights_file(path: str) -> str:
  if os.path.isfile(path):
    return path
  if not os.path.isdir(path):
    raise FileNotFoundError(f'No Hugging Face checkpoint at {path!r} (neither file nor directory).')
  for name in WEIGHT_NAMES:
    candidate = os.path.join(path, name)
    if os.path.isfile(candidate):
      return candidate
  raise FileNotFoundError(f'No weights in {path!r}: expected one of {", ".join(WEIGHT_NAMES)}.')


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
  # The flax reader: safetensors.numpy cannot hold bfloat16.
  return {name: np.asarray(value) for name, value in safetensors.flax.load_file(path).items()}


def _read_torch(path: str) -> dict[str, np.ndarray]:
  import torch  # pylint: disable=g-import-not-at-top  (optional: only for .bin checkpoints)
  state = torch.load(path, map_location='cpu', weights_only=True)
  return {name: (t.float() if t.dtype == torch.bfloat16 else t).numpy()
          for name, t in state.items()}


def _read_flax(path: str) -> dict[str, np.ndarray]:
  """Torch-style names and layouts."""
  with open(path, 'rb') as f:
    tree = serialization.msgpack_restore(f.read())
  out = {}
  for key_path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
    names = [str(getattr(k, 'key', k)) for k in key_path]
    value = np.asarray(value)
    leaf = names[-1]
    if leaf == 'kernel':  # Flax Dense [in, out] -> torch Linear [out, in]
      names[-1], value = 'weight', value.T
    elif leaf in ('scale', 'embedding'):
      names[-1] = 'weight'
    out['.'.join(names)] = value
  return out


def _read_sharded(index_path: str) -> dict[str, np.ndarray]:
  with open(index_path) as f:
    shards = sorted(set(json.load(f)['weight_map'].values()))
  return {name: value for shard in shards for name, value in
          load_state_dict(os.path.join(os.path.dirname(index_path), shard)).items()}


def load_state_dict(path: str) -> dict[str, np.ndarray]:
  """HF parameter name -> numpy array (torch layout), from a checkpoint directory or a file."""
  weights = _weights_file(path)
  for suffixes, read in (('.index.json', _read_sharded), ('.safetensors', _read_safetensors),
                         (('.bin', '.pt', '.pth'), _read_torch), ('.msgpack', _read_flax)):
    if weights.endswith(suffixes):
      try:
        return read(weights)
      except (ImportError, MemoryError, FileNotFoundError):
        raise
      except Exception as e:  # pylint: disable=broad-except  (each format's reader its own)
        raise ValueError(f'{weights} cannot be read ({type(e).__name__}: '
                         f'{" ".join(str(e).split())[:200]}): the file is truncated, damaged or '
                         'not what its name says. Download or save the checkpoint again.') from e
  raise ValueError(f'Unknown weights format {weights!r}: expected .safetensors, .bin, .pt or '
                   '.msgpack.')


def load_hf_config(path: str) -> dict[str, Any]:
  """The ``config.json`` of a checkpoint directory (or the file itself)."""
  if os.path.isdir(path):
    path = os.path.join(path, CONFIG_NAME)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'No Hugging Face config at {path!r}.')
  with open(path) as f:
    return json.load(f)


def copy_tokenizer(checkpoint: str, target: str) -> None:
  """Writes a checkpoint's tokenizer.json (or one built from its vocab.txt) to ``target``."""
  storage.write_atomically(target, tokenizers.read_huggingface(checkpoint).encode('utf-8'))


def _check_supported(c: Mapping[str, Any]) -> None:
  model_type = c.get('model_type', 'roformer')
  if model_type != 'roformer':
    raise ValueError(f'Not a RoFormer config: model_type={model_type!r}.')
  act = c.get('hidden_act', 'gelu')
  if act not in EXACT_GELU:
    raise ValueError(f'hidden_act={act!r} is not supported: models/encoder.py uses exact (erf) '
                     f'GELU, which is HF\'s {" / ".join(map(repr, EXACT_GELU))}.')
  if c.get('is_decoder') or c.get('add_cross_attention'):
    raise ValueError('Decoder RoFormer checkpoints (is_decoder / add_cross_attention) are not '
                     'supported: this model is a bidirectional encoder.')
  if c['hidden_size'] % c['num_attention_heads']:
    raise ValueError(f'hidden_size={c["hidden_size"]} is not divisible by '
                     f'num_attention_heads={c["num_attention_heads"]}.')


def hf_fields(c: Mapping[str, Any], *,
              layout: str = HF_LAYOUT) -> tuple[dict[str, Any], dict[str, Any]]:
  """The ``model`` and ``rope`` config fields of a HF config (vocab, classes: from data)."""
  _check_supported(c)
  hidden = c['hidden_size']
  model = dict(
      position=Rotary.name, attention='softmax', num_layers=c['num_hidden_layers'],
      hidden_size=hidden, num_heads=c['num_attention_heads'], mlp_dim=c['intermediate_size'],
      embedding_size=c.get('embedding_size') or hidden,
      dropout_rate=float(c.get('hidden_dropout_prob', 0.1)),
      attention_dropout_rate=float(c.get('attention_probs_dropout_prob', 0.1)), norm='post',
      layer_norm_eps=float(c.get('layer_norm_eps', 1e-12)), pooling='cls',
      type_vocab_size=int(c.get('type_vocab_size', 2)),
      max_length=int(c.get('max_position_embeddings', 512)))
  rope_fields = dict(base=HF_ROPE_BASE, layout=layout, rotary_dim=None, p=1.0, scaling='none',
                     xpos=False, rotary_value=bool(c.get('rotary_value', False)))
  return model, rope_fields


# HF RoFormer rotates in every layer: a conversion has no NoPE layers, whatever ``base`` has.
HF_EVERY_LAYER = {'nope_layers': (), 'nope_interval': 0}


def dotted(model: Mapping[str, Any], rope_fields: Mapping[str, Any]) -> dict[str, Any]:
  """``hf_fields``' two groups as dotted overrides (``model.num_layers``)."""
  return {**{f'model.{k}': v for k, v in model.items()},
          **{f'rope.{k}': v for k, v in rope_fields.items()}}


def model_config(c: Mapping[str, Any], base: ModelConfig, *, num_classes: int | None = None,
                 layout: str = HF_LAYOUT, **changes: Any) -> ModelConfig:
  """The ``ModelConfig`` of a HF config dict; ``base`` gives the fields HF does not define.
  ``num_classes`` None: the config's labels (HF's default 2)."""
  model, rope_fields = hf_fields(c, layout=layout)
  if num_classes is None:
    num_classes = len(c['id2label']) if c.get('id2label') else int(c.get('num_labels', 2))
  return base.replace(**{**model, **HF_EVERY_LAYER, **changes}, vocab_size=int(c['vocab_size']),
                      num_classes=int(num_classes),
                      rope=dataclasses.replace(base.rope, **rope_fields))


def sinusoidal_table(num_positions: int, dim: int) -> np.ndarray:
  """HF RoFormer's ``embed_positions`` table [positions, dim]: sin(m theta_i) then cos."""
  theta = HF_ROPE_BASE ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
  angle = np.arange(num_positions, dtype=np.float64)[:, None] * theta
  return np.concatenate([np.sin(angle), np.cos(angle)], axis=-1).astype(np.float32)


def abstract_params(cfg: ModelConfig) -> dict[Any, Any]:
  """The pure params dict of ``cfg``'s model, shapes only."""
  abstract = nnx.eval_shape(lambda: Classifier(cfg, rngs=nnx.Rngs(0)))
  return nnx.to_pure_dict(nnx.state(abstract, nnx.Param))


def strip_prefix(state_dict: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Drops the ``roformer.`` prefix of a task model's encoder keys."""
  return {k.removeprefix('roformer.'): v for k, v in state_dict.items()}


def _ln_name(name: str) -> str:
  """Old TF-ported checkpoints name LayerNorm parameters gamma/beta."""
  return name.replace('LayerNorm.gamma', 'LayerNorm.weight').replace('LayerNorm.beta',
                                                                     'LayerNorm.bias')


class _Converter:
  """Fills a pure params dict from HF tensors, checking every shape against the model."""

  def __init__(self, state_dict: Mapping[str, np.ndarray], cfg: ModelConfig):
    self.sd = {_ln_name(k): v for k, v in strip_prefix(state_dict).items()}
    self.cfg = cfg
    self.used: set[str] = set()
    self.target = abstract_params(cfg)
    self.params: dict[Any, Any] = {}

  def get(self, name: str) -> np.ndarray:
    if name not in self.sd:
      raise KeyError(f'Hugging Face checkpoint lacks {name!r} (needed by this model config).')
    self.used.add(name)
    return np.asarray(self.sd[name], np.float32)

  def put(self, path: tuple[Any, ...], value: np.ndarray, source: str) -> None:
    node = self.target
    for key in path:
      if not isinstance(node, Mapping) or key not in node:
        raise ValueError(f'Model has no parameter {"/".join(map(str, path))} (for HF {source!r});'
                         ' the ModelConfig does not match the checkpoint.')
      node = node[key]
    if tuple(node.shape) != value.shape:
      raise ValueError(f'Shape mismatch for HF {source!r} -> {"/".join(map(str, path))}: '
                       f'checkpoint gives {value.shape}, model expects {tuple(node.shape)}.')
    functools.reduce(lambda d, k: d.setdefault(k, {}), path[:-1], self.params)[path[-1]] = value

  def linear(self, hf: str, path: tuple[Any, ...], in_shape=None, out_shape=None) -> None:
    """torch Linear ``hf`` [out, in] -> kernel [*in_shape, *out_shape] and bias [*out_shape]."""
    w = self.get(f'{hf}.weight')
    if w.ndim != 2:
      raise ValueError(f'HF {hf + ".weight"!r} should be a 2-D [out, in] matrix, got {w.shape}.')
    b = self.get(f'{hf}.bias')
    kernel = w.T
    if in_shape is not None or out_shape is not None:
      in_shape = in_shape or (w.shape[1],)
      out_shape = out_shape or (w.shape[0],)
      if np.prod(in_shape) != w.shape[1] or np.prod(out_shape) != w.shape[0]:
        raise ValueError(f'Shape mismatch for HF {hf + ".weight"!r}: {w.shape} cannot be '
                         f'reshaped to [{", ".join(map(str, out_shape + in_shape))}] (out, in).')
      kernel = kernel.reshape(*in_shape, *out_shape)
      b = b.reshape(out_shape)
    self.put(path + ('kernel',), kernel, f'{hf}.weight')
    self.put(path + ('bias',), b, f'{hf}.bias')

  def layer_norm(self, hf: str, path: tuple[Any, ...]) -> None:
    self.put(path + ('scale',), self.get(f'{hf}.weight'), f'{hf}.weight')
    self.put(path + ('bias',), self.get(f'{hf}.bias'), f'{hf}.bias')

  def check_sinusoidal(self) -> None:
    name = 'encoder.embed_positions.weight'
    if name not in self.sd:
      return
    table = self.get(name)
    expected = sinusoidal_table(table.shape[0], self.cfg.head_dim)
    if table.shape != expected.shape or not np.allclose(table, expected, atol=1e-5):
      raise ValueError(f'HF {name!r} ({table.shape}) is not the standard RoFormer sinusoidal '
                       f'table (base {HF_ROPE_BASE:g}, head_dim {self.cfg.head_dim}); this model '
                       'computes that table and cannot reproduce a different one.')


def permute_layout(params: dict[Any, Any], cfg: ModelConfig, src: str = HF_LAYOUT) -> None:
  """In place: layout ``src`` (HF's interleaved pairs) -> ``cfg.rope.layout`` (no-op if equal)."""
  dst = cfg.rope.layout
  if dst == src:
    return

  def permute(w: np.ndarray, axis: int) -> np.ndarray:
    return rope.convert_qk_projection(w, head_dim=cfg.head_dim, src=src, dst=dst,
                                      rotary_dim=cfg.rope.rotary_dim, axis=axis)

  for layer in params['layers'].values():
    attn = layer['attention']
    rotated = ('query', 'key', 'value') if cfg.rope.rotary_value else ('query', 'key')
    for name in rotated:  # output features (head_dim, the last axis) of the projection
      attn[name]['kernel'] = permute(attn[name]['kernel'], -1)
      attn[name]['bias'] = permute(attn[name]['bias'], -1)
    if cfg.rope.rotary_value:  # rotated values: the output projection reads permuted features
      attn['output']['kernel'] = permute(attn['output']['kernel'], 1)


@dataclasses.dataclass(frozen=True)
class Converted:
  """A converted state dict: pure ``params`` and whether the head came from the checkpoint."""

  params: dict[Any, Any]
  has_head: bool
  unused_keys: tuple[str, ...]


def convert_state_dict(state_dict: Mapping[str, np.ndarray], cfg: ModelConfig, *,
                       init_params: Mapping[Any, Any] | None = None) -> Converted:
  """HF tensors -> this model's float32 params for ``cfg``; ``init_params`` (a fresh model's)
  gives the head when the checkpoint has none. A missing tensor or a wrong shape raises."""
  if (cfg.position != Rotary.name or cfg.attention != 'softmax' or cfg.norm != 'post'
      or cfg.dual_encoder):
    raise ValueError('HF RoFormer is a post-LN softmax encoder with rotary positions and one '
                     f'input; got position={cfg.position!r}, attention={cfg.attention!r}, '
                     f'norm={cfg.norm!r}, dual_encoder={cfg.dual_encoder}.')
  conv = _Converter(state_dict, cfg)
  conv.check_sinusoidal()
  _convert_embeddings(conv, cfg)
  for i in range(cfg.num_layers):
    _convert_layer(conv, cfg, i)
  if f'encoder.layer.{cfg.num_layers}.attention.self.query.weight' in conv.sd:
    raise ValueError(f'Checkpoint has more than num_layers={cfg.num_layers} layers.')
  has_head = _convert_head(conv, init_params)
  _check_complete(conv.params, conv.target)
  permute_layout(conv.params, cfg)
  unused = tuple(sorted(k for k in conv.sd
                        if k not in conv.used and k != 'encoder.embed_positions.weight'))
  return Converted(params=conv.params, has_head=has_head, unused_keys=unused)


def _convert_embeddings(conv: _Converter, cfg: ModelConfig) -> None:
  word = conv.get('embeddings.word_embeddings.weight')
  if cfg.type_vocab_size:
    conv.put(('embeddings', 'token_type_embeddings', 'embedding'),
             conv.get('embeddings.token_type_embeddings.weight'),
             'embeddings.token_type_embeddings.weight')
  elif 'embeddings.token_type_embeddings.weight' in conv.sd:
    # No token types in this model: HF's embedding of type 0 is a constant row; fold it in.
    word = word + conv.get('embeddings.token_type_embeddings.weight')[0]
  conv.put(('embeddings', 'word_embeddings', 'embedding'), word,
           'embeddings.word_embeddings.weight')
  conv.layer_norm('embeddings.LayerNorm', ('embeddings', 'layer_norm'))
  if cfg.embedding_size != cfg.hidden_size:
    conv.linear('embeddings_project', ('embeddings_project',))
  elif 'embeddings_project.weight' in conv.sd:
    raise ValueError('Checkpoint has embeddings_project but the config has embedding_size == '
                     f'hidden_size == {cfg.hidden_size}.')


def _convert_layer(conv: _Converter, cfg: ModelConfig, i: int) -> None:
  hf, ours = f'encoder.layer.{i}', ('layers', i)
  for name in ('query', 'key', 'value'):
    conv.linear(f'{hf}.attention.self.{name}', ours + ('attention', name),
                out_shape=(cfg.num_heads, cfg.head_dim))
  conv.linear(f'{hf}.attention.output.dense', ours + ('attention', 'output'),
              in_shape=(cfg.num_heads, cfg.head_dim))
  conv.layer_norm(f'{hf}.attention.output.LayerNorm', ours + ('attention_norm',))
  conv.linear(f'{hf}.intermediate.dense', ours + ('intermediate',))
  conv.linear(f'{hf}.output.dense', ours + ('output',))
  conv.layer_norm(f'{hf}.output.LayerNorm', ours + ('output_norm',))


def _convert_head(conv: _Converter, init_params: Mapping[Any, Any] | None) -> bool:
  """Whether the checkpoint had a head (else it is ``init_params``')."""
  present = [k for k in _HEAD_KEYS if k in conv.sd]
  if present and len(present) < len(_HEAD_KEYS):
    raise ValueError(f'Incomplete classification head in checkpoint: has {present}, needs '
                     f'{list(_HEAD_KEYS)}.')
  if present:
    conv.linear('classifier.dense', ('head', 'dense'))
    conv.linear('classifier.out_proj', ('head', 'out_proj'))
    return True
  if init_params is None:
    raise ValueError('Checkpoint has no classification head (classifier.dense / '
                     'classifier.out_proj): pass init_params from a fresh model to initialise it.')
  conv.params['head'] = jax.tree.map(lambda x: np.asarray(x, np.float32),
                                     dict(init_params['head']))
  return False


def _check_complete(params: Mapping[Any, Any], target: Mapping[Any, Any], prefix: str = ''):
  for key, sub in target.items():
    name = f'{prefix}{key}'
    if key not in params:
      raise ValueError(f'No checkpoint tensor for model parameter {name!r}.')
    if isinstance(sub, Mapping):
      _check_complete(params[key], sub, name + '/')


@dataclasses.dataclass(frozen=True)
class HFRoFormer:
  """A converted checkpoint; ``overrides``: the dotted config overrides that give this model."""

  cfg: ModelConfig
  params: dict[Any, Any]
  overrides: dict[str, Any]
  has_head: bool
  unused_keys: tuple[str, ...]

  def model(self) -> Classifier:
    abstract = nnx.eval_shape(lambda: Classifier(self.cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, self.params))
    return nnx.merge(graphdef, state)


def load_hf_roformer(path: str, base: ModelConfig, *, num_classes: int | None = None,
                     layout: str = HF_LAYOUT, key: jax.Array | None = None,
                     **changes: Any) -> HFRoFormer:
  """Reads and converts a ``save_pretrained`` directory. ``num_classes`` None: the head's (else
  the config's labels); ``key`` initialises a missing head. Other arguments as ``model_config``."""
  hf_config = load_hf_config(path)
  state_dict = load_state_dict(path)
  stripped = strip_prefix(state_dict)
  out_proj = stripped.get('classifier.out_proj.weight')
  if out_proj is not None:
    if num_classes is not None and num_classes != out_proj.shape[0]:
      raise ValueError(f'num_classes={num_classes} but the checkpoint head has '
                       f'{out_proj.shape[0]} classes; pass num_classes=None to keep it.')
    num_classes = out_proj.shape[0]
  word = stripped.get('embeddings.word_embeddings.weight')
  if (word is not None and 'embeddings_project.weight' not in stripped and
      'embedding_size' not in changes and word.shape[1] == hf_config['hidden_size']):
    # Flax RoFormer ignores embedding_size (no projection): follow the weights.
    changes['embedding_size'] = hf_config['hidden_size']
  cfg = model_config(hf_config, base, num_classes=num_classes, layout=layout, **changes)
  init_params = None
  if out_proj is None:
    key = jax.random.key(0) if key is None else key
    init_params = nnx.to_pure_dict(init(cfg, key)[1])
    logging.info('HF checkpoint %s has no classification head: initialised a fresh one.', path)
  converted = convert_state_dict(state_dict, cfg, init_params=init_params)
  if converted.unused_keys:
    logging.info('Unused HF tensors: %s', ', '.join(converted.unused_keys))
  model, rope_fields = hf_fields(hf_config, layout=layout)
  overrides = dotted({k: getattr(cfg, k) for k in model},
                     {k: getattr(cfg.rope, k) for k in rope_fields})
  return HFRoFormer(cfg=cfg, params=converted.params, overrides=overrides,
                    has_head=converted.has_head, unused_keys=converted.unused_keys)
