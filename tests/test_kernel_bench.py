"""scripts/bench_kernels.py and scripts/bench.py on small shapes (smoke
tests: they measure, they do not judge speed)."""

import json

import numpy as np
import pytest

from trax_qkv.benchmarks import kernels as kernel_bench
from trax_qkv.benchmarks import timing
from helpers import command


def test_kernel_bench_measures_every_implementation(tmp_path):
  shape = (2, 16, 24, 16, 4)  # batch, Lq, Lk, d_model, heads
  command('bench_kernels').main([
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


def test_interleaved_rounds_rotate_and_prime_each_turn():
  """Each turn: `untimed` calls, then `calls` timed ones; rounds rotate."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  log = []

  def contender(name):
    return lambda: log.append(name) or jnp.zeros(())
  times = timing.interleaved_times(
      {'a': contender('a'), 'b': contender('b')}, rounds=2, warmup=1,
      calls=2, untimed=1)
  assert log == ['a', 'b'] + ['a'] * 3 + ['b'] * 3 + ['b'] * 3 + ['a'] * 3
  assert {name: len(t) for name, t in times.items()} == {'a': 2, 'b': 2}


def test_short_calls_are_repeated_to_fill_a_turn():
  """min_turn_seconds: a 250 ms call is timed once per turn, a call of
  microseconds many times (counts from the last warm-up call's time; the
  bound leaves room for that call to be preempted for up to 50 ms)."""
  import time  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  counts = {'fast': 0, 'slow': 0}
  result = jnp.zeros(())  # made once: no dispatch or compile in the calls

  def contender(name, seconds):
    def call():
      counts[name] += 1
      if seconds:
        time.sleep(seconds)
      return result
    return call
  timing.interleaved_times(
      {'fast': contender('fast', 0.0), 'slow': contender('slow', 0.25)},
      rounds=2, min_turn_seconds=0.2)
  assert counts['slow'] == 1 + 2  # warm-up, then one timed call per turn
  assert counts['fast'] >= 1 + 2 * 4
  with pytest.raises(ValueError, match='warm-up'):
    timing.interleaved_times({'x': contender('fast', 0.0)}, rounds=1,
                                   warmup=0, min_turn_seconds=0.1)


def test_page_faults_count_fresh_memory():
  """A call that writes a fresh 64 MB output faults on its pages; one that
  writes 4 KB does not (malloc maps the big buffer afresh every call)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  fill = jax.jit(lambda x, n: jnp.full((n,), x), static_argnums=1)
  pages = 2**26 // 4096
  big, _ = timing.page_faults_per_call(lambda: fill(1.0, 2**24))
  small, _ = timing.page_faults_per_call(lambda: fill(1.0, 2**10))
  assert big > pages / 2 and small < pages / 16, (big, small)


def test_bad_shape_is_refused_before_any_work(capsys):
  with pytest.raises(SystemExit) as exit_info:
    command('bench_kernels').main(['--shape', '1', '8', '8', '10', '4'])
  assert exit_info.value.code == 2
  assert 'HEADS must divide D_MODEL' in capsys.readouterr().err


@pytest.mark.slow
def test_bench_quick_run_keeps_rounds_and_pairs_them(tmp_path):
  """scripts/bench.py --quick: every contender at every shape, each round's
  time kept, medians and the per-round (paired) speed-ups made from them."""
  from trax_qkv.benchmarks import layers as bench  # pylint: disable=g-import-not-at-top
  rounds = 2
  command('bench').main(['--quick', '--rounds', str(rounds),
                             '--output_dir', str(tmp_path)])
  results = json.loads((tmp_path / 'bench.json').read_text())
  for entry in results['layers']:
    assert set(entry['results']) == set(bench.contenders())
    for name, r in entry['results'].items():
      for key in ('fwd', 'fwd_bwd'):
        times = r[f'{key}_round_ms']
        assert len(times) == rounds and min(times) > 0, name
        assert r[f'{key}_ms'] == pytest.approx(np.median(times))
      assert r['fwd_bwd_page_faults'] >= 0 and r['fwd_bwd_kernel_ms'] >= 0
    builtin, auto = (entry['results'][name]['fwd_bwd_round_ms']
                     for name in (bench.BUILTIN, 'auto'))
    assert bench.round_speedups(entry, 'auto', 'fwd_bwd') == pytest.approx(
        [b / a for b, a in zip(builtin, auto)])
  for key in ('decode_tokens_per_s', 'train_steps_per_s'):
    assert set(results[key]) == {bench.BUILTIN, 'reference', 'auto'}
    assert min(results[key].values()) > 0
  table = (tmp_path / 'bench.md').read_text()
  assert table.count('page faults / call') == len(results['layers'])
  paired_rows = [line for line in table.splitlines() if line.endswith('] |')]
  assert len(paired_rows) == len(results['layers'])
