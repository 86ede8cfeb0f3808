"""Hugging Face interop: RoFormer checkpoints in (weights, config and tokenizer) and out.

Sits above ``models`` and ``data`` and below ``training`` (``train.init_from`` reads checkpoints).

  hf.py          a checkpoint directory's files (safetensors, torch .bin, Flax msgpack,
                 config.json, tokenizer) -> ModelConfig and params (``load_hf_roformer``)
  converted.py   ``scripts/convert_hf.py``'s output (``save_converted`` / ``load_converted``)
  export.py      params -> a checkpoint ``transformers`` loads (``scripts/export_hf.py``)
"""
