"""trax-qkv-bench --only checkpoints --quick: both readers load the same
checkpoint (the toy Transformer's; the table's is the Multi30k-sized
model's: `checkpoints.QUICK_MODEL` and `MODEL`)."""

import pytest

from trax_qkv.benchmarks import checkpoints


@pytest.mark.slow
def test_checkpoint_bench_times_both_readers():
  results = checkpoints.run(rounds=1, quick=True, log=lambda line: None)
  assert set(results['times_s']) == {'trax', 'trax_qkv', 'trax_qkv_resume'}
  assert results['model'] == 'the toy Transformer'
  assert results['checkpoint_mb'] > 0
  assert results['trax_qkv_ratio_median'] > 0
  assert results['trax_qkv_resume_ratio_median'] > 0
  table = checkpoints.markdown(results)
  assert table.startswith('Checkpoint of the toy Transformer (')
  assert '| trax_qkv (`ResumableLoop.load_checkpoint`) |' in table
  assert '| trax_qkv, a resume in all (files checked, then loaded) |' in table
