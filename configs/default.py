"""Default config: a tiny RoFormer classifier on the embedded position probes.

Every field is commented. Fields set to ``placeholder(type)`` default to ``None``
and take their value from the model-size preset (``model.size``) or the data.

Run:
  python train.py --config=configs/default.py --workdir=/tmp/run \
      --config.model.position=alibi --config.train.num_steps=500
"""

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()

  # ---------------------------------------------------------------- model
  c.model = m = ml_collections.ConfigDict()
  m.size = 'tiny'  # Preset: 'tiny' (tests), 'small', 'base' (RoFormer-base).
  # Position scheme: none | sinusoidal | learned | shaw | t5 | alibi | rotary.
  m.position = 'rotary'
  m.attention = 'softmax'  # Attention kind: softmax | linear (paper eq. 19).
  # Sizes; None takes the preset's value.
  m.num_layers = config_dict.placeholder(int)  # Encoder layers.
  m.hidden_size = config_dict.placeholder(int)  # Model width.
  m.num_heads = config_dict.placeholder(int)  # Attention heads.
  m.mlp_dim = config_dict.placeholder(int)  # Feed-forward width.
  m.embedding_size = config_dict.placeholder(int)  # Token-embedding width (projected to hidden_size if different).
  m.dropout_rate = 0.1  # Dropout on embeddings, attention output and FFN.
  m.attention_dropout_rate = 0.0  # Dropout on attention probabilities.
  m.norm = 'post'  # 'post' (BERT/RoFormer) or 'pre' LayerNorm.
  m.layer_norm_eps = 1e-12  # LayerNorm epsilon (1e-12 as in BERT/RoFormer).
  m.init_std = 0.02  # Std of the normal init of all weights (0.02 as in BERT/RoFormer).
  m.pooling = 'cls'  # Classification pooling: 'cls' (first token) or 'mean' (over real tokens).
  m.type_vocab_size = 0  # Token-type embeddings (2 in Hugging Face RoFormer checkpoints; 0 = none).
  m.max_length = config_dict.placeholder(int)  # Positions `learned` embeddings cover (None = data.max_length); longer raises.
  m.dtype = 'float32'  # Compute dtype: 'float32' or 'bfloat16' (parameters stay float32).
  m.remat = False  # Rematerialise each layer (jax.checkpoint) to save memory.
  m.fused_qkv = False  # One [embed, 3, heads, head_dim] matmul for Q, K, V (same parameters); slower on CPU, try it on GPU/TPU.
  m.shaw_max_distance = 16  # Shaw et al. (2018): relative distances clipped at +-k.
  m.shaw_values = False  # Shaw: also add relative representations to values.
  m.t5_num_buckets = 32  # T5 bias: number of buckets (bidirectional: half per direction).
  m.t5_max_distance = 128  # T5 bias: distance beyond which all share the last bucket.
  m.linear_feature_map = 'elu+1'  # Linear attention feature map phi: 'elu+1' or 'relu'.

  # ---------------------------------------------------------------- rope
  # Rotary options, used when model.position == 'rotary' (see rope/).
  c.rope = r = ml_collections.ConfigDict()
  r.base = 10000.0  # theta_i = base^(-2i/d).
  r.layout = 'interleaved'  # 'interleaved' pairs (2i, 2i+1) as in the paper; 'half' pairs (i, i+d/2) as in GPT-NeoX/LLaMA.
  r.rotary_dim = config_dict.placeholder(int)  # Rotate only the first rotary_dim features of each head (None = all).
  r.scaling = 'none'  # Frequency scaling: none | linear | ntk | yarn | llama3.
  r.scaling_factor = 1.0  # Context-extension factor s for the scaling variants.
  r.original_max_length = 512  # Training context length that the scaling variants extend (yarn, llama3, ntk).
  r.yarn_beta_fast = 32.0  # YaRN ramp: dims with more than beta_fast rotations are not interpolated.
  r.yarn_beta_slow = 1.0  # YaRN ramp: dims with fewer than beta_slow rotations are fully interpolated.
  r.llama3_low_freq_factor = 1.0  # Llama-3.1 scaling: wavelengths above original/low are divided by factor.
  r.llama3_high_freq_factor = 4.0  # Llama-3.1 scaling: wavelengths below original/high are kept.
  r.xpos = False  # xPos (Sun et al. 2022): exponential decay on queries (zeta^m) and keys (zeta^-m).
  r.xpos_scale_base = 512.0  # xPos length scale: q scaled by zeta_i^(m/scale_base), k by zeta_i^(-m/scale_base).
  r.rotary_value = False  # Also rotate values (Hugging Face RoFormer's rotary_value).

  # ---------------------------------------------------------------- optim
  c.optim = o = ml_collections.ConfigDict()
  o.learning_rate = 1e-3  # Peak learning rate.
  o.warmup_steps = 50  # Linear warmup steps.
  o.schedule = 'cosine'  # Decay after warmup: 'cosine', 'linear' or 'constant'.
  o.end_lr_factor = 0.0  # Final learning rate as a fraction of the peak.
  o.weight_decay = 0.01  # AdamW decoupled weight decay (not on biases, LayerNorm or embeddings).
  o.b1 = 0.9  # Adam beta1.
  o.b2 = 0.999  # Adam beta2.
  o.eps = 1e-8  # Adam epsilon.
  o.grad_clip_norm = 1.0  # Global-norm gradient clipping (0 = off).
  o.grad_accum_steps = 1  # Gradient accumulation (optax.MultiSteps); effective batch = batch_size * this.

  # ---------------------------------------------------------------- data
  c.data = d = ml_collections.ConfigDict()
  # Dataset: position_probes/<task> | listops | fortunes | imdb_reviews | glue/sst2 |
  # ag_news_subset | yelp_polarity_reviews | files.
  d.name = 'position_probes/order'
  d.data_dir = config_dict.placeholder(str)  # TFDS data_dir (prepared data; embedded builders are generated here).
  d.max_length = 64  # Tokens per example, including the [CLS] token; longer texts are truncated.
  d.tokenizer = 'byte'  # 'byte' (UTF-8 bytes, no vocabulary) or 'sentencepiece' (trained offline, cached in workdir).
  d.sp_vocab_size = 8000  # SentencePiece vocabulary size.
  d.train_files = ''  # data.name=files: comma-separated CSV/TSV/JSONL paths for training.
  d.validation_files = ''  # data.name=files: validation paths (empty = hold out 10% of train).
  d.test_files = ''  # data.name=files: test paths (empty = use validation).
  d.text_column = 'text'  # data.name=files: column/key with the text.
  d.label_column = 'label'  # data.name=files: column/key with the label (names or integers).
  d.seed = 0  # Data-order seed, shared by all model seeds so seeds differ only in init and dropout.
  d.prefetch = 2  # Batches prefetched by tf.data.

  # ---------------------------------------------------------------- train
  c.train = t = ml_collections.ConfigDict()
  t.seed = 0  # Seed for parameter init and dropout (data order: data.seed).
  t.num_seeds = 1  # Train seeds seed, seed+1, ... together in one vmapped step (batches shared).
  t.batch_size = 32  # Global batch size (split across hosts and data-parallel devices).
  t.num_steps = 300  # Optimizer steps.
  t.eval_every = 100  # Evaluate on the validation split every this many steps (and at the end).
  t.log_every = 20  # Write train metrics every this many steps.
  t.checkpoint_every = 100  # Save a checkpoint every this many steps (and at the end).
  t.keep_checkpoints = 2  # Most recent checkpoints kept (plus the best by validation accuracy).
  t.eval_batch_size = 64  # Global batch size for evaluation.
  t.skip_nonfinite = False  # On a NaN/Inf loss or gradient: False stops the run; True skips the update and counts it.
  t.compilation_cache_dir = '~/.cache/roformer_jax/xla'  # JAX persistent compilation cache ('' = off).

  # ---------------------------------------------------------------- mesh
  # Device mesh (see training/partitioning.py); one axis may be -1 (fills the remaining devices).
  c.mesh = ms = ml_collections.ConfigDict()
  ms.data = -1  # Data-parallel axis (within a slice on multi-slice TPU).
  ms.fsdp = 1  # Fully sharded data-parallel axis (parameters and optimizer state sharded, batch split too).
  ms.tensor = 1  # Tensor-parallel axis (heads, MLP units and vocabulary sharded).
  ms.dcn_data = 1  # Multi-slice TPU: data-parallel factor across slices (total data = dcn_data * data).
  ms.dcn_fsdp = 1  # Multi-slice TPU: FSDP factor across slices.
  ms.dcn_tensor = 1  # Multi-slice TPU: tensor-parallel factor across slices.
  ms.rules = ''  # Overrides of the logical->mesh axis table, e.g. 'vocab=,embed=fsdp+tensor'.

  return c
