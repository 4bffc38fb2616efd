"""Translation data that runs offline: tensorflow-datasets builders + trax.data.

Three sources, all read through `trax.data.TFDS`:
  * `trax_qkv_numbers`: generated English -> German number words (num2words),
    no download. German puts units before tens ("twenty-one" ->
    "einundzwanzig"), so cross-attention must learn non-monotonic alignments.
  * a directory of parallel text, `{split}.{src}` / `{split}.{tgt}`, one
    sentence per line (e.g. ../shared/data/multi30k), via
    `parallel_text_dataset(directory, src, tgt)`.
  * any TFDS translation data set the user has prepared, by name.
A subword vocabulary (Trax's SubwordTextEncoder) is built offline from the
training split and cached beside the prepared data.
"""

import collections
import hashlib
import os
import re

import gin
import numpy as np
import tensorflow_datasets as tfds
import trax
from num2words import num2words
from trax.data import text_encoder

EOS_ID = 1  # SubwordTextEncoder reserves 0 for padding and 1 for <EOS>.
# File-name prefixes accepted for each split in a parallel-text directory,
# in order of preference (Multi30k ships val.* and test2016.*).
SPLIT_FILE_PREFIXES = {
    'train': ('train',),
    'validation': ('validation', 'val', 'valid', 'dev'),
    'test': ('test', 'test2016'),
}
DEFAULT_DATA_DIR = os.path.expanduser('~/tensorflow_datasets')


# ----------------------------------------------------------------- numbers

class NumbersConfig(tfds.core.BuilderConfig):
  """Numbers 1..max_number, split at random (fixed seed) into disjoint sets."""

  def __init__(self, *, max_number, n_validation, n_test, seed=0, **kwargs):
    super().__init__(version=tfds.core.Version('1.0.0'), **kwargs)
    self.max_number = max_number
    self.n_validation = n_validation
    self.n_test = n_test
    self.seed = seed


def number_splits(max_number, n_validation, n_test, seed=0):
  """{split: sorted numbers}; deterministic and pairwise disjoint."""
  numbers = np.random.RandomState(seed).permutation(
      np.arange(1, max_number + 1))
  test, validation = numbers[:n_test], numbers[n_test:n_test + n_validation]
  train = numbers[n_test + n_validation:]
  return {'train': sorted(train.tolist()),
          'validation': sorted(validation.tolist()),
          'test': sorted(test.tolist())}


def number_pair(n):
  """1234 -> ('one thousand, two hundred and thirty-four', 'eintausend...')."""
  return num2words(n, lang='en'), num2words(n, lang='de')


class TraxQkvNumbers(tfds.core.GeneratorBasedBuilder):
  """English number words -> German number words, generated locally."""

  BUILDER_CONFIGS = [
      NumbersConfig(name='default', max_number=9999, n_validation=500,
                    n_test=500,
                    description='1..9999: 8999 train, 500 val, 500 test.'),
      NumbersConfig(name='tiny', max_number=200, n_validation=20, n_test=20,
                    description='1..200, for tests.'),
  ]

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            'en': tfds.features.Text(), 'de': tfds.features.Text()}),
        supervised_keys=('en', 'de'),
        homepage='https://pypi.org/project/num2words/')

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    c = self.builder_config
    splits = number_splits(c.max_number, c.n_validation, c.n_test, c.seed)
    return {name: self._generate_examples(numbers)
            for name, numbers in splits.items()}

  def _generate_examples(self, numbers):
    for n in numbers:
      en, de = number_pair(n)
      yield n, {'en': en, 'de': de}


# ----------------------------------------------------------- parallel text

class ParallelTextError(ValueError):
  """A parallel-text directory that cannot be used as it is."""


def read_parallel_split(directory, split, src, tgt):
  """Returns (source lines, target lines) of one split, fully checked."""
  columns = []
  for lang in (src, tgt):
    path = os.path.join(directory, f'{split}.{lang}')
    if not os.path.isfile(path):
      raise ParallelTextError(
          f'missing file {path}: a parallel-text directory needs '
          f'{{split}}.{{lang}} files, one sentence per line, for '
          f'languages {src!r} and {tgt!r}.')
    with open(path, 'rb') as f:
      raw = f.read()
    try:
      text = raw.decode('utf-8')
    except UnicodeDecodeError as e:
      line = raw[:e.start].count(b'\n') + 1
      raise ParallelTextError(
          f'{path}, line {line}: not valid UTF-8 ({e.reason}); expected '
          'UTF-8 text, one sentence per line.') from None
    lines = text.split('\n')
    if lines and lines[-1] == '':
      lines.pop()  # the final newline ends the last line
    for number, line in enumerate(lines, start=1):
      if not line.strip():
        raise ParallelTextError(
            f'{path}, line {number}: empty line; every line must hold one '
            'sentence (remove the pair from both files).')
    columns.append([line.strip() for line in lines])
  if len(columns[0]) != len(columns[1]):
    raise ParallelTextError(
        f'{split}.{src} has {len(columns[0])} lines but {split}.{tgt} has '
        f'{len(columns[1])}: the two sides must be line-aligned.')
  return columns[0], columns[1]


def split_files(directory, src):
  """{TFDS split: file prefix} for the splits present in `directory`."""
  found = {}
  for split, prefixes in SPLIT_FILE_PREFIXES.items():
    for prefix in prefixes:
      if os.path.isfile(os.path.join(directory, f'{prefix}.{src}')):
        found[split] = prefix
        break
  return found


class _ParallelTextBase(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of the per-directory builders made by `parallel_text_dataset`."""

  VERSION = tfds.core.Version('1.0.0')
  DIRECTORY = None
  LANGS = None

  def _info(self):
    src, tgt = self.LANGS
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            src: tfds.features.Text(), tgt: tfds.features.Text()}),
        supervised_keys=(src, tgt),
        description=f'Parallel text from {self.DIRECTORY}.')

  def _split_generators(self, dl_manager):
    del dl_manager
    src, tgt = self.LANGS
    return {split: self._generate_examples(prefix)
            for split, prefix in split_files(self.DIRECTORY, src).items()}

  def _generate_examples(self, prefix):
    src, tgt = self.LANGS
    sources, targets = read_parallel_split(self.DIRECTORY, prefix, src, tgt)
    for i, (s, t) in enumerate(zip(sources, targets)):
      yield i, {src: s, tgt: t}


_PARALLEL_BUILDERS = {}


@gin.configurable(module='trax_qkv.data')
def parallel_text_dataset(directory, src, tgt):
  """Registers a TFDS builder for `directory`; returns its data set name.

  Every file is checked (present, UTF-8, no empty lines, aligned line counts)
  before anything is prepared, so a bad directory leaves nothing behind.
  """
  for name, value in (('src', src), ('tgt', tgt)):
    if not isinstance(value, str) or not re.fullmatch(r'[A-Za-z_-]+', value):
      raise ParallelTextError(
          f'{name} must be a language suffix such as "de"; got {value!r}.')
  directory = os.path.abspath(os.path.expanduser(directory))
  if not os.path.isdir(directory):
    raise ParallelTextError(
        f'directory {directory} does not exist; expected a directory with '
        f'{{split}}.{src} and {{split}}.{tgt} files.')
  splits = split_files(directory, src)
  if 'train' not in splits or len(splits) < 2:
    raise ParallelTextError(
        f'{directory} needs train.{src}/train.{tgt} and a validation or test '
        f'split (file prefixes {SPLIT_FILE_PREFIXES}); found {splits}.')
  for prefix in splits.values():
    read_parallel_split(directory, prefix, src, tgt)

  digest = hashlib.sha1(directory.encode()).hexdigest()[:8]
  slug = re.sub(r'[^a-z0-9]+', '_', os.path.basename(directory).lower())
  name = f'trax_qkv_parallel_{slug}_{src}_{tgt}_{digest}'.replace('__', '_')
  if name not in _PARALLEL_BUILDERS:
    _PARALLEL_BUILDERS[name] = type(
        f'ParallelText_{digest}', (_ParallelTextBase,),
        {'name': name, 'DIRECTORY': directory, 'LANGS': (src, tgt),
         '__module__': __name__})
  return name


# ---------------------------------------------------------------- pipeline

def vocab_path(dataset_name, keys, target_size, data_dir=None):
  """Where the vocabulary for these settings is cached: (dir, file)."""
  data_dir = data_dir or DEFAULT_DATA_DIR
  vocab_dir = os.path.join(data_dir, 'trax_qkv_vocabs')
  safe = dataset_name.replace('/', '__')
  return vocab_dir, f'{safe}.{"_".join(keys)}.{target_size}.subwords'


def build_vocab(dataset_name, keys, target_size, data_dir=None):
  """Builds (once) a shared subword vocabulary from the training split."""
  vocab_dir, vocab_file = vocab_path(dataset_name, keys, target_size,
                                     data_dir)
  path = os.path.join(vocab_dir, vocab_file)
  if not os.path.exists(path):
    encoder = text_encoder.SubwordTextEncoder.build_from_generator(
        (text for pair in load_split(dataset_name, 'train', keys, data_dir)
         for text in pair),
        target_size, max_subtoken_length=12)
    os.makedirs(vocab_dir, exist_ok=True)
    tmp = path + '.tmp'
    encoder.store_to_file(tmp)
    os.replace(tmp, path)  # never leave a half-written vocabulary
  return vocab_dir, vocab_file


def load_vocab(vocab_dir, vocab_file):
  return text_encoder.SubwordTextEncoder(os.path.join(vocab_dir, vocab_file))


class TranslationData(collections.namedtuple(
    'TranslationData', 'name keys data_dir vocab_dir vocab_file')):
  """A prepared translation data set and its vocabulary.

  Attributes: TFDS `name`, (source, target) `keys`, TFDS `data_dir`, and the
  subword vocabulary as (`vocab_dir`, `vocab_file`) for trax.data.Tokenize.
  """

  def vocab(self):
    return load_vocab(self.vocab_dir, self.vocab_file)


@gin.configurable(module='trax_qkv.data')
def translation_data(dataset='trax_qkv_numbers', keys=('en', 'de'),
                     source_dir=None, data_dir=None, vocab_size=2**10):
  """Prepares the data set and its vocabulary (once; cached) -> TranslationData.

  Args:
    dataset: a TFDS name (e.g. 'trax_qkv_numbers', 'trax_qkv_numbers/tiny',
        'wmt14_translate/de-en'); ignored when `source_dir` is given.
    keys: (source, target) feature names, e.g. ('en', 'de').
    source_dir: a directory of `{split}.{lang}` parallel text files.
    data_dir: where TFDS data and vocabularies live (default
        ~/tensorflow_datasets).
    vocab_size: target size of the shared subword vocabulary.
  """
  keys = tuple(keys)
  if len(keys) != 2 or not all(isinstance(k, str) for k in keys):
    raise ValueError(f'keys must be (source, target) feature names such as '
                     f"('en', 'de'); got {keys!r}.")
  name = parallel_text_dataset(source_dir, *keys) if source_dir else dataset
  data_dir = os.path.expanduser(data_dir or DEFAULT_DATA_DIR)
  vocab_dir, vocab_file = build_vocab(name, keys, vocab_size, data_dir)
  return TranslationData(name, keys, data_dir, vocab_dir, vocab_file)


@gin.configurable(module='trax_qkv.data')
def translation_vocab_size(data=None):
  """Size of the vocabulary of `data` (default: gin's translation_data())."""
  return (data or translation_data()).vocab().vocab_size


def SeededShuffle(queue_size, seed):  # pylint: disable=invalid-name
  """`trax.data.Shuffle` drawing from its own `RandomState(seed)`.

  Trax's shuffle draws from NumPy's global generator, which Loop seeds only
  after the first batch was drawn and which anything else may advance; a
  stream must replay exactly for a resumed run to read the same batches.
  Same algorithm and draws as `trax.data.inputs.shuffle` after
  `np.random.seed(seed)`.
  """
  if queue_size < 1:
    raise ValueError(f'shuffle queue_size must be >= 1; got {queue_size}.')

  def shuffle(samples):
    rng = np.random.RandomState(seed)
    queue = []
    for sample in samples:
      if len(queue) < queue_size:
        queue.append(sample)
        continue
      i = rng.randint(queue_size)
      yield queue[i]
      queue[i] = sample
    rng.shuffle(queue)
    yield from queue
  return shuffle


@gin.configurable(module='trax_qkv.data')
def TranslationInputs(data=None,  # pylint: disable=invalid-name
                      max_length=64,
                      batch_size=64,
                      eval_batch_size=None,
                      bucket_boundaries=(16, 32),
                      shuffle_queue=2048,
                      seed=0):
  """`trax.data.inputs.Inputs` for translation from `keys[0]` to `keys[1]`.

  Pipeline per split: TFDS -> Tokenize (subwords) -> append EOS -> (shuffle)
  -> FilterByLength -> BucketByLength -> AddLossWeights (padding masked)
  -> CountAndSkip. Both streams are deterministic, and their `CountAndSkip`
  counters, saved with each Loop checkpoint, let a resumed run continue
  where the interrupted one was.

  Args:
    data: a TranslationData (default: gin's `translation_data()`).
    max_length: examples with source or target longer than this (in
        subwords, EOS included) are dropped.
    batch_size: training batch size, for every bucket.
    eval_batch_size: evaluation batch size (default: batch_size).
    bucket_boundaries: length boundaries of the buckets.
    shuffle_queue: size of the training shuffle buffer.
    seed: seed of the training shuffle.
  """
  data = data or translation_data()
  n_buckets = len(bucket_boundaries) + 1

  def stream(train, batch):
    return trax.data.Serial(
        trax.data.TFDS(data.name, data_dir=data.data_dir, keys=data.keys,
                       train=train, shuffle_train=False),
        trax.data.Tokenize(keys=[0, 1], vocab_type='subword',
                           vocab_dir=data.vocab_dir,
                           vocab_file=data.vocab_file),
        trax.data.AppendValue(val={0: [EOS_ID], 1: [EOS_ID]}),
        *([SeededShuffle(shuffle_queue, seed)] if train else []),
        trax.data.FilterByLength(max_length, length_keys=[0, 1]),
        trax.data.BucketByLength(list(bucket_boundaries),
                                 [batch] * n_buckets, length_keys=[0, 1]),
        trax.data.AddLossWeights(id_to_mask=0),
        trax.data.CountAndSkip('trax_qkv_train' if train else 'trax_qkv_eval'),
    )

  train_stream = stream(True, batch_size)
  eval_stream = stream(False, eval_batch_size or batch_size)
  return trax.data.inputs.Inputs(train_stream=lambda _: train_stream(),
                                 eval_stream=lambda _: eval_stream())


def load_split(dataset_name, split, keys, data_dir=None):
  """All (source, target) string pairs of one split.

  The order is the prepared data set's (TFDS shuffles examples when it
  writes them): the same on every call, not the source files' line order.
  """
  ds = tfds.load(dataset_name, split=split, data_dir=data_dir or
                 DEFAULT_DATA_DIR, shuffle_files=False)
  return [(ex[keys[0]].decode('utf-8'), ex[keys[1]].decode('utf-8'))
          for ex in tfds.as_numpy(ds)]


