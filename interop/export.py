"""This model's parameters -> a Hugging Face RoFormer checkpoint (inverse of ``interop/hf.py``)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import safetensors.numpy

import storage
from data import tokenizers
from interop.hf import (CONFIG_NAME, HF_LAYOUT, HF_ROPE_BASE, WEIGHT_NAMES, permute_layout,
                        sinusoidal_table)
from models.config import ModelConfig
from models.positions import Rotary

WEIGHTS_NAME = WEIGHT_NAMES[0]  # model.safetensors: what transformers reads without pickle
EXPORTED_FILES = (CONFIG_NAME, WEIGHTS_NAME, tokenizers.HF_TOKENIZER_FILE,
                  tokenizers.HF_TOKENIZER_CONFIG)


def architecture(cfg: ModelConfig) -> str:
  """The ``transformers`` class an export of ``cfg`` loads as."""
  return {'classify': 'RoFormerForSequenceClassification', 'mlm': 'RoFormerForMaskedLM',
          'clm': 'RoFormerForCausalLM'}[cfg.task]


def check_exportable(cfg: ModelConfig) -> None:
  """ValueError naming every field HF RoFormer (``architecture(cfg)``) cannot express."""
  rope_cfg = cfg.rope
  problems = [
      f'{name}={value!r} (HF: {want!r})' for name, value, want in (
          ('model.position', cfg.position, Rotary.name),
          ('model.attention', cfg.attention, 'softmax'),
          ('model.norm', cfg.norm, 'post'), ('model.pooling', cfg.pooling, 'cls'),
          ('model.dual_encoder', cfg.dual_encoder, False),
          ('rope.base', rope_cfg.base, HF_ROPE_BASE), ('rope.scaling', rope_cfg.scaling, 'none'),
          ('rope.xpos', rope_cfg.xpos, False),
          ('rope.rotary_dim', rope_cfg.rotary_dim or cfg.head_dim, cfg.head_dim),
          ('rope.p', rope_cfg.p, 1.0),
          # RoFormer rotates in every layer; transformers has no per-layer switch
          ('model.nope_layers', cfg.nope_layers, ()), ('model.nope_interval', cfg.nope_interval, 0))
      if value != want]
  if problems:
    raise ValueError('Hugging Face RoFormer cannot express this model: '
                     + '; '.join(problems) + '. Only a post-LN softmax encoder with full '
                     'rotary positions in every layer (base 10000, every frequency, no scaling), '
                     'CLS pooling and one input exports; other schemes stay in this codebase.')


def export_state_dict(params: Mapping[Any, Any], cfg: ModelConfig,
                      num_positions: int) -> dict[str, np.ndarray]:
  """This model's params -> ``architecture(cfg)``'s tensors (torch names, layouts)."""
  check_exportable(cfg)
  params = jax.tree.map(np.asarray, dict(params))
  if cfg.rope.layout != HF_LAYOUT:  # back to HF's interleaved pairs
    permute_layout(params, cfg.replace(rope=dataclasses.replace(cfg.rope, layout=HF_LAYOUT)),
                   src=cfg.rope.layout)
  sd = {}

  def linear(name: str, node, in_axes: int = 1):
    """kernel [*in, *out] and bias [*out] -> torch Linear (weight [out, in], bias [out])."""
    kernel = node['kernel']
    sd[f'{name}.weight'] = kernel.reshape(int(np.prod(kernel.shape[:in_axes])), -1).T
    sd[f'{name}.bias'] = node['bias'].reshape(-1)

  def layer_norm(name: str, node):
    sd[f'{name}.weight'], sd[f'{name}.bias'] = node['scale'], node['bias']

  e, p = params['embeddings'], 'roformer.'
  sd[f'{p}embeddings.word_embeddings.weight'] = e['word_embeddings']['embedding']
  types = e.get('token_type_embeddings') or {'embedding': np.zeros((1, cfg.embedding_size))}
  sd[f'{p}embeddings.token_type_embeddings.weight'] = types['embedding']
  layer_norm(f'{p}embeddings.LayerNorm', e['layer_norm'])
  if params.get('embeddings_project') is not None:
    linear(f'{p}embeddings_project', params['embeddings_project'])
  sd[f'{p}encoder.embed_positions.weight'] = sinusoidal_table(num_positions, cfg.head_dim)
  for i, layer in params['layers'].items():
    hf = f'{p}encoder.layer.{i}'
    for name in ('query', 'key', 'value'):
      linear(f'{hf}.attention.self.{name}', layer['attention'][name])
    linear(f'{hf}.attention.output.dense', layer['attention']['output'], in_axes=2)
    layer_norm(f'{hf}.attention.output.LayerNorm', layer['attention_norm'])
    linear(f'{hf}.intermediate.dense', layer['intermediate'])
    linear(f'{hf}.output.dense', layer['output'])
    layer_norm(f'{hf}.output.LayerNorm', layer['output_norm'])
  if cfg.language_model:  # RoFormerLMPredictionHead; the decoder is tied to the embeddings
    linear('cls.predictions.transform.dense', params['head']['dense'])
    layer_norm('cls.predictions.transform.LayerNorm', params['head']['layer_norm'])
    sd['cls.predictions.bias'] = sd['cls.predictions.decoder.bias'] = params['head']['bias']
    sd['cls.predictions.decoder.weight'] = sd[f'{p}embeddings.word_embeddings.weight']
  else:
    linear('classifier.dense', params['head']['dense'])
    linear('classifier.out_proj', params['head']['out_proj'])
  return {k: np.ascontiguousarray(v, np.float32) for k, v in sd.items()}


def export_config(cfg: ModelConfig, class_names: tuple[str, ...], num_positions: int,
                  pad_id: int) -> dict[str, Any]:
  """The config.json of ``export_state_dict``'s model."""
  labels = {} if cfg.language_model else {
      'id2label': dict(enumerate(class_names)),
      'label2id': {name: i for i, name in enumerate(class_names)}}
  return {
      'architectures': [architecture(cfg)], 'model_type': 'roformer', 'is_decoder': cfg.causal,
      'tie_word_embeddings': True, **labels,
      'vocab_size': cfg.vocab_size, 'embedding_size': cfg.embedding_size,
      'hidden_size': cfg.hidden_size, 'num_hidden_layers': cfg.num_layers,
      'num_attention_heads': cfg.num_heads, 'intermediate_size': cfg.mlp_dim,
      'hidden_act': 'gelu', 'hidden_dropout_prob': cfg.dropout_rate,
      'attention_probs_dropout_prob': cfg.attention_dropout_rate,
      'max_position_embeddings': num_positions, 'type_vocab_size': max(cfg.type_vocab_size, 1),
      'layer_norm_eps': cfg.layer_norm_eps, 'initializer_range': cfg.init_std,
      'rotary_value': cfg.rope.rotary_value, 'pad_token_id': pad_id}


def save_pretrained(out: str, params: Mapping[Any, Any], cfg: ModelConfig, *,
                    class_names: tuple[str, ...], num_positions: int,
                    tokenizer: tokenizers.Tokenizer, max_length: int) -> bool:
  """Writes ``EXPORTED_FILES`` to the local folder ``out``; whether it wrote the tokenizer's two
  (byte and SentencePiece tokenizers have no ``transformers`` counterpart)."""
  os.makedirs(out, exist_ok=True)
  safetensors.numpy.save_file(export_state_dict(params, cfg, num_positions),
                              os.path.join(out, WEIGHTS_NAME), metadata={'format': 'pt'})
  storage.write_json(os.path.join(out, CONFIG_NAME), export_config(
      cfg, class_names, num_positions, tokenizer.specials.pad))
  if not isinstance(tokenizer, tokenizers.HuggingFaceTokenizer):
    return False
  storage.write_atomically(os.path.join(out, tokenizers.HF_TOKENIZER_FILE), tokenizer.serialized)
  special = {f'{role}_token': tokenizer.token(i)
             for role, i in dataclasses.asdict(tokenizer.specials).items() if i is not None}
  storage.write_json(os.path.join(out, tokenizers.HF_TOKENIZER_CONFIG), {
      # truncation=True then cuts where training (and predict.py) did
      'tokenizer_class': 'PreTrainedTokenizerFast', 'model_max_length': max_length, **special})
  return True
