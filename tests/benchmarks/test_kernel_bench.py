"""The benchmark commands on small shapes (smoke tests: they measure, they
do not judge speed) and the timing harness's own logic."""

import json
import subprocess
import sys
import textwrap

from helpers import ROOT
from helpers import command
import numpy as np
import pytest

from trax_qkv.benchmarks import kernels as kernel_bench
from trax_qkv.benchmarks import timing


def test_interleaved_rounds_rotate_and_prime_each_turn():
  """Each turn: `untimed` calls, then `calls` timed ones; rounds rotate."""
  import jax.numpy as jnp

  log = []

  def contender(name):
    return lambda: log.append(name) or jnp.zeros(())

  times = timing.interleaved_times(
    {'a': contender('a'), 'b': contender('b')},
    rounds=2,
    warmup=1,
    calls=2,
    untimed=1,
  )
  assert log == ['a', 'b'] + ['a'] * 3 + ['b'] * 3 + ['b'] * 3 + ['a'] * 3
  assert {name: len(t) for name, t in times.items()} == {'a': 2, 'b': 2}


class _FakeClock:
  """Stands in for the `time` module of trax_qkv.benchmarks.timing: calls
  advance it by their scripted duration, so turn lengths are exact."""

  def __init__(self):
    self.now = 0.0

  def perf_counter(self):
    return self.now

  def sleep(self, seconds):
    self.now += seconds


def test_short_calls_are_repeated_to_fill_a_turn(monkeypatch):
  """min_turn_seconds: a call of 250 ms is timed once per turn, one of
  1 ms 200 times (the count from the last warm-up call's time), and each
  round's time is per call."""
  import jax.numpy as jnp

  clock = _FakeClock()
  monkeypatch.setattr(timing, 'time', clock)
  counts = {'fast': 0, 'slow': 0}
  result = jnp.zeros(())

  def contender(name, seconds):
    def call():
      counts[name] += 1
      clock.now += seconds
      return result

    return call

  times = timing.interleaved_times(
    {'fast': contender('fast', 0.001), 'slow': contender('slow', 0.25)},
    rounds=2,
    min_turn_seconds=0.2,
    settle=0.3,
    untimed=1,
  )
  assert counts == {'fast': 1 + 2 * (1 + 200), 'slow': 1 + 2 * (1 + 1)}
  assert times['fast'] == pytest.approx([0.001, 0.001])
  assert times['slow'] == pytest.approx([0.25, 0.25])
  with pytest.raises(ValueError, match='warm-up'):
    timing.interleaved_times(
      {'x': contender('fast', 0.0)}, rounds=1, warmup=0, min_turn_seconds=0.1
    )


def test_page_faults_per_call_averages_the_process_counters(monkeypatch):
  """(minor faults, kernel seconds) per call: the difference of the
  process's counters around the timed calls, after one untimed call."""
  import resource

  import jax.numpy as jnp

  usage = iter(
    [
      resource.struct_rusage((0, 1.0) + (0,) * 4 + (100,) + (0,) * 9),
      resource.struct_rusage((0, 1.6) + (0,) * 4 + (400,) + (0,) * 9),
    ]
  )
  monkeypatch.setattr(timing.resource, 'getrusage', lambda who: next(usage))
  calls = []
  faults, kernel_seconds = timing.page_faults_per_call(
    lambda: calls.append(1) or jnp.zeros(()), calls=3
  )
  assert len(calls) == 1 + 3
  assert faults == 100 and kernel_seconds == pytest.approx(0.2)


@pytest.mark.slow
def test_kernel_bench_measures_every_implementation_without_trax(tmp_path):
  """`python3 -m _trax_qkv_cli bench_kernels` on a Python where importing
  trax or tensorflow fails (the kernels and their benchmark need JAX
  alone) measures every implementation of both dtypes, the float32 fast
  paths within their promise of the reference."""
  shape = (2, 16, 24, 16, 4)  # batch, Lq, Lk, d_model, heads
  blocker = textwrap.dedent(f"""
      import runpy, sys
      class Blocked:
        def find_spec(self, name, path=None, target=None):
          if name.split('.')[0] in ('trax', 'tensorflow'):
            raise ModuleNotFoundError(f'No module named {{name}}', name=name)
      sys.meta_path.insert(0, Blocked())
      sys.argv = ['_trax_qkv_cli', 'bench_kernels', '--rounds', '1',
                  '--shape', *{list(map(str, shape))!r}, '--output_dir',
                  {str(tmp_path)!r}]
      sys.path.insert(0, {ROOT!r})
      try:
        runpy.run_module('_trax_qkv_cli', run_name='__main__')
      finally:
        assert not any(m.split('.')[0] in ('trax', 'tensorflow')
                       for m in sys.modules), 'trax or tensorflow imported'
      """)
  done = subprocess.run(
    [sys.executable, '-c', blocker],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads((tmp_path / 'kernel_bench.json').read_text())
  assert [e['dtype'] for e in results['shapes']] == ['bfloat16', 'float32']
  for entry in results['shapes']:
    assert entry['shape'] == list(shape)
    assert set(kernel_bench.implementations_for(entry['dtype'])) == set(
      entry['results']
    )
    for implementation, r in entry['results'].items():
      assert r['fwd_ms'] > 0 and r['fwd_bwd_ms'] > 0, implementation
      if entry['dtype'] == 'float32':  # the fast paths' promise
        assert r['max_rel_error'] < 1e-5, implementation
  table = (tmp_path / 'kernel_bench.md').read_text()
  assert table.count('| 2, 16, 24, 16, 4 |') == 2 * len(
    kernel_bench.implementations_for('float32')
  )


def test_bad_shape_is_refused_before_any_work(capsys):
  with pytest.raises(SystemExit) as exit_info:
    command('bench_kernels').main(['--shape', '1', '8', '8', '10', '4'])
  assert exit_info.value.code == 2
  assert 'HEADS must divide D_MODEL' in capsys.readouterr().err


@pytest.mark.slow
def test_bench_quick_run_keeps_rounds_and_pairs_them(tmp_path):
  """trax-qkv-bench --quick (toy sizes): every contender at every shape,
  each round's time kept, medians and the per-round (paired) speed-ups
  made from them; then every model case, each contender's rounds kept."""
  from trax_qkv.benchmarks import layers as bench
  from trax_qkv.benchmarks import models as model_bench

  rounds = 2
  command('bench').main(
    ['--quick', '--rounds', str(rounds), '--output_dir', str(tmp_path)]
  )
  results = json.loads((tmp_path / 'bench.json').read_text())
  for entry in results['layers']:
    assert set(entry['results']) == set(bench.contenders())
    for name, r in entry['results'].items():
      for key in ('fwd', 'fwd_bwd'):
        times = r[f'{key}_round_ms']
        assert len(times) == rounds and min(times) > 0, name
        assert r[f'{key}_ms'] == pytest.approx(np.median(times))
    builtin, auto = (
      entry['results'][name]['fwd_bwd_round_ms']
      for name in (bench.BUILTIN, 'auto')
    )
    assert bench.round_speedups(entry, 'auto', 'fwd_bwd') == pytest.approx(
      [b / a for b, a in zip(builtin, auto)]
    )
  for key in ('decode_tokens_per_s', 'train_steps_per_s'):
    assert set(results[key]) == {bench.BUILTIN, 'reference', 'auto'}
    assert min(results[key].values()) > 0
  table = (tmp_path / 'bench.md').read_text()
  assert table.count('page faults / call') == len(results['layers'])
  paired_rows = [line for line in table.splitlines() if line.endswith('] |')]
  assert len(paired_rows) == len(results['layers'])
  models = json.loads((tmp_path / 'bench_models.json').read_text())
  assert [e['model'] for e in models['models']] == list(model_bench.QUICK_CASES)
  for entry in models['models']:
    assert set(entry['results']) == set(model_bench.CONTENDERS)
    for r in entry['results'].values():
      assert len(r['train_round_s']) == rounds and min(r['train_round_s']) > 0
      assert r['train_steps_per_s'] > 0 and r['decode_tokens_per_s'] > 0
    assert model_bench.round_speedups(entry, 'auto') == pytest.approx(
      [
        b / a
        for b, a in zip(
          entry['results'][model_bench.BUILTIN]['train_round_s'],
          entry['results']['auto']['train_round_s'],
        )
      ]
    )
  assert (tmp_path / 'bench_models.md').read_text().count('| toy ') >= 2
