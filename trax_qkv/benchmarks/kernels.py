"""Benchmarks of the attention math alone: every implementation, same inputs.

This module imports JAX and `trax_qkv.kernels` only -- never Trax or
TensorFlow -- so it measures the kernels (Q, K and V already projected) on
any JAX device, a GPU included. `trax_qkv.benchmarks.layers` compares the
Trax layers with the built-in `tl.AttentionQKV`.
"""

import jax
import jax.numpy as jnp

from trax_qkv import kernels
from trax_qkv.benchmarks import timing
from trax_qkv.kernels import reference

# (batch, Lq, Lk, d_model, heads): the length-4096 shape, and one
# that keeps a GPU busy (head size 64, cuDNN's favourite).
GPU_SHAPES = ((1, 4096, 4096, 256, 8), (8, 4096, 4096, 1024, 16))
CPU_SHAPES = ((4, 1024, 1024, 256, 8),)
DEFAULT_ROUNDS = 5


def core_flops(batch, lq, lk, d):
  """Forward FLOPs of the attention math: Q K^T and weights @ V."""
  return 4 * batch * lq * lk * d


def core_inputs(batch, lq, lk, d, dtype):
  """Projected q, k, v and a key-padding mask (last eighth of keys off)."""
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  q = jax.random.normal(keys[0], (batch, lq, d), dtype)
  k = jax.random.normal(keys[1], (batch, lk, d), dtype)
  v = jax.random.normal(keys[2], (batch, lk, d), dtype)
  mask = jnp.ones((batch, 1, 1, lk), bool).at[..., lk - lk // 8 :].set(False)
  return q, k, v, mask


def compiled_core(implementation, inputs, n_heads, backward):
  """(zero-argument callable, temporary bytes) of one compiled program.

  Forward: the attention activations. Forward+backward: gradients of their
  sum with respect to q, k and v.
  """
  q, k, v, mask = inputs

  def forward(q, k, v):
    return kernels.attend(q, k, v, mask, n_heads, implementation=implementation)

  def forward_backward(q, k, v):
    return jax.grad(lambda *x: jnp.sum(forward(*x)), argnums=(0, 1, 2))(q, k, v)

  return timing.compile_with_temp_bytes(
    forward_backward if backward else forward, q, k, v
  )


def implementations_for(dtype):
  """Every kernel that can run here on `dtype` inputs, then 'auto'."""
  return [
    name
    for name, kernel in kernels.KERNELS.items()
    if kernel.unsupported_reason(dtype, 0.0) is None
  ] + [kernels.AUTO]


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
      lambda *x: reference.dot_product_attention(*x, mask, n_heads)[0],
      *(x.astype(jnp.float32) for x in (q, k, v)),
    )
    got = output_and_grads(
      lambda *x: kernels.attend(
        *x, mask, n_heads, implementation=implementation
      ),
      q,
      k,
      v,
    )
  return max(
    float(jnp.max(jnp.abs(g.astype(jnp.float32) - e)) / jnp.max(jnp.abs(e)))
    for g, e in zip(got, expected)
  )


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
      result[name][f'{key}_temp_mb'] = None if temp is None else temp / 2**20
    seconds = timing.interleaved_medians(
      fns, rounds, calls=calls, settle=timing.settle_seconds(), untimed=1
    )
    for name in names:
      result[name][f'{key}_ms'] = seconds[name] * 1e3
      result[name][f'{key}_vs_reference'] = seconds['reference'] / seconds[name]
  for name in names:
    result[name]['fwd_tflops'] = (
      core_flops(batch, lq, lk, d) / (result[name]['fwd_ms'] / 1e3) / 1e12
    )
  return result


def run(rounds=DEFAULT_ROUNDS, shapes=None, log=print):
  """Every implementation at `shapes` in bf16 and float32; a results dict."""
  on_gpu = jax.default_backend() == 'gpu'
  shapes = shapes or (GPU_SHAPES if on_gpu else CPU_SHAPES)
  calls = 10 if on_gpu else 1
  results = {
    'device': jax.devices()[0].device_kind,
    'backend': jax.default_backend(),
    'rounds': rounds,
    'calls_per_round': calls,
    'matmul_tflops': {},
    'shapes': [],
  }
  for dtype in (jnp.bfloat16, jnp.float32):
    n = 8192 if on_gpu else 2048
    results['matmul_tflops'][jnp.dtype(dtype).name] = (
      timing.matmul_flops_per_second(n, rounds, dtype, calls) / 1e12
    )
  log(f'{results["device"]}: matmul TFLOP/s {results["matmul_tflops"]}')
  for shape in shapes:
    for dtype in (jnp.bfloat16, jnp.float32):
      name = jnp.dtype(dtype).name
      log(f'attention {shape} {name} ...')
      timings = bench_shape(shape, dtype, rounds, calls)
      batch, lq, lk, d, heads = shape
      inputs = core_inputs(batch, lq, lk, d, dtype)
      for impl in timings:
        timings[impl]['max_rel_error'] = max_relative_error(impl, inputs, heads)
      results['shapes'].append(
        {'shape': list(shape), 'dtype': name, 'results': timings}
      )
      log(markdown_rows(results['shapes'][-1], results['matmul_tflops']))
  return results


def markdown_rows(entry, matmul_tflops):
  batch, lq, lk, d, heads = entry['shape']
  label = f'{batch}, {lq}, {lk}, {d}, {heads} | {entry["dtype"]}'
  peak = matmul_tflops[entry['dtype']]
  rows = []
  for impl, r in entry['results'].items():
    rows.append(
      f'| {label} | {impl} | {r["fwd_ms"]:.3f} | {r["fwd_vs_reference"]:.2f}'
      f' | {r["fwd_bwd_ms"]:.3f} | {r["fwd_bwd_vs_reference"]:.2f} | '
      f'{r["fwd_tflops"]:.3g} ({r["fwd_tflops"] / peak:.0%}) | '
      + (
        f'{r["fwd_bwd_temp_mb"]:.0f}'
        if r['fwd_bwd_temp_mb'] is not None
        else 'n/a'
      )
      + f' | {r["max_rel_error"]:.1e} |'
    )
  return '\n'.join(rows)


def markdown(results):
  mm = results['matmul_tflops']
  lines = [
    f'Device: {results["device"]} ({results["backend"]}); medians of '
    f'{results["rounds"]} interleaved rounds of '
    f'{results["calls_per_round"]} calls; matmul '
    + ', '.join(f'{k} {v:.3g} TFLOP/s' for k, v in mm.items())
    + '. '
    'Error: against float32 attention with full-precision matmuls on the '
    'same input values.',
    '',
    '| batch, Lq, Lk, d, heads | dtype | implementation | fwd ms | '
    'fwd x ref | fwd+bwd ms | fwd+bwd x ref | fwd TFLOP/s (% of matmul) '
    '| fwd+bwd temp MB | max rel. error, fwd and grads |',
    '|---|---|---|---|---|---|---|---|---|---|',
  ]
  lines += [markdown_rows(entry, mm) for entry in results['shapes']]
  return '\n'.join(lines) + '\n'
