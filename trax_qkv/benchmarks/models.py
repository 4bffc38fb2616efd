"""Whole trax.models against the built-in: trax_qkv in every attention site.

For each model below, three contenders are built from the same code:
'trax' (Trax's own layers everywhere), 'reference' and 'auto' (trax_qkv's
layers in every site: encoder self-attention, decoder causal attention,
cross-attention, through `trax_qkv.use_attention`). In one run, interleaved
(see `timing.interleaved_times`), it measures

  - a training step: the jitted loss and its gradients with respect to the
    weights, in 'train' mode (dropout on), steps/s;
  - the step's temporary memory, XLA's accounting of the compiled program;
  - greedy decoding in 'predict' mode, one jitted model call per token,
    tokens/s.

The optimizer update is left out: it is the same for every contender.
"""

import jax
import jax.numpy as jnp
import numpy as np
import trax
from trax import layers as tl
from trax import shapes

import trax_qkv
from trax_qkv.benchmarks import timing
from trax_qkv.models import registry

BUILTIN = registry.BUILTIN
CONTENDERS = (BUILTIN, 'reference', 'auto')
DEFAULT_ROUNDS = 5


def transformer(vocab, d_model, d_ff, n_layers, max_len, mode, n_heads=8, **kw):
  """trax.models.Transformer of `n_layers` encoder and as many decoder
  layers, dropout 0.1 (`kw`: more of its arguments)."""
  layers = dict(n_encoder_layers=n_layers, n_decoder_layers=n_layers)
  return trax.models.Transformer(
    vocab, d_model=d_model, d_ff=d_ff, max_len=max_len, mode=mode,
    n_heads=n_heads, dropout=0.1, **layers, **kw
  )  # fmt: skip


def _lm(
  mode, d_model=512, d_ff=2048, n_layers=2, max_len=2048, n_heads=8, **kw
):
  # Bytes in; by default d 512, 2 layers, up to 2048 positions.
  return trax.models.TransformerLM(
    256, d_model=d_model, d_ff=d_ff, n_layers=n_layers, max_len=max_len,
    mode=mode, n_heads=n_heads, dropout=0.1, **kw
  )  # fmt: skip


def _long_source(mode, **kw):
  return transformer(256, 256, 1024, 2, 1024, mode, **kw)


# --quick: one layer, d 64; the smoke test of every part of the bench.
def _toy_lm(mode, **kw):
  return _lm(
    mode, d_model=64, d_ff=128, n_layers=1, max_len=256, n_heads=4, **kw
  )


def toy_transformer(mode, **kw):
  return transformer(256, 64, 128, 1, 128, mode, n_heads=4, **kw)


def translation_model(mode, **kw):
  # The main job's Multi30k model (README recipe) at its vocabulary size.
  return transformer(8192, 256, 1024, 3, 128, mode, **kw)


# name -> (builder, training batch shape: (batch, length) for a language
# model, (batch, source length, target length) for a Transformer, greedy
# decoding: (batch, tokens)).
CASES = {
  'TransformerLM 2x2048': (_lm, (2, 2048), (2, 64)),
  'TransformerLM 4x1024': (_lm, (4, 1024), (4, 64)),
  'Transformer 4x1024 -> 64': (_long_source, (4, 1024, 64), (4, 32)),
  'Transformer 128x32 -> 32 (translation)': (
    translation_model,
    (128, 32, 32),
    (128, 32),
  ),
}
VOCAB_SIZES = {translation_model: 8192}
QUICK_CASES = {
  'toy TransformerLM 2x128': (_toy_lm, (2, 128), (2, 8)),
  'toy Transformer 4x64 -> 16': (toy_transformer, (4, 64, 16), (4, 8)),
}


def vocab_size(builder):
  """The vocabulary `builder`'s model is built with: bytes unless listed."""
  return VOCAB_SIZES.get(builder, 256)


def build(builder, contender, mode):
  """The model with `contender` in every attention site."""
  if contender == BUILTIN:
    return builder(mode)
  with trax_qkv.use_attention(**dict.fromkeys(registry.SITES, contender)):
    return builder(mode)


def _batch(shape, vocab, seed=0):
  """Token inputs of a training step: tokens for a language model, (source,
  target) for a Transformer; no padding."""
  rs = np.random.RandomState(seed)
  if len(shape) == 2:
    return rs.randint(1, vocab, shape).astype(np.int32)
  batch, source, target = shape
  return (
    rs.randint(1, vocab, (batch, source)).astype(np.int32),
    rs.randint(1, vocab, (batch, target)).astype(np.int32),
  )


def training_step(model, inputs):
  """(zero-argument callable: loss and weight gradients of one step, XLA
  temporary bytes). The targets are the (last) inputs."""
  weights, state = model.init(
    shapes.signature(inputs), rng=jax.random.PRNGKey(0)
  )
  targets = inputs if not isinstance(inputs, tuple) else inputs[1]
  loss_layer = tl.WeightedCategoryCrossEntropy()
  rng = jax.random.PRNGKey(1)

  def loss(weights, inputs):
    outputs, _ = model.pure_fn(inputs, weights, state, rng)
    logits = outputs[0] if isinstance(outputs, tuple) else outputs
    return loss_layer((logits, targets, jnp.ones(targets.shape)))

  return timing.compile_with_temp_bytes(
    jax.value_and_grad(loss), weights, inputs
  )


def greedy_decoding(model, shape, source_shape, vocab):
  """Zero-argument callable: `tokens` greedy steps of a predict-mode model,
  one jitted call per token, from token 0 (and a random source)."""
  batch, tokens = shape
  source = (
    None if source_shape is None else _batch((batch, source_shape, 1), vocab)[0]
  )
  first = np.zeros((batch, 1), np.int32)
  signature = shapes.signature(first if source is None else (source, first))
  model.init(signature, rng=jax.random.PRNGKey(0))
  step = jax.jit(model.pure_fn)
  weights, initial_state = model.weights, model.state

  def decode():
    state, token, out = initial_state, jnp.asarray(first), []
    for _ in range(tokens):
      inputs = token if source is None else (source, token)
      outputs, state = step(inputs, weights, state, jax.random.PRNGKey(0))
      logits = outputs[0] if isinstance(outputs, tuple) else outputs
      token = jnp.argmax(logits[:, -1:], axis=-1).astype(jnp.int32)
      out.append(token)
    return jnp.concatenate(out, axis=1)

  return decode


def bench_case(builder, train_shape, decode_shape, rounds, log=print):
  """{contender: {train_steps_per_s, train_round_s, train_temp_mb,
  decode_tokens_per_s}} for one model."""
  vocab = vocab_size(builder)
  inputs = _batch(train_shape, vocab)
  steps, memory = {}, {}
  for name in CONTENDERS:
    steps[name], memory[name] = training_step(
      build(builder, name, 'train'), inputs
    )
  times = timing.interleaved_times(
    steps, rounds, settle=timing.settle_seconds(), untimed=1
  )
  result = {
    name: {
      'train_steps_per_s': 1.0 / float(np.median(times[name])),
      'train_round_s': times[name],
      'train_temp_mb': (
        memory[name] / 2**20 if memory[name] is not None else None
      ),
    }
    for name in CONTENDERS
  }
  log(
    '  training: '
    + ', '.join(
      f'{n} {r["train_steps_per_s"]:.2f} steps/s' for n, r in result.items()
    )
  )
  del steps
  source = train_shape[1] if len(train_shape) == 3 else None
  decoders = {
    name: greedy_decoding(
      build(builder, name, 'predict'), decode_shape, source, vocab
    )
    for name in CONTENDERS
  }
  seconds = timing.interleaved_medians(decoders, max(2, rounds // 2))
  for name in CONTENDERS:
    result[name]['decode_tokens_per_s'] = (
      decode_shape[0] * decode_shape[1] / seconds[name]
    )
  log(
    '  decoding: '
    + ', '.join(
      f'{n} {r["decode_tokens_per_s"]:.0f} tokens/s' for n, r in result.items()
    )
  )
  return result


def run(rounds=DEFAULT_ROUNDS, quick=False, log=print):
  results = {
    'device': jax.devices()[0].device_kind,
    'backend': jax.default_backend(),
    'rounds': rounds,
    'models': [],
  }
  for name, (builder, train_shape, decode_shape) in (
    QUICK_CASES if quick else CASES
  ).items():
    log(f'{name} ...')
    results['models'].append(
      {
        'model': name,
        'train_shape': list(train_shape),
        'decode_shape': list(decode_shape),
        'results': bench_case(builder, train_shape, decode_shape, rounds, log),
      }
    )
  return results


def round_speedups(entry, name):
  """Built-in step time / `name`'s in each round (paired ratios)."""
  base = entry['results'][BUILTIN]['train_round_s']
  return [b / t for b, t in zip(base, entry['results'][name]['train_round_s'])]


def markdown(results):
  """Speed-ups are trax_qkv's rate / the built-in's; memory the step's."""
  names = CONTENDERS
  lines = [
    f'Device: {results["device"]} ({results["backend"]}); training steps: '
    f'medians of {results["rounds"]} interleaved rounds, the spread is '
    'the 25th-75th percentile of the per-round ratios; trax_qkv in every '
    'attention site.',
    '',
    '| model | measure | ' + ' | '.join(names) + ' |',
    '|---|---|' + '---|' * len(names),
  ]
  for entry in results['models']:
    res, base = entry['results'], entry['results'][BUILTIN]
    cells = []
    for name in names:
      cell = (
        f'{res[name]["train_steps_per_s"]:.2f} '
        f'(x{res[name]["train_steps_per_s"] / base["train_steps_per_s"]:.2f}'
      )
      if name != BUILTIN:
        low, high = np.percentile(round_speedups(entry, name), (25, 75))
        cell += f' [{low:.2f}-{high:.2f}]'
      cells.append(cell + ')')
    lines.append(
      f'| {entry["model"]} | training steps/s | ' + ' | '.join(cells) + ' |'
    )
    cells = [
      f'{res[n]["train_temp_mb"]:.0f} MB'
      if res[n]['train_temp_mb'] is not None
      else 'n/a'
      for n in names
    ]
    lines.append(
      f'| {entry["model"]} | step temp memory | ' + ' | '.join(cells) + ' |'
    )
    cells = [
      f'{res[n]["decode_tokens_per_s"]:.0f} '
      f'(x{res[n]["decode_tokens_per_s"] / base["decode_tokens_per_s"]:.2f})'
      for n in names
    ]
    lines.append(
      f'| {entry["model"]} | greedy decoding tokens/s | '
      + ' | '.join(cells)
      + ' |'
    )
  return '\n'.join(lines) + '\n'


def write(results, output_dir):
  timing.write_results(results, output_dir, 'bench_models', markdown(results))
