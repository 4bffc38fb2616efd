"""Small tasks chosen so that the Gram bound forbids the natural solution.

The model is one self-attention layer of a registered implementation
(`'reference'` or a variant of trax_qkv.models.variants), between token
embeddings plus sinusoidal positions (optionally LayerNorm'd) and a Dense
to the vocabulary, with no residual: whatever the model predicts at a
position it has read through that one layer. The tasks (random tokens of
a vocabulary of 16, sequences of 24):

  swap             the target at 2k is token 2k+1 and at 2k+1 token 2k:
                   each of a pair reads the other, the mutual preference
                   that a Gram head's maxima cannot show (gram_bound, 2).
  previous         the target at i >= 1 is token i-1: a predecessor head,
                   which a Gram head can be only with a diagonal that
                   falls along the sequence (gram_bound, 1); absolute
                   positions let it fall.
  previous_offset  the same, the positions of each sequence starting at a
                   random offset in [0, 64): a diagonal that falls by
                   absolute position must fall over 88 positions.
  copy             a random half of 12 tokens, then the same again, under
                   a causal mask; in the second copy the target at t is
                   token t+1 (token t-11 of the first copy): read a fixed
                   distance back, the induction head's job made positional.

`train` trains one model; `measure` reads its accuracy and, per head,
where each scored row's attention peaks (on the target, on itself,
elsewhere) and whether the bound's consequences hold in its scores.
"""

import dataclasses

import jax
from jax import numpy as jnp
import numpy as np
import trax
from trax import layers as tl
from trax import shapes

from trax_qkv.models import registry
from trax_qkv.research import circuits
from trax_qkv.research import gram_bound

TASKS = ('swap', 'previous', 'previous_offset', 'copy')
MAX_OFFSET = 64


@dataclasses.dataclass(frozen=True)
class Setting:
  """One synthetic training run's settings (the defaults: 300 steps of
  Adam at 0.01 on batches of 64, d_model 64, 2 heads)."""

  task: str = 'swap'
  implementation: str = 'reference'
  layer_norm: bool = False
  seed: int = 0
  vocab: int = 16
  length: int = 24
  d_model: int = 64
  n_heads: int = 2
  steps: int = 300
  batch: int = 64
  learning_rate: float = 0.01
  eval_every: int = 25
  eval_batch: int = 256

  def __post_init__(self):
    if self.task not in TASKS:
      raise ValueError(f'task must be one of {TASKS}; got {self.task!r}.')
    if self.length % 2:
      raise ValueError(f'length must be even; got {self.length}.')
    registry.resolve_attention(registry.SELF_ATTENTION, self.implementation)


def batch(setting, rng):
  """(tokens, positions, mask, targets, weights) of one batch; `rng` a
  numpy RandomState. mask is the (batch, 1, 1, L) padding mask of
  self-attention, all True; `copy` runs causal attention instead."""
  n, length, task = setting.batch, setting.length, setting.task
  tokens = rng.randint(0, setting.vocab, (n, length)).astype(np.int32)
  if task == 'copy':
    tokens[:, length // 2 :] = tokens[:, : length // 2]
  offsets = (
    rng.randint(0, MAX_OFFSET, (n, 1))
    if task == 'previous_offset'
    else np.zeros((n, 1), int)
  )
  positions = (offsets + np.arange(length)).astype(np.int32)
  mask = np.ones((n, 1, 1, length), bool)
  target_position = targets_of(task, length)
  weights = (target_position >= 0).astype(np.float32)
  targets = tokens[:, np.maximum(target_position, 0)] * (weights > 0)
  weights = np.broadcast_to(weights, (n, length)).astype(np.float32)
  return tokens, positions, mask, targets.astype(np.int32), weights


def targets_of(task, length):
  """Per position, the position whose token is its target (-1: none)."""
  i = np.arange(length)
  if task == 'swap':
    return i ^ 1
  if task in ('previous', 'previous_offset'):
    return i - 1  # -1 at position 0: no target
  half = length // 2  # copy: from the second copy's first token on
  return np.where((i >= half) & (i < length - 1), i + 1 - half, -1)


def _sinusoids(positions, d_model):
  """Trax's PositionalEncoding table at explicit positions."""
  half = d_model // 2
  rates = jnp.exp(-jnp.log(10000.0) * jnp.arange(half) * 2 / d_model)
  angles = positions[..., None].astype(jnp.float32) * rates
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def site(task):
  """The attention site a task trains: causal for `copy`."""
  if task == 'copy':
    return registry.CAUSAL_ATTENTION
  return registry.SELF_ATTENTION


def visible(task, length):
  """(L, L) bool: the keys each query may read."""
  keys = np.ones((length, length), bool)
  return np.tril(keys) if task == 'copy' else keys


def model(setting, mode='train'):
  """(tokens, positions, mask) -> logits: the front (embeddings plus
  positions, LayerNorm'd or not), the attention of the task's site, a
  Dense to the vocabulary."""
  d = setting.d_model
  front = tl.Serial(
    tl.Embedding(setting.vocab, d),
    tl.Fn('AddPositions', lambda x, p: x + _sinusoids(p, d)),
    [tl.LayerNorm()] if setting.layer_norm else [],
  )
  attention = registry.build(
    site(setting.task),
    setting.implementation,
    d,
    n_heads=setting.n_heads,
    dropout=0.0,
    mode=mode,
  )
  drop_mask = tl.Select([0], n_in=2)
  if site(setting.task) == registry.CAUSAL_ATTENTION:
    return tl.Serial(front, drop_mask, attention, tl.Dense(setting.vocab))
  return tl.Serial(front, attention, drop_mask, tl.Dense(setting.vocab))


def _loss(logits, targets, weights):
  log_p = jax.nn.log_softmax(logits)
  picked = jnp.take_along_axis(log_p, targets[..., None], -1)[..., 0]
  return -jnp.sum(picked * weights) / jnp.sum(weights)


def _accuracy(logits, targets, weights):
  right = (jnp.argmax(logits, -1) == targets) * weights
  return jnp.sum(right) / jnp.sum(weights)


def train(setting):
  """(trained model, [(step, eval accuracy)]): Adam from the seed's
  initialization; the eval batch is the same for every setting of a
  seed."""
  net = model(setting)
  data = np.random.RandomState(setting.seed)
  sample = batch(setting, data)
  net.init(shapes.signature(sample[:3]), rng=jax.random.PRNGKey(setting.seed))
  weights, state = net.weights, net.state
  optimizer = trax.optimizers.Adam(setting.learning_rate)
  slots, opt_params = optimizer.tree_init(weights)
  eval_data = batch(
    dataclasses.replace(setting, batch=setting.eval_batch),
    np.random.RandomState(10_000 + setting.seed),
  )
  rng = jax.random.PRNGKey(0)  # no dropout: unused

  def loss(weights, inputs, targets, mask_weights):
    logits, _ = net.pure_fn(inputs, weights, state, rng)
    return _loss(logits, targets, mask_weights)

  @jax.jit
  def step(i, weights, slots, inputs, targets, mask_weights):
    grads = jax.grad(loss)(weights, inputs, targets, mask_weights)
    weights, slots, _ = optimizer.tree_update(
      i, grads, weights, slots, opt_params
    )
    return weights, slots

  @jax.jit
  def accuracy(weights):
    logits, _ = net.pure_fn(eval_data[:3], weights, state, rng)
    return _accuracy(logits, *eval_data[3:])

  curve = [(0, float(accuracy(weights)))]
  for i in range(setting.steps):
    tokens, positions, mask, targets, mask_weights = batch(setting, data)
    weights, slots = step(
      i, weights, slots, (tokens, positions, mask), targets, mask_weights
    )
    if (i + 1) % setting.eval_every == 0 or i + 1 == setting.steps:
      curve.append((i + 1, float(accuracy(weights))))
  net.weights = weights
  return net, curve


def _projections(net):
  """The layer that makes (q, k, v) in the model's attention block: the
  block's variant InputProjections (weights or none), else its first
  sublayer before the core with weights and 3 outputs (Trax's Parallel of
  three Dense, or its causal Branch of Dense and head split)."""
  ((_, block),) = circuits.attention_blocks(net)
  for layer in block.sublayers:
    if type(layer).__name__ in circuits.CORES:
      break
    if type(layer).__name__ == 'InputProjections' or (
      layer.n_out == 3 and jax.tree_util.tree_leaves(layer.weights)
    ):
      return layer
  raise ValueError(f'{block.name}: no input projections before the core.')


def head_scores(net, setting, inputs):
  """(batch, heads, L, L) scores q_h k_h^T / sqrt(d_head) of the trained
  attention on `inputs` (tokens, positions, mask), biases and temperature
  included, unmasked; the one-head variant has one head."""
  x = net.sublayers[0](inputs[:2])  # the front: embeddings + positions
  projections = _projections(net)
  q, k, _ = projections(x if projections.n_in == 1 else (x, x, x))
  heads = setting.n_heads
  if circuits.projections_of(setting.implementation)[1]:
    heads = 1
  n, length = x.shape[:2]

  def by_head(a):  # (n, L, d) or, split already, (n * heads, L, d_head)
    a = np.asarray(a)
    if a.shape[0] == n * heads and heads > 1:
      return a.reshape(n, heads, length, -1)
    return a.reshape(n, length, heads, -1).transpose(0, 2, 1, 3)

  q, k = by_head(q), by_head(k)
  return np.einsum('bhid,bhjd->bhij', q, k) / np.sqrt(q.shape[-1])


def _measuring_scores(net, setting, n_sequences):
  """(head_scores, target weights) on the measuring batch of
  `n_sequences`, the same for every implementation of a seed."""
  tokens, positions, mask, _, weights = batch(
    dataclasses.replace(setting, batch=n_sequences),
    np.random.RandomState(20_000 + setting.seed),
  )
  return head_scores(net, setting, (tokens, positions, mask)), weights


def measure(net, setting, curve, n_sequences=256):
  """Accuracy, steps to solve (first eval at >= 0.99, None if never),
  and per head the share of scored rows whose attention peaks on the
  target, on itself, elsewhere; the bound's consequences in the scores
  (rows peaking on another key with no larger diagonal; mutual pairs)."""
  scores, weights = _measuring_scores(net, setting, n_sequences)
  keys = visible(setting.task, setting.length)
  peak = np.argmax(np.where(keys, scores, -np.inf), -1)  # (n, heads, L)
  target = targets_of(setting.task, setting.length)
  rows = weights[0] > 0
  i = np.arange(setting.length)
  share = lambda hit: np.mean(hit[..., rows], axis=(0, 2))  # noqa: E731
  on_target = share(peak == target)
  on_self = share(peak == i)
  solved = next((s for s, a in curve if a >= 0.99), None)
  return {
    'accuracy': curve[-1][1],
    'steps_to_solve': solved,
    'curve': curve,
    'argmax_on_target': on_target.tolist(),
    'argmax_on_self': on_self.tolist(),
    'argmax_elsewhere': (1 - on_target - on_self).tolist(),
    'bound_breaking_rows': gram_bound.off_diagonal_argmax_with_smaller_diagonal(
      scores, keys
    ),
    'mutual_pairs': gram_bound.mutual_pairs(scores, keys),
  }


def mean_attention(net, setting, n_sequences=64):
  """(heads, L, L): each head's attention weights (softmax of its scores
  over the keys a row sees), averaged over `n_sequences` sequences of the
  measuring batch."""
  scores, _ = _measuring_scores(net, setting, n_sequences)
  scores = np.where(visible(setting.task, setting.length), scores, -np.inf)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return weights.mean(0)
