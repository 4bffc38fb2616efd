"""Translating sentences with a trained model directory."""

import itertools
import math

import numpy as np
from trax import shapes

from trax_qkv import data as data_lib
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


def encode_lines(model, sentences, max_length=None, start=0):
  """(indices of the non-blank sentences, their source ids with EOS, the
  length limit: `max_length`, else `default_max_length` of the longest)
  of a ModelDir's `sentences`, translated together. ValueError, as
  `check_sources_fit`, for one too long for the model; `start` as there."""
  todo = [i for i, s in enumerate(sentences) if s.strip()]
  sources = data_lib.encode_with_eos(model.vocab, [sentences[i] for i in todo])
  check_sources_fit(
    sources, model.settings, [start + i + 1 for i in todo], start
  )
  limit = max_length or default_max_length(
    model.settings, max((len(s) for s in sources), default=1)
  )
  return todo, sources, limit


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


class Translator:
  """A model directory loaded once, and its compiled search: translates
  batch after batch of sentences (`translate_lines`' chunks, the lines of
  an interactive session), each compiled program reused by later batches
  of its shape.

  Args:
    model_dir: a directory written by trax-qkv-validate (or its ModelDir).
    n_beams, alpha, attention, batch_size, max_length: as for
      `translate_ids`.

  Raises:
    ValueError: an argument out of range, or a model directory or
      checkpoint that cannot be used; before anything is decoded.
  """

  def __init__(
    self,
    model_dir,
    n_beams=1,
    alpha=0.6,
    attention=None,
    batch_size=32,
    max_length=None,
  ):
    self.model = _checked_model(
      model_dir, n_beams, alpha, attention, batch_size, max_length
    )
    self.batch_size, self.max_length = batch_size, max_length
    self.model_fn = model_dir_lib.model_fn(self.model.settings, attention)
    self._n_beams, self._alpha = n_beams, alpha
    self._decoder = None

  @property
  def decoder(self):
    """The `decoding.Decoder`, its checkpoint checked when first asked."""
    if self._decoder is None:  # checked and read once, when first needed
      check_checkpoint(self.model, self.model_fn)
      self._decoder = decoding.Decoder(
        self.model_fn, self.model.checkpoint, self._n_beams, self._alpha
      )
    return self._decoder

  def ids(self, sentences, start=0, log=None):
    """One list of token ids (no EOS) per sentence, None for a blank one.
    `start`: how many lines before these were translated (in messages)."""
    out = [None] * len(sentences)
    todo, sources, limit = encode_lines(
      self.model, sentences, self.max_length, start
    )
    if not todo:
      return out
    ids = self.decoder.decode(
      sources,
      self.batch_size,
      limit,
      self.model.settings['max_len'],
      description='translating'
      if start == 0
      else f'translating from line {start}',
      log=log,
    )
    for i, hypothesis in zip(todo, ids):
      out[i] = hypothesis
    return out

  def translate(self, sentences, start=0, log=None):
    """One translation per sentence ('' for a blank one)."""
    return [
      self.model.vocab.decode(ids) if ids is not None else ''
      for ids in self.ids(sentences, start, log)
    ]

  def warm_up(self):
    """Reads and checks the checkpoint now rather than at the first
    sentence (an interactive session answers its first line sooner).
    Returns the `decoding.Decoder`."""
    return self.decoder


def _checked_model(
  model_dir, n_beams, alpha, attention, batch_size, max_length
):
  """The ModelDir of `model_dir`, every option checked against it."""
  for name, value in (('n_beams', n_beams), ('batch_size', batch_size)):
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
  return model


def _prepared_chunks(model_dir, lines, chunk_size, log=None, **options):
  """(ModelDir, iterator of per-chunk id lists), every argument checked
  before the first line is read, and the lines before the model is."""
  if not isinstance(chunk_size, int) or chunk_size < 1:
    raise ValueError(f'chunk_size must be a positive int; got {chunk_size!r}.')
  translator = Translator(model_dir, **options)
  lines = iter(lines)
  first = list(itertools.islice(lines, chunk_size))
  if not first:
    raise ValueError(
      'no sentences to translate: give them as arguments or '
      'one per line on standard input.'
    )
  translator.warm_up()

  def chunks():
    chunk, start = first, 0
    while chunk:
      yield translator.ids(chunk, start, log)
      start += len(chunk)
      chunk = list(itertools.islice(lines, chunk_size))

  return translator.model, chunks()
