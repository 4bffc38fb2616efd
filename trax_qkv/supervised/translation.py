"""Translating sentences with a trained model directory."""

import itertools
import math

import numpy as np
from trax import shapes

from trax_qkv.models import registry
from trax_qkv.supervised import checkpointing
from trax_qkv.supervised import decoding
from trax_qkv.supervised import model_dir as model_dir_lib


def longest_output(settings):
  """The most tokens a model can decode: with EOS within its max_len (its
  positional encoding has no positions beyond that)."""
  return settings['max_len'] - 1


def default_max_length(settings, source_length):
  """Decoded tokens at most: twice the source and 10, within
  `longest_output`."""
  return min(longest_output(settings), 2 * source_length + 10)


def check_sources_fit(sources, settings, numbers, done=0):
  """Raises ValueError naming the sentences (by `numbers`, 1-based) whose
  subwords with EOS exceed the model's max_len, before they are decoded:
  the encoder has no positions for them. `done`: how many lines before
  them were translated already (streaming)."""
  longest = settings['max_len']
  too_long = [
    (n, len(ids)) for n, ids in zip(numbers, sources) if len(ids) > longest
  ]
  if too_long:
    shown = ', '.join(f'{n} ({length} subwords)' for n, length in too_long[:5])
    more = f' and {len(too_long) - 5} more' if len(too_long) > 5 else ''
    raise ValueError(
      f'{len(too_long)} sentence(s) are longer than the model takes '
      f'({longest} subwords with EOS, its max_len): sentence {shown}'
      f'{more}. '
      + (f'Lines 1-{done} were translated, ' if done else 'Nothing was ')
      + ('none after them' if done else 'translated')
      + '; split or shorten them.'
    )


def check_checkpoint(model, model_fn):
  """Raises a ValueError unless the checkpoint of `model` (a ModelDir) is
  safe to read, whole, and has the weights `model_fn` builds (Trax's
  loader would quietly keep fresh weights where one does not fit)."""
  probe = model_fn(mode='eval')
  probe.init(
    shapes.signature((np.zeros((1, 1), np.int32), np.zeros((1, 1), np.int32)))
  )
  checkpointing.check_checkpoint_fits(probe, model.path)


# Lines translated together by `translate_lines`: sorted by length into
# batches within a chunk, written in input order when the chunk is done.
CHUNK_SIZE = 2048


def translate(model_dir, sentences, **options):
  """One translation per sentence, greedy (n_beams 1) or by beam search.

  Args:
    model_dir: a directory written by trax-qkv-validate or trax-qkv-train,
      or its `model_dir.ModelDir`.
    sentences: source-language strings.
    **options: as for `translate_ids` (n_beams, alpha, attention, ...).

  Returns:
    One string per sentence ('' for a blank one).
  """
  return list(translate_lines(model_dir, sentences, **options))


def translate_lines(model_dir, lines, chunk_size=CHUNK_SIZE, **options):
  """Translations of `lines`, an iterable of strings, yielded in order.

  Lines are read and translated `chunk_size` at a time, so a file of any
  length streams through in bounded memory; every check that needs only
  the arguments is made before the first line is read. A line that
  cannot be translated (too long for the model) raises ValueError naming
  it when its chunk comes, after the translations of earlier chunks.

  Args:
    model_dir, **options: as for `translate_ids`.
    lines: source-language strings; a blank one translates to ''.
    chunk_size: lines read and decoded at a time.
  """
  model, chunks = _prepared_chunks(model_dir, lines, chunk_size, **options)
  return (
    model.vocab.decode(ids) if ids is not None else ''
    for chunk in chunks
    for ids in chunk
  )


def translate_ids(model_dir, sentences, **options):
  """One list of token ids (no EOS) per sentence, None for a blank one.

  Args:
    model_dir: a directory written by trax-qkv-validate (or its ModelDir).
    sentences: source-language strings; an empty one translates to ''.
    **options:
      n_beams, alpha: beam size and GNMT length penalty.
      attention: {site: implementation} to decode with; sites not named
        run what the model was trained with (the checkpoint fits every
        one).
      batch_size: sentences decoded at once.
      max_length: most tokens decoded (default `default_max_length` of
        the longest source of each chunk of lines).
      log: if given, progress lines go to it (a bar on a terminal).
  """
  _, chunks = _prepared_chunks(model_dir, sentences, CHUNK_SIZE, **options)
  return [ids for chunk in chunks for ids in chunk]


def _prepared_chunks(
  model_dir,
  lines,
  chunk_size,
  n_beams=1,
  alpha=0.6,
  attention=None,
  batch_size=32,
  max_length=None,
  log=None,
):
  """(ModelDir, iterator of per-chunk id lists), every argument checked."""
  for name, value in (
    ('n_beams', n_beams),
    ('batch_size', batch_size),
    ('chunk_size', chunk_size),
  ):
    if not isinstance(value, int) or value < 1:
      raise ValueError(f'{name} must be a positive int; got {value!r}.')
  if (
    not isinstance(alpha, (int, float))
    or not math.isfinite(alpha)
    or (alpha < 0)
  ):
    raise ValueError(f'alpha must be a finite number >= 0; got {alpha!r}.')
  registry.check_attention(attention)
  model = (
    model_dir
    if isinstance(model_dir, model_dir_lib.ModelDir)
    else model_dir_lib.load(model_dir)
  )
  if max_length is not None and not (
    isinstance(max_length, int)
    and 1 <= max_length <= longest_output(model.settings)
  ):
    raise ValueError(
      f'max_length must be an int from 1 to '
      f"{longest_output(model.settings)} (the model's max_len "
      f'{model.settings["max_len"]}, less one for EOS); got '
      f'{max_length!r}.'
    )
  lines = iter(lines)
  first = list(itertools.islice(lines, chunk_size))
  if not first:
    raise ValueError(
      'no sentences to translate: give them as arguments or '
      'one per line on standard input.'
    )
  model_fn = model_dir_lib.transformer_fn(model.settings, attention)
  check_checkpoint(model, model_fn)
  decoder = decoding.Decoder(model_fn, model.checkpoint, n_beams, alpha)

  def chunks():
    chunk, start = first, 0
    while chunk:
      todo = [i for i, s in enumerate(chunk) if s.strip()]
      out = [None] * len(chunk)
      if todo:
        sources = decoding.encode_sources(model.vocab, [chunk[i] for i in todo])
        check_sources_fit(
          sources, model.settings, [start + i + 1 for i in todo], start
        )
        limit = max_length or default_max_length(
          model.settings, max(len(s) for s in sources)
        )
        ids = decoder.decode(
          sources,
          batch_size,
          limit,
          model.settings['max_len'],
          description='translating'
          if start == 0
          else f'translating from line {start}',
          log=log,
        )
        for i, hypothesis in zip(todo, ids):
          out[i] = hypothesis
      yield out
      start += len(chunk)
      chunk = list(itertools.islice(lines, chunk_size))

  return model, chunks()
