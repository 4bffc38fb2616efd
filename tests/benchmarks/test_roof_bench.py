"""trax-qkv-bench --only roof --quick: both layers, both contenders, the
training step, one table."""

import json

from helpers import command
import numpy as np
import pytest

from trax_qkv.benchmarks import layers as layer_bench
from trax_qkv.benchmarks import roof
from trax_qkv.kernels import causal
from trax_qkv.kernels import fused


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


@pytest.mark.parametrize('length', [2048, 1000, 40])
def test_causal_kernel_counts_the_blocks_its_loop_visits(length):
  rows = 16
  tiles = causal._tiles(rows, length, causal.DEFAULT_BLOCK_SIZE, 2**19)
  padded = -(-length // tiles[1]) * tiles[1]
  blocks = causal._Blocks(np.zeros((rows, padded, 8), np.float32), tiles)
  diagonal = sum(
    (queries.stop - queries.start) * keys.stop
    for queries, keys in blocks.sub_blocks()
  )
  visited = 0
  for step in range(blocks.n_steps):
    _, i = blocks.origin(step)
    visited += blocks.tile_rows * (i * blocks.block**2 + diagonal)
  assert causal.logits_computed(rows, length) == visited


@pytest.mark.parametrize('lq', [1024, 1000])
def test_fused_kernel_counts_the_tiles_its_loop_visits(lq):
  batch, heads, lk = 4, 8, 1024
  tiles = fused._step_tiles(batch, heads, lq, lk)
  padded = -(-lq // tiles[2]) * tiles[2]
  tiling = fused._Tiling(
    np.zeros((batch, padded, 256), np.float32),
    np.zeros((batch, lk, 256), np.float32),
    None,
    tiles,
    8,
  )
  visited = tiling.n_steps * tiling.rows * tiling.n_queries * lk
  assert fused.logits_computed(batch, heads, lq, lk) == visited


def test_ceilings_count_what_each_contender_executes():
  batch, length, d, heads = roof.CAUSAL
  projections = 3 * 4 * 2 * batch * length * d * d
  per_logit = 2 * (d // heads)  # FLOPs of one logit in one matmul
  # The built-in computes every logit: 2 matmuls forward, 4 backward.
  every = batch * heads * length * length
  builtin = roof.causal_executed_flops('trax', *roof.CAUSAL)
  assert builtin == projections + 6 * per_logit * every
  # 'auto' runs the causal kernel on a CPU: the 6 blocks of 512 below the
  # diagonal of 4, 3/4 of each of the 4 on it (two query sub-blocks), and
  # q k^T once more in the backward.
  auto = roof.causal_executed_flops('auto', *roof.CAUSAL)
  assert auto == projections + 7 * per_logit * batch * heads * 9 * 512**2
  assert 0.86 < roof.causal_flops(batch, length, d) / auto < 0.87
  # Cross-attention: all logits in both; only the recomputation differs.
  counted = roof.cross_flops(*roof.CROSS[:3])
  assert roof.cross_executed_flops('trax', *roof.CROSS) == counted
  assert counted / roof.cross_executed_flops('auto', *roof.CROSS) == 0.9
  # The quick causal case is small enough for 'auto' to run the reference.
  assert roof.causal_executed_flops(
    'auto', *roof.QUICK_CAUSAL
  ) == roof.causal_executed_flops('trax', *roof.QUICK_CAUSAL)


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
      assert 0.5 < row['ceiling'] <= 1
  step = results['training_step']
  assert step['model'] == roof.QUICK_LM and len(step['round_speedups']) == 1
  table = (tmp_path / 'bench_roof.md').read_text()
  assert '| causal self-attention | 2, 256, 128, 4 | auto |' in table
