"""trax-qkv-bench --only checkpoints: both readers load the same checkpoint."""

import pytest

from trax_qkv.benchmarks import checkpoints


@pytest.mark.slow
def test_checkpoint_bench_times_both_readers():
  results = checkpoints.run(rounds=1, log=lambda line: None)
  assert set(results['times_s']) == {'trax', 'trax_qkv'}
  assert results['checkpoint_mb'] > 50  # the Multi30k-sized model
  assert results['ratio_median'] > 0
  assert '| trax_qkv (`ResumableLoop.load_checkpoint`) |' in (
      checkpoints.markdown(results))
