"""trax-qkv-bench --only decoding --quick: every contender, one table."""

import json

from helpers import command
import pytest


@pytest.mark.slow
def test_decoding_bench_quick(tmp_path, capsys):
  assert (
    command('bench').main(
      ['--only', 'decoding', '--quick', '--rounds', '1']
      + ['--output_dir', str(tmp_path)]
    )
    == 0
  )
  out = capsys.readouterr().out
  # The loop and the compiled search decoded the same tokens.
  assert 'decoded other tokens' not in out
  results = json.loads((tmp_path / 'bench_decoding.json').read_text())
  transformer = results['models']['Transformer (Multi30k-sized)']
  assert set(transformer['rows']) == {
    'greedy / autoregressive_sample',
    'greedy / python loop',
    'greedy / compiled',
    'beam 4 / python loop',
    'beam 4 / compiled',
  }
  assert set(transformer['ratios']) == {
    'greedy: compiled vs python loop',
    'beam 4: compiled vs python loop',
    'compiled: beam 4 / greedy time',
  }
  lm = results['models']['TransformerLM']
  assert set(lm['rows']) == {
    'greedy / autoregressive_sample',
    'greedy / python loop',
    'greedy / compiled',
  }
  for row in list(transformer['rows'].values()) + list(lm['rows'].values()):
    assert row['flops'] > 0 and 0 < row['matmul_fraction'] < 2
  assert '| Transformer (Multi30k-sized) | beam 4 | compiled |' in (
    (tmp_path / 'bench_decoding.md').read_text()
  )
