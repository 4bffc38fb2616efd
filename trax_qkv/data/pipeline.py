"""Vocabulary and input pipeline: TFDS -> subwords -> batches for Trax.

A subword vocabulary (Trax's SubwordTextEncoder) is built offline from the
training split and cached beside the prepared data; Trax's default
vocabularies live on gs:// and are never fetched.
"""

import collections
import contextlib
import io
import logging
import os
import re
import sys

import gin
import numpy as np
import tensorflow_datasets as tfds
import trax
from trax.data import text_encoder

from trax_qkv import files
from trax_qkv.data import parallel_text

EOS_ID = 1  # SubwordTextEncoder reserves 0 for padding and 1 for <EOS>.
DEFAULT_DATA_DIR = os.path.expanduser('~/tensorflow_datasets')
# Held in data_dir while a data set and its vocabulary are prepared, so
# that runs sharing data_dir never write the same files at once.
DATA_LOCK_FILE = '.trax_qkv_data.lock'
# Source and target keys: TFDS feature names or file suffixes ('en', 'de',
# 'zh-CN'), never paths.
_KEY = re.compile(r'[A-Za-z][A-Za-z0-9_-]*')


def vocab_path(dataset_name, keys, target_size, data_dir=None):
  """Where the vocabulary for these settings is cached: (dir, file)."""
  data_dir = data_dir or DEFAULT_DATA_DIR
  vocab_dir = os.path.join(data_dir, 'trax_qkv_vocabs')
  safe = dataset_name.replace('/', '__')
  return vocab_dir, f'{safe}.{"_".join(keys)}.{target_size}.subwords'


def build_vocab(dataset_name, keys, target_size, data_dir=None):
  """Builds (once) a shared subword vocabulary from the training split."""
  vocab_dir, vocab_file = vocab_path(dataset_name, keys, target_size, data_dir)
  path = os.path.join(vocab_dir, vocab_file)
  if not os.path.exists(path):
    encoder = text_encoder.SubwordTextEncoder.build_from_generator(
      (
        text
        for pair in load_split(dataset_name, 'train', keys, data_dir)
        for text in pair
      ),
      target_size,
      max_subtoken_length=12,
    )
    os.makedirs(vocab_dir, exist_ok=True)
    with files.atomic_path(path) as tmp:
      encoder.store_to_file(tmp)
  return vocab_dir, vocab_file


def load_vocab(vocab_dir, vocab_file):
  return text_encoder.SubwordTextEncoder(os.path.join(vocab_dir, vocab_file))


class TranslationData(
  collections.namedtuple(
    'TranslationData', 'name keys data_dir vocab_dir vocab_file'
  )
):
  """A prepared translation data set and its vocabulary.

  Attributes: TFDS `name`, (source, target) `keys`, TFDS `data_dir`, and the
  subword vocabulary as (`vocab_dir`, `vocab_file`) for trax.data.Tokenize.
  """

  def vocab(self):
    return load_vocab(self.vocab_dir, self.vocab_file)


def prepare_translation_data(
  dataset='trax_qkv_numbers',
  keys=('en', 'de'),
  source_dir=None,
  data_dir=None,
  vocab_size=2**10,
):
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
  keys = check_keys(keys)
  name = (
    parallel_text.parallel_text_dataset(source_dir, *keys)
    if source_dir
    else dataset
  )
  data_dir = os.path.expanduser(data_dir or DEFAULT_DATA_DIR)
  with files.locked(data_dir, DATA_LOCK_FILE):
    check_dataset(name, data_dir)
    prepare_dataset(name, data_dir)
    vocab_dir, vocab_file = build_vocab(name, keys, vocab_size, data_dir)
  return TranslationData(name, keys, data_dir, vocab_dir, vocab_file)


def check_keys(keys):
  """(source, target) as a tuple; ValueError unless two different names
  of letters, digits, '_' and '-' (they become feature names and file
  suffixes)."""
  keys = tuple(keys) if isinstance(keys, (tuple, list)) else (keys,)
  if (
    len(keys) != 2
    or keys[0] == keys[1]
    or not all(isinstance(k, str) and _KEY.fullmatch(k) for k in keys)
  ):
    raise ValueError(
      f'keys must be two different (source, target) feature '
      "names such as ('en', 'de'): a letter, then letters, "
      f"digits, '_' or '-'; got {keys!r}."
    )
  return keys


# The same, configurable from gin (whose errors carry a line naming it).
translation_data = gin.external_configurable(
  prepare_translation_data, 'translation_data', module='trax_qkv.data'
)


class UnknownDatasetError(ValueError):
  """A data set name that TFDS does not know."""


def check_dataset(name, data_dir=None):
  """Raises UnknownDatasetError, in one line with TFDS's closest names,
  unless TFDS has a builder for `name` (before anything is prepared)."""
  try:
    tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    guesses = re.findall(r'Did you mean: \S+ -> (.+?) \?', str(e))
    hint = f' (did you mean {" or ".join(guesses)}?)' if guesses else ''
    raise UnknownDatasetError(
      f'dataset {name!r} is not a tensorflow-datasets data set{hint}; give '
      'a TFDS name such as trax_qkv_numbers, or --source_dir for a '
      'directory of parallel text.'
    ) from None


def prepare_dataset(name, data_dir=None):
  """Prepares the TFDS data set `name` in `data_dir`, once.

  TFDS prints progress bars and "Downloading and preparing dataset" (our
  builders download nothing) to stdout and stderr, and logs a warning for
  a new folder; our commands say what they prepare in a line of their
  own. Those messages are held back, and written to stderr only if
  preparing fails.
  """
  held = io.StringIO()
  absl_logger = logging.getLogger('absl')
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)
  try:
    builder = tfds.builder(name, data_dir=data_dir or DEFAULT_DATA_DIR)
    if builder.is_prepared():
      return
    with contextlib.redirect_stdout(held), contextlib.redirect_stderr(held):
      builder.download_and_prepare()
  except BaseException:
    sys.stderr.write(held.getvalue())
    raise
  finally:
    absl_logger.setLevel(level)


@gin.configurable(module='trax_qkv.data')
def translation_vocab_size(data=None):
  """Size of the vocabulary of `data` (default: gin's translation_data())."""
  return (data or translation_data()).vocab().vocab_size


def SeededShuffle(queue_size, seed):
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
def TranslationInputs(
  data=None,
  max_length=64,
  batch_size=64,
  eval_batch_size=None,
  bucket_boundaries=(16, 32),
  shuffle_queue=2048,
  seed=0,
):
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
      trax.data.TFDS(
        data.name,
        data_dir=data.data_dir,
        keys=data.keys,
        train=train,
        shuffle_train=False,
        # Every process of a run reads the whole split (and the same
        # batches); Trax would give each its own part of it.
        host_id=0,
        n_hosts=1,
      ),
      trax.data.Tokenize(
        keys=[0, 1],
        vocab_type='subword',
        vocab_dir=data.vocab_dir,
        vocab_file=data.vocab_file,
      ),
      trax.data.AppendValue(val={0: [EOS_ID], 1: [EOS_ID]}),
      *([SeededShuffle(shuffle_queue, seed)] if train else []),
      trax.data.FilterByLength(max_length, length_keys=[0, 1]),
      trax.data.BucketByLength(
        list(bucket_boundaries), [batch] * n_buckets, length_keys=[0, 1]
      ),
      trax.data.AddLossWeights(id_to_mask=0),
      trax.data.CountAndSkip('trax_qkv_train' if train else 'trax_qkv_eval'),
    )

  train_stream = stream(True, batch_size)
  eval_stream = stream(False, eval_batch_size or batch_size)
  return trax.data.inputs.Inputs(
    train_stream=lambda _: train_stream(), eval_stream=lambda _: eval_stream()
  )


def encode_with_eos(vocab, texts):
  """Each text's token ids with EOS appended, as the training batches hold
  them: a source to translate, or a target to teacher-force."""
  return [vocab.encode(t) + [EOS_ID] for t in texts]


def split_batches(data, split, max_length, batch_size, widths=(16, 32)):
  """Every pair of `split` once, as the batches of `TranslationInputs`
  ((source, target, weights): EOS appended, pairs longer than
  `max_length` dropped, weight 0 on padding), for an evaluation over the
  whole split where Trax's eval stream repeats it.

  Pairs are sorted by length and padded to the first of `widths` (then
  `max_length`) that fits both sides; the last batch is padded with empty
  rows (weight 0), so that few shapes, and compiled eval steps, serve the
  split.
  """
  vocab = data.vocab()
  split_pairs = load_split(data.name, split, data.keys, data.data_dir)
  pairs = sorted(
    (ids_s, ids_t)
    for ids_s, ids_t in zip(
      encode_with_eos(vocab, [s for s, _ in split_pairs]),
      encode_with_eos(vocab, [t for _, t in split_pairs]),
    )
    if len(ids_s) <= max_length and len(ids_t) <= max_length
  )
  batches = []
  for start in range(0, len(pairs), batch_size):
    chunk = pairs[start : start + batch_size]
    longest = max(max(len(s), len(t)) for s, t in chunk)
    width = next((w for w in widths if longest <= w), max_length)
    src, tgt = (np.zeros((batch_size, width), np.int32) for _ in range(2))
    for i, (s, t) in enumerate(chunk):
      src[i, : len(s)], tgt[i, : len(t)] = s, t
    batches.append((src, tgt, (tgt != 0).astype(np.float32)))
  return batches


def load_split(dataset_name, split, keys, data_dir=None):
  """All (source, target) string pairs of one split.

  The order is the prepared data set's (TFDS shuffles examples when it
  writes them): the same on every call, not the source files' line order.
  """
  ds = tfds.load(
    dataset_name,
    split=split,
    data_dir=data_dir or DEFAULT_DATA_DIR,
    shuffle_files=False,
  )
  return [
    (ex[keys[0]].decode('utf-8'), ex[keys[1]].decode('utf-8'))
    for ex in tfds.as_numpy(ds)
  ]
