"""Model FLOPs of the project's train step, counted as MaxText counts them.

MaxText's ``calculate_tflops_training_per_device`` (``src/maxtext/utils/maxtext_utils.py``)
takes a training step to cost 3 x the forward FLOPs (the backward pass twice the forward) of

* the weight matmuls: 2 FLOPs per multiply-add, for the QKV and output projections, the
  feed-forward (one activation: two matmuls) and the unembedding, and
* attention: QK^T and PV, 4 B T S H D, halved for a causal mask;

the embedding lookup is a gather and counts nothing, nor does elementwise work. ``train_step``
applies that count to this encoder; what differs from a decoder is said there.
"""

from __future__ import annotations

import models


def train_step(cfg: models.ModelConfig, batch_size: int, length: int) -> dict[str, float]:
  """FLOPs of one train step of the classifier on ``batch_size`` x ``length`` tokens: 'weights'
  (3 x the forward weight matmuls), 'attention' (3 x 4 B T S H D) and their 'total'.

  As MaxText, but for a bidirectional encoder: no causal halving of attention; no unembedding,
  the head is dense E -> E and E -> C on the B pooled vectors. With CLS pooling the last layer
  computes its first position only (``models.Classifier``): keys and values over all L
  positions, queries, output projection, attention and feed-forward for T = 1."""
  if (cfg.task != 'classify' or cfg.dual_encoder or cfg.attention != 'softmax'
      or cfg.embedding_size != cfg.hidden_size):
    raise ValueError('model_flops.train_step counts a single-input softmax classifier with '
                     f'embedding_size = hidden_size only; got task={cfg.task!r}, '
                     f'dual_encoder={cfg.dual_encoder}, attention={cfg.attention!r}.')
  e, f, hd, b = cfg.hidden_size, cfg.mlp_dim, cfg.num_heads * cfg.head_dim, batch_size
  weights = attention = 0.0
  last_queries = 1 if cfg.pooling == 'cls' else length
  for layer in range(cfg.num_layers):
    t, s = (last_queries if layer == cfg.num_layers - 1 else length), length
    weights += 2 * b * (t * e * hd * 2 + s * e * hd * 2 + t * 2 * e * f)  # q, out; k, v; FFN
    attention += 4 * b * t * s * hd
  weights += 2 * b * (e * e + e * cfg.num_classes)
  return {'weights': 3 * weights, 'attention': 3 * attention,
          'total': 3 * (weights + attention)}
