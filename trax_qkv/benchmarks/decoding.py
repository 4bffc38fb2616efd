"""Decoding speed: Trax's sampler, release 0.3's Python loop, the compiled
search (`trax-qkv-bench --only decoding`).

Three models with trax_qkv's `'auto'` layers in every attention site (as
its users decode them), random weights (so no hypothesis ends early and
every contender decodes every token):

  - the Multi30k-sized `Transformer` (vocabulary 8192, d_model 256, d_ff
    1024, 3 + 3 layers, 8 heads): 100 sources of 24 tokens, 32 tokens
    decoded each, 32 sentences per batch; greedy and beam search (4);
  - the main job's `LSTMSeq2SeqAttn` (`trax-qkv-validate --model
    lstm_seq2seq_attn`: vocabulary 512, d_model 128, 2 + 2 LSTM layers, 4
    heads), the same sources and searches (not with `--quick`: its code
    is the Transformer's). Trax's model runs its LSTM encoder over the
    whole source at every step (it has no `Cache` around it), and so does
    every contender;
  - the `TransformerLM` of the model bench (bytes, d_model 512, 2 layers):
    greedy sampling of 64 tokens for 8 rows from token 0.

Contenders, interleaved in one run (`timing.interleaved_times`):
'autoregressive_sample' (Trax's, its default 2048-position cache, greedy
only), 'python loop' (`python_loop_decoding`, one jitted model call per
token, cache sized to the output) and 'compiled' (`decoding.Decoder` /
`search.greedy_search`: one program per batch). FLOPs are XLA's count of
the model's work that decoding needs -- the encoder once per source, one
decoder step per row and token -- the same for every contender of a row,
so GFLOP/s compares them as tokens/s does, and against the matmul rate
measured in the same run.
"""

import functools
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from trax import shapes
import trax.models
from trax.supervised import decoding as trax_decoding

from trax_qkv.benchmarks import models
from trax_qkv.benchmarks import python_loop_decoding
from trax_qkv.benchmarks import timing
from trax_qkv.data import EOS_ID
from trax_qkv.supervised import decoding
from trax_qkv.supervised import search

DEFAULT_ROUNDS = 3
TRANSLATION = dict(sources=100, source_length=24, tokens=32, batch=32)
QUICK_TRANSLATION = dict(sources=6, source_length=8, tokens=6, batch=4)
LM = dict(rows=8, tokens=64)
QUICK_LM = dict(rows=2, tokens=8)
N_BEAMS = 4
ATTENTION = 'auto'


def _quick_translation_model(mode):
  return models.transformer(512, 64, 128, 1, 64, mode)


def lstm_translator(mode):
  """The main job's LSTMSeq2SeqAttn (its default settings), vocabulary 512."""
  return trax.models.LSTMSeq2SeqAttn(
    512,
    512,
    d_model=128,
    n_encoder_layers=2,
    n_decoder_layers=2,
    n_attention_heads=4,
    mode=mode,
  )


def _with_attention(builder):
  """builder(mode) with ATTENTION in every site."""
  return functools.partial(models.build, builder, ATTENTION)


def _step_flops(model, inputs, state):
  """(XLA's FLOPs of one predict-mode call, the state after it)."""
  rng = jax.random.PRNGKey(0)
  step = jax.jit(model.pure_fn)
  compiled = step.lower(inputs, model.weights, state, rng).compile()
  flops = compiled.cost_analysis()['flops']
  return flops, step(inputs, model.weights, state, rng)[1]


def translation_flops(model, rows, source_length):
  """(first-step FLOPs per source beyond a later step's, FLOPs per row and
  later step) of a predict-mode translation model: a Transformer's first
  step runs the encoder and later ones only the decoder; Trax's
  LSTMSeq2SeqAttn runs its encoder in every step."""
  sources = np.ones((rows, source_length), np.int32)
  token = np.zeros((rows, 1), np.int32)
  first, state = _step_flops(model, (sources, token), model.state)
  later, _ = _step_flops(model, (sources, token), state)
  return (first - later) / rows, later / rows


def translation_case(builder, vocab, quick=False, log=print):
  """Contenders -> zero-argument callables, and the FLOPs each call does,
  for the translation model that `builder(mode)` builds with a vocabulary
  of `vocab`: {(search, contender): (fn, flops)}."""
  shape = QUICK_TRANSLATION if quick else TRANSLATION
  model_fn = _with_attention(builder)
  n, length = shape['sources'], shape['source_length']
  tokens, batch = shape['tokens'], shape['batch']
  rs = np.random.RandomState(0)
  sources = [
    rs.randint(2, vocab, length - 1).tolist() + [EOS_ID] for _ in range(n)
  ]
  directory = tempfile.mkdtemp(prefix='trax_qkv_bench_decoding_')
  path = os.path.join(directory, 'model.pkl.gz')
  model = model_fn('eval')
  model.init(
    shapes.signature((np.ones((1, length), np.int32),) * 2),
    rng=jax.random.PRNGKey(0),
  )
  model.save_to_file(path)
  greedy_model = decoding.predict_model(model_fn, path, batch, length, tokens)
  encoder, per_token = translation_flops(greedy_model, batch, length)
  log(
    f'  XLA FLOPs: first step {encoder / 1e6:.1f} M more per source, '
    f'{per_token / 1e6:.2f} M per row and step'
  )
  greedy_flops = n * (encoder + tokens * per_token)
  beam_flops = n * (encoder + per_token + (tokens - 1) * N_BEAMS * per_token)
  loop_greedy = python_loop_decoding.accelerated(greedy_model)
  loop_beam = python_loop_decoding.accelerated(
    decoding.predict_model(model_fn, path, batch * N_BEAMS, length, tokens)
  )
  sampler = decoding.predict_model(model_fn, path, batch, length)
  greedy = decoding.Decoder(model_fn, path)
  beam = decoding.Decoder(model_fn, path, N_BEAMS)

  fast, initial = python_loop_decoding.accelerated(sampler)

  def sample():
    out = []
    for start in range(0, n, batch):
      rows = sources[start : start + batch]
      fast.state = initial
      out.append(
        trax_decoding.autoregressive_sample(
          fast,
          decoding.pad_rows(rows + [[]] * (batch - len(rows)), length),
          batch_size=batch,
          temperature=0.0,
          max_length=tokens,
          eos_id=EOS_ID,
          accelerate=False,
        )
      )
    return out

  return {
    ('greedy', 'autoregressive_sample'): (sample, greedy_flops),
    ('greedy', 'python loop'): (
      lambda: python_loop_decoding.greedy_decode(
        loop_greedy, sources, batch, length, tokens
      ),
      greedy_flops,
    ),
    ('greedy', 'compiled'): (
      lambda: greedy.decode(sources, batch, tokens, length),
      greedy_flops,
    ),
    (f'beam {N_BEAMS}', 'python loop'): (
      lambda: python_loop_decoding.beam_decode(
        loop_beam, sources, batch, length, N_BEAMS, tokens
      ),
      beam_flops,
    ),
    (f'beam {N_BEAMS}', 'compiled'): (
      lambda: beam.decode(sources, batch, tokens, length),
      beam_flops,
    ),
  }


def lm_case(quick=False):
  """{('greedy', contender): (fn, flops)} for the TransformerLM."""
  shape = QUICK_LM if quick else LM
  rows, tokens = shape['rows'], shape['tokens']
  first = np.zeros((rows, 1), np.int32)

  lm = _with_attention(models._lm)
  sized = decoding._predict_layer(lm, tokens)
  sized.init(shapes.signature(first), rng=jax.random.PRNGKey(0))
  sampler = lm('predict')
  sampler.init(shapes.signature(first), rng=jax.random.PRNGKey(0))
  per_token, _ = _step_flops(sized, first, sized.state)
  flops = tokens * per_token
  weights, initial = sized.weights, sized.state
  rng = jax.random.PRNGKey(0)
  step = jax.jit(sized.pure_fn)

  def loop():
    state, token, out = initial, jnp.asarray(first), []
    for _ in range(tokens):
      logits, state = step(token, weights, state, rng)
      token = jnp.argmax(
        jax.nn.log_softmax(logits[:, -1]), axis=-1, keepdims=True
      ).astype(jnp.int32)
      out.append(token)
    return jnp.concatenate(out, axis=1)

  @jax.jit
  def compiled(weights, state):
    def lm_step(state, tokens):
      return sized.pure_fn(tokens, weights, state, rng)

    active = jnp.ones((rows,), bool)
    return search.greedy_search(lm_step, state, tokens, -1, active)

  fast_sampler, sampler_state = python_loop_decoding.accelerated(sampler)

  def sample():
    fast_sampler.state = sampler_state
    return trax_decoding.autoregressive_sample(
      fast_sampler,
      batch_size=rows,
      temperature=0.0,
      max_length=tokens,
      eos_id=-1,
      accelerate=False,
    )

  return {
    ('greedy', 'autoregressive_sample'): (sample, flops),
    ('greedy', 'python loop'): (loop, flops),
    ('greedy', 'compiled'): (
      functools.partial(compiled, weights, initial),
      flops,
    ),
  }


def _same_outputs(a, b):
  return all(
    np.array_equal(np.asarray(x), np.asarray(y))
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
  )


def run(rounds=DEFAULT_ROUNDS, quick=False, log=print):
  """{'matmul_gflops', 'models': {model: {'tokens', 'rows': {...}}}}."""
  matmul = timing.matmul_flops_per_second()
  log(f'matmul rate: {matmul / 1e9:.1f} GFLOP/s (2048^3, float32)')
  shape = QUICK_TRANSLATION if quick else TRANSLATION
  lm = QUICK_LM if quick else LM
  results = {
    'matmul_gflops': matmul / 1e9,
    'rounds': rounds,
    'attention': ATTENTION,
    'models': {},
  }
  translators = [
    (
      'Transformer (Multi30k-sized)',
      _quick_translation_model if quick else models.translation_model,
      512 if quick else models.vocab_size(models.translation_model),
    )
  ]
  if not quick:  # the same code as the Transformer's: --quick skips it
    translators.append(('LSTMSeq2SeqAttn (main job)', lstm_translator, 512))
  cases = [
    (
      name,
      functools.partial(translation_case, builder, vocab, quick, log),
      shape['sources'] * shape['tokens'],
    )
    for name, builder, vocab in translators
  ]
  cases.append(
    (
      'TransformerLM',
      functools.partial(lm_case, quick),
      lm['rows'] * lm['tokens'],
    )
  )
  for name, build, tokens in cases:
    log(f'{name}: building and compiling ...')
    case = build()
    # Same tokens from the loop and the compiled search (random weights:
    # every row decodes to the end).
    for search_name in {s for s, _ in case}:
      loop, compiled = (
        case[search_name, 'python loop'][0],
        case[search_name, 'compiled'][0],
      )
      if not _same_outputs(loop(), compiled()):
        log(
          f'  warning: {search_name}: the compiled search decoded other tokens'
        )
    times = timing.interleaved_times(
      {key: fn for key, (fn, _) in case.items()},
      rounds,
      settle=timing.settle_seconds(),
    )
    rows = {}
    for (search_name, contender), (_, flops) in case.items():
      t = np.array(times[search_name, contender])
      seconds = float(np.median(t))
      rows[f'{search_name} / {contender}'] = dict(
        search=search_name,
        contender=contender,
        seconds=seconds,
        seconds_min=float(t.min()),
        seconds_max=float(t.max()),
        tokens_per_s=tokens / seconds,
        gflops_per_s=flops / seconds / 1e9,
        matmul_fraction=flops / seconds / matmul,
        flops=flops,
      )
    ratios = {}
    for search_name in sorted({s for s, _ in case}):
      per_round = np.array(times[search_name, 'python loop']) / np.array(
        times[search_name, 'compiled']
      )
      key = f'{search_name}: compiled vs python loop'
      ratios[key] = timing.spread(per_round)
    if ('beam 4', 'compiled') in case:
      ratios['compiled: beam 4 / greedy time'] = timing.spread(
        np.array(times['beam 4', 'compiled'])
        / np.array(times['greedy', 'compiled'])
      )
    results['models'][name] = dict(tokens=tokens, rows=rows, ratios=ratios)
    for key, row in rows.items():
      log(
        f'  {key}: {row["seconds"]:.3f} s ({row["seconds_min"]:.3f}-'
        f'{row["seconds_max"]:.3f}), {row["tokens_per_s"]:.0f} tokens/s, '
        f'{row["gflops_per_s"]:.1f} GFLOP/s '
        f'({100 * row["matmul_fraction"]:.0f} % of matmul)'
      )
    for key, r in ratios.items():
      log(f'  {key}: x{r["median"]:.2f} ({r["min"]:.2f}-{r["max"]:.2f})')
  return results


def markdown(results):
  lines = [
    f'Matmul rate measured in the same run: '
    f'{results["matmul_gflops"]:.1f} GFLOP/s; medians of '
    f'{results["rounds"]} interleaved rounds, (min-max); '
    f'{results["attention"]!r} in every attention site.',
    '',
    '| model | search | contender | s per call | tokens/s | GFLOP/s '
    '| of matmul rate |',
    '|---|---|---|---|---|---|---|',
  ]
  for model, entry in results['models'].items():
    for row in entry['rows'].values():
      lines.append(
        f'| {model} | {row["search"]} | {row["contender"]} | '
        f'{row["seconds"]:.3f} ({row["seconds_min"]:.3f}-'
        f'{row["seconds_max"]:.3f}) | {row["tokens_per_s"]:.0f} | '
        f'{row["gflops_per_s"]:.1f} | '
        f'{100 * row["matmul_fraction"]:.0f} % |'
      )
  lines += ['', '| model | ratio (per round) | median | min-max |']
  lines.append('|---|---|---|---|')
  for model, entry in results['models'].items():
    for key, r in entry['ratios'].items():
      lines.append(
        f'| {model} | {key} | x{r["median"]:.2f} | '
        f'{r["min"]:.2f}-{r["max"]:.2f} |'
      )
  return '\n'.join(lines) + '\n'


def write(results, output_dir):
  timing.write_results(results, output_dir, 'bench_decoding', markdown(results))
