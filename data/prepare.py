r"""Prepares datasets ahead of training (useful before multi-host runs on a shared data_dir).

Embedded datasets are generated (probes) or read from local files (fortunes) into
``data_dir``. TFDS text datasets cannot be downloaded on a machine without internet: for those
this prints how to prepare them elsewhere, and whether they are already prepared here.

  python -m data.prepare --name=position_probes/order --data_dir=/data/tfds
  python -m data.prepare --name=position_probes/order,position_probes/nearest,fortunes
  python -m data.prepare --name=imdb_reviews --data_dir=/data/tfds
"""

from __future__ import annotations

from absl import app
from absl import flags
import tensorflow_datasets as tfds

import data
from data import datasets
from data import sources

_NAME = flags.DEFINE_list('name', None, f'Datasets (comma-separated) among {tuple(data.DATASETS)}.',
                          required=True)
_DATA_DIR = flags.DEFINE_string('data_dir', None, 'TFDS data_dir (default: TFDS default).')


def prepare_embedded(name: str, data_dir: str | None) -> None:
  """Generates an embedded dataset if needed and prints its splits and an example."""
  builder = datasets.embedded_builder(name, data_dir)
  sources.prepare(builder)
  print(f'{name}: prepared in {builder.data_dir}')
  for split, split_info in builder.info.splits.items():
    print(f'  {split}: {split_info.num_examples} examples')
  example = next(iter(tfds.as_numpy(builder.as_dataset(split='validation').take(1))))
  label = builder.info.features['label'].int2str(example['label'])
  texts = [example[k][:200] for k in ('text', 'text_a', 'text_b') if k in example]
  print(f'  example: {" | ".join(map(repr, texts))} -> {label}')


def explain_tfds(name: str, data_dir: str | None) -> None:
  """Prints whether a TFDS text dataset is prepared here and how to prepare it elsewhere."""
  builder = tfds.builder(name, data_dir=data_dir)
  state = 'prepared' if builder.is_prepared() else 'NOT prepared'
  print(f'{name}: {state} in {builder.data_dir}.\n'
        f'  To prepare it: on a machine with internet, `pip install tensorflow-datasets` and run\n'
        f'    tfds build {name} --data_dir=DIR\n'
        f'  then copy DIR/{name.split("/")[0]} into this machine\'s data_dir (--data_dir, '
        'config data.data_dir).')


def main(argv: list[str]) -> None:
  del argv
  for name in _NAME.value:
    entry = data.DATASETS.get(name)
    if entry is None:
      raise app.UsageError(f'Unknown dataset {name!r}; valid: {tuple(data.DATASETS)}')
    if entry.kind == 'embedded':
      prepare_embedded(name, _DATA_DIR.value)
    elif entry.kind == 'tfds':
      explain_tfds(name, _DATA_DIR.value)
    else:
      print('files: local CSV/TSV/JSONL files need no preparation (see data/files.py).')


if __name__ == '__main__':
  app.run(main)
