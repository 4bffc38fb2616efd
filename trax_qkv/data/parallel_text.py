"""A TFDS builder for any directory of parallel text files.

`{split}.{src}` / `{split}.{tgt}`, one sentence per line (e.g.
../shared/data/multi30k); every file is checked before anything is
prepared.
"""

import hashlib
import os
import re

import gin
import tensorflow_datasets as tfds

# File-name prefixes accepted for each split in a parallel-text directory,
# in order of preference (Multi30k ships val.* and test2016.*).
SPLIT_FILE_PREFIXES = {
  'train': ('train',),
  'validation': ('validation', 'val', 'valid', 'dev'),
  'test': ('test', 'test2016'),
}


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
        f'languages {src!r} and {tgt!r}.'
      )
    with open(path, 'rb') as f:
      raw = f.read()
    try:
      text = raw.decode('utf-8')
    except UnicodeDecodeError as e:
      line = raw[: e.start].count(b'\n') + 1
      raise ParallelTextError(
        f'{path}, line {line}: not valid UTF-8 ({e.reason}); expected '
        'UTF-8 text, one sentence per line.'
      ) from None
    lines = text.split('\n')
    if lines and lines[-1] == '':
      lines.pop()  # the final newline ends the last line
    for number, line in enumerate(lines, start=1):
      if not line.strip():
        raise ParallelTextError(
          f'{path}, line {number}: empty line; every line must hold one '
          'sentence (remove the pair from both files).'
        )
    columns.append([line.strip() for line in lines])
  if len(columns[0]) != len(columns[1]):
    raise ParallelTextError(
      f'{split}.{src} has {len(columns[0])} lines but {split}.{tgt} has '
      f'{len(columns[1])}: the two sides must be line-aligned.'
    )
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


class _ParallelTextBase(
  tfds.core.GeneratorBasedBuilder, skip_registration=True
):
  """Base of the per-directory builders made by `parallel_text_dataset`."""

  VERSION = tfds.core.Version('1.0.0')
  DIRECTORY = None
  LANGS = None

  def _info(self):
    src, tgt = self.LANGS
    return self.dataset_info_from_configs(
      features=tfds.features.FeaturesDict(
        {src: tfds.features.Text(), tgt: tfds.features.Text()}
      ),
      supervised_keys=(src, tgt),
      description=f'Parallel text from {self.DIRECTORY}.',
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    src, tgt = self.LANGS
    return {
      split: self._generate_examples(prefix)
      for split, prefix in split_files(self.DIRECTORY, src).items()
    }

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
        f'{name} must be a language suffix such as "de"; got {value!r}.'
      )
  directory = os.path.abspath(os.path.expanduser(directory))
  if not os.path.isdir(directory):
    raise ParallelTextError(
      f'directory {directory} does not exist; expected a directory with '
      f'{{split}}.{src} and {{split}}.{tgt} files.'
    )
  splits = split_files(directory, src)
  if 'train' not in splits or len(splits) < 2:
    raise ParallelTextError(
      f'{directory} needs train.{src}/train.{tgt} and a validation or test '
      f'split (file prefixes {SPLIT_FILE_PREFIXES}); found {splits}.'
    )
  for prefix in splits.values():
    read_parallel_split(directory, prefix, src, tgt)

  digest = hashlib.sha1(directory.encode()).hexdigest()[:8]
  slug = re.sub(r'[^a-z0-9]+', '_', os.path.basename(directory).lower())
  name = f'trax_qkv_parallel_{slug}_{src}_{tgt}_{digest}'.replace('__', '_')
  if name not in _PARALLEL_BUILDERS:
    _PARALLEL_BUILDERS[name] = type(
      f'ParallelText_{digest}',
      (_ParallelTextBase,),
      {
        'name': name,
        'DIRECTORY': directory,
        'LANGS': (src, tgt),
        '__module__': __name__,
      },
    )
  return name
