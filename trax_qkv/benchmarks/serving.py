"""The server under load (`trax-qkv-bench --only serve`).

Starts `trax-qkv-serve` on a model directory (a process of its own, on a
free port) and runs `trax-qkv-translate` on the same sentences, one per
line, as the answers to check against. Then `clients` concurrent clients
each send `requests` requests of one sentence, one after another (a
client sends its next request when its answer is back), for `rounds`
rounds after one untimed warm-up round. Meanwhile one more client sends
every malformed request of `BAD_REQUESTS`, again and again.

Per round: requests answered per second (the round's requests over its
wall time), and the median, 95th percentile and largest latency of its
requests. Every answer is compared with the command's line for its
sentence; both decode with the same length limit (--max_length, default
the model's longest output), as `trax-qkv-translate` only sets one limit
for a whole file. The client runs in this process, on the same cores as
the server.
"""

import asyncio
import collections
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

from trax_qkv.benchmarks import timing

CLIENTS, REQUESTS, ROUNDS = 8, 100, 3

# Malformed requests (body, the status expected), sent during the load.
BAD_REQUESTS = (
  (b'{"sentences": ["a"', 400),  # not JSON
  (b'["a"]', 400),  # not an object
  (b'{"sentences": ["a"], "beams": 2}', 400),  # unknown field
  (json.dumps({'sentences': ['a'] * 65}).encode(), 413),  # too many
  (json.dumps({'sentences': ['a' * 70_000]}).encode(), 413),  # body size
  (b'{"sentences": ["a"], "beam": 99}', 400),  # beam out of range
  (json.dumps({'sentences': ['ein ' * 200]}).encode(), 400),  # too long
)


def _command(name, *args):
  return [sys.executable, '-m', '_trax_qkv_cli', name, *args]


def batch_command_lines(model_dir, sentences_file, max_length, log=print):
  """(the lines `trax-qkv-translate` prints for the file, its wall time)."""
  start = time.perf_counter()
  with open(sentences_file, 'rb') as stdin:
    out = subprocess.run(
      _command(
        'translate', '--model_dir', model_dir, '--max_length', str(max_length)
      ),
      stdin=stdin, capture_output=True, check=True,
    )  # fmt: skip
  seconds = time.perf_counter() - start
  log(f'trax-qkv-translate: {seconds:.1f} s for the file')
  return out.stdout.decode('utf-8').splitlines(), seconds


def start_server(model_dir, *flags):
  """(the server process, its URL) once it listens; its standard error
  (a line per request) is read and dropped from then on."""
  process = subprocess.Popen(
    _command('serve', '--model_dir', model_dir, '--port', '0', *flags),
    stderr=subprocess.PIPE, text=True,
  )  # fmt: skip
  for line in process.stderr:
    if line.startswith('serving '):
      threading.Thread(
        target=collections.deque, args=(process.stderr, 0), daemon=True
      ).start()
      return process, line.split(' on ')[-1].strip().rstrip('/')
  raise RuntimeError(f'trax-qkv-serve exited with {process.wait()}')


async def _client(session, url, sentences, max_length, latencies, answers):
  import aiohttp

  for index, sentence in sentences:
    start = time.perf_counter()
    async with session.post(
      url + '/translate',
      json={'sentences': [sentence], 'max_length': max_length},
      timeout=aiohttp.ClientTimeout(total=600),
    ) as response:
      body = await response.json()
    latencies.append(time.perf_counter() - start)
    answers[index] = body['translations'][0] if response.status == 200 else body


async def _bad_client(session, url, stop, statuses):
  while not stop.is_set():
    for body, expected in BAD_REQUESTS:
      async with session.post(url + '/translate', data=body) as response:
        statuses.append((response.status, expected))
        await response.read()
    await asyncio.sleep(0.5)


async def _round(url, sentences, clients, requests, max_length, offset):
  """(wall seconds, latencies, {index: answer}, bad statuses) of one
  round: client c sends sentences offset + c * requests + j."""
  import aiohttp

  latencies, answers, statuses = [], {}, []
  stop = asyncio.Event()
  connector = aiohttp.TCPConnector(limit=clients + 1)
  async with aiohttp.ClientSession(connector=connector) as session:
    bad = asyncio.create_task(_bad_client(session, url, stop, statuses))
    start = time.perf_counter()
    sent = [
      [(offset + c * requests + j) % len(sentences) for j in range(requests)]
      for c in range(clients)
    ]
    await asyncio.gather(
      *[
        _client(
          session,
          url,
          [(i, sentences[i]) for i in indices],
          max_length,
          latencies,
          answers,
        )  # fmt: skip
        for indices in sent
      ]
    )
    seconds = time.perf_counter() - start
    stop.set()
    await bad
  return seconds, latencies, answers, statuses


def run(
  model_dir,
  sentences_file,
  clients=CLIENTS,
  requests=REQUESTS,
  rounds=ROUNDS,
  max_length=None,
  log=print,
):
  """Results of the load (see the module doc) as a JSON-able dict."""
  from trax_qkv.supervised import model_dir as model_dir_lib

  settings = model_dir_lib.load(model_dir).settings
  max_length = max_length or settings['max_len'] - 1
  with open(sentences_file, encoding='utf-8') as f:
    sentences = f.read().splitlines()
  expected, command_seconds = batch_command_lines(
    model_dir, sentences_file, max_length, log
  )
  process, url = start_server(model_dir)
  try:
    per_round, mismatches, bad = [], 0, []
    for r in range(rounds + 1):  # round 0 warms up
      seconds, latencies, answers, statuses = asyncio.run(
        _round(url, sentences, clients, requests, max_length,
               r * clients * requests)
      )  # fmt: skip
      mismatches += sum(answers[i] != expected[i] for i in answers)
      bad += statuses
      if r == 0:
        log(f'warm-up: {seconds:.1f} s')
        continue
      latencies = np.array(latencies)
      per_round.append(
        dict(
          requests_per_s=len(latencies) / seconds,
          p50_s=float(np.percentile(latencies, 50)),
          p95_s=float(np.percentile(latencies, 95)),
          max_s=float(latencies.max()),
        )
      )
      log(
        f'round {r}: {per_round[-1]["requests_per_s"]:.1f} requests/s, '
        f'p50 {per_round[-1]["p50_s"] * 1000:.0f} ms, '
        f'p95 {per_round[-1]["p95_s"] * 1000:.0f} ms'
      )
    with _urlopen(url + '/health') as response:
      health = json.load(response)
  finally:
    process.terminate()
    exit_status = process.wait(120)
  return dict(
    model_dir=os.path.abspath(model_dir),
    model=settings,
    sentences=len(sentences),
    clients=clients,
    requests_per_client=requests,
    rounds=rounds,
    max_length=max_length,
    command_seconds=command_seconds,
    rounds_measured=per_round,
    **{
      key: timing.spread([r[key] for r in per_round])
      for key in ('requests_per_s', 'p50_s', 'p95_s', 'max_s')
    },
    answers_compared=(rounds + 1) * clients * requests,
    answers_differing=mismatches,
    bad_requests_sent=len(bad),
    bad_requests_answered_as_expected=sum(got == want for got, want in bad),
    mean_batch=health['sentences'] / max(health['batches'], 1),
    server_exit_status=exit_status,
  )


def _urlopen(url):
  import urllib.request

  return urllib.request.urlopen(url, timeout=60)


def markdown(results):
  r = results
  rows = [
    ('requests/s', 'requests_per_s', '{:.1f}'),
    ('p50 latency, ms', 'p50_s', '{:.0f}', 1000),
    ('p95 latency, ms', 'p95_s', '{:.0f}', 1000),
    ('largest latency, ms', 'max_s', '{:.0f}', 1000),
  ]
  lines = [
    f'{r["clients"]} clients x {r["requests_per_client"]} requests of one '
    f'sentence, {r["rounds"]} rounds after a warm-up round; medians '
    f'(min-max) of the rounds. max_length {r["max_length"]}.',
    '',
    '| measure | median | min-max |',
    '|---|---|---|',
  ]
  for label, key, form, *scale in rows:
    s = scale[0] if scale else 1
    lines.append(
      f'| {label} | {form.format(r[key]["median"] * s)} | '
      f'{form.format(r[key]["min"] * s)}-{form.format(r[key]["max"] * s)} |'
    )
  lines += [
    '',
    f'Answers equal to the trax-qkv-translate line: '
    f'{r["answers_compared"] - r["answers_differing"]} of '
    f'{r["answers_compared"]}. Malformed requests answered with the '
    f'expected 4xx: {r["bad_requests_answered_as_expected"]} of '
    f'{r["bad_requests_sent"]}. Sentences per decoded batch: '
    f'{r["mean_batch"]:.1f}. trax-qkv-translate on the '
    f'{r["sentences"]} sentences: {r["command_seconds"]:.1f} s. Server '
    f'exit status after SIGTERM: {r["server_exit_status"]}.',
  ]
  return '\n'.join(lines) + '\n'


def write(results, output_dir):
  timing.write_results(results, output_dir, 'bench_serve', markdown(results))
