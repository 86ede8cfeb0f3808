"""Man pages: long real documents, classified by the kind of page, available offline.

The Linux man-pages project (Debian's ``manpages`` and ``manpages-dev``, ``apt-get install
manpages manpages-dev``) documents system calls (section 2), library functions (section 3) and
commands, devices, file formats and overviews (sections 1, 4, 5, 6, 7, 8). Each page is one
document; the task is its kind, three classes: ``system call``, ``library function``, ``other``.
The pages are the packages' own files (their dpkg file lists), so the data do not depend on what
else is installed. ``.so`` redirects are dropped, and the roff source becomes plain text
(``roff_to_text``): comments, the ``.TH`` title line (it holds the section number, i.e. the
label) and formatting requests go; section headings and text stay. Pages shorter than
``min_bytes`` and texts seen twice are dropped. The split is fixed by MD5 of the text (0:
``test``, 1: ``validation``, else ``train``). Related pages (``printf(3)`` and ``fprintf``'s
family share one page; ``open(2)`` and ``openat2(2)`` do not) can fall in different splits.

Long documents: the median page is over 4,000 bytes, so byte-level models see more of each page
at 1k, 2k and 4k tokens than at 512 (the ``SEE ALSO`` list, which names related pages with their
sections, is at the end).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import re
from typing import Iterable

import tensorflow_datasets as tfds

from data import builders

DPKG_INFO = '/var/lib/dpkg/info'
PACKAGES = ('manpages', 'manpages-dev')
_SECTION_CLASS = {'2': 0, '3': 1}  # section -> index in Manpages.CLASSES; else 2 ('other')

# Requests whose arguments are text in another font (kept, joined as roff joins them).
_FONT_REQUESTS = {'B', 'I', 'SM', 'SB', 'BR', 'BI', 'IB', 'RB', 'IR', 'RI'}
_ALTERNATING = {'BR', 'BI', 'IB', 'RB', 'IR', 'RI'}
_PARAGRAPH_REQUESTS = {'PP', 'P', 'LP', 'TP', 'HP', 'sp', 'br', 'RS', 'RE'}
_ESCAPES = [
    (r'\\".*', ''),  # comment to the end of the line
    (r'\\f(\[[^\]]*\]|\(..|.)', ''),  # font changes
    (r'\\s[-+]?\d', ''),  # size changes
    (r'\\\*?\((lq|rq|dq)', '"'), (r'\\\*?\[(lq|rq|dq)\]', '"'), (r'\\\(aq|\\\[aq\]', "'"),
    (r'\\\(em|\\\[em\]', '--'), (r'\\\(en|\\\[en\]', '-'), (r'\\\(bu|\\\[bu\]', '*'),
    (r'\\\(co|\\\[co\]', '(c)'), (r'\\\(mu|\\\[mu\]', 'x'), (r'\\\(ti|\\\[ti\]', '~'),
    (r'\\\(ha|\\\[ha\]', '^'), (r'\\\(rs|\\\[rs\]', '\\\\'), (r'\\\(.{2}|\\\[[^\]]*\]', ''),
    (r'\\\*\(..|\\\*\[[^\]]*\]|\\\*.', ''), (r'\\-', '-'), (r'\\[~ 0]', ' '),
    (r'\\[&:%c/,|^)]', ''), (r'\\e', '\\\\'),
]


@dataclasses.dataclass(eq=False)
class ManpagesConfig(tfds.core.BuilderConfig):
  packages: tuple[str, ...] = PACKAGES
  dpkg_info: str = DPKG_INFO
  min_bytes: int = 2000


def _arguments(text: str) -> list[str]:
  return [a[1:-1] if a.startswith('"') else a for a in re.findall(r'"[^"]*"?|\S+', text)]


def _unescape(line: str) -> str:
  for pattern, replacement in _ESCAPES:
    line = re.sub(pattern, replacement, line)
  return line


def _lines(source: str):
  """The source's lines, continuations joined, tbl tables as no-fill text (cells spaced)."""
  table = None  # None, 'format' (until the line ending in '.'), 'rows'
  for line in re.sub(r'(?<!\\)\\\n', '', source).splitlines():
    if line.startswith('.TS'):
      table = 'format'
      yield '.nf'
    elif line.startswith('.TE'):
      table = None
      yield '.fi'
    elif table == 'format':
      table = 'rows' if line.rstrip().endswith('.') else table
    elif table == 'rows':
      row = ' '.join(re.sub(r'T[{}]', '', line).split('\t')).strip()
      if row and not line.startswith('.'):
        yield row
    else:
      yield line


def _request(name: str, rest: str) -> tuple[str, str]:
  """(kind, text) of a request line: kind text, heading, break, nofill, fill or skip."""
  rest = rest.replace('\\ ', '\\~')  # an escaped space does not separate arguments
  if name in ('SH', 'SS'):
    return 'heading', ' '.join(_arguments(rest))
  if name in _FONT_REQUESTS:
    return 'text', ('' if name in _ALTERNATING else ' ').join(_arguments(rest))
  if name in ('IP', 'TQ'):
    return 'break', ' '.join(_arguments(rest)[:1])
  if name in ('nf', 'EX'):
    return 'nofill', ''
  if name in ('fi', 'EE'):
    return 'fill', ''
  if name in _PARAGRAPH_REQUESTS:
    return 'break', ''
  return 'skip', ''


def roff_to_text(source: str) -> str | None:
  """A man page's roff source as plain text (paragraphs filled, as man shows them), or None for
  a ``.so`` redirect."""
  blocks, paragraph, fill = [], [], True

  def flush():
    if paragraph:
      blocks.append((' ' if fill else '\n').join(paragraph))
      paragraph.clear()

  for line in _lines(source):
    if line.startswith('.so '):
      return None
    kind, text = ('text', line) if line.strip() else ('break', '')  # a blank line: a paragraph
    if line[:1] in ('.', "'"):
      name, _, rest = line[1:].strip().partition(' ')
      kind, text = _request(name, rest)
    elif line.startswith(('\\"', '\\}')):
      continue
    text = _unescape(text).strip() if fill else _unescape(text).rstrip()
    if kind in ('heading', 'break', 'nofill', 'fill'):
      flush()
      fill = {'nofill': False, 'fill': True}.get(kind, fill)
    if text and kind != 'skip':
      (blocks if kind == 'heading' else paragraph).append(text)
  flush()
  return '\n\n'.join(blocks).strip()


def page_files(config: ManpagesConfig) -> list[tuple[str, str]]:
  """(path, section) of every English man page the packages install, sorted."""
  pages = []
  for package in config.packages:
    listing = os.path.join(config.dpkg_info, f'{package}.list')
    if not os.path.isfile(listing):
      raise FileNotFoundError(
          f'The {package!r} package is not installed ({listing} is missing). Install the man '
          f'pages with `apt-get install {" ".join(config.packages)}` (Debian/Ubuntu), or use '
          'another data.name.')
    with open(listing) as f:
      for path in f.read().split('\n'):
        match = re.fullmatch(r'.*/man/man(\d)/[^/]+\.\d\w*\.gz', path)
        if match and os.path.isfile(path) and not os.path.islink(path):  # links: same page
          pages.append((path, match.group(1)))
  if not pages:
    raise FileNotFoundError(
        f'The packages {", ".join(config.packages)} are installed but none of their man pages '
        'is on disk (a dpkg path-exclude for /usr/share/man, as slim Docker images set, drops '
        'them). Remove that exclusion (/etc/dpkg/dpkg.cfg.d/) and reinstall the packages, or '
        'use another data.name.')
  return sorted(pages)


def load_examples(config: ManpagesConfig) -> dict[str, list[tuple[str, int]]]:
  examples: dict[str, list[tuple[str, int]]] = {'train': [], 'validation': [], 'test': []}
  seen = set()
  for path, section in page_files(config):
    with gzip.open(path, 'rb') as f:
      text = roff_to_text(f.read().decode('utf-8', errors='replace'))
    if text is None or len(text.encode('utf-8')) < config.min_bytes or text in seen:
      continue
    seen.add(text)
    examples[builders.split_of(text)].append((text, _SECTION_CLASS.get(section, 2)))
  return examples


class Manpages(builders.EmbeddedBuilder):
  """Is a Linux man page about a system call, a library function, or something else."""

  VERSION = tfds.core.Version('1.1.0')
  RELEASE_NOTES = {
      '1.0.0': 'Debian manpages and manpages-dev (6.03), split by MD5 of the text.',
      '1.1.0': 'Continuation lines joined, tables as text, blank lines as paragraph breaks.'}
  CLASSES = ('system call', 'library function', 'other')
  BUILDER_CONFIGS = [ManpagesConfig(name='kinds', description='Three kinds: ' +
                                    ', '.join(CLASSES))]
  HOMEPAGE = 'https://www.kernel.org/doc/man-pages/'
  CITATION = ('@misc{manpages, title = {The Linux man-pages project}, '
              'howpublished = {Debian packages manpages and manpages-dev}}')

  def rows(self) -> dict[str, Iterable[tuple]]:
    return load_examples(self.builder_config)


_SECTION = re.compile(r'^([A-Z][A-Z /-]*)\n\n(.*?)(?=\n\n[A-Z][A-Z /-]*\n\n|\Z)', re.M | re.S)


def summary_and_description(text: str) -> tuple[str, str] | None:
  """A page's one-line summary (its NAME line after the dash) and DESCRIPTION, or None."""
  sections = {m.group(1): m.group(2).strip() for m in _SECTION.finditer(text)}
  name, description = sections.get('NAME', ''), sections.get('DESCRIPTION', '')
  summary = re.split(r'\s+-+\s+', name, maxsplit=1)[-1].strip() if ' - ' in name else ''
  return (summary, description) if summary and description else None


def load_pairs(config: ManpagesConfig) -> dict[str, list[tuple[str, str, int]]]:
  """Split -> (summary, description, label): a page's summary with its own description (1) and
  with the one of the page half a split away in MD5 order (0)."""
  examples = {}
  for split, pages in load_examples(config).items():
    parts = sorted((p for p in (summary_and_description(t) for t, _ in pages) if p),
                   key=lambda p: hashlib.md5('\n'.join(p).encode('utf-8')).hexdigest())
    shift = max(len(parts) // 2, 1)
    examples[split] = [(a, b, 1) for a, b in parts] + [
        (a, parts[(i + shift) % len(parts)][1], 0) for i, (a, _) in enumerate(parts)
        if len(parts) > 1]
  return examples


class ManpagePairs(builders.EmbeddedBuilder):
  """Does this one-line summary belong to this man page's DESCRIPTION? A real-text sentence
  pair task (``data.name=manpages/pairs``): two texts, two balanced classes."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Summaries and descriptions of the manpages dataset (1.1.0).'}
  BUILDER_CONFIGS = [ManpagesConfig(name='pairs', description='Summary/description matching')]
  TEXTS = ('text_a', 'text_b')
  CLASSES = ('another page', 'same page')
  HOMEPAGE = Manpages.HOMEPAGE

  def rows(self) -> dict[str, Iterable[tuple]]:
    return load_pairs(self.builder_config)

  def key(self, index: int, row: tuple) -> str:
    del index  # With the label: pages that share a description make a pair of both labels.
    return hashlib.md5('\0'.join(map(str, row)).encode('utf-8')).hexdigest()

  def description(self) -> str:
    return self.__doc__
