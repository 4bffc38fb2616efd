"""trax-qkv-bench --only roof --quick: both layers, both contenders, the
training step, one table."""

import json

from helpers import command
import pytest

from trax_qkv.benchmarks import layers as layer_bench
from trax_qkv.benchmarks import roof


def test_causal_flops_count_the_visible_logits():
  # One position, one feature: 4 projections of 2 FLOPs, one visible
  # logit of 4 FLOPs; forward + backward is three forwards.
  assert roof.causal_flops(1, 1, 1) == 3 * (8 + 4)
  # Cross-attention counts every logit, as the layer bench does.
  full = layer_bench.attention_flops(2, 2048, 2048, 512) * 3
  assert roof.cross_flops(2, 2048, 512) == full
  # Causal attention at 2 x 2048 (d 512): the same projections, and half
  # of the full count of logits plus the diagonal.
  projections = 3 * 4 * 2 * 2 * 2048 * 512 * 512
  all_logits = full - projections
  diagonal = 3 * 4 * 2 * 2048 * 512
  attention = roof.causal_flops(2, 2048, 512) - projections
  assert attention == all_logits // 2 + diagonal // 2


@pytest.mark.slow
def test_roof_bench_quick(tmp_path):
  assert (
    command('bench').main(
      ['--only', 'roof', '--quick', '--rounds', '1']
      + ['--output_dir', str(tmp_path)]
    )
    == 0
  )
  results = json.loads((tmp_path / 'bench_roof.json').read_text())
  assert set(results['layers']) == {'causal self-attention', 'cross-attention'}
  for entry in results['layers'].values():
    assert set(entry['rows']) == {'trax', 'auto'}
    for row in entry['rows'].values():
      assert 0 < row['matmul_fraction']['median'] < 2
  step = results['training_step']
  assert step['model'] == roof.QUICK_LM and len(step['round_speedups']) == 1
  table = (tmp_path / 'bench_roof.md').read_text()
  assert '| causal self-attention | 2, 256, 128, 4 | auto |' in table
