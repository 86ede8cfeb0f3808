"""Text classification with a chosen scheme, size and dataset, selected by a config argument.

  python train.py --config=configs/classify.py:pos=rotary,size=small,data=imdb_reviews,len=1024 \
      --workdir=/tmp/imdb_rotary

Arguments (all optional, comma-separated key=value):
  pos   model.position (none, sinusoidal, learned, shaw, t5, alibi, rotary)
  attn  model.attention (softmax, linear)
  size  model.size preset (tiny, small, base)
  data  data.name (position_probes/order, listops, fortunes, imdb_reviews, glue/sst2, ...)
  len   data.max_length
Everything else is configs/default.py, overridable with --config.a.b=... as usual.
"""

from configs import default

_KEYS = {'pos': ('model', 'position', str), 'attn': ('model', 'attention', str),
         'size': ('model', 'size', str), 'data': ('data', 'name', str),
         'len': ('data', 'max_length', int)}


def parse_arg(arg: str | None) -> dict[str, str]:
  """'pos=rotary,size=small' -> {'pos': 'rotary', 'size': 'small'}, checking the keys."""
  out = {}
  for item in filter(None, (arg or '').split(',')):
    key, sep, value = item.partition('=')
    if not sep or key not in _KEYS:
      raise ValueError(f'Bad config argument {item!r}: use key=value with keys '
                       f'{", ".join(_KEYS)}, e.g. configs/classify.py:pos=rotary,size=small.')
    out[key] = value
  return out


def get_config(arg: str | None = None):
  c = default.get_config()
  for key, value in parse_arg(arg).items():
    group, field, cast = _KEYS[key]
    c[group][field] = cast(value)
  return c
