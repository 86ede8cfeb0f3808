"""Converts a local Hugging Face RoFormer checkpoint into this codebase's parameters.

  python scripts/convert_hf.py --hf_dir=/path/to/roformer --out=/tmp/roformer_jax \
      [--layout=half] [--num_classes=N] [--type_vocab_size=0] [--seed=0]

``--hf_dir`` is a ``save_pretrained`` directory (config.json + model.safetensors,
pytorch_model.bin or flax_model.msgpack) of ``RoFormerModel`` or
``RoFormerForSequenceClassification``; nothing is downloaded. Writes OUT/params,
OUT/hf_conversion.json and OUT/tokenizer.json (``interop/converted.py``) and prints the
``--config.*`` overrides that make ``configs/default.py`` describe this model, so that
fine-tuning is one more command:

  python train.py --config=configs/default.py --workdir=runs/finetune \
      --config.train.init_from=/tmp/roformer_jax <the printed overrides> \
      --config.data.name=files --config.data.train_files=train.csv
Load it back with ``interop.converted.load_converted(OUT)`` (``.model()`` builds the Classifier). A
checkpoint without a classification head gets a fresh head initialised from ``--seed``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top

import storage  # pylint: disable=g-import-not-at-top
from data import tokenizers  # pylint: disable=g-import-not-at-top
from experiments import cli  # pylint: disable=g-import-not-at-top
from interop import converted, hf  # pylint: disable=g-import-not-at-top
from training import outputs  # pylint: disable=g-import-not-at-top
from training.config import RunConfig  # pylint: disable=g-import-not-at-top


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--hf_dir', required=True, help='HF RoFormer checkpoint directory.')
  parser.add_argument('--out', required=True, help='Output directory.')
  parser.add_argument('--layout', default=hf.HF_LAYOUT, choices=('interleaved', 'half'),
                      help='Rotary layout to run in (half: projections permuted, same outputs).')
  parser.add_argument('--num_classes', type=int, default=None,
                      help="Classes (default: the checkpoint head's, else the config's labels).")
  parser.add_argument('--type_vocab_size', type=int, default=None,
                      help='0: fold token type 0 into the word embeddings (no token types).')
  parser.add_argument('--seed', type=int, default=0, help='Seed of a fresh classification head.')
  return parser.parse_args(argv)


def convert(args: argparse.Namespace) -> hf.HFRoFormer:
  if storage.is_file(args.out):
    raise ValueError(f'--out: {args.out} is a file; name the folder to write the conversion to.')
  written = (converted.CONVERTED_METADATA, tokenizers.HF_TOKENIZER_FILE)
  outputs.check([os.path.join(args.out, name) for name in written], '--out', folder=args.hf_dir)
  changes = {} if args.type_vocab_size is None else {'type_vocab_size': args.type_vocab_size}
  # The fields HF RoFormer does not define (e.g. model.attention_impl) take their defaults.
  base = RunConfig().model_config()
  result = hf.load_hf_roformer(args.hf_dir, base, num_classes=args.num_classes,
                               layout=args.layout, key=jax.random.key(args.seed), **changes)
  converted.save_converted(result, args.out, source=os.path.abspath(args.hf_dir))
  return result


def copy_tokenizer(hf_dir: str, out: str) -> bool:
  """Writes the checkpoint's tokenizer to OUT/tokenizer.json; False if it has none."""
  try:
    hf.copy_tokenizer(hf_dir, os.path.join(out, tokenizers.HF_TOKENIZER_FILE))
  except FileNotFoundError:
    return False
  return True


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  result = convert(args)
  cfg = result.cfg
  print(f'Converted {args.hf_dir} -> {os.path.abspath(args.out)}')
  print(f'vocab_size={cfg.vocab_size} num_classes={cfg.num_classes} '
        f'head={"from checkpoint" if result.has_head else "freshly initialised"}')
  if result.unused_keys:
    print(f'unused checkpoint tensors: {", ".join(result.unused_keys)}')
  overrides = {name: value for name, value in result.overrides.items()
               if value is not None}  # None fields are defaults
  if copy_tokenizer(args.hf_dir, args.out):
    overrides['data.tokenizer'] = 'huggingface'  # OUT/tokenizer.json, found through init_from
  else:
    print(f'No tokenizer.json or vocab.txt in {args.hf_dir}: give data.tokenizer_path.')
  print('config overrides:')
  print(' '.join(f'--config.{name}={value}' for name, value in overrides.items()))


if __name__ == '__main__':
  try:
    main()
  except cli.USER_ERRORS as e:
    cli.fail(e)
