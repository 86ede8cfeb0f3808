"""RoFormer-style encoder classifiers whose position scheme is one config field.

  cfg = models.ModelConfig.from_config(config, vocab_size=..., num_classes=...)
  graphdef, params = models.init(cfg, key)
  logits = nnx.merge(graphdef, params)(inputs_BxL, positions_BxL, rngs=nnx.Rngs(dropout=key))

Modules: ``config`` (ModelConfig, presets), ``positions`` (scheme registry), ``attention``,
``encoder`` (the model), ``sharding`` (logical axis names), ``hf`` (Hugging Face checkpoints).
"""

from models.config import PRESETS, ModelConfig, RopeConfig
from models.encoder import PAD_ID, Classifier, count_params, init
from models.positions import SCHEMES, LengthError

__all__ = ['PAD_ID', 'PRESETS', 'SCHEMES', 'Classifier', 'LengthError', 'ModelConfig',
           'RopeConfig', 'count_params', 'init']
