"""A converted Hugging Face checkpoint (``scripts/convert_hf.py``'s output), and the checkpoints
``train.init_from`` reads: a Hugging Face directory or a conversion.

  OUT/params               orbax checkpoint of the pure params dict (nnx.to_pure_dict layout)
  OUT/hf_conversion.json   ModelConfig fields, config overrides, has_head, unused keys, source
  OUT/tokenizer.json       the checkpoint's tokenizer (its tokenizer.json or WordPiece vocab.txt)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

import rope
import storage
from interop import hf
from models.config import ModelConfig

CONVERTED_PARAMS = 'params'
CONVERTED_METADATA = 'hf_conversion.json'


def save_converted(result: hf.HFRoFormer, directory: str, *, source: str = '') -> None:
  """Writes ``directory/params`` and ``hf_conversion.json``, overwriting a conversion there."""
  directory = storage.canonical(directory)
  storage.makedirs(directory)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.path.join(directory, CONVERTED_PARAMS), result.params, force=True)
  storage.write_json(os.path.join(directory, CONVERTED_METADATA), {
      'source': source, 'model_config': dataclasses.asdict(result.cfg),
      'overrides': result.overrides, 'has_head': result.has_head,
      'unused_keys': list(result.unused_keys)})


def load_converted(directory: str, **changes: Any) -> hf.HFRoFormer:
  """Reads a ``save_converted`` directory; ``changes``: ModelConfig fields that keep the shapes."""
  directory = storage.canonical(directory)
  metadata = storage.read_json(os.path.join(directory, CONVERTED_METADATA))
  fields = dict(metadata['model_config'], rope=rope.RopeConfig(**metadata['model_config']['rope']))
  cfg = ModelConfig(**fields).replace(**changes)
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), hf.abstract_params(cfg))
  with ocp.StandardCheckpointer() as checkpointer:
    params = checkpointer.restore(os.path.join(directory, CONVERTED_PARAMS), target)
  return hf.HFRoFormer(cfg=cfg, params=jax.tree.map(np.asarray, params),
                       overrides=metadata['overrides'], has_head=metadata['has_head'],
                       unused_keys=tuple(metadata['unused_keys']))


def is_converted(directory: str) -> bool:
  return storage.is_file(os.path.join(directory, CONVERTED_METADATA))


def checkpoint_fields(directory: str, layout: str) -> dict[str, Any]:
  """The dotted model and rope fields the parameters of a conversion or a Hugging Face checkpoint
  (read in rotary ``layout``) were made for."""
  fields = (storage.read_json(os.path.join(directory, CONVERTED_METADATA))['overrides']
            if is_converted(directory)
            else hf.dotted(*hf.hf_fields(hf.load_hf_config(directory), layout=layout)))
  return {**fields, **{f'model.{name}': value for name, value in hf.HF_EVERY_LAYER.items()}}


def load_checkpoint(directory: str, base: ModelConfig) -> hf.HFRoFormer:
  """A conversion, or a Hugging Face checkpoint converted for ``base`` (its layout included)."""
  if is_converted(directory):
    return load_converted(directory)
  return hf.load_hf_roformer(directory, base, layout=base.rope.layout)
