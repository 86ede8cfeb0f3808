"""RoFormer-style encoders whose position scheme is one config field: classifiers, or masked or
causal language models. ``graphdef, params = models.init(models.ModelConfig.of(...), key)``; then
``nnx.merge(graphdef, params)(inputs_BxL, positions_BxL, mask_BxL, rngs=nnx.Rngs(dropout=key))``.
"""

from models.config import ATTENTION_KINDS, PRESETS, SIZED_FIELDS, TASKS, ModelConfig
from models.encoder import Classifier, count_params, init
from models.positions import SCHEMES, LengthError, has_max_length, reads_positions, unread_fields

__all__ = ['ATTENTION_KINDS', 'PRESETS', 'SCHEMES', 'SIZED_FIELDS', 'TASKS', 'Classifier',
           'LengthError', 'ModelConfig', 'count_params', 'has_max_length', 'init',
           'reads_positions', 'unread_fields']
