"""What a trained Transformer's attention weights say, head by head.

For head h of an attention layer whose input projections are W_Q, W_K,
W_V (d x d; the identity where a variant has none, one head's d x d_head
block repeated for multi-query) and whose output Dense is W_O (d x d),
Elhage et al. (2021) read two circuits:

  QK  M_h = W_Q[:, h] W_K[:, h]^T (d x d, rank <= d_head): the head's
      scores are x_i M_h x_j^T / sqrt(d_head), biases aside.
  OV  N_h = W_V[:, h] W_O[h, :] (d x d): what the head writes for what it
      reads. Only the product acts, so per head one of W_V, W_O is a
      choice of factorization.

Each circuit is summarized by three numbers (`circuit_measures`):

  asymmetry  ||C - C^T|| / ||C|| (Frobenius): 0 for a symmetric form, as
             unprojected or shared-query-key attention has by construction.
  trace      tr(C) / ||C||_* (nuclear norm), in [-1, 1]: 1 for a positive
             semi-definite form, which (QK) scores a token highest against
             itself and its copies, or (OV) copies what it reads; near 0
             for a form that mixes directions. Trockman & Kolter (2023)
             find trained QK forms of vision Transformers near +-I.
  rank       the effective rank exp(H(s / sum s)) of the singular values s
             (Roy & Vetterli 2007): how many of its at most d_head
             directions the head uses (Bhojanapalli et al. 2020 on the
             d_head bottleneck).

`head_importance` is Michel et al.'s (2019): the change in the loss on
held-out pairs when one head is masked (its rows of W_O zeroed), the rest
of the model unchanged.
"""

import jax
from jax import numpy as jnp
import numpy as np

from trax_qkv.layers import variants
from trax_qkv.models import registry
from trax_qkv.models import variants as registered_variants

CORES = {'PureAttention': 'attend', 'DotProductCausalAttention': 'causal'}
# Per site of a Transformer, the part of the model it is in, as reports
# name them.
PARTS = {name: site.part for name, site in registry.SITES.items()}


def projections_of(implementation):
  """(Projections, whether it is the one-head variant) of a registered
  implementation name: Trax's three Dense for anything not a variant."""
  if implementation == 'one_head':
    return variants.Projections(), True
  record, _ = registered_variants.VARIANTS.get(implementation, (None, None))
  return record or variants.Projections(), False


def attention_blocks(model):
  """[(site, block)] of the attention layers of `model` that a site built
  (`registry.attention_sites`), in tree order.

  A block is the layer, within the site's layer, whose sublayers hold the
  attention core (PureAttention or DotProductCausalAttention), the input
  projections before it and the output Dense after it: Trax's
  `AttentionQKV` and `CausalAttention`, 'reference' and the variants
  alike.
  """
  return [
    (site, _block(layer)) for site, layer in registry.attention_sites(model)
  ]


def _block(layer):
  for sub in registry.walk(layer):
    if any(type(s).__name__ in CORES for s in sub.sublayers):
      return sub
  raise ValueError(
    f'{layer.name}: no attention core ({", ".join(CORES)}) in it.'
  )


def leaves(layer):
  """The layers under `layer` without sublayers, in the tree's order."""
  return [sub for sub in registry.walk(layer) if not sub.sublayers]


def block_weights(block):
  """(input weights in tree order, the output Dense layer) of a block: the
  weights of every Dense and InputProjections before the core, flattened
  to a list ((W, b) pairs, and a variant's temperatures last)."""
  before, output, seen_core = [], None, False
  for leaf in leaves(block):
    name = type(leaf).__name__
    if name in CORES:
      seen_core = True
    elif name == 'InputProjections':
      before += list(leaf.weights)
    elif name == 'Dense':
      if seen_core:
        output = leaf
      else:
        before.append(leaf.weights)
  if output is None:
    raise ValueError(f'{block.name}: no output Dense after the attention.')
  return before, output


def head_slices(implementation, n_heads, d):
  """Per head, the slice of the d features it owns: its columns of the
  input projections, its rows of the output Dense W_O. One slice for the
  one-head variant, whatever the model's `n_heads`."""
  heads = 1 if projections_of(implementation)[1] else n_heads
  d_head = d // heads
  return [slice(h * d_head, (h + 1) * d_head) for h in range(heads)]


def head_matrices(block, implementation, n_heads):
  """Per head, (W_Q, W_K, W_V, W_O) of a block as numpy arrays: d x
  d_head, d x d_head, d x d_head, d_head x d (module doc), for the
  registered `implementation` the block was built by."""
  projections, _ = projections_of(implementation)
  before, output = block_weights(block)
  w_o = np.asarray(output.weights[0], np.float64)
  d = w_o.shape[1]
  heads = head_slices(implementation, n_heads, d)
  own = iter(before)
  dense = {}
  for name in 'qkv':
    kind = getattr(projections, name)
    if kind in ('dense', 'head'):
      dense[name] = np.asarray(next(own)[0], np.float64)
  temperature = (
    np.exp(np.asarray(next(own), np.float64))
    if projections.temperature
    else np.ones(len(heads))
  )
  identity = np.eye(d)

  def per_head(name, rows):
    kind = getattr(projections, name)
    if kind == 'none':
      w = identity
    elif kind == 'head':
      return dense[name]
    else:
      w = dense['q' if kind == 'q' else name]
    return w[:, rows]

  return [
    (
      per_head('q', rows) * temperature[h],
      per_head('k', rows),
      per_head('v', rows),
      w_o[rows],
    )
    for h, rows in enumerate(heads)
  ]


def circuit_measures(c):
  """{'asymmetry', 'trace', 'rank'} of one d x d circuit (module doc)."""
  c = np.asarray(c, np.float64)
  norm = np.linalg.norm(c)
  s = np.linalg.svd(c, compute_uv=False)
  p = s / s.sum()
  p = p[p > 0]
  return dict(
    asymmetry=float(np.linalg.norm(c - c.T) / norm),
    trace=float(np.trace(c) / s.sum()),
    rank=float(np.exp(-np.sum(p * np.log(p)))),
  )


def head_circuits(heads):
  """Per head, {'qk_asymmetry', 'qk_trace', 'qk_rank', 'ov_...'}."""
  out = []
  for w_q, w_k, w_v, w_o in heads:
    qk = circuit_measures(w_q @ w_k.T)
    ov = circuit_measures(w_v @ w_o)
    out.append(
      {f'qk_{k}': v for k, v in qk.items()}
      | {f'ov_{k}': v for k, v in ov.items()}
    )
  return out


def model_circuits(model, attention, n_heads):
  """The circuit measures of a Transformer's varied sites.

  Args:
    model: the Transformer, its weights loaded.
    attention: {site: implementation name} it was built with (the run's
      settings); sites not in it are Trax's.
    n_heads: the model's heads per layer.

  Returns:
    {part: {measure: [per layer, the mean over its heads]}} for each part
    ('encoder', 'decoder', 'cross') of `attention`.
  """
  result = {}
  for site, block in attention_blocks(model):
    if site not in attention:
      continue
    heads = head_circuits(head_matrices(block, attention[site], n_heads))
    part = result.setdefault(PARTS[site], {})
    for key in heads[0]:
      part.setdefault(key, []).append(float(np.mean([h[key] for h in heads])))
  return result


def _loss_fn(model):
  """weights, state, (source, target, mask) -> summed token cross-entropy
  and the number of target tokens."""

  def loss(weights, state, batch):
    src, tgt, mask = batch
    logits = model.pure_fn((src, tgt), weights, state, jax.random.PRNGKey(0))[
      0
    ][0]
    logp = jax.nn.log_softmax(logits)
    picked = jnp.take_along_axis(logp, tgt[..., None], axis=-1)[..., 0]
    return -jnp.sum(picked * mask), jnp.sum(mask)

  return jax.jit(loss)


def mean_loss(model, batches, loss=None):
  """The mean token cross-entropy (nats, no label smoothing) of `model` in
  eval mode over `batches` of (source, target, mask)."""
  loss = loss or _loss_fn(model)
  total, count = 0.0, 0.0
  for batch in batches:
    s, n = loss(model.weights, model.state, batch)
    total, count = total + float(s), count + float(n)
  return total / count


def head_importance(model, attention, n_heads, batches):
  """Michel et al.'s head importance in the varied sites.

  Args:
    model: the Transformer in eval mode, its weights loaded (restored
      afterwards).
    attention, n_heads: as for `model_circuits`.
    batches: held-out (source, target, mask) batches.

  Returns:
    {'loss': the unmasked mean loss, part: [per layer, [per head]]}: the
    rise of the mean loss when that one head is masked.
  """
  loss = _loss_fn(model)
  base = mean_loss(model, batches, loss)
  result = {'loss': base}
  for site, block in attention_blocks(model):
    if site not in attention:
      continue
    _, output = block_weights(block)
    w_o, b_o = output.weights
    rises = []
    for rows in head_slices(attention[site], n_heads, w_o.shape[0]):
      masked = np.array(w_o)
      masked[rows] = 0
      output.weights = (jnp.asarray(masked), b_o)
      rises.append(mean_loss(model, batches, loss) - base)
    output.weights = (w_o, b_o)
    result.setdefault(PARTS[site], []).append(rises)
  return result
