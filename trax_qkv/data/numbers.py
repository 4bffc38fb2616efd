"""`trax_qkv_numbers`: English -> German number words, generated offline.

Generated with num2words, no download. German puts units before tens
("twenty-one" -> "einundzwanzig"), so cross-attention must learn
non-monotonic alignments.
"""

from num2words import num2words
import numpy as np
import tensorflow_datasets as tfds


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
    np.arange(1, max_number + 1)
  )
  test, validation = numbers[:n_test], numbers[n_test : n_test + n_validation]
  train = numbers[n_test + n_validation :]
  return {
    'train': sorted(train.tolist()),
    'validation': sorted(validation.tolist()),
    'test': sorted(test.tolist()),
  }


def number_pair(n):
  """1234 -> ('one thousand, two hundred and thirty-four', 'eintausend...')."""
  return num2words(n, lang='en'), num2words(n, lang='de')


class TraxQkvNumbers(tfds.core.GeneratorBasedBuilder):
  """English number words -> German number words, generated locally."""

  BUILDER_CONFIGS = [
    NumbersConfig(
      name='default',
      max_number=9999,
      n_validation=500,
      n_test=500,
      description='1..9999: 8999 train, 500 val, 500 test.',
    ),
    NumbersConfig(
      name='tiny',
      max_number=200,
      n_validation=20,
      n_test=20,
      description='1..200, for tests.',
    ),
  ]

  def _info(self):
    return self.dataset_info_from_configs(
      features=tfds.features.FeaturesDict(
        {'en': tfds.features.Text(), 'de': tfds.features.Text()}
      ),
      supervised_keys=('en', 'de'),
      homepage='https://pypi.org/project/num2words/',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    c = self.builder_config
    splits = number_splits(c.max_number, c.n_validation, c.n_test, c.seed)
    return {
      name: self._generate_examples(numbers) for name, numbers in splits.items()
    }

  def _generate_examples(self, numbers):
    for n in numbers:
      en, de = number_pair(n)
      yield n, {'en': en, 'de': de}
