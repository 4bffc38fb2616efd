"""tensorflow-datasets builders and the trax.data pipeline, offline."""

import os

from helpers import require_shared_data
import numpy as np
import pytest

from trax_qkv import data


@pytest.fixture(scope='module')
def tfds_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('tfds'))


def test_number_splits_are_deterministic_and_disjoint():
  a = data.number_splits(200, 20, 20, seed=0)
  assert a == data.number_splits(200, 20, 20, seed=0)
  assert [len(a[s]) for s in ('train', 'validation', 'test')] == [160, 20, 20]
  assert not set(a['train']) & set(a['test'])
  assert not set(a['validation']) & set(a['test'])
  assert sorted(a['train'] + a['validation'] + a['test']) == list(range(1, 201))


def test_number_words_put_units_before_tens_in_german():
  assert data.number_pair(21) == ('twenty-one', 'einundzwanzig')
  assert data.number_pair(1234) == (
    'one thousand, two hundred and thirty-four',
    'eintausendzweihundertvierunddreißig',
  )


def test_numbers_builder_prepares_offline(tfds_dir):
  test = data.load_split(
    'trax_qkv_numbers/tiny', 'test', ('en', 'de'), tfds_dir
  )
  expected = [
    data.number_pair(n) for n in data.number_splits(200, 20, 20)['test']
  ]
  assert sorted(test) == sorted(expected)


def test_preparing_keeps_tfds_messages_back(tmp_path, capfd):
  """TFDS's progress bars, 'Downloading and preparing dataset' (nothing is
  downloaded) and its new-folder warning stay out of a command's output."""
  data.translation_data(
    'trax_qkv_numbers/tiny', data_dir=str(tmp_path), vocab_size=200
  )
  printed = ''.join(capfd.readouterr())
  tfds_says = (
    'Downloading',
    'Generating',
    'Shuffling',
    'prepared',
    'dataset_info',
  )
  assert not [said for said in tfds_says if said in printed], printed


def test_pipeline_yields_transformer_batches(tfds_dir):
  spec = data.translation_data(
    'trax_qkv_numbers/tiny', data_dir=tfds_dir, vocab_size=200
  )
  assert os.path.exists(os.path.join(spec.vocab_dir, spec.vocab_file))
  inputs = data.TranslationInputs(spec, max_length=16, batch_size=8)
  for stream in (inputs.train_stream(1), inputs.eval_stream(1)):
    source, target, weights = next(stream)
    assert source.shape[0] == target.shape[0] == weights.shape[0] == 8
    assert np.issubdtype(source.dtype, np.integer)
    assert np.issubdtype(target.dtype, np.integer)
    assert weights.dtype == np.float32 and weights.shape == target.shape
    assert source.shape[1] <= 16 and target.shape[1] <= 16
    assert np.array_equal(weights, (target != 0).astype(np.float32))
    # Every row ends in EOS before its padding.
    for row in target:
      assert row[np.count_nonzero(row) - 1] == data.EOS_ID
  vocab = spec.vocab()
  assert data.translation_vocab_size(spec) == vocab.vocab_size
  assert vocab.decode(vocab.encode('einundzwanzig')) == 'einundzwanzig'


def test_split_batches_hold_every_pair_once(tfds_dir):
  spec = data.translation_data(
    'trax_qkv_numbers/tiny', data_dir=tfds_dir, vocab_size=200
  )
  pairs = data.load_split(spec.name, 'validation', spec.keys, tfds_dir)
  batches = data.split_batches(spec, 'validation', 16, 8, widths=(8,))
  vocab = spec.vocab()
  got = [
    (vocab.decode(list(s[s > 0][:-1])), vocab.decode(list(t[t > 0][:-1])))
    for src, tgt, _ in batches
    for s, t in zip(src, tgt, strict=True)
    if t.any()
  ]
  assert sorted(got) == sorted(pairs)  # each pair once (none over 16 here)
  for src, tgt, weights in batches:
    assert src.shape == tgt.shape == weights.shape and src.shape[0] == 8
    assert src.shape[1] in (8, 16)  # a width, or max_length
    assert np.array_equal(weights, (tgt != 0).astype(np.float32))


def _write(directory, split, lang, lines, raw=None):
  with open(os.path.join(directory, f'{split}.{lang}'), 'wb') as f:
    f.write(raw if raw is not None else ('\n'.join(lines) + '\n').encode())


def _parallel_dir(tmp_path, n=6):
  d = tmp_path / 'corpus'
  d.mkdir()
  for split in ('train', 'validation', 'test'):
    _write(d, split, 'de', [f'Satz {i} {split}' for i in range(n)])
    _write(d, split, 'en', [f'sentence {i} {split}' for i in range(n)])
  return d


def test_parallel_text_builder(tmp_path, tfds_dir):
  d = _parallel_dir(tmp_path)
  name = data.parallel_text_dataset(str(d), 'de', 'en')
  assert name == data.parallel_text_dataset(str(d), 'de', 'en')  # idempotent
  pairs = data.load_split(name, 'test', ('de', 'en'), tfds_dir)
  assert sorted(pairs) == sorted(
    (f'Satz {i} test', f'sentence {i} test') for i in range(6)
  )


@pytest.mark.parametrize(
  'damage,message',
  [
    ('missing', r'missing file .*test\.en'),
    ('counts', r'test\.de has 6 lines but test\.en has 5'),
    ('empty', r'test\.en, line 3: empty line'),
    ('utf8', r'test\.en, line 2: not valid UTF-8'),
  ],
)
def test_bad_parallel_text_fails_before_preparing(tmp_path, damage, message):
  d = _parallel_dir(tmp_path)
  if damage == 'missing':
    os.remove(d / 'test.en')
    os.remove(d / 'validation.en')
    os.remove(d / 'validation.de')
  elif damage == 'counts':
    _write(d, 'test', 'en', [f'sentence {i}' for i in range(5)])
  elif damage == 'empty':
    _write(d, 'test', 'en', ['a', 'b', '  ', 'd', 'e', 'f'])
  else:
    _write(d, 'test', 'en', None, raw=b'ok\nbad \xff\xfe byte\n' * 3)
  tfds_out = tmp_path / 'tfds'
  with pytest.raises(data.ParallelTextError, match=message):
    data.translation_data(
      source_dir=str(d), keys=('de', 'en'), data_dir=str(tfds_out)
    )
  assert not tfds_out.exists()  # nothing half-prepared


def test_missing_directory_and_bad_keys(tmp_path):
  with pytest.raises(data.ParallelTextError, match='does not exist'):
    data.parallel_text_dataset(str(tmp_path / 'nope'), 'de', 'en')
  with pytest.raises(data.ParallelTextError, match='src must be a language'):
    data.parallel_text_dataset(str(tmp_path), '../de', 'en')
  with pytest.raises(
    ValueError, match=r'keys must be two different \(source, target\)'
  ):
    data.translation_data(keys=('en',))


def test_multi30k_directory_is_usable(tmp_path):
  path = require_shared_data('multi30k')
  name = data.parallel_text_dataset(path, 'de', 'en')
  assert data.split_files(path, 'de') == {
    'train': 'train',
    'validation': 'val',
    'test': 'test2016',
  }
  counts = {
    prefix: len(data.read_parallel_split(path, prefix, 'de', 'en')[0])
    for prefix in ('train', 'val', 'test2016')
  }
  assert counts == {'train': 29000, 'val': 1014, 'test2016': 1000}
  assert name.startswith('trax_qkv_parallel_multi30k_de_en_')
