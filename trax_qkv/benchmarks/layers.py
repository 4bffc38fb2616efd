"""Benchmarks against the built-in tl.AttentionQKV, measured in one run.

Every number that is compared is measured in the same process, interleaved
(one call of each contender per round, after warm-up), and summarised by its
median; the per-round times are kept too, so that each round's built-in /
contender ratio (a paired measurement: both timed seconds apart) shows how
far a ratio moves on a noisy machine. Memory is XLA's own accounting of the
compiled program's temporary buffers (`memory_analysis()`), which is what
the O(Lq*Lk) logits occupy.
The attention math alone, on any JAX device (a GPU's cuDNN path included),
is measured by `trax_qkv.benchmarks.kernels`.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import trax
from trax import layers as tl
from trax import shapes
from trax.supervised import training

import trax_qkv
from trax_qkv.benchmarks import kernels as kernel_bench
from trax_qkv.benchmarks import models as model_bench
from trax_qkv.benchmarks import timing
from trax_qkv.models import registry

LAYER_SHAPES = (
  (32, 64, 64, 256, 8),
  (8, 256, 256, 256, 8),
  (4, 1024, 1024, 256, 8),
  (1, 4096, 4096, 256, 8),
)
CROSS_SHAPE = (4, 64, 8192, 256, 8)  # (batch, Lq, Lk, d_model, heads)
# --quick: toy sizes, a smoke test of every part of the bench.
QUICK_LAYER_SHAPES = ((8, 64, 64, 64, 4),)
QUICK_CROSS_SHAPE = (1, 16, 256, 64, 4)
BUILTIN = registry.BUILTIN
# Each contender's turn in a round times back-to-back calls for at least
# this long (one call at length >= 1024; several at the small shapes).
MIN_TURN_SECONDS = 0.1
DEFAULT_ROUNDS = 15


def contenders():
  """name -> factory(d_model, n_heads, mode) of the layers compared: the
  built-in, then every kernel that can run here on float32 inputs and
  'auto'."""
  out = {BUILTIN: lambda d, h, mode: tl.AttentionQKV(d, n_heads=h, mode=mode)}
  for name in kernel_bench.implementations_for(jnp.float32):
    out[name] = functools.partial(
      lambda d, h, mode, impl: trax_qkv.AttentionQKV(
        d, n_heads=h, mode=mode, implementation=impl
      ),
      impl=name,
    )
  return out


def projection_flops(batch, lq, lk, d):
  """Forward FLOPs of an attention layer's 4 (d, d) projections: Q and
  the output over lq positions, K and V over lk."""
  return 2 * batch * d * d * (2 * lq + 2 * lk)


def attention_flops(batch, lq, lk, d):
  """Forward FLOPs of AttentionQKV: 4 projections, 2 batched matmuls."""
  return projection_flops(batch, lq, lk, d) + 4 * batch * lq * lk * d


def _layer_inputs(batch, lq, lk, d):
  """Inputs (q, kv, kv, mask) of AttentionQKV; K and V inputs are the same."""
  q, kv, _, mask = kernel_bench.core_inputs(batch, lq, lk, d, jnp.float32)
  return q, kv, kv, mask


def _compiled(layer, x, backward):
  """(jitted fn of (weights, x), its compiled memory in bytes)."""
  weights, state = layer.init(shapes.signature(x), rng=jax.random.PRNGKey(0))
  rng = jax.random.PRNGKey(1)

  def forward(weights, x):
    return layer.pure_fn(x, weights, state, rng)[0][0]

  def forward_backward(weights, x):
    loss = lambda w, q, k, v: jnp.sum(forward(w, (q, k, v, x[3])))
    return jax.grad(loss, argnums=(0, 1, 2, 3))(weights, *x[:3])

  return timing.compile_with_temp_bytes(
    forward_backward if backward else forward, weights, x
  )


def bench_layer_shape(batch, lq, lk, d, heads, rounds):
  """Forward and forward+backward times and memory of every contender."""
  x = _layer_inputs(batch, lq, lk, d)
  result = {}
  for backward in (False, True):
    key = 'fwd_bwd' if backward else 'fwd'
    fns, memory = {}, {}
    for name, factory in contenders().items():
      fns[name], memory[name] = _compiled(
        factory(d, heads, 'eval'), x, backward
      )
    times = timing.interleaved_times(
      fns,
      rounds,
      settle=timing.settle_seconds(),
      untimed=1,
      min_turn_seconds=MIN_TURN_SECONDS,
    )
    for name in fns:
      result.setdefault(name, {})[f'{key}_ms'] = (
        float(np.median(times[name])) * 1e3
      )
      result[name][f'{key}_round_ms'] = [t * 1e3 for t in times[name]]
      result[name][f'{key}_temp_mb'] = (
        memory[name] / 2**20 if memory[name] is not None else None
      )
    if backward:
      for name, fn in fns.items():
        faults, kernel_seconds = timing.page_faults_per_call(fn)
        result[name]['fwd_bwd_page_faults'] = faults
        result[name]['fwd_bwd_kernel_ms'] = kernel_seconds * 1e3
  flops = attention_flops(batch, lq, lk, d)
  for name in result:
    result[name]['fwd_gflops'] = flops / (result[name]['fwd_ms'] / 1e3) / 1e9
  return result


# The decoding and training Transformer: (d_model, d_ff, layers each side).
SMALL_TRANSFORMER = (128, 256, 2)
QUICK_SMALL_TRANSFORMER = (64, 128, 1)


def _small_transformer(cross_attention, mode, size, vocab=512):
  d_model, d_ff, n_layers = size
  with trax_qkv.use_attention(cross_attention=cross_attention):
    return model_bench.transformer(
      vocab, d_model, d_ff, n_layers, 128, mode, n_heads=4
    )


def decoding_tokens_per_second(
  implementations,
  batch=32,
  src_len=32,
  steps=32,
  rounds=3,
  size=SMALL_TRANSFORMER,
):
  """Greedy predict-mode decoding of a small Transformer, tokens/s."""
  src = (
    np.random.RandomState(0).randint(2, 512, (batch, src_len)).astype(np.int32)
  )
  fns = {}
  for impl in implementations:
    model = _small_transformer(impl, 'predict', size)
    model.init(shapes.signature((src, src[:, :1])), rng=jax.random.PRNGKey(0))
    step = jax.jit(model.pure_fn)
    weights, initial_state = model.weights, model.state

    def decode(step=step, weights=weights, initial_state=initial_state):
      state, token, out = initial_state, jnp.zeros((batch, 1), jnp.int32), []
      for _ in range(steps):
        (logits, _), state = step(
          (src, token), weights, state, jax.random.PRNGKey(0)
        )
        token = jnp.argmax(logits[:, -1:], axis=-1).astype(jnp.int32)
        out.append(token)
      return jnp.concatenate(out, axis=1)

    fns[impl] = decode
  seconds = timing.interleaved_medians(fns, rounds)
  return {impl: batch * steps / s for impl, s in seconds.items()}


def training_steps_per_second(
  implementations,
  steps=20,
  rounds=3,
  batch=64,
  length=24,
  size=SMALL_TRANSFORMER,
):
  """training.Loop steps/s of the small translation Transformer."""
  rs = np.random.RandomState(0)
  src = rs.randint(1, 512, (batch, length)).astype(np.int32)
  tgt = rs.randint(1, 512, (batch, length)).astype(np.int32)
  batches = itertools.repeat((src, tgt, np.ones_like(tgt, np.float32)))
  fns = {}
  for impl in implementations:
    task = training.TrainTask(
      batches, tl.WeightedCategoryCrossEntropy(), trax.optimizers.Adam(1e-3)
    )
    loop = training.Loop(
      _small_transformer(impl, 'train', size),
      task,
      eval_at=lambda _: False,
      checkpoint_at=lambda _: False,
    )
    fns[impl] = functools.partial(
      lambda loop: (loop.run(steps), loop.model.weights)[1], loop
    )
  seconds = timing.interleaved_medians(fns, rounds)
  return {impl: steps / s for impl, s in seconds.items()}


def run(rounds=DEFAULT_ROUNDS, quick=False, log=print):
  """All benchmarks; returns the results dict."""
  layer_shapes = QUICK_LAYER_SHAPES if quick else LAYER_SHAPES
  cross = QUICK_CROSS_SHAPE if quick else CROSS_SHAPE
  small = QUICK_SMALL_TRANSFORMER if quick else SMALL_TRANSFORMER
  results = {
    'device': jax.devices()[0].device_kind,
    'backend': jax.default_backend(),
    'rounds': rounds,
    'matmul_gflops': timing.matmul_flops_per_second(
      256 if quick else 2048, rounds
    )
    / 1e9,
  }
  log(f'matmul: {results["matmul_gflops"]:.1f} GFLOP/s')
  results['layers'] = []
  for shape in layer_shapes + (cross,):
    batch, lq, lk, d, heads = shape
    log(f'AttentionQKV batch {batch} Lq {lq} Lk {lk} d {d} heads {heads} ...')
    timings = bench_layer_shape(batch, lq, lk, d, heads, rounds)
    results['layers'].append(
      {
        'shape': dict(batch=batch, lq=lq, lk=lk, d_model=d, heads=heads),
        'cross': shape == cross,
        'results': timings,
      }
    )
    log(format_shape_row(results['layers'][-1]))
  impls = [BUILTIN, 'reference', 'auto']
  log('decoding ...')
  results['decode_tokens_per_s'] = decoding_tokens_per_second(
    impls, steps=8 if quick else 32, rounds=rounds, size=small
  )
  log('training ...')
  results['train_steps_per_s'] = training_steps_per_second(
    impls, steps=5 if quick else 20, rounds=rounds, size=small
  )
  return results


def round_speedups(entry, name, key):
  """Built-in time / `name`'s time in each round, for `key` 'fwd' or
  'fwd_bwd': paired ratios, the two calls timed seconds apart."""
  base = entry['results'][BUILTIN][f'{key}_round_ms']
  times = entry['results'][name][f'{key}_round_ms']
  return [b / t for b, t in zip(base, times)]


def format_shape_row(entry):
  """A line per contender: its times and speed-ups over the built-in."""
  base = entry['results'][BUILTIN]

  def timed(r, key):
    return f'{r[key]:.1f} ms (x{base[key] / r[key]:.2f})'

  return '  ' + '\n  '.join(
    f'{name}: fwd {timed(r, "fwd_ms")}, fwd+bwd {timed(r, "fwd_bwd_ms")}'
    for name, r in entry['results'].items()
  )


def _shape_label(shape):
  return ', '.join(
    str(shape[key]) for key in ('batch', 'lq', 'lk', 'd_model', 'heads')
  )


def markdown(results):
  """The README table: speed-ups are built-in time / contender time."""
  names = list(results['layers'][0]['results'])
  lines = [
    f'Device: {results["device"]} ({results["backend"]}); medians of '
    f'{results["rounds"]} interleaved rounds; matmul '
    f'{results["matmul_gflops"]:.1f} GFLOP/s.',
    '',
    '| batch, Lq, Lk, d, heads | pass | ' + ' | '.join(names) + ' |',
    '|---|---|' + '---|' * len(names),
  ]
  for entry in results['layers']:
    label = _shape_label(entry['shape'])
    base = entry['results'][BUILTIN]
    for key, title in (('fwd', 'fwd'), ('fwd_bwd', 'fwd+bwd')):
      cells = [
        f'{r[f"{key}_ms"]:.1f} ms (x{base[f"{key}_ms"] / r[f"{key}_ms"]:.2f})'
        for r in entry['results'].values()
      ]
      lines.append(f'| {label} | {title} | ' + ' | '.join(cells) + ' |')
    cells = [
      f'{r["fwd_bwd_temp_mb"]:.0f} MB'
      if r['fwd_bwd_temp_mb'] is not None
      else 'n/a'
      for r in entry['results'].values()
    ]
    lines.append(
      f'| {label} | fwd+bwd temp memory | ' + ' | '.join(cells) + ' |'
    )
    cells = [
      f'{r["fwd_bwd_page_faults"] / 1e3:.1f}k ({r["fwd_bwd_kernel_ms"]:.0f} ms)'
      for r in entry['results'].values()
    ]
    lines.append(
      f'| {label} | fwd+bwd page faults / call (kernel time) | '
      + ' | '.join(cells)
      + ' |'
    )
    matmul = results['matmul_gflops']
    cells = [
      f'{r["fwd_gflops"]:.1f} ({r["fwd_gflops"] / matmul:.0%})'
      for r in entry['results'].values()
    ]
    lines.append(
      f'| {label} | fwd GFLOP/s (% of matmul) | ' + ' | '.join(cells) + ' |'
    )
  lines += [
    '',
    "Per-round speed-ups of 'auto' (built-in / 'auto' in the same "
    'round): median [25th-75th percentile].',
    '',
    '| batch, Lq, Lk, d, heads | fwd | fwd+bwd |',
    '|---|---|---|',
  ]
  for entry in results['layers']:
    cells = []
    for key in ('fwd', 'fwd_bwd'):
      low, mid, high = np.percentile(
        round_speedups(entry, 'auto', key), (25, 50, 75)
      )
      cells.append(f'x{mid:.2f} [{low:.2f}-{high:.2f}]')
    lines.append(
      f'| {_shape_label(entry["shape"])} | ' + ' | '.join(cells) + ' |'
    )
  for key, title in (
    ('decode_tokens_per_s', 'greedy decoding, tokens/s'),
    ('train_steps_per_s', 'training.Loop, steps/s'),
  ):
    base = results[key][BUILTIN]
    lines += [
      '',
      f'{title}: '
      + ', '.join(
        f'{name} {v:.1f} (x{v / base:.2f})' for name, v in results[key].items()
      ),
    ]
  return '\n'.join(lines) + '\n'


def write(results, output_dir):
  timing.write_results(results, output_dir, 'bench', markdown(results))
