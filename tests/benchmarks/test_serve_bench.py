"""trax-qkv-bench --only serve at toy size: it runs, and what it checks
(answers against trax-qkv-translate's, 4xx for malformed requests, a clean
exit) is in its results."""

import os

from helpers import ROOT
import pytest

pytest.importorskip(
  'aiohttp', reason='the serve bench needs aiohttp (.[serve])'
)

from trax_qkv.benchmarks import serving  # noqa: E402

MODEL = os.path.join(ROOT, 'tests', 'fixtures', 'release_0.2.0')


@pytest.mark.slow
def test_serve_bench_quick(tmp_path):
  sentences = tmp_path / 'sentences.txt'
  sentences.write_text(
    open(os.path.join(MODEL, 'sources.txt'), encoding='utf-8').read()
  )
  results = serving.run(
    MODEL, str(sentences), clients=2, requests=3, rounds=1, log=lambda _: None
  )
  assert results['answers_compared'] == 2 * 3 * 2
  assert results['answers_differing'] == 0
  assert results['bad_requests_sent'] >= len(serving.BAD_REQUESTS)
  assert (
    results['bad_requests_answered_as_expected'] == results['bad_requests_sent']
  )
  assert results['server_exit_status'] == 0
  assert len(results['rounds_measured']) == 1
  serving.write(results, str(tmp_path / 'out'))
  table = (tmp_path / 'out' / 'bench_serve.md').read_text()
  assert '| requests/s |' in table and '12 of 12' in table
