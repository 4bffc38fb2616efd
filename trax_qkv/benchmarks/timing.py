"""Timing helpers for benchmarks on any JAX device (JAX only, no Trax).

Timings are medians of interleaved rounds (one turn of each contender per
round) after warm-up; each turn pauses, makes one untimed call and then
times back-to-back dispatches with one wait, so that neither a cold start
nor, on a GPU, the launch latency of a short kernel is what is measured
(see `interleaved_times`).
"""

import math
import os
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np

from trax_qkv import files

# Seconds to pause before each timed call on a CPU (see interleaved_times).
CPU_SETTLE_SECONDS = 0.3


def settle_seconds():
  """The pause before each timed call on this backend: none on a GPU."""
  return 0.0 if jax.default_backend() == 'gpu' else CPU_SETTLE_SECONDS


def block_until_ready(tree):
  """Waits for the JAX arrays of `tree`; other leaves (NumPy, ints: the
  results of host-side loops) are ready already."""
  for leaf in jax.tree_util.tree_leaves(tree):
    if isinstance(leaf, jax.Array):
      leaf.block_until_ready()
  return tree


def interleaved_medians(fns, rounds, **timing):
  """{name: median seconds per call}; `timing` as in `interleaved_times`."""
  times = interleaved_times(fns, rounds, **timing)
  return {name: float(np.median(t)) for name, t in times.items()}


def interleaved_times(
  fns, rounds, warmup=1, calls=1, settle=0.0, untimed=0, min_turn_seconds=0.0
):
  """{name: [seconds per call in each round]} of zero-argument callables.

  Contenders run round-robin, one turn each per round, so that a machine
  slowing down or speeding up affects all of them alike, and each round
  starts one contender later. A turn times `calls` back-to-back calls, or
  more where the contender's last warm-up call says that `calls` would take
  under `min_turn_seconds`: a 30 ms call timed alone moves by several ms
  from round to round on this machine, an average over 0.1 s much less.
  Before each turn the process sleeps `settle` seconds: on a CPU a call
  right after one that freed hundreds of MB (the built-in at length >=
  1024) measured 10-25 % slower while the kernel was still reclaiming that
  memory. `untimed` calls of the contender then run before its timed ones:
  the first call after the pause pays for waking the idle thread pool and
  cold caches (at (8, 256, 256, 8) 'fused' forward+backward measured 62 ms
  that way and 47 ms right after a call of itself, the built-in 73 ms both
  ways), a cost a training loop, which runs its steps back to back, does
  not pay.
  """
  if min_turn_seconds and warmup < 1:
    raise ValueError('min_turn_seconds needs a warm-up call to time')
  turn_calls = {}
  for name, fn in fns.items():
    for _ in range(warmup):
      start = time.perf_counter()
      block_until_ready(fn())
      seconds = time.perf_counter() - start
    turn_calls[name] = (
      calls
      if not min_turn_seconds
      else max(calls, math.ceil(min_turn_seconds / seconds))
    )
  times = {name: [] for name in fns}
  names = list(fns)
  for round_index in range(rounds):
    shift = round_index % len(names)
    for name in names[shift:] + names[:shift]:
      fn = fns[name]
      time.sleep(settle)
      for _ in range(untimed):
        block_until_ready(fn())
      start = time.perf_counter()
      for _ in range(turn_calls[name]):
        out = fn()
      block_until_ready(out)
      times[name].append((time.perf_counter() - start) / turn_calls[name])
  return times


def spread(values):
  """{'median', 'min', 'max'} of per-round values, as floats."""
  return dict(
    median=float(np.median(values)),
    min=float(np.min(values)),
    max=float(np.max(values)),
  )


def page_faults_per_call(fn, calls=3):
  """(page faults, kernel CPU seconds) per call of zero-argument `fn`.

  From the process's own counters (getrusage, all threads), after one
  untimed call: on a CPU, temporaries larger than malloc reuses (32 MB) are
  mapped afresh on every call, and each 4 KB page then faults when first
  written -- time that shows up as kernel time, not in any XLA op.
  """
  block_until_ready(fn())
  before = resource.getrusage(resource.RUSAGE_SELF)
  for _ in range(calls):
    block_until_ready(fn())
  after = resource.getrusage(resource.RUSAGE_SELF)
  return (
    (after.ru_minflt - before.ru_minflt) / calls,
    (after.ru_stime - before.ru_stime) / calls,
  )


def matmul_flops_per_second(n=2048, rounds=5, dtype=jnp.float32, calls=1):
  """The machine's measured (n, n) @ (n, n) rate, FLOP/s."""
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
  f = jax.jit(lambda x, y: x @ y)
  seconds = interleaved_medians(
    {'matmul': lambda: f(a, a)}, rounds, calls=calls
  )['matmul']
  return 2 * n**3 / seconds


def compile_with_temp_bytes(fn, *args):
  """(zero-argument callable running jitted `fn(*args)`, XLA temp bytes).

  Temporary bytes are XLA's accounting of the compiled program's scratch
  buffers (`memory_analysis()`), None where the backend does not report it.
  """
  compiled = jax.jit(fn).lower(*args).compile()
  memory = compiled.memory_analysis()
  temp = getattr(memory, 'temp_size_in_bytes', None) if memory else None
  return (lambda: compiled(*args)), temp


def write_results(results, output_dir, name, table):
  """{output_dir}/{name}.json (the results) and {name}.md (`table`)."""
  os.makedirs(output_dir, exist_ok=True)
  files.write_json(os.path.join(output_dir, f'{name}.json'), results)
  files.write_text(os.path.join(output_dir, f'{name}.md'), table)
