"""trax-qkv-serve: translations and attention maps over HTTP, one model
loaded once.

  pip install 'trax_qkv[serve]'
  trax-qkv-serve --model_dir runs/m30k/reference --port 8000
  curl -s localhost:8000/translate -d '{"sentences": ["Ein Hund rennt."]}'

Then open http://127.0.0.1:8000/ for a page that translates a sentence
and draws the cross-attention of every layer and head.

  POST /translate  {"sentences": [...], "beam": 1, "alpha": 0.6,
                    "max_length": null} -> {"translations": [...]}
  POST /attention  {"sentence": "...", "beam": 1, "format": "json"|"png"}
  GET  /health

Each translation is what trax-qkv-translate prints for the request's
sentences with the same options. Requests that arrive together are
decoded together (--max_batch sentences at most, the first waiting at
most --max_wait_ms for others). A request over a limit is answered 4xx
with {"error": ...}. SIGTERM or Ctrl-C stops taking requests, answers
those in flight, and exits 0.
"""

import asyncio
import logging
import signal
import sys

from trax_qkv import cli


def build_parser():
  parser = cli.new_parser('trax-qkv-serve', __doc__)
  cli.add_model_dir_flag(parser)
  parser.add_argument(
    '--host',
    default='127.0.0.1',
    help='address to listen on (default: 127.0.0.1)',
  )
  parser.add_argument(
    '--port',
    type=int,
    default=8000,
    help='port to listen on; 0 picks a free one (default: 8000)',
  )
  cli.add_attention_flag(parser)
  cli.add_positive_int(
    parser, '--max_batch', 32, 'most sentences decoded at once'
  )
  parser.add_argument(
    '--max_wait_ms',
    type=float,
    default=5.0,
    help='how long the first sentence of a batch waits for others, in '
    'milliseconds (default: 5)',
  )
  cli.add_positive_int(
    parser, '--max_sentences', 64, 'most sentences in one request'
  )
  cli.add_positive_int(
    parser, '--max_body_kb', 64, 'largest request body, in KiB'
  )
  cli.add_positive_int(
    parser, '--max_beam', 8, 'largest beam a request may ask'
  )
  return parser


async def serve(app, host, port, model_dir):
  """Serves `app` until SIGTERM or SIGINT, then lets the requests in
  flight finish. ValueError if it cannot listen."""
  from aiohttp import web

  runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=60)
  await runner.setup()
  try:
    await web.TCPSite(runner, host, port).start()
  except OSError as e:
    await runner.cleanup()
    raise ValueError(f'cannot listen on {host}:{port}: {e.strerror}.') from None
  stop = asyncio.Event()
  for signum in (signal.SIGTERM, signal.SIGINT):
    asyncio.get_running_loop().add_signal_handler(signum, stop.set)
  bound_host, bound_port = runner.addresses[0][:2]
  print(
    f'serving {model_dir} on http://{bound_host}:{bound_port}/',
    file=sys.stderr,
    flush=True,
  )
  await stop.wait()
  print(
    'stopping: answering the requests in flight', file=sys.stderr, flush=True
  )
  await runner.cleanup()


def _log_requests():
  """One line per request (aiohttp's access log) and our errors on
  standard error; other libraries' logging stays as it was."""
  handler = logging.StreamHandler(sys.stderr)
  handler.setFormatter(logging.Formatter('%(message)s'))
  for name in ('aiohttp.access', 'trax_qkv.serving'):
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    logger.propagate = False


def main(argv=None):
  args = build_parser().parse_args(argv)
  try:
    from trax_qkv.serving import app as app_lib
  except ModuleNotFoundError as e:
    if e.name != 'aiohttp':
      raise
    print(
      'error: trax-qkv-serve needs aiohttp: pip install "trax_qkv[serve]".',
      file=sys.stderr,
    )
    return 2
  from trax_qkv.serving import batching

  _log_requests()
  try:
    if not 0 <= args.port <= 65535:
      raise ValueError(f'--port must be 0 to 65535; got {args.port}.')
    if not 0 <= args.max_wait_ms <= 10_000:
      raise ValueError(
        f'--max_wait_ms must be 0 to 10000; got {args.max_wait_ms}.'
      )
    batcher = batching.Batcher(
      args.model_dir,
      attention=cli.attention_from_flags(args),
      max_batch=args.max_batch,
      max_wait=args.max_wait_ms / 1000,
    )
    batcher.load()
    limits = app_lib.Limits(
      max_body_bytes=args.max_body_kb * 1024,
      max_sentences=args.max_sentences,
      max_beam=args.max_beam,
    )
    asyncio.run(
      serve(
        app_lib.make_app(batcher, limits), args.host, args.port, args.model_dir
      )
    )
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  return 0
