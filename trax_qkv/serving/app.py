"""The HTTP API of `trax-qkv-serve`, on aiohttp.

  GET  /            the page: a sentence in, its translation and the
                    cross-attention of every layer and head out
  GET  /health      {"status": "ok", "model_dir": ..., "max_len": ...,
                     "requests": ..., "sentences": ..., "batches": ...,
                     "compilations": ...} (counts since start)
  POST /translate   {"sentences": [...], "beam": 1, "alpha": 0.6,
                     "max_length": null} -> {"translations": [...]}
  POST /attention   {"sentence": ..., "beam": 1, "alpha": 0.6,
                     "max_length": null, "target": null, "format": "json"}
                    -> the translation (or the target given), its
                    subwords and the weights [layer][head][target][source];
                    "format": "png" -> the map as a PNG

A request the server cannot take is answered 4xx with {"error": "..."}
naming what is wrong, before any decoding; nothing of it is logged but its
access line, and the server goes on.
"""

import dataclasses
import importlib.resources
import io
import json
import logging
import math

from aiohttp import web

from trax_qkv.data import EOS_ID
from trax_qkv.supervised import attention_maps

logger = logging.getLogger('trax_qkv.serving')

TRANSLATE_FIELDS = ('sentences', 'beam', 'alpha', 'max_length')
ATTENTION_FIELDS = (
  'sentence',
  'beam',
  'alpha',
  'max_length',
  'target',
  'format',
)


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one request may ask."""

  max_body_bytes: int = 64 * 1024
  max_sentences: int = 64
  max_beam: int = 8


class BadRequest(Exception):
  def __init__(self, message, status=400):
    super().__init__(message)
    self.status = status


def _is_int(value):
  return isinstance(value, int) and not isinstance(value, bool)


def search_options(body, limits, longest_output):
  """(beam, alpha, max_length) of a request body, each checked."""
  beam = body.get('beam', 1)
  if not _is_int(beam) or not 1 <= beam <= limits.max_beam:
    raise BadRequest(
      f'beam must be an int from 1 to {limits.max_beam}; got {beam!r}.'
    )
  alpha = body.get('alpha', 0.6)
  if (
    isinstance(alpha, bool)
    or not isinstance(alpha, (int, float))
    or not math.isfinite(alpha)
    or alpha < 0
  ):
    raise BadRequest(f'alpha must be a finite number >= 0; got {alpha!r}.')
  max_length = body.get('max_length')
  if max_length is not None and not (
    _is_int(max_length) and 1 <= max_length <= longest_output
  ):
    raise BadRequest(
      f'max_length must be null or an int from 1 to {longest_output} '
      f"(the model's max_len less one for EOS); got {max_length!r}."
    )
  return beam, float(alpha), max_length


def check_fields(body, known):
  unknown = sorted(set(body) - set(known))
  if unknown:
    raise BadRequest(
      f'unknown field(s) {", ".join(map(repr, unknown))}; a request takes '
      f'{", ".join(known)}.'
    )


def check_sentences(sentences, limits):
  if not isinstance(sentences, list) or not all(
    isinstance(s, str) for s in sentences
  ):
    raise BadRequest('"sentences" must be a list of strings.')
  if not 1 <= len(sentences) <= limits.max_sentences:
    raise BadRequest(
      f'"sentences" must hold 1 to {limits.max_sentences} sentences; got '
      f'{len(sentences)}.',
      413 if sentences else 400,
    )


async def read_json(request, limits):
  """The request's JSON object; BadRequest if it is too large, not JSON,
  or not an object."""
  too_large = BadRequest(
    f'the body is larger than {limits.max_body_bytes} bytes.', 413
  )
  if (request.content_length or 0) > limits.max_body_bytes:
    raise too_large
  try:
    raw = await request.read()
  except web.HTTPRequestEntityTooLarge:
    raise too_large from None
  try:
    body = json.loads(raw)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise BadRequest(f'the body is not JSON: {e}.') from None
  if not isinstance(body, dict):
    raise BadRequest(
      f'the body must be a JSON object; got {type(body).__name__}.'
    )
  return body


def _answers(handler):
  """`handler` with BadRequest and ValueError answered as JSON errors, and
  anything else as one log line and a 500."""

  async def answer(request):
    try:
      return await handler(request)
    except BadRequest as e:
      return web.json_response({'error': str(e)}, status=e.status)
    except ValueError as e:  # the model's own checks (a too-long sentence)
      return web.json_response({'error': str(e)}, status=400)
    except Exception as e:  # noqa: BLE001 (the server goes on)
      logger.error(
        '%s %s failed: %s: %s',
        request.method,
        request.path,
        type(e).__name__,
        e,
      )
      return web.json_response(
        {'error': f'internal error: {type(e).__name__}: {e}'}, status=500
      )

  return answer


class Routes:
  """The handlers, over one `batching.Batcher`."""

  def __init__(self, batcher, limits):
    self.batcher, self.limits = batcher, limits
    self._reader = None

  async def page(self, request):
    del request
    html = importlib.resources.files(__package__).joinpath('page.html')
    return web.Response(text=html.read_text('utf-8'), content_type='text/html')

  async def health(self, request):
    del request
    model = self.batcher.model
    return web.json_response(
      {
        'status': 'ok',
        'model_dir': model.path,
        'max_len': model.settings['max_len'],
        **{
          k: self.batcher.counts[k]
          for k in ('requests', 'sentences', 'batches')
        },
        'compilations': self.batcher.compilations,
      }
    )

  async def translate(self, request):
    body = await read_json(request, self.limits)
    check_fields(body, TRANSLATE_FIELDS)
    if 'sentences' not in body:
      raise BadRequest('the body must have "sentences": a list of strings.')
    check_sentences(body['sentences'], self.limits)
    beam, alpha, max_length = search_options(
      body, self.limits, self.batcher.longest_output
    )
    translations = await self.batcher.translate(
      body['sentences'], beam, alpha, max_length
    )
    return web.json_response({'translations': translations})

  async def attention(self, request):
    body = await read_json(request, self.limits)
    check_fields(body, ATTENTION_FIELDS)
    sentence, target = body.get('sentence'), body.get('target')
    if not isinstance(sentence, str) or not sentence.strip():
      raise BadRequest('"sentence" must be a non-empty string.')
    if target is not None and not isinstance(target, str):
      raise BadRequest('"target" must be null or a string.')
    form = body.get('format', 'json')
    if form not in ('json', 'png'):
      raise BadRequest(f'"format" must be "json" or "png"; got {form!r}.')
    beam, alpha, max_length = search_options(
      body, self.limits, self.batcher.longest_output
    )
    model = self.batcher.model
    (source_ids,), _ = self.batcher.encode([sentence], max_length)
    if target is None:
      (ids,) = await self.batcher.translate_ids(
        [sentence], beam, alpha, max_length
      )
      target, target_ids = model.vocab.decode(ids), ids + [EOS_ID]
    else:
      target_ids = attention_maps.encode_target(
        model.vocab, target, model.settings
      )
    sources, targets, weights = await self.batcher.in_worker(
      attention_maps.one_map, self._cross_attention(), model.vocab, source_ids,
      target_ids,
    )  # fmt: skip
    if form == 'png':
      return web.Response(
        body=await self.batcher.in_worker(
          _png, weights, sources, targets, f'"{sentence}" -> "{target}"'
        ),
        content_type='image/png',
      )
    return web.json_response(
      {
        'sentence': sentence,
        'translation': target,
        'source_tokens': sources,
        'target_tokens': targets,
        'weights': [w.tolist() for w in weights],
      }
    )

  def _cross_attention(self):
    if self._reader is None:
      translator = self.batcher.translator
      self._reader = attention_maps.CrossAttentionReader(
        translator.model_fn,
        translator.model.checkpoint,
        translator.model.settings['max_len'],
      )
    return self._reader


def _png(weights, sources, targets, title):
  from trax_qkv.validation import report

  out = io.BytesIO()
  report.plot_heatmaps(weights, sources, targets, out, title)
  return out.getvalue()


def make_app(batcher, limits=Limits()):
  """The aiohttp application over `batcher` (started and closed with
  the application)."""
  app = web.Application(client_max_size=limits.max_body_bytes)
  routes = Routes(batcher, limits)
  app.router.add_get('/', _answers(routes.page))
  app.router.add_get('/health', _answers(routes.health))
  app.router.add_post('/translate', _answers(routes.translate))
  app.router.add_post('/attention', _answers(routes.attention))

  async def start(app):
    del app
    await batcher.start()

  async def close(app):
    del app
    await batcher.close()

  app.on_startup.append(start)
  app.on_cleanup.append(close)
  return app
