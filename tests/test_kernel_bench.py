"""scripts/bench_kernels.py's functions on a tiny shape (a smoke test)."""

import json

import pytest

from trax_qkv import kernel_bench
from helpers import load_script


def test_kernel_bench_measures_every_implementation(tmp_path):
  shape = (2, 16, 24, 16, 4)  # batch, Lq, Lk, d_model, heads
  load_script('bench_kernels').main([
      '--rounds', '1', '--shape', *map(str, shape),
      '--output_dir', str(tmp_path)])
  results = json.loads((tmp_path / 'kernel_bench.json').read_text())
  assert [e['dtype'] for e in results['shapes']] == ['bfloat16', 'float32']
  for entry in results['shapes']:
    assert entry['shape'] == list(shape)
    assert set(kernel_bench.implementations_for(entry['dtype'])) == set(
        entry['results'])
    for implementation, r in entry['results'].items():
      assert r['fwd_ms'] > 0 and r['fwd_bwd_ms'] > 0, implementation
      if entry['dtype'] == 'float32':  # the fast paths' promise
        assert r['max_rel_error'] < 1e-5, implementation
  table = (tmp_path / 'kernel_bench.md').read_text()
  assert table.count('| 2, 16, 24, 16, 4 |') == 2 * len(
      kernel_bench.implementations_for('float32'))


def test_bad_shape_is_refused_before_any_work(capsys):
  with pytest.raises(SystemExit) as exit_info:
    load_script('bench_kernels').main(['--shape', '1', '8', '8', '10', '4'])
  assert exit_info.value.code == 2
  assert 'HEADS must divide D_MODEL' in capsys.readouterr().err
