"""trax-qkv-serve, run as users run it (a process on a port): answers equal
to trax-qkv-translate's, concurrent requests batched, limits answered 4xx
while the load goes on, the attention map as JSON, PNG and a page in a
real browser, and SIGTERM.

The model is release 0.2.0's committed model directory: barely trained,
its hypotheses run to their length limit, so an answer decoded with
another limit than the command's would show."""

import concurrent.futures
import functools
import json
import os
import random
import shutil
import signal
import socket
import time
import urllib.error
import urllib.request

from helpers import ROOT
from helpers import Server
from helpers import command
import numpy as np
import pytest

pytest.importorskip('aiohttp', reason='trax-qkv-serve needs aiohttp (.[serve])')

from trax_qkv.supervised import attention_maps  # noqa: E402
from trax_qkv.supervised import translation  # noqa: E402

MODEL = os.path.join(ROOT, 'tests', 'fixtures', 'release_0.2.0')
CHROMIUM = os.environ.get('TRAX_QKV_CHROMIUM', '/usr/bin/chromium')


@pytest.fixture(scope='module')
def model_dir(tmp_path_factory):
  """A copy of MODEL, or $TRAX_QKV_SERVE_MODEL_DIR (to take the page's
  screenshot of a real model: docs/serving.md)."""
  if os.environ.get('TRAX_QKV_SERVE_MODEL_DIR'):
    return os.environ['TRAX_QKV_SERVE_MODEL_DIR']
  copy = tmp_path_factory.mktemp('serve') / 'model'
  shutil.copytree(MODEL, copy)
  return str(copy)


@pytest.fixture(scope='module')
def server(model_dir):
  server = Server(model_dir, '--max_wait_ms', '50')
  yield server
  server.stop()


def _sentences(n, seed):
  from num2words import num2words

  rng = random.Random(seed)
  return [num2words(rng.randrange(10 ** rng.randrange(1, 7))) for _ in range(n)]


def _requests(seed):
  """Requests of 1 to 4 sentences, a blank one among them, greedy and
  with two beams, some with their own max_length."""
  rng = random.Random(seed)
  out = []
  for i in range(10):
    sentences = _sentences(rng.randrange(1, 5), seed * 100 + i)
    body = {'sentences': sentences}
    if i % 4 == 1:  # one limit: a beam program per limit
      body.update(beam=2, max_length=12)
    elif i % 3 == 2:
      body['max_length'] = rng.randrange(3, 30)
    out.append(body)
  out[0]['sentences'].append('  ')
  return out


@functools.cache
def _translator(model_dir, n_beams, alpha, max_length):
  return translation.Translator(
    model_dir, n_beams=n_beams, alpha=alpha, max_length=max_length
  )


def _expected(model_dir, body):
  """What `trax-qkv-translate` prints for the request's sentences (as
  `translation.translate`, its Translator kept for the next request)."""
  return _translator(
    model_dir, body.get('beam', 1), body.get('alpha', 0.6),
    body.get('max_length'),
  ).translate(body['sentences'])  # fmt: skip


def _post_all(server, bodies, threads=8):
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    return list(pool.map(lambda b: server.post('/translate', b), bodies))


@pytest.mark.slow
def test_concurrent_requests_are_batched_and_answered_as_the_command(
  server, model_dir
):
  bodies = _requests(seed=1)
  before = json.loads(server.get('/health'))
  answers = _post_all(server, bodies)
  after = json.loads(server.get('/health'))
  for body, (status, answer) in zip(bodies, answers):
    assert status == 200, answer
    assert answer == {'translations': _expected(model_dir, body)}
  assert after['requests'] - before['requests'] == len(bodies)
  # Greedy requests of all limits share batches: fewer than requests.
  assert after['batches'] - before['batches'] < len(bodies)


BAD = [
  (b'{"sentences": ["a"', 400, 'the body is not JSON'),
  (b'\xff\xfe', 400, 'the body is not JSON'),
  (b'["a"]', 400, 'must be a JSON object; got list'),
  (b'{}', 400, 'must have "sentences"'),
  ({'sentences': ['a'], 'beams': 2}, 400, "unknown field(s) 'beams'"),
  ({'sentences': 'a'}, 400, '"sentences" must be a list of strings'),
  ({'sentences': [1]}, 400, '"sentences" must be a list of strings'),
  ({'sentences': []}, 400, 'must hold 1 to 64 sentences; got 0'),
  ({'sentences': ['a'] * 65}, 413, 'must hold 1 to 64 sentences; got 65'),
  ({'sentences': ['a' * 70_000]}, 413, 'larger than 65536 bytes'),
  ({'sentences': ['a'], 'beam': 0}, 400, 'beam must be an int from 1 to 8'),
  ({'sentences': ['a'], 'beam': 9}, 400, 'beam must be an int from 1 to 8'),
  ({'sentences': ['a'], 'beam': True}, 400, 'beam must be an int'),
  ({'sentences': ['a'], 'alpha': -1}, 400, 'alpha must be a finite number'),
  ({'sentences': ['a'], 'alpha': 'x'}, 400, 'alpha must be a finite number'),
  ({'sentences': ['a'], 'max_length': 0}, 400, 'max_length must be null'),
  ({'sentences': ['a'], 'max_length': 64}, 400, 'int from 1 to 63'),
  (
    {'sentences': ['one', 'twenty-one ' * 30]},
    400,
    'longer than the model takes (64 subwords with EOS, its max_len): '
    'sentence 2',
  ),
]


@pytest.mark.slow
def test_bad_requests_are_4xx_and_the_load_goes_on(server, model_dir):
  load = _requests(seed=1)  # the shapes compiled above, for a steady load
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    answers = pool.submit(_post_all, server, load, 4)
    for body, status, message in BAD:
      got, answer = server.post('/translate', body)
      assert (got, message in answer['error']) == (status, True), answer
    for body, status, message in (
      ({'sentence': ' '}, 400, '"sentence" must be a non-empty string'),
      ({'sentence': 'one', 'format': 'gif'}, 400, '"format" must be'),
      ({'sentence': 'one', 'target': 'x ' * 80}, 400, 'target has'),
    ):
      got, answer = server.post('/attention', body)
      assert (got, message in answer['error']) == (status, True), answer
    for body, (status, answer) in zip(load, answers.result()):
      assert status == 200
      assert answer['translations'] == _expected(model_dir, body)
  assert server.process.poll() is None
  assert not any('Traceback' in line for line in server.log), server.log


@pytest.mark.slow
def test_attention_as_json_and_png(server, model_dir):
  sentence = 'one hundred and thirty-one'
  status, answer = server.post('/attention', {'sentence': sentence})
  assert status == 200
  # Trax's own cross-attention layer on the same checkpoint.
  sources, targets, weights, target = attention_maps.for_sentence(
    model_dir, sentence, attention={'cross_attention': 'trax'}
  )
  assert answer['translation'] == target
  assert server.post('/translate', {'sentences': [sentence]})[1] == {
    'translations': [target]
  }
  assert (answer['source_tokens'], answer['target_tokens']) == (
    sources,
    targets,
  )
  assert len(answer['weights']) == len(weights)
  # Cross-attention, by its shape: each target token over the source
  # tokens (of other lengths here), not the encoder's self-attention.
  n_src, n_tgt = len(sources), len(targets)
  assert n_src != n_tgt
  for got, want in zip(answer['weights'], weights, strict=True):
    assert np.shape(got)[1:] == (n_tgt, n_src)
    assert np.allclose(np.sum(got, axis=-1), 1.0, atol=1e-5)
    assert np.array_equal(np.asarray(got, np.float32), want)
  # The server reuses its compiled viz model: a sentence of another shape
  # between, and the first one's answer is the same.
  assert server.post('/attention', {'sentence': 'five'})[0] == 200
  assert server.post('/attention', {'sentence': sentence})[1] == answer
  status, png = server.post(
    '/attention', {'sentence': 'eighty-one', 'format': 'png'}, raw=True
  )
  assert status == 200 and png.startswith(b'\x89PNG\r\n\x1a\n')


def _browser():
  """Playwright's Chromium on Debian's binary, or a skip that says why."""
  playwright = pytest.importorskip(
    'playwright.sync_api', reason='playwright is not installed (.[test])'
  )
  if not os.path.exists(CHROMIUM):
    pytest.skip(f'no Chromium at {CHROMIUM} (.ci/run installs Debian chromium)')
  return playwright.sync_playwright()


@pytest.mark.slow
def test_the_page_translates_and_draws_every_head(server, tmp_path):
  sentence = os.environ.get('TRAX_QKV_PAGE_SENTENCE', 'one hundred and two')
  with _browser() as p:
    browser = p.chromium.launch(executable_path=CHROMIUM)
    page = browser.new_page(viewport={'width': 1100, 'height': 700})
    page.goto(server.url + '/')
    page.fill('#sentence', sentence)
    page.click('#go')
    page.wait_for_selector('.head canvas', timeout=120_000)
    shown = page.inner_text('#translation')
    n_maps = page.locator('.head canvas').count()
    painted = page.evaluate(
      """() => [...document.querySelectorAll('.head canvas')].map(c => {
           const d = c.getContext('2d').getImageData(0, 0, c.width,
                                                     c.height).data;
           let colored = 0;
           for (let i = 0; i < d.length; i += 4)
             if (d[i] !== d[i + 1] || d[i + 1] !== d[i + 2]) colored++;
           return colored; })"""
    )
    legend = page.inner_text('#legend')
    page.screenshot(
      path=os.environ.get(
        'TRAX_QKV_PAGE_SCREENSHOT', str(tmp_path / 'page.png')
      ),
      full_page=True,
    )
    browser.close()
  settings = json.load(open(os.path.join(server.model_dir, 'model.json')))
  assert (
    shown
    == server.post('/translate', {'sentences': [sentence]})[1]['translations'][
      0
    ]
  )
  assert n_maps == settings['n_decoder_layers'] * settings['n_heads']
  assert all(colored > 0 for colored in painted)
  tokens = server.post('/attention', {'sentence': sentence})[1]
  for token in tokens['source_tokens'] + tokens['target_tokens']:
    assert token.strip() in legend


def test_serve_refuses_a_bad_model_dir_and_a_busy_port(
  model_dir, tmp_path, capsys
):
  serve = command('serve')
  assert serve.main(['--model_dir', str(tmp_path / 'none')]) == 2
  assert 'error: ' in capsys.readouterr().err
  with socket.socket() as busy:
    busy.bind(('127.0.0.1', 0))
    busy.listen()
    port = busy.getsockname()[1]
    assert serve.main(['--model_dir', model_dir, '--port', str(port)]) == 2
  assert f'cannot listen on 127.0.0.1:{port}' in capsys.readouterr().err


@pytest.mark.slow
def test_sigterm_answers_the_requests_in_flight_and_exits_0(server, model_dir):
  # Last in this module: it stops the module's server. A beam search of
  # its own alpha compiles first, so the requests are in flight.
  bodies = [
    {'sentences': s, 'beam': 3, 'alpha': 0.3} for s in (_sentences(3, 7),
                                                         _sentences(2, 8))
  ]  # fmt: skip

  def received():
    return json.loads(server.get('/health'))['requests']

  before = received()
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    answers = [pool.submit(server.post, '/translate', b) for b in bodies]
    deadline = time.time() + 120
    while received() < before + 2:  # both taken by the server
      assert time.time() < deadline, 'the server took no requests in 120 s'
      time.sleep(0.01)
    assert not any(a.done() for a in answers)  # and not yet answered
    server.process.send_signal(signal.SIGTERM)
    results = [a.result() for a in answers]
  assert server.process.wait(120) == 0
  for body, (status, answer) in zip(bodies, results):
    assert status == 200
    assert answer['translations'] == _expected(model_dir, body)
  assert any(line.startswith('stopping') for line in server.log)
  with pytest.raises(urllib.error.URLError):
    server.get('/health')
