"""Sentences that arrive together, decoded together.

A `Batcher` holds one model directory, loaded once, and a queue of
sentences. One asyncio task takes what the queue holds, waiting at most
`max_wait` seconds for more after the first, groups the sentences by
search (greedy, or beam search with its beam size, alpha and length
limit), and decodes each group in batches of at most `max_batch` rows on
one worker thread, where every JAX call of the server runs. Each answer
goes back to the request that asked for it.

A request is answered as `trax-qkv-translate` answers its sentences given
as arguments: the same length limit (`max_length`, else twice the longest
source of the request and 10, within the model's), each row decoded by
the same compiled search. Batches are padded to a few shapes (rows to a
power of two, sources to `decoding.bucket_length`) so that a server
compiles a handful of programs, not one per request. Greedy rows of all
limits share a program decoding up to the model's longest output, each
row cut at its own limit afterwards: greedy search fixes every token
before the next, so the first L tokens are those a search limited to L
finds. Beam search ranks hypotheses by their length penalty up to the
limit, so each limit is a program of its own.
"""

import asyncio
import collections
import concurrent.futures
import dataclasses

from trax_qkv.supervised import decoding
from trax_qkv.supervised import translation

# (n_beams, alpha) searches kept compiled; an older one is dropped (and
# compiled again, or read from the compilation cache, if asked again).
MAX_SEARCHES = 8


@dataclasses.dataclass(frozen=True)
class Search:
  """What rows must share to be decoded in one batch."""

  n_beams: int
  alpha: float
  limit: int  # beam search's length limit; the model's longest for greedy


@dataclasses.dataclass
class _Request:
  answers: list  # the ids of each sentence's translation, as decoded
  left: int  # sentences not yet decoded
  done: asyncio.Future  # set to `answers` once `left` is 0


@dataclasses.dataclass
class _Row:
  ids: list  # source ids with EOS
  limit: int  # most tokens of its hypothesis
  request: _Request
  index: int  # its sentence's place in the request


def row_bucket(rows, max_rows):
  """Rows of a batch of `rows` sentences: the next power of two, at most
  `max_rows`."""
  bucket = 1
  while bucket < rows:
    bucket *= 2
  return min(bucket, max_rows)


class Batcher:
  """Translates requests' sentences in shared batches (see module doc).

  Args:
    model_dir: a directory written by trax-qkv-validate (or its ModelDir).
    attention: {site: implementation} to decode with.
    max_batch: most sentences decoded at once.
    max_wait: seconds the first sentence of a batch waits for others.

  Raises:
    ValueError: as `translation.Translator`, before anything is served.
  """

  def __init__(self, model_dir, attention=None, max_batch=32, max_wait=0.005):
    if not isinstance(max_wait, (int, float)) or not 0 <= max_wait <= 10:
      raise ValueError(f'max_wait must be 0 to 10 seconds; got {max_wait!r}.')
    self.translator = translation.Translator(
      model_dir, attention=attention, batch_size=max_batch
    )
    self.model = self.translator.model
    self.max_batch, self.max_wait = max_batch, max_wait
    self._searches = collections.OrderedDict()  # (n_beams, alpha) -> Decoder
    self._worker = concurrent.futures.ThreadPoolExecutor(
      1, thread_name_prefix='trax_qkv_decode'
    )
    self._queue = None
    self._task = None
    # What /health reports: requests and sentences taken, batches decoded.
    self.counts = collections.Counter()

  @property
  def longest_output(self):
    return translation.longest_output(self.model.settings)

  def load(self):
    """Reads and checks the checkpoint (ValueError if it cannot be used)."""
    self.translator.warm_up()

  async def start(self):
    """Starts taking sentences (in the running event loop)."""
    self._queue = asyncio.Queue()
    self._task = asyncio.get_running_loop().create_task(self._serve())

  async def close(self):
    """Stops once the batch being decoded is done; later calls fail."""
    if self._task is not None:
      self._task.cancel()
      await asyncio.gather(self._task, return_exceptions=True)
    self._worker.shutdown(wait=True)

  def encode(self, sentences, max_length=None):
    """(source ids or None per sentence, the length limit) of a request,
    as `trax-qkv-translate` encodes its arguments; ValueError naming a
    sentence too long for the model."""
    ids = [None] * len(sentences)
    todo, sources, limit = translation.encode_lines(
      self.model, sentences, max_length
    )
    for i, source in zip(todo, sources):
      ids[i] = source
    return ids, limit

  async def translate(self, sentences, n_beams=1, alpha=0.6, max_length=None):
    """One translation per sentence ('' for a blank one), as
    `trax-qkv-translate --beam n_beams --alpha alpha [--max_length L]`
    prints them. Options are taken as checked (`app.search_options`)."""
    ids = await self.translate_ids(sentences, n_beams, alpha, max_length)
    return ['' if i is None else self.model.vocab.decode(i) for i in ids]

  async def translate_ids(
    self, sentences, n_beams=1, alpha=0.6, max_length=None
  ):
    """As `translate`, the ids of each translation (None for a blank
    sentence)."""
    sources, limit = self.encode(sentences, max_length)
    self.counts['requests'] += 1
    self.counts['sentences'] += len(sentences)
    rows = [i for i, source in enumerate(sources) if source is not None]
    answers = [None] * len(sentences)
    if not rows:
      return answers
    request = _Request(
      answers, len(rows), asyncio.get_running_loop().create_future()
    )
    search = Search(
      n_beams, float(alpha), limit if n_beams > 1 else self.longest_output
    )
    for i in rows:
      self._queue.put_nowait((search, _Row(sources[i], limit, request, i)))
    return await request.done

  async def in_worker(self, fn, *args):
    """fn(*args) on the thread that runs every JAX call of the server."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(self._worker, fn, *args)

  async def _serve(self):
    while True:
      taken = await self._take()
      groups = collections.defaultdict(list)
      for search, row in taken:
        if not row.request.done.done():  # failed, or its client went away
          groups[search].append(row)
      for search, rows in groups.items():
        for start in range(0, len(rows), self.max_batch):
          await self._decode(search, rows[start : start + self.max_batch])

  async def _take(self):
    """What the queue holds: at least one item; then, until `max_batch`
    items are taken or `max_wait` has passed since the first, whatever
    arrives; then whatever else is already queued (the groups are cut
    into batches of `max_batch` afterwards)."""
    taken = [await self._queue.get()]
    deadline = asyncio.get_running_loop().time() + self.max_wait
    while len(taken) < self.max_batch:
      if not self._queue.empty():
        taken.append(self._queue.get_nowait())
        continue
      left = deadline - asyncio.get_running_loop().time()
      if left <= 0:
        break
      try:
        taken.append(await asyncio.wait_for(self._queue.get(), left))
      except TimeoutError:
        break
    while not self._queue.empty():  # arrived while we waited: no reason to
      taken.append(self._queue.get_nowait())  # keep them for later
    return taken

  async def _decode(self, search, rows):
    self.counts['batches'] += 1
    try:
      hypotheses = await self.in_worker(self._decode_rows, search, rows)
    except Exception as e:  # noqa: BLE001 (every waiting request is told)
      for row in rows:
        if not row.request.done.done():
          row.request.done.set_exception(e)
      return
    for row, ids in zip(rows, hypotheses):
      request = row.request
      request.answers[row.index] = ids
      request.left -= 1
      if request.left == 0 and not request.done.done():
        request.done.set_result(request.answers)

  def _decode_rows(self, search, rows):
    """The hypotheses (ids) of `rows`, on the worker thread."""
    decoder = self._decoder(search.n_beams, search.alpha)
    sources = [row.ids for row in rows]
    width = row_bucket(len(sources), self.max_batch)
    length = decoding.bucket_length(
      max(len(s) for s in sources), self.model.settings['max_len']
    )
    batch = decoding.pad_rows(sources + [[]] * (width - len(sources)), length)
    hypotheses = decoder.decode_batch(batch, len(sources), search.limit)
    return [ids[: row.limit] for ids, row in zip(hypotheses, rows)]

  @property
  def compilations(self):
    """Search programs compiled so far (by the searches still kept)."""
    return sum(d.compilations for d in self._searches.values())

  def _decoder(self, n_beams, alpha):
    key = (n_beams, alpha)
    if key not in self._searches:
      if len(self._searches) == MAX_SEARCHES:
        self._searches.popitem(last=False)
      base = self.translator.decoder
      self._searches[key] = (
        base if key == (base.n_beams, base.alpha) else base.with_search(*key)
      )
    self._searches.move_to_end(key)
    return self._searches[key]
