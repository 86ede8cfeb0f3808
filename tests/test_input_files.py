"""How data/files.py reads the user's files: lines end at \\n only, UTF-16/UTF-32 is refused,
TSV files are not quoted by default (data.quoting), and a list field refuses duplicates; then
predict.py's command line (run in this process, helpers/entry.py) on the inputs that used to go
wrong."""

import gzip
import json
import os

import pytest

import settings
from configs import tiny
from data import files
from data.config import DataConfig
from helpers import entry
from tests.test_cli_errors import snapshot
from training import trainer

TEXT = files.Columns(text='text', label='')
LABELLED = files.Columns(text='text', label='label')


def _write(path, content: bytes | str) -> str:
  with open(path, 'wb') as f:
    f.write(content.encode() if isinstance(content, str) else content)
  return str(path)


def _texts(path, columns=TEXT) -> list[bytes]:
  return list(files.read_inputs(str(path), columns))


def _data_config(**overrides):
  """The data group as the library takes it (typed, lists parsed)."""
  return settings.build_group(DataConfig, overrides, 'data')


# ---------------------------------------------------------------- lines
def test_txt_lines_end_at_newline_only(tmp_path):
  # A lone \r is text; CRLF loses its \r; empty lines are examples; a final \n adds none.
  assert _texts(_write(tmp_path / 'a.txt', 'one\rstill one\r\n\ntwo\n')) == [
      b'one\rstill one', b'', b'two']
  assert _texts(_write(tmp_path / 'b.txt', 'one\ntwo')) == [b'one', b'two']
  assert _texts(_write(tmp_path / 'c.txt', 'one\r\r\n')) == [b'one\r']  # only one \r dropped
  pairs = files.Columns(text='a', label='', text_b='b')
  assert files.read_inputs(_write(tmp_path / 'd.txt', 'x\ty\rz\r\n'), pairs).tolist() == [
      [b'x', b'y\rz']]


def test_documents_are_separated_by_blank_lines_of_any_line_ending(tmp_path):
  crlf = _write(tmp_path / 'crlf.txt', 'doc one\r\nline two\r\n \r\ndoc two\r\n')
  assert files.read_documents(crlf, TEXT) == [b'doc one\r\nline two', b'doc two']
  lone = _write(tmp_path / 'cr.txt', 'doc one\r\rstill doc one\n\ndoc two\n')
  assert files.read_documents(lone, TEXT) == [b'doc one\r\rstill doc one', b'doc two']


def test_jsonl_lines_end_at_newline_only(tmp_path):
  path = _write(tmp_path / 'a.jsonl', '{"text":\r"a\\rb"}\r\n\r\n{"text": "c"}')
  assert _texts(path) == [b'a\rb', b'c']


# ---------------------------------------------------------------- encodings
WIDE = {'utf-16': 'UTF-16 byte-order mark', 'utf-32': 'UTF-32 byte-order mark',
        'utf-16-be': 'NUL bytes', 'utf-32-le': 'NUL bytes'}
CONTENT = {'.txt': 'hello\n', '.csv': 'text\nhello\n', '.tsv': 'text\nhello\n',
           '.jsonl': '{"text": "hello"}\n'}


@pytest.mark.parametrize('encoding', WIDE)
@pytest.mark.parametrize('suffix', ['.txt', '.csv', '.tsv', '.jsonl', '.txt.gz', '.tsv.gz'])
def test_utf16_and_utf32_are_refused(tmp_path, encoding, suffix):
  content = CONTENT[suffix.removesuffix('.gz')].encode(encoding)
  path = _write(tmp_path / f'in{suffix}', gzip.compress(content) if 'gz' in suffix else content)
  with pytest.raises(ValueError, match=f'in{suffix} .*{WIDE[encoding]}.*iconv -f UTF-'):
    files.read_inputs(path, TEXT)


def test_utf16_training_files_and_corpora_are_refused(tmp_path):
  train = _write(tmp_path / 'train.csv', 'text,label\na,0\n'.encode('utf-16'))
  with pytest.raises(ValueError, match=r'train\.csv starts with a UTF-16 .*iconv'):
    files.FilesSource(train_files=(train,), validation_files=(), test_files=(), columns=LABELLED,
                      workdir=None)
  corpus = _write(tmp_path / 'corpus.txt', 'a document\n'.encode('utf-16'))
  with pytest.raises(ValueError, match=r'corpus\.txt starts with a UTF-16'):
    files.DocumentsSource(train_files=(corpus,), validation_files=(), test_files=(),
                          text_column='text')


def test_nul_bytes_are_refused_and_invalid_utf8_is_kept(tmp_path):
  with pytest.raises(ValueError, match=r'x\.csv holds NUL bytes in its first 4 KiB'):
    _texts(_write(tmp_path / 'x.csv', b'text\nhel\x00lo\n'))
  assert _texts(_write(tmp_path / 'y.csv', b'text\ncaf\xe9 \xff\n')) == [b'caf\xe9 \xff']
  assert _texts(_write(tmp_path / 'z.txt', b'\xef\xbb\xbfwith a UTF-8 mark\n')) == [
      b'with a UTF-8 mark']


# ---------------------------------------------------------------- quoting
TSV = 'text\tlabel\n"opens a quote\t1\nsays "hi"\t0\n'
CSV = 'text,label\n"a, b",1\n"say ""hi""",0\n'
QUOTING = [
    ('.tsv', 'auto', TSV, [b'"opens a quote', b'says "hi"']),
    ('.tsv', 'none', TSV, [b'"opens a quote', b'says "hi"']),
    ('.tab', 'auto', TSV, [b'"opens a quote', b'says "hi"']),
    ('.tsv', 'csv', 'text\tlabel\n"a\tb"\t1\n', [b'a\tb']),
    ('.csv', 'auto', CSV, [b'a, b', b'say "hi"']),
    ('.csv', 'csv', CSV, [b'a, b', b'say "hi"']),
    ('.csv', 'none', 'text,label\n"a,1\n', [b'"a']),
]


@pytest.mark.parametrize('extension, quoting, content, texts', QUOTING,
                         ids=[f'{e[1:]}-{q}' for e, q, _, _ in QUOTING])
def test_quoting(tmp_path, extension, quoting, content, texts):
  path = _write(tmp_path / f'f{extension}', content)
  columns = files.Columns.of(_data_config(quoting=quoting))
  assert [row.text for row in files.read_rows(path, columns)] == texts


def test_unquoted_rows_are_lines(tmp_path):
  # One row a line: a lone \r is text, CRLF loses its \r, blank lines are skipped (as csv does).
  path = _write(tmp_path / 'f.tsv', 'text\tlabel\r\na\rb\t1\r\n\r\n\nc\t0\n')
  rows = files.read_rows(path, LABELLED)
  assert [(row.text, row.label, row.where[-14:]) for row in rows] == [
      (b'a\rb', '1', 'row 1 (line 2)'), (b'c', '0', 'row 2 (line 5)')]
  short = _write(tmp_path / 'short.tsv', 'text\tlabel\n"a\n')
  with pytest.raises(ValueError, match=r'row 1 \(line 2\): fewer fields .*without quoting'):
    files.read_rows(short, LABELLED)


def test_quoted_tsv_error_names_the_switch(tmp_path):
  path = _write(tmp_path / 'f.tsv', TSV)
  with pytest.raises(ValueError, match=r'row 1 \(from line 2\): not valid CSV .*'
                                       r'--config\.data\.quoting=none'):
    files.read_rows(path, files.Columns.of(_data_config(quoting='csv')))


def test_quoting_must_be_a_choice():
  with pytest.raises(ValueError, match=r"data\.quoting='tsv' is not valid; valid choices: "
                                       'auto, csv, none'):
    files.Columns.of(_data_config(quoting='tsv'))
  assert files.Columns.of(_data_config()).quoting == 'auto'  # a saved config without the field


def test_corpora_read_with_the_quoting_given(tmp_path):
  path = _write(tmp_path / 'c.tsv', 'text\n' + ''.join(f'"doc {i}\n' for i in range(10)))
  source = files.DocumentsSource(train_files=(path,), validation_files=(), test_files=(),
                                 text_column='text')
  assert b'"doc 0' in list(source.read('train')[0]) + list(source.read('validation')[0])
  with pytest.raises(ValueError, match='not valid CSV'):
    files.DocumentsSource(train_files=(path,), validation_files=(), test_files=(),
                          text_column='text', quoting='csv')


# ---------------------------------------------------------------- duplicates
def test_list_fields_refuse_duplicates(tmp_path, monkeypatch):
  with pytest.raises(ValueError, match=r"data\.columns='label,text,label' names label more "
                                       'than once'):
    files.Columns.of(_data_config(columns='label,text,label'))
  monkeypatch.chdir(tmp_path)
  _write(tmp_path / 'a.csv', 'text,label\n' + ''.join(f'x{i},{i % 2}\n' for i in range(20)))
  for field, value in (('train_files', ('a.csv', './a.csv')),
                       ('validation_files', ('a.csv', f'{tmp_path}/a.csv')),
                       ('test_files', ('a.csv', 'a.csv'))):
    paths = {'train_files': ('a.csv',), 'validation_files': (), 'test_files': (), field: value}
    with pytest.raises(ValueError, match=rf'data\.{field}=.* more than once'):
      files.FilesSource(**paths, columns=LABELLED, workdir=None)
  with pytest.raises(ValueError, match=r'data\.train_files=.* more than once'):
    files.DocumentsSource(train_files=('a.csv', './a.csv'), validation_files=(), test_files=(),
                          text_column='text')


# ---------------------------------------------------------------- predict.py
@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  """A tiny run of 2 steps on a TSV whose texts start with quotes, as GLUE's may."""
  root = tmp_path_factory.mktemp('run')
  data_file = _write(root / 'train.tsv', 'text\tlabel\n' + ''.join(
      f'"quoted {i}\t{i % 2}\n' for i in range(40)))
  config = tiny.get_config()
  config.data.name, config.data.train_files = 'files', data_file
  config.train.num_steps = config.train.eval_every = config.train.checkpoint_every = 2
  trainer.train_and_evaluate(config, str(root / 'run'))
  return str(root / 'run')


def _predict(workdir, input_path, output_path):
  """predict.py with these flags, in this process (helpers/entry.py)."""
  return entry.run(['predict.py', f'--workdir={workdir}', f'--input={input_path}',
                    f'--output={output_path}'])


@pytest.mark.parametrize('name, content, count', [
    ('lone_cr.txt', 'first\rstill first\n\nthird\r\n', 3),
    ('quotes.tsv', 'id\ttext\n1\t"opens a quote\n2\tsays "hi"\n', 2),
], ids=['txt_with_a_lone_cr', 'tsv_with_quotes'])
def test_predict_gives_one_prediction_per_example(workdir, tmp_path, name, content, count):
  output = tmp_path / 'out.jsonl'
  proc = _predict(workdir, _write(tmp_path / name, content), output)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert len([json.loads(line) for line in output.read_text().splitlines()]) == count


def test_predict_refuses_utf16(workdir, tmp_path):
  before = snapshot(workdir)
  output = tmp_path / 'out.jsonl'
  proc = _predict(workdir, _write(tmp_path / 'in.txt', 'hello\nworld\n'.encode('utf-16')),
                  output)
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
  errors = [line for line in proc.stderr.splitlines() if line.startswith('predict.py: error: ')]
  assert len(errors) == 1 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  assert 'UTF-16 byte-order mark' in errors[0] and 'iconv -f UTF-16 -t UTF-8' in errors[0]
  assert not output.exists() and snapshot(workdir) == before
