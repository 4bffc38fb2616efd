"""How close attention comes to the machine's matmul rate, in one run.

Measured interleaved against the built-in, in one process:

  - one causal self-attention layer (`tl.CausalAttention` against
    trax_qkv's), batch 2 x 2048 positions, d_model 512, 8 heads;
  - one cross-attention layer (`tl.AttentionQKV` against trax_qkv's), 4 x
    1024 queries over 1024 keys, d_model 256, 8 heads;

each forward + backward (gradients of the inputs and the weights) in
'eval' mode, as GFLOP/s and as a fraction of the (2048, 2048) float32
matmul rate measured in the same run; and

  - the `TransformerLM` 2 x 2048 training step of the model bench
    (`benchmarks.models`, dropout on), as the built-in's step time over
    trax_qkv's per round.

FLOPs are counted, not measured: a layer's forward is its four
projections and its two attention matmuls, where causal attention counts
only the L (L + 1) / 2 logits a query may see (a kernel that computes the
masked half too does not get credit for it); the backward is twice the
forward.

Beside each fraction stands its ceiling: counted FLOPs over the FLOPs of
the matmuls the contender's kernel executes, i.e. the fraction it would
reach if every one of them ran at the matmul rate and nothing else took
time. The blockwise kernels execute more than is counted: the backward
recomputes q k^T, and a causal diagonal block is computed in two halves
of queries, the masked triangle of each included.
"""

import jax
import jax.numpy as jnp
import numpy as np
from trax import layers as tl
from trax import shapes

import trax_qkv
from trax_qkv.benchmarks import layers as layer_bench
from trax_qkv.benchmarks import models as model_bench
from trax_qkv.benchmarks import timing
from trax_qkv.kernels import dispatch
from trax_qkv.models import registry

BUILTIN = registry.BUILTIN
CONTENDERS = (BUILTIN, 'auto')
DEFAULT_ROUNDS = 5
# (batch, length, d_model, heads)
CAUSAL = (2, 2048, 512, 8)
CROSS = (4, 1024, 256, 8)  # queries and keys alike
LM_CASE = 'TransformerLM 2x2048'
QUICK_CAUSAL, QUICK_CROSS = (2, 256, 128, 4), (2, 128, 128, 4)
QUICK_LM = 'toy TransformerLM 2x128'


def causal_flops(batch, length, d):
  """Forward + backward FLOPs of a causal self-attention layer: 4
  projections and the visible L (L + 1) / 2 logits, forward tripled."""
  projections = layer_bench.projection_flops(batch, length, length, d)
  attention = 4 * batch * d * length * (length + 1) // 2
  return 3 * (projections + attention)


def cross_flops(batch, length, d):
  """Forward + backward FLOPs of AttentionQKV with Lq = Lk = length."""
  return 3 * layer_bench.attention_flops(batch, length, length, d)


def _executed(name, call, projections, d_head):
  """Forward + backward FLOPs of the matmuls contender `name` executes for
  `call`: the projections, and per logit its kernel computes (`Kernel.
  logits_computed`) its `matmuls_per_logit`; None for a kernel that does
  not count them. The built-in runs the reference's math."""
  kernel = (
    dispatch.KERNELS[dispatch.REFERENCE]
    if name == BUILTIN
    else dispatch.resolve(name, call)
  )
  if kernel.matmuls_per_logit is None or kernel.logits_computed is None:
    return None
  matmuls = sum(kernel.matmuls_per_logit)
  return 3 * projections + matmuls * 2 * d_head * kernel.logits_computed(call)


def causal_executed_flops(name, batch, length, d, heads):
  """As `causal_flops`, for the matmuls contender `name` executes: the
  reference computes all L * L logits, the causal kernel its blocks."""
  shape = (batch * heads, length, d // heads)
  call = dispatch.Call(shape, shape, jnp.float32, 1, causal=True)
  projections = layer_bench.projection_flops(batch, length, length, d)
  return _executed(name, call, projections, d // heads)


def cross_executed_flops(name, batch, length, d, heads):
  """As `cross_flops`, for the matmuls contender `name` executes."""
  shape = (batch, length, d)
  call = dispatch.Call(shape, shape, jnp.float32, heads)
  projections = layer_bench.projection_flops(batch, length, length, d)
  return _executed(name, call, projections, d // heads)


def _causal_layer(name, d, heads):
  if name == BUILTIN:
    return tl.CausalAttention(d, n_heads=heads, mode='eval')
  return trax_qkv.CausalAttention(
    d, n_heads=heads, mode='eval', implementation=name
  )


def _cross_layer(name, d, heads):
  if name == BUILTIN:
    return tl.AttentionQKV(d, n_heads=heads, mode='eval')
  return trax_qkv.AttentionQKV(
    d, n_heads=heads, mode='eval', implementation=name
  )


def causal_step(name, batch, length, d, heads):
  """(zero-argument callable: gradients of a causal layer's output sum
  with respect to its weights and input, XLA temporary bytes)."""
  x = jax.random.normal(jax.random.PRNGKey(0), (batch, length, d))
  layer = _causal_layer(name, d, heads)
  weights, state = layer.init(shapes.signature(x), rng=jax.random.PRNGKey(0))
  rng = jax.random.PRNGKey(1)

  def loss(weights, x):
    return jnp.sum(layer.pure_fn(x, weights, state, rng)[0])

  return timing.compile_with_temp_bytes(
    jax.grad(loss, argnums=(0, 1)), weights, x
  )


def cross_step(name, batch, length, d, heads):
  """As `causal_step`, for AttentionQKV (the layer bench's inputs: keys
  and values from one tensor, the last eighth of the keys padding)."""
  x = layer_bench._layer_inputs(batch, length, length, d)
  return layer_bench._compiled(_cross_layer(name, d, heads), x, True)


def _interleaved(fns, rounds):
  """({contender: [seconds per round]}, the built-in's time over 'auto's
  in each round)."""
  times = timing.interleaved_times(
    fns, rounds, settle=timing.settle_seconds(), untimed=1
  )
  return times, np.array(times[BUILTIN]) / np.array(times['auto'])


def _layer_case(step, executed, shape, flops, rounds, matmul):
  times, speedup = _interleaved(
    {name: step(name, *shape)[0] for name in CONTENDERS}, rounds
  )
  rows = {}
  for name in CONTENDERS:
    fractions = flops / np.array(times[name]) / matmul
    seconds = float(np.median(times[name]))
    executed_flops = executed(name, *shape)
    rows[name] = dict(
      seconds=seconds,
      gflops_per_s=flops / seconds / 1e9,
      matmul_fraction=timing.spread(fractions),
      executed_flops=executed_flops,
      ceiling=flops / executed_flops if executed_flops else None,
      round_seconds=list(times[name]),
    )
  return dict(
    shape=list(shape), flops=flops, rows=rows, speedup=timing.spread(speedup)
  )


def _lm_case(case, rounds):
  builder, shape, _ = (model_bench.QUICK_CASES | model_bench.CASES)[case]
  inputs = model_bench._batch(shape, model_bench.vocab_size(builder))
  times, speedup = _interleaved(
    {
      name: model_bench.training_step(
        model_bench.build(builder, name, 'train'), inputs
      )[0]
      for name in CONTENDERS
    },
    rounds,
  )
  return dict(
    model=case,
    seconds={name: float(np.median(times[name])) for name in CONTENDERS},
    round_seconds={name: list(times[name]) for name in CONTENDERS},
    speedup=timing.spread(speedup),
    round_speedups=[float(s) for s in speedup],
  )


def run(rounds=DEFAULT_ROUNDS, quick=False, log=print):
  """{'matmul_gflops', 'layers': {...}, 'training_step': {...}}."""
  matmul = timing.matmul_flops_per_second()
  log(f'matmul rate: {matmul / 1e9:.1f} GFLOP/s (2048^3, float32)')
  results = {
    'device': jax.devices()[0].device_kind,
    'matmul_gflops': matmul / 1e9,
    'rounds': rounds,
    'layers': {},
  }
  causal, cross = (QUICK_CAUSAL, QUICK_CROSS) if quick else (CAUSAL, CROSS)
  for label, step, executed, shape, flops in (
    (
      'causal self-attention',
      causal_step,
      causal_executed_flops,
      causal,
      causal_flops(*causal[:3]),
    ),
    (
      'cross-attention',
      cross_step,
      cross_executed_flops,
      cross,
      cross_flops(*cross[:3]),
    ),
  ):
    log(f'{label} {shape}: forward + backward ...')
    entry = _layer_case(step, executed, shape, flops, rounds, matmul)
    results['layers'][label] = entry
    for name, row in entry['rows'].items():
      log(
        f'  {name}: {row["seconds"] * 1e3:.1f} ms, '
        f'{row["gflops_per_s"]:.1f} GFLOP/s '
        f'({row["matmul_fraction"]["median"]:.0%} of matmul, ceiling '
        f'{_percent(row["ceiling"])})'
      )
  case = QUICK_LM if quick else LM_CASE
  log(f'{case}: training step ...')
  results['training_step'] = _lm_case(case, rounds)
  s = results['training_step']['speedup']
  log(f'  auto: x{s["median"]:.2f} ({s["min"]:.2f}-{s["max"]:.2f})')
  return results


def _percent(fraction):
  return '-' if fraction is None else f'{fraction:.0%}'


def markdown(results):
  lines = [
    f'Device: {results["device"]}; matmul rate measured in the same run: '
    f'{results["matmul_gflops"]:.1f} GFLOP/s; medians of '
    f'{results["rounds"]} interleaved rounds, (min-max) over the rounds.',
    '',
    '| layer, forward + backward | batch, L, d_model, heads | contender '
    '| ms | GFLOP/s | of matmul rate | ceiling | speed-up |',
    '|---|---|---|---|---|---|---|---|',
  ]
  for label, entry in results['layers'].items():
    for name, row in entry['rows'].items():
      f = row['matmul_fraction']
      s = entry['speedup'] if name != BUILTIN else None
      lines.append(
        f'| {label} | {", ".join(map(str, entry["shape"]))} | {name} | '
        f'{row["seconds"] * 1e3:.1f} | {row["gflops_per_s"]:.1f} | '
        f'{f["median"]:.0%} ({f["min"]:.0%}-{f["max"]:.0%}) | '
        f'{_percent(row["ceiling"])} | '
        + (
          f'x{s["median"]:.2f} ({s["min"]:.2f}-{s["max"]:.2f})'
          if s
          else 'x1.00'
        )
        + ' |'
      )
  step = results['training_step']
  s = step['speedup']
  lines += [
    '',
    f'{step["model"]} training step: {BUILTIN} '
    f'{step["seconds"][BUILTIN]:.3f} s, auto {step["seconds"]["auto"]:.3f} '
    f's; auto x{s["median"]:.2f} (per round: '
    + ', '.join(f'{r:.2f}' for r in step['round_speedups'])
    + ').',
  ]
  return '\n'.join(lines) + '\n'


def write(results, output_dir):
  timing.write_results(results, output_dir, 'bench_roof', markdown(results))
