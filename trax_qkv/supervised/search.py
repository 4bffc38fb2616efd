"""Greedy and beam search as pure JAX: one `lax.while_loop` per search.

Both functions take a `step` function, `step(state, tokens) -> (logits,
state)`, that runs a predict-mode model on one token per row: `tokens` is
(rows, 1) int32, `logits` (rows, 1, vocab), and `state` the model's
predict-mode state (the encoder output it caches, the decoder's K/V caches
and their position). The search calls `step` once outside the loop -- a
Trax `Cache` layer changes the structure of its state on its first call --
and then inside it, so that under `jax.jit` the whole search is one
program: no host round trip per token, the beams reordered on the device.

The rules are those of the per-token Python loop they replace
(`trax_qkv.benchmarks.python_loop_decoding`), step for step: greedy takes
the argmax of the log-softmax; beam search extends every alive beam by
every token, sends candidates that end in EOS to the finished ones (scored
by GNMT's length penalty) as long as fewer than `n_beams` better
candidates stay alive, and stops a source once no alive beam can beat its
best finished hypothesis. Nothing here imports Trax.
"""

import jax
from jax import lax
import jax.numpy as jnp


def length_penalty(length, alpha):
  """GNMT's ((5 + length) / 6) ** alpha; alpha 0 ranks by log-probability."""
  return ((5.0 + length) / 6.0) ** alpha


def _log_probs(logits):
  """The last position's log-softmax, as Trax's `tl.log_softmax` computes
  it (x - logsumexp(x)): greedy decoding takes its argmax, as Trax's
  sampler at temperature 0 does, and rounding decides near-ties."""
  x = logits[:, -1, :].astype(jnp.float32)
  return x - jax.scipy.special.logsumexp(x, axis=-1, keepdims=True)


def greedy_search(step, state, max_length, eos_id, active):
  """Greedy decoding of every row, up to `max_length` tokens.

  Args:
    step: as in the module docstring.
    state: the model's initial predict-mode state.
    max_length: most tokens decoded (a Python int).
    eos_id: the end-of-sequence token.
    active: (rows,) bool, the rows that hold a source; the search stops
      once every active row has produced EOS (padding rows do not count).

  Returns:
    (rows, max_length) int32: each row's tokens, EOS included; the tokens
    after a row's EOS and beyond the last step are meaningless.
  """
  rows = active.shape[0]

  def advance(i, tokens, state, out, done):
    logits, state = step(state, tokens[:, None])
    tokens = argmax(_log_probs(logits)).astype(jnp.int32)
    out = lax.dynamic_update_slice(out, tokens[:, None], (0, i))
    return tokens, state, out, done | (tokens == eos_id)

  out = jnp.zeros((rows, max_length), jnp.int32)
  carry = (1,) + advance(0, jnp.zeros((rows,), jnp.int32), state, out, ~active)

  def keep_going(carry):
    i, _, _, _, done = carry
    return (i < max_length) & ~jnp.all(done)

  def body(carry):
    i, tokens, state, out, done = carry
    return (i + 1,) + advance(i, tokens, state, out, done)

  return lax.while_loop(keep_going, body, carry)[3]


def gather_rows(tree, order, rows, unless_in=None):
  """Every batched array of `tree` with its rows taken in `order`.

  Batched arrays have `rows` rows or a multiple of it as leading axis
  (Trax's decoder caches hold rows * heads, batch-major); row i of the
  result is row order[i], and `order` may be longer than `rows` (copying
  one row into several beams). Scalars (cache positions) are shared by all
  rows and stay. So do the arrays that are leaves of `unless_in` too: what
  a step passed through unchanged (the encoder output and its K/V, kept by
  Trax's `Cache` layers) is the same in every beam of a source, and
  copying it would change nothing.
  """
  unchanged = {id(x) for x in jax.tree_util.tree_leaves(unless_in)}

  def take(x):
    if not jnp.ndim(x) or x.shape[0] % rows or id(x) in unchanged:
      return x
    per_row = x.reshape((rows, x.shape[0] // rows) + x.shape[1:])
    # `order` is in range: 'clip' spares the per-element select with which
    # the default mode fills rows out of range.
    return jnp.take(per_row, order, axis=0, mode='clip').reshape(
      (-1,) + x.shape[1:]
    )

  return jax.tree_util.tree_map(take, tree)


TOP_K_BLOCK = 128


def top_k(x, k, block=TOP_K_BLOCK):
  """`lax.top_k(x, k)` of a (rows, n) array, by blocks.

  XLA's CPU top_k sorts the whole row, which over beams x a vocabulary
  costs more than the model's step (docs/decoding.md: "One program per
  batch shape"). The k best lie in the k blocks of `block` values with
  the largest maxima (ties to the lower index, as top_k's):
  each block ranked above one holding a top-k value holds a value ranked
  above it. So top_k runs on the block maxima and then on those k blocks,
  taken in index order so that equal values still come lowest index first.
  The result is exactly `lax.top_k`'s.
  """
  rows, n = x.shape
  if n <= 4 * block or k > n // block:
    return lax.top_k(x, k)
  padded = -(-n // block) * block
  blocks = jnp.pad(x, ((0, 0), (0, padded - n)), constant_values=-jnp.inf)
  blocks = blocks.reshape(rows, -1, block)
  _, chosen = lax.top_k(jnp.max(blocks, axis=2), k)
  chosen = jnp.sort(chosen, axis=1)
  values, within = lax.top_k(
    jnp.take_along_axis(blocks, chosen[:, :, None], 1).reshape(rows, -1), k
  )
  index = jnp.take_along_axis(chosen, within // block, 1) * block
  return values, index + within % block


def argmax(x, block=TOP_K_BLOCK):
  """`jnp.argmax(x, axis=1)` of a (rows, n) array, by blocks.

  XLA's CPU argmax reduces over (value, index) pairs, which costs more
  per value than the log-softmax before it (docs/benchmarks.md:
  "Decoding"). The first maximum lies in the
  first block whose maximum is the largest (or, as argmax counts NaN as
  largest, in the first block holding a NaN), so a max over blocks, an
  argmax over their maxima and one over that block find it. The last
  block, if short, is read as the `block` values that end the row: any
  it shares with the block before are below the maximum, or that block
  would have been chosen. The result is exactly `jnp.argmax`'s.
  """
  rows, n = x.shape
  if n <= 4 * block:
    return jnp.argmax(x, axis=1)
  whole = n // block * block
  parts = [x[:, :whole].reshape(rows, -1, block)]
  if whole < n:
    parts.append(x[:, None, whole:])
  maxima = jnp.concatenate([jnp.max(p, axis=2) for p in parts], axis=1)
  # XLA:CPU's max does not carry NaN through: NaN is looked for apart.
  nans = jnp.concatenate([jnp.any(jnp.isnan(p), axis=2) for p in parts], axis=1)
  first = jnp.where(
    jnp.any(nans, axis=1),
    jnp.argmax(nans, axis=1),
    jnp.argmax(maxima, axis=1),
  )
  start = jnp.minimum(first * block, n - block)
  window = jax.vmap(lambda row, i: lax.dynamic_slice(row, (i,), (block,)))(
    x, start
  )
  return start + jnp.argmax(window, axis=1)


def _select(candidates, vocab, n_beams, eos_id):
  """One step of beam search over (sources, beams * vocab) `candidates`
  (`vocab` entries per beam; those past the model's vocabulary -inf).

  Candidates are taken best first until n_beams go on; one that ends in
  EOS finishes, if fewer than n_beams better ones went on. Returns the
  new alive beams' (scores, parent beams, tokens), each (sources,
  n_beams), -inf / 0 / 0 where fewer candidates were finite, and
  (values, parents, finishes) of the candidates looked at.
  """
  # 2 * n_beams candidates always hold n_beams that do not end in EOS.
  values, index = top_k(candidates, min(2 * n_beams, candidates.shape[1]))
  parents, tokens = index // vocab, (index % vocab).astype(jnp.int32)
  finite = jnp.isfinite(values)
  ends = tokens == eos_id
  goes_on = finite & ~ends
  going_before = jnp.cumsum(goes_on, axis=1) - goes_on
  finishes = finite & ends & (going_before < n_beams)
  # Slot k takes the k-th candidate that goes on; slot n_beams is a bin.
  slot = jnp.where(goes_on & (going_before < n_beams), going_before, n_beams)

  def scatter(x, fill):
    return jax.vmap(
      lambda x, s: jnp.full((n_beams + 1,), fill, x.dtype).at[s].set(x)
    )(x, slot)[:, :n_beams]

  return (
    (scatter(values, -jnp.inf), scatter(parents, 0), scatter(tokens, 0)),
    (values, parents, finishes),
  )


def _better_finished(best, step, prefixes, looked_at, alpha):
  """`best` (score, log-probability, tokens, length per source) updated
  with the candidates of `step` that finish, where one scores higher:
  log-probability / length_penalty(step + 1), the first of equals kept."""
  values, parents, finishes = looked_at
  scores = jnp.where(
    finishes, values / length_penalty(step + 1.0, alpha), -jnp.inf
  )
  pick = jnp.argmax(scores, axis=1)[:, None]

  def picked(x):
    return jnp.take_along_axis(x, pick, 1)[:, 0]

  score = picked(scores)
  tokens = jnp.take_along_axis(prefixes, picked(parents)[:, None, None], 1)
  better = score > best[0]
  return (
    jnp.where(better, score, best[0]),
    jnp.where(better, picked(values), best[1]),
    jnp.where(better[:, None], tokens[:, 0], best[2]),
    jnp.where(better, step, best[3]),
  )


def beam_search(step, state, n_beams, max_length, eos_id, alpha, active):
  """Beam search, `n_beams` beams per source, up to `max_length` tokens.

  The first step runs one row per source (the encoder too): all beams
  start equal. Its state is then copied into the beams, and the loop runs
  sources * n_beams rows, the beams of source b in rows b * n_beams ...
  b * n_beams + n_beams - 1.

  Args:
    step: as in the module docstring, for one row per source and for
      n_beams rows per source.
    state: the model's initial predict-mode state, one row per source.
    n_beams, max_length: Python ints.
    eos_id: the end-of-sequence token.
    alpha: GNMT length penalty (a Python float).
    active: (sources,) bool, the sources that are real; the search stops
      once every active source is done.

  Returns:
    (tokens, lengths, log_probs) per source: (sources, max_length) int32
    ids of its best hypothesis without EOS, their number, and the model's
    log-probability of them (with EOS, if the hypothesis ended).
  """
  sources = active.shape[0]
  # Log-probabilities only fall as a beam grows, so an alive beam can score
  # at most (its score now) / (the largest length penalty).
  bound = length_penalty(max_length, alpha)

  def advance(i, carry, first=False):
    """Step i: every alive beam extended by every token, the best kept."""
    tokens, state, scores, prefixes, best = carry
    beams = scores.shape[1]  # 1 in the first step, then n_beams
    logits, new_state = step(state, tokens.reshape(-1, 1))
    vocab = logits.shape[-1]
    # Each beam's candidates padded with -inf to whole blocks of `top_k`,
    # in the pass that adds the scores: a vocabulary of other sizes
    # (8,345) made top_k pad, i.e. copy, all candidates once more.
    width = -(-vocab // TOP_K_BLOCK) * TOP_K_BLOCK
    log_probs = jnp.pad(
      _log_probs(logits).reshape(sources, beams, vocab),
      ((0, 0), (0, 0), (0, width - vocab)),
      constant_values=-jnp.inf,
    )
    (scores, parents, tokens), looked_at = _select(
      (scores[..., None] + log_probs).reshape(sources, -1),
      width,
      n_beams,
      eos_id,
    )
    best = _better_finished(best, i, prefixes, looked_at, alpha)
    prefixes = jnp.take_along_axis(prefixes, parents[..., None], 1)
    prefixes = lax.dynamic_update_slice(prefixes, tokens[..., None], (0, 0, i))
    order = (jnp.arange(sources)[:, None] * beams + parents).reshape(-1)
    new_state = gather_rows(
      new_state, order, sources * beams, unless_in=None if first else state
    )
    return tokens, new_state, scores, prefixes, best

  def keep_going(loop):
    i, (_, _, scores, _, (best_score, _, _, _)) = loop
    beaten = jnp.isfinite(best_score) & (
      best_score >= jnp.max(scores, axis=1) / bound
    )
    return (i < max_length) & ~jnp.all(~active | beaten)

  def body(loop):
    i, carry = loop
    return i + 1, advance(i, carry)

  no_best = (
    jnp.full((sources,), -jnp.inf),
    jnp.zeros((sources,)),
    jnp.zeros((sources, max_length), jnp.int32),
    jnp.zeros((sources,), jnp.int32),
  )
  first = (
    jnp.zeros((sources, 1), jnp.int32),
    state,
    jnp.zeros((sources, 1)),
    jnp.zeros((sources, 1, max_length), jnp.int32),
    no_best,
  )
  steps, carry = lax.while_loop(
    keep_going, body, (1, advance(0, first, first=True))
  )
  _, _, scores, prefixes, (best_score, log_prob, tokens, length) = carry
  # A source without a finished hypothesis (max_length reached): its best
  # alive beam, all `steps` tokens of it.
  alive = jnp.argmax(scores, axis=1)
  unfinished = jnp.isneginf(best_score)
  return (
    jnp.where(
      unfinished[:, None],
      jnp.take_along_axis(prefixes, alive[:, None, None], 1)[:, 0],
      tokens,
    ),
    jnp.where(unfinished, steps, length),
    jnp.where(
      unfinished, jnp.take_along_axis(scores, alive[:, None], 1)[:, 0], log_prob
    ),
  )
