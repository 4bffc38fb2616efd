"""Benchmarks of the attention math alone: every implementation, same inputs.

This module imports JAX and `trax_qkv`'s pure attention functions only --
never Trax -- so it measures the kernels (Q, K and V already projected) on
any JAX device, a GPU included. `trax_qkv.bench` builds the layer-level
comparison with the built-in `tl.AttentionQKV` on top of the timing helpers
here.

Timings are medians of interleaved rounds (one turn of each contender per
round) after warm-up; each turn pauses, makes one untimed call and then
times back-to-back dispatches with one wait, so that neither a cold start
nor, on a GPU, the launch latency of a short kernel is what is measured
(see `interleaved_times`).
"""

import json
import math
import os
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np

from trax_qkv import attention_math
from trax_qkv import fast_attention

# (batch, Lq, Lk, d_model, heads): the length-4096 shape, and one
# that keeps a GPU busy (head size 64, cuDNN's favourite).
GPU_SHAPES = ((1, 4096, 4096, 256, 8), (8, 4096, 4096, 1024, 16))
CPU_SHAPES = ((4, 1024, 1024, 256, 8),)
# Seconds to pause before each timed call on a CPU (see interleaved_times).
CPU_SETTLE_SECONDS = 0.3


def settle_seconds():
  """The pause before each timed call on this backend: none on a GPU."""
  return 0.0 if jax.default_backend() == 'gpu' else CPU_SETTLE_SECONDS


def block_until_ready(tree):
  return jax.tree_util.tree_map(lambda a: a.block_until_ready(), tree)


def interleaved_medians(fns, rounds, **timing):
  """{name: median seconds per call}; `timing` as in `interleaved_times`."""
  times = interleaved_times(fns, rounds, **timing)
  return {name: float(np.median(t)) for name, t in times.items()}


def interleaved_times(fns, rounds, warmup=1, calls=1, settle=0.0, untimed=0,
                      min_turn_seconds=0.0):
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
    turn_calls[name] = calls if not min_turn_seconds else max(
        calls, math.ceil(min_turn_seconds / seconds))
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
  return ((after.ru_minflt - before.ru_minflt) / calls,
          (after.ru_stime - before.ru_stime) / calls)


def matmul_flops_per_second(n=2048, rounds=5, dtype=jnp.float32, calls=1):
  """The machine's measured (n, n) @ (n, n) rate, FLOP/s."""
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
  f = jax.jit(lambda x, y: x @ y)
  seconds = interleaved_medians({'matmul': lambda: f(a, a)}, rounds,
                                calls=calls)['matmul']
  return 2 * n ** 3 / seconds


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
  with open(os.path.join(output_dir, f'{name}.json'), 'w') as f:
    json.dump(results, f, indent=2)
  with open(os.path.join(output_dir, f'{name}.md'), 'w') as f:
    f.write(table)


def core_flops(batch, lq, lk, d):
  """Forward FLOPs of the attention math: Q K^T and weights @ V."""
  return 4 * batch * lq * lk * d


def core_inputs(batch, lq, lk, d, dtype):
  """Projected q, k, v and a key-padding mask (last eighth of keys off)."""
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  q = jax.random.normal(keys[0], (batch, lq, d), dtype)
  k = jax.random.normal(keys[1], (batch, lk, d), dtype)
  v = jax.random.normal(keys[2], (batch, lk, d), dtype)
  mask = jnp.ones((batch, 1, 1, lk), bool).at[..., lk - lk // 8:].set(False)
  return q, k, v, mask


def compiled_core(implementation, inputs, n_heads, backward):
  """(zero-argument callable, temporary bytes) of one compiled program.

  Forward: the attention activations. Forward+backward: gradients of their
  sum with respect to q, k and v.
  """
  q, k, v, mask = inputs

  def forward(q, k, v):
    return fast_attention.attend(q, k, v, mask, n_heads,
                                 implementation=implementation)

  def forward_backward(q, k, v):
    return jax.grad(lambda *x: jnp.sum(forward(*x)), argnums=(0, 1, 2))(
        q, k, v)

  return compile_with_temp_bytes(forward_backward if backward else forward,
                                 q, k, v)


def implementations_for(dtype):
  names = ['reference', 'fused', 'chunked']
  if fast_attention.cudnn_supported(jnp.zeros((), dtype), 0.0):
    names.append('cudnn')
  return names + ['auto']


def max_relative_error(implementation, inputs, n_heads):
  """Worst of max|x - ref| / max|ref| over the output and d q, d k, d v.

  `implementation` runs on `inputs` as given (bf16 ones included); the
  reference runs in float32 on the same (already rounded) values, with
  full-precision matmuls, so this is the error against exact attention.
  """
  q, k, v, mask = inputs

  def output_and_grads(fn, q, k, v):
    out, pullback = jax.vjp(lambda *x: fn(*x).astype(jnp.float32), q, k, v)
    return (out,) + pullback(jnp.ones_like(out))

  with jax.default_matmul_precision('highest'):
    expected = output_and_grads(
        lambda *x: attention_math.dot_product_attention(*x, mask,
                                                        n_heads)[0],
        *(x.astype(jnp.float32) for x in (q, k, v)))
    got = output_and_grads(
        lambda *x: fast_attention.attend(*x, mask, n_heads,
                                         implementation=implementation),
        q, k, v)
  return max(float(jnp.max(jnp.abs(g.astype(jnp.float32) - e)) /
                   jnp.max(jnp.abs(e))) for g, e in zip(got, expected))


def bench_shape(shape, dtype, rounds, calls):
  """{implementation: fwd/fwd+bwd ms, temp MB, fwd TFLOP/s, ratios}."""
  batch, lq, lk, d, heads = shape
  inputs = core_inputs(batch, lq, lk, d, dtype)
  names = implementations_for(dtype)
  result = {name: {} for name in names}
  for backward, key in ((False, 'fwd'), (True, 'fwd_bwd')):
    fns = {}
    for name in names:
      fns[name], temp = compiled_core(name, inputs, heads, backward)
      result[name][f'{key}_temp_mb'] = (None if temp is None
                                        else temp / 2**20)
    seconds = interleaved_medians(fns, rounds, calls=calls,
                                  settle=settle_seconds(), untimed=1)
    for name in names:
      result[name][f'{key}_ms'] = seconds[name] * 1e3
      result[name][f'{key}_vs_reference'] = (seconds['reference'] /
                                             seconds[name])
  for name in names:
    result[name]['fwd_tflops'] = (core_flops(batch, lq, lk, d) /
                                  (result[name]['fwd_ms'] / 1e3) / 1e12)
  return result


def run(rounds=5, shapes=None, log=print):
  """Every implementation at `shapes` in bf16 and float32; a results dict."""
  on_gpu = jax.default_backend() == 'gpu'
  shapes = shapes or (GPU_SHAPES if on_gpu else CPU_SHAPES)
  calls = 10 if on_gpu else 1
  results = {'device': jax.devices()[0].device_kind,
             'backend': jax.default_backend(), 'rounds': rounds,
             'calls_per_round': calls, 'matmul_tflops': {}, 'shapes': []}
  for dtype in (jnp.bfloat16, jnp.float32):
    n = 8192 if on_gpu else 2048
    results['matmul_tflops'][jnp.dtype(dtype).name] = (
        matmul_flops_per_second(n, rounds, dtype, calls) / 1e12)
  log(f"{results['device']}: matmul TFLOP/s {results['matmul_tflops']}")
  for shape in shapes:
    for dtype in (jnp.bfloat16, jnp.float32):
      name = jnp.dtype(dtype).name
      log(f'attention {shape} {name} ...')
      timings = bench_shape(shape, dtype, rounds, calls)
      batch, lq, lk, d, heads = shape
      inputs = core_inputs(batch, lq, lk, d, dtype)
      for impl in timings:
        timings[impl]['max_rel_error'] = max_relative_error(impl, inputs,
                                                            heads)
      results['shapes'].append({'shape': list(shape), 'dtype': name,
                                'results': timings})
      log(markdown_rows(results['shapes'][-1], results['matmul_tflops']))
  return results


def markdown_rows(entry, matmul_tflops):
  batch, lq, lk, d, heads = entry['shape']
  label = f"{batch}, {lq}, {lk}, {d}, {heads} | {entry['dtype']}"
  peak = matmul_tflops[entry['dtype']]
  rows = []
  for impl, r in entry['results'].items():
    rows.append(
        f"| {label} | {impl} | {r['fwd_ms']:.3f} | {r['fwd_vs_reference']:.2f}"
        f" | {r['fwd_bwd_ms']:.3f} | {r['fwd_bwd_vs_reference']:.2f} | "
        f"{r['fwd_tflops']:.3g} ({r['fwd_tflops'] / peak:.0%}) | "
        + (f"{r['fwd_bwd_temp_mb']:.0f}" if r['fwd_bwd_temp_mb'] is not None
           else 'n/a')
        + f" | {r['max_rel_error']:.1e} |")
  return '\n'.join(rows)


def markdown(results):
  mm = results['matmul_tflops']
  lines = [
      f"Device: {results['device']} ({results['backend']}); medians of "
      f"{results['rounds']} interleaved rounds of "
      f"{results['calls_per_round']} calls; matmul "
      + ', '.join(f'{k} {v:.3g} TFLOP/s' for k, v in mm.items()) + '. '
      'Error: against float32 attention with full-precision matmuls on the '
      'same input values.', '',
      '| batch, Lq, Lk, d, heads | dtype | implementation | fwd ms | '
      'fwd x ref | fwd+bwd ms | fwd+bwd x ref | fwd TFLOP/s (% of matmul) '
      '| fwd+bwd temp MB | max rel. error, fwd and grads |',
      '|---|---|---|---|---|---|---|---|---|---|']
  lines += [markdown_rows(entry, mm) for entry in results['shapes']]
  return '\n'.join(lines) + '\n'
