"""Exports a trained workdir as a Hugging Face RoFormer checkpoint that ``transformers`` loads.

  python scripts/export_hf.py --workdir=runs/finetune --out=runs/finetune_hf [--checkpoint=best]

Writes OUT/config.json and OUT/model.safetensors for
``transformers.RoFormerForSequenceClassification.from_pretrained(OUT)`` (PyTorch), with the
run's class names as ``id2label``, or for a pre-trained language model (``train.task``)
``RoFormerForMaskedLM`` (mlm) or ``RoFormerForCausalLM`` (clm); with
``data.tokenizer=huggingface`` also OUT/tokenizer.json and tokenizer_config.json, so
``AutoTokenizer.from_pretrained(OUT)`` builds the same inputs (``interop/export.py``).
The parameters are one member's (the first of the learning rate the run chose), as predict.py
uses. A model that HF RoFormer cannot express (another position scheme, linear attention,
pre-LN, RoPE scaling, mean pooling, two towers) is refused, naming the fields; the half rotary
layout is permuted back to HF's interleaved one. Byte and SentencePiece tokenizers have no
``transformers`` counterpart: their ids must be built as data/tokenizers.py does.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from data import datasets  # pylint: disable=g-import-not-at-top
import storage  # pylint: disable=g-import-not-at-top
from experiments import cli  # pylint: disable=g-import-not-at-top
# A name of its own: export() is this script's.
from interop import export as hf_export  # pylint: disable=g-import-not-at-top
from training import outputs  # pylint: disable=g-import-not-at-top
from training import prediction  # pylint: disable=g-import-not-at-top
from training import validation  # pylint: disable=g-import-not-at-top


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--workdir', required=True, help='The train.py workdir to export.')
  parser.add_argument('--out', required=True, help='Output directory.')
  parser.add_argument('--checkpoint', default='best', help="'best', 'latest' or a step.")
  return parser.parse_args(argv)


def export(workdir: str, out: str, checkpoint: str = 'best') -> str:
  """Writes the checkpoint directory; returns what it holds, in words."""
  workdir = validation.check_workdir(workdir)
  if storage.is_file(out):
    raise ValueError(f'--out: {out} is a file; name the folder to write the checkpoint into.')
  outputs.check([os.path.join(out, name) for name in hf_export.EXPORTED_FILES], '--out',
                workdir=workdir)
  config, info, cfg = prediction.describe(workdir)
  hf_export.check_exportable(cfg)  # before anything is read
  tokenizer = datasets.load_tokenizer(config.data, workdir)
  step, params = prediction.load_params(workdir, checkpoint, config.train.keep_checkpoints)
  if hf_export.save_pretrained(out, params, cfg, class_names=info.class_names,
                               num_positions=max(cfg.max_length, config.data.max_length),
                               tokenizer=tokenizer, max_length=config.data.max_length):
    return f'step {step}; tokenizer.json'
  return f'step {step}; no tokenizer ({config.data.tokenizer} has no transformers counterpart)'


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  held = export(args.workdir, args.out, args.checkpoint)
  print(f'Exported {args.workdir} ({held}) -> {os.path.abspath(args.out)}: '
        f'transformers.{hf_export.architecture(prediction.describe(args.workdir)[2])}'
        '.from_pretrained(OUT)')


if __name__ == '__main__':
  try:
    main()
  except cli.USER_ERRORS as e:
    cli.fail(e)
