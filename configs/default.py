"""Default config: a tiny RoFormer classifier on the embedded position probes.

Every field is commented here, and declared nowhere else: the model's frozen config is built
from the ``model`` group in one line, and the ``rope`` group is ``rope.RopeConfig`` (whose
docstring explains each option). Size fields set to ``placeholder(int)`` default to ``None`` and
take their value from the model-size preset (``model.size``).

Run:
  python train.py --config=configs/default.py --workdir=/tmp/run \
      --config.model.position=alibi --config.train.num_steps=500
"""

import dataclasses

import ml_collections
from ml_collections import config_dict

import rope


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.model = _model()
  # Rotary options (model.position == 'rotary'): the fields of rope.RopeConfig, with its
  # defaults (the paper's): base, layout, rotary_dim, scaling, scaling_factor,
  # original_max_length, yarn_beta_fast, yarn_beta_slow, yarn_ramp, llama3_low_freq_factor,
  # llama3_high_freq_factor, xpos, xpos_scale_base, rotary_value.
  c.rope = ml_collections.ConfigDict(dataclasses.asdict(rope.RopeConfig()))
  c.rope.rotary_dim = config_dict.placeholder(int)  # None: rotate every feature of a head.
  c.optim = _optim()
  c.data = _data()
  c.train = _train()
  c.mesh = _mesh()
  return c


def _model() -> ml_collections.ConfigDict:
  m = ml_collections.ConfigDict()
  m.size = 'tiny'  # Preset: 'tiny' (tests), 'small', 'base' (RoFormer-base).
  # Position scheme: none | sinusoidal | learned | shaw | t5 | alibi | rotary.
  m.position = 'rotary'
  m.attention = 'softmax'  # Attention kind: softmax | linear (paper eq. 19).
  # Softmax attention: 'explicit' (written out), 'xla' or 'cudnn' (jax.nn.dot_product_attention;
  # cudnn: fused flash attention on NVIDIA GPUs), 'chunked' (blocks with an online softmax, memory
  # linear in the length: long inputs on CPU/TPU), 'splash' / 'pallas_flash' (Pallas TPU kernels;
  # splash: no bias schemes; pallas_flash: also alibi/t5/shaw as a dense bias; interpret mode, slow,
  # off TPU), 'auto' (explicit on CPU, xla elsewhere).
  m.attention_impl = 'auto'
  m.attention_chunk_size = 512  # Queries and keys per block with attention_impl='chunked'.
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
  # Sentence pairs encoded one text at a time by the shared encoder, the head reading
  # [u, v, u*v, u-v] of their pooled vectors (LRA Retrieval's two towers); False: one joint input.
  m.dual_encoder = False
  m.type_vocab_size = 0  # Token-type embeddings (2 in Hugging Face RoFormer checkpoints; 0 = none).
  m.max_length = 512  # Positions the `learned` scheme has embeddings for; longer inputs raise.
  m.dtype = 'float32'  # Compute dtype: 'float32' or 'bfloat16' (parameters stay float32).
  m.remat = False  # Rematerialise each layer (jax.checkpoint) to save memory.
  m.shaw_max_distance = 16  # Shaw et al. (2018): relative distances clipped at +-k.
  m.shaw_values = False  # Shaw: also add relative representations to values.
  m.t5_num_buckets = 32  # T5 bias: number of buckets (bidirectional: half per direction).
  # T5 bias: distance beyond which all share the last bucket: the training length (data.max_length)
  # so that every bucket is trained; the T5 paper's value is 128.
  m.t5_max_distance = 64
  m.linear_feature_map = 'elu+1'  # Linear attention feature map phi: 'elu+1' or 'relu'.

  return m


def _optim() -> ml_collections.ConfigDict:
  o = ml_collections.ConfigDict()
  o.learning_rate = 1e-3  # Peak learning rate.
  # Peak learning rates trained together in one vmapped run, one member per (rate, seed), e.g.
  # '3e-4,1e-3,3e-3' (each member its own rate, injected into its optimizer state); '' trains
  # optim.learning_rate alone.
  o.learning_rates = ''
  # Fine-tuning (train.init_from): layer i of L learns at layer_decay^(L - i) x the rate, the
  # embeddings at layer_decay^(L + 1), the head at 1 (1.0: off; ELECTRA/BEiT use 0.65-0.9).
  o.layer_decay = 1.0
  o.freeze_encoder = False  # Train the classification head only (a linear probe of the encoder).
  o.position_lr_multiplier = 1.0  # The position scheme's own parameters learn at this x the rate.
  o.warmup_steps = 50  # Linear warmup steps.
  o.schedule = 'cosine'  # Decay after warmup: 'cosine', 'linear', 'constant' or 'rsqrt' (sqrt(warmup / step), LRA).
  o.end_lr_factor = 0.0  # Final learning rate as a fraction of the peak.
  o.weight_decay = 0.01  # AdamW decoupled weight decay (not on biases, LayerNorm or embeddings).
  o.b1 = 0.9  # Adam beta1.
  o.b2 = 0.999  # Adam beta2.
  o.eps = 1e-8  # Adam epsilon.
  o.grad_clip_norm = 1.0  # Global-norm gradient clipping (0 = off).
  o.grad_accum_steps = 1  # Gradient accumulation (optax.MultiSteps); effective batch = batch_size * this.
  return o


def _data() -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  # Dataset: position_probes/<task> | listops | fortunes | imdb_reviews | glue/sst2 |
  # ag_news_subset | yelp_polarity_reviews | files.
  d.name = 'position_probes/order'
  d.data_dir = config_dict.placeholder(str)  # TFDS data_dir (prepared data; embedded builders are generated here).
  d.max_length = 64  # Tokens per example, including the [CLS] token; longer texts are truncated.
  # 'byte' (UTF-8 bytes, no vocabulary), 'sentencepiece', 'wordpiece' (BERT's) or 'bpe'
  # (byte-level, GPT-2's), trained offline on the training split and cached in the workdir, or
  # 'huggingface' (data.tokenizer_path).
  d.tokenizer = 'byte'
  d.sp_vocab_size = 8000  # Vocabulary size of the tokenizers trained here (sentencepiece, wordpiece, bpe).
  # data.tokenizer='huggingface': a tokenizer.json, a WordPiece vocab.txt, or a Hugging Face
  # checkpoint directory holding one (copied into the workdir on first use).
  d.tokenizer_path = ''

  d.train_files = ''  # data.name=files: comma-separated CSV/TSV/JSONL paths for training.
  d.validation_files = ''  # data.name=files: validation paths (empty = hold out 10% of train).
  d.test_files = ''  # data.name=files: test paths (empty = use validation).
  d.text_column = 'text'  # data.name=files: column/key with the text.
  d.label_column = 'label'  # data.name=files: column/key with the label (names or integers).
  # data.name=files: column/key of a second text (sentence pairs; '' = one text per example).
  # Pairs are joined as [CLS] a [SEP] b [SEP] with token types 0/1 (needs model.type_vocab_size
  # >= 2), or encoded one by one with model.dual_encoder (LRA Retrieval's two towers).
  d.text_b_column = ''
  # data.name=files: comma-separated names of the columns of CSV/TSV files without a header row
  # (e.g. LRA Retrieval's 'label,id1,id2,text1,text2'); '' = the first row names them.
  d.columns = ''
  # data.name=files: how CSV/TSV fields are quoted. 'auto': .csv files by CSV rules (a quoted
  # field may hold the delimiter, newlines and "" for a quote), .tsv/.tab files not at all, as
  # GLUE's are written (one row a line, a field at every tab, a quote is text); 'csv' or 'none':
  # that rule for every CSV/TSV file.
  d.quoting = 'auto'
  # data.name=files: the labels are real numbers (STS-B-like): a one-output head trained with
  # squared error, scored by Pearson's (ranking checkpoints) and Spearman's correlation.
  d.regression = False
  # Language models (train.task mlm/clm; data/lm.py): documents packed into rows of max_length.
  d.mask_rate = 0.15  # MLM: fraction of tokens predicted (80% [MASK], 10% random, 10% kept).
  d.whole_word_masking = False  # MLM: mask all the tokens of a word together.
  # Evaluation lengths in tokens beyond data.max_length, comma-separated (test split as
  # 'test_<n>'): perplexity vs evaluation length.
  d.eval_lengths = ''
  d.eval_tokens = 65536  # Evaluate on the first this many tokens of each split (the same text at every length).
  d.seed = 0  # Data-order seed, shared by all model seeds so seeds differ only in init and dropout.
  d.prefetch = 2  # Batches prepared ahead, in as many threads.
  # The training split cut into this many contiguous shards, each filling an equal part of every
  # batch with its own shuffle (data/sources.py TrainShards): a process reads only the shards its
  # rows draw from. 1: one shuffle of the whole split, read by every process. On k hosts use a
  # multiple of k that divides the global batch; it is part of the data order, so keep it fixed
  # across runs you compare (the number of processes never changes the batches).
  d.num_shards = 1
  return d


def _train() -> ml_collections.ConfigDict:
  t = ml_collections.ConfigDict()
  # 'classify' (a classifier on data.name's labels), 'mlm' (BERT's masked language modelling) or
  # 'clm' (causal language modelling: next token, causal attention) on data.name's texts.
  t.task = 'classify'
  t.seed = 0  # Seed for parameter init and dropout (data order: data.seed).
  t.num_seeds = 1  # Train seeds seed, seed+1, ... together in one step (batches shared).
  # How the members (learning rate x seed) share the step: 'vmap' (all in one batched
  # computation), 'loop' (one after another inside the step, each at single-run speed) or 'auto'
  # (loop on CPU, where benchmarks/seeds_bench.py measures vmap slower; vmap elsewhere).
  t.members = 'auto'
  t.batch_size = 32  # Global batch size (split across hosts and data-parallel devices).
  # Instead of batch_size (set it to 0; exactly one of the two): examples per data-parallel
  # device, so the global batch is this x the devices and one command fits any slice.
  t.per_device_batch_size = 0
  t.num_steps = 300  # Optimizer steps.
  t.eval_every = 100  # Evaluate on the validation split every this many steps (and at the end).
  t.log_every = 20  # Write train metrics every this many steps.
  t.checkpoint_every = 100  # Save a checkpoint every this many steps (and at the end).
  t.keep_checkpoints = 2  # Most recent checkpoints kept (plus the best by validation accuracy).
  t.eval_batch_size = 64  # Global batch size for evaluation.
  t.eval_max_length = 0  # Evaluate the test splits up to this length at the end (0: all).
  t.skip_nonfinite = False  # On a NaN/Inf loss or gradient: False stops the run; True skips the update and counts it.
  t.compilation_cache_dir = '~/.cache/roformer_jax/xla'  # JAX persistent compilation cache ('' = off).
  # Start from another run's weights (a train.py workdir; training/init_from.py): every parameter
  # but the classification head ('' = a fresh start; resuming this run's own checkpoint wins).
  t.init_from = ''
  t.init_head = False  # With init_from: the head too (same task, e.g. a fine-tune at a longer length).
  # A jax.profiler trace of steps 'first:last' (e.g. '10:15') into workdir/profile ('' = none).
  t.profile_steps = ''
  # Also log to this Weights & Biases project ('' = off; needs `pip install wandb`; set
  # WANDB_MODE=offline to keep the run in workdir/wandb for `wandb sync`).
  t.wandb_project = ''
  return t


def _mesh() -> ml_collections.ConfigDict:
  # Device mesh (see training/partitioning.py); one axis may be -1 (fills the remaining devices).
  ms = ml_collections.ConfigDict()
  ms.data = -1  # Data-parallel axis (within a slice on multi-slice TPU).
  ms.fsdp = 1  # Fully sharded data-parallel axis (parameters and optimizer state sharded, batch split too).
  ms.tensor = 1  # Tensor-parallel axis (heads, MLP units and vocabulary sharded).
  ms.dcn_data = 1  # Multi-slice TPU: data-parallel factor across slices (total data = dcn_data * data).
  ms.dcn_fsdp = 1  # Multi-slice TPU: FSDP factor across slices.
  ms.dcn_tensor = 1  # Multi-slice TPU: tensor-parallel factor across slices.
  ms.rules = ''  # Overrides of the logical->mesh axis table, e.g. 'vocab=,embed=fsdp+tensor'.
  return ms
