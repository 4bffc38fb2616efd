"""`PureAttention` and `AttentionQKV`: drop-in replacements for trax 1.4.1's.

Why Q, K and V get their own projections: attention reads from a set of
vectors by content. The query projection decides what a position is looking
for, the key projection decides what each position advertises, and the value
projection decides what it hands over once chosen. With separate (and, per
head, separately sliced) projections every head can learn its own retrieval
criterion -- one head aligns a German unit word with the English "-one", another
with "twenty" -- instead of all heads matching raw activations to themselves.

Both layers reproduce the built-in's layer tree exactly (sublayer nesting,
weight and state trees, the rng splits that follow from them), so checkpoints
and dropout masks carry over bit for bit; `trax_qkv.kernels` holds the math
itself.
"""

import gin
from jax import numpy as jnp
from trax import fastmath
from trax.layers import combinators as cb
from trax.layers import core
from trax.layers.assert_shape import AssertFunction
from trax.layers.research import sparsity

from trax_qkv import kernels
from trax_qkv.layers import checks
from trax_qkv.layers import kernel_layer


@gin.configurable('QkvPureAttention', module='trax_qkv', denylist=['mode'])
class PureAttention(kernel_layer.KernelLayer):
  """Maps `(Q, K, V, mask)` to `(activations, mask)`: multi-head attention.

  Q, K and V are already projected, shaped (batch, L, d); the layer splits
  them into `n_heads` heads, attends per head and merges the heads again. In
  'viz' mode its state holds the (batch, heads, Lq, Lk) attention weights.
  """

  def __init__(
    self, n_heads=1, dropout=0.0, mode='train', implementation='reference'
  ):
    """Creates a PureAttention layer.

    Args:
      n_heads: number of attention heads; must divide the feature size.
      dropout: rate in [0, 1) at which attention weights are dropped in
          'train' mode.
      mode: one of 'train', 'eval', 'predict', 'viz'.
      implementation: 'reference' (bit-identical to
          trax.layers.PureAttention), another kernel of
          `trax_qkv.kernels.names()`, or 'auto' (see `KernelLayer`).
    """
    checks.check_n_heads(n_heads)
    super().__init__(4, 2, dropout, mode, implementation)
    self._n_heads = n_heads

  @property
  def n_heads(self):
    return self._n_heads

  def check_inputs(self, inputs):
    checks.check_qkv_inputs(inputs, self._n_heads)

  def _call(self, q, k):
    return kernels.Call(
      q.shape, k.shape, q.dtype, self._n_heads, self.dropout_rate
    )

  def forward(self, inputs):
    self.check_inputs(inputs)
    q, k, v, mask = inputs
    if self._mode == 'viz':
      activations, self.state = kernels.reference.dot_product_attention(
        q, k, v, mask, self._n_heads
      )
    else:
      activations = self.kernel_for(q, k).attend(
        q,
        k,
        v,
        mask,
        self._n_heads,
        dropout_rate=self.dropout_rate,
        dropout_rng=self.rng,
      )
    return activations, mask


class CachedKVPureAttention(PureAttention):
  """`PureAttention` after the cached K and V projections of
  `AttentionQKV(cache_KV_in_predict=True)` in 'predict' mode, for every
  implementation but one that keeps Trax's state tree
  (`Kernel.trax_state`: 'reference').

  There K and V are the same in every call (the encoder output, projected
  once), so where an exact kernel runs (`Kernel.exact`) their heads are
  split, and
  the keys transposed for q k^T, in the first call only and kept in the
  state: every later decoding step skips two transposes of the whole
  (batch, heads, Lk, d_head) K and V (docs/decoding.md). The product is
  the reference's, of the same operands, so the outputs stay the built-in's
  bit for bit; the state does not: like Trax's `Cache`, the layer changes
  the structure of its state in the first call, () -> (keys transposed,
  values), where Trax's attention keeps ().
  """

  def forward(self, inputs):
    self.check_inputs(inputs)
    q, k, v, mask = inputs
    if not self.kernel_for(q, k).exact:
      return super().forward(inputs)
    if not self.state:
      self.state = (
        kernels.reference.keys_transposed(
          kernels.reference.split_heads(k, self._n_heads)
        ),
        kernels.reference.split_heads(v, self._n_heads),
      )
    k_t, v_heads = self.state
    per_head, _ = kernels.reference.per_head_attention(
      kernels.reference.split_heads(q, self._n_heads),
      k_t,
      v_heads,
      mask,
      k_transposed=True,
    )
    return kernels.reference.merge_heads(per_head), mask


class CheckedSerial(cb.Serial):
  """A `Serial` whose `init` runs `check_inputs(input_signature)` first.

  Trax wraps every exception raised during `init` in a LayerError; checking
  before delegating keeps the caller's ValueError/TypeError (and its message
  naming the bad input) intact.
  """

  def __init__(self, *sublayers, check_inputs, name='Serial'):
    # Named 'Serial' so that the printed tree is the built-in's.
    super().__init__(*sublayers, name=name)
    self._check_inputs = check_inputs

  def init(self, input_signature, rng=None, use_cache=False):
    self._check_inputs(input_signature)
    return super().init(input_signature, rng=rng, use_cache=use_cache)


def affine_rows(x, w, b):
  """x @ w + b computed on a (rows, d_in) view of x (see `RowsDense`)."""
  return (jnp.dot(x.reshape((-1, x.shape[-1])), w) + b).reshape(
    x.shape[:-1] + (w.shape[-1],)
  )


class RowsDense(core.Dense):
  """`core.Dense` (with bias) computed on a (rows, d_in) view of its input.

  Same weights, initialisation and rng use as `core.Dense`; the outputs and
  gradients agree within float32 rounding. XLA:CPU computes the gradients
  of a 2-D dot faster than those of the (batch, L, d) one
  (docs/kernels.md: "RowsDense"). The 'reference' implementation keeps
  `core.Dense`, whose gradients it reproduces bit for bit.
  """

  def forward(self, x):
    w, b = self.weights
    return affine_rows(x, w, b)


def dense_kv_projection(k_block, v_block, kv_params):
  """What the K and V `RowsDense` layers compute, from their (w, b)
  weights: a pure function that `jax.vjp` can pull gradients back through."""
  (w_k, b_k), (w_v, b_v) = kv_params
  return affine_rows(k_block, w_k, b_k), affine_rows(v_block, w_v, b_v)


class KeyBlockProjectedAttention(cb.Serial):
  """`Serial(Parallel(Dense, Dense, Dense), PureAttention, Dense)` that, when
  the attention's kernel can (`Kernel.attend_projecting`: 'chunked'),
  projects K and V one key block at a time inside it.

  Same sublayers as the plain Serial, so the same weights, init keys, rng
  splits and checkpoints; only the order of the computation differs. With
  long keys (cross-attention over a long encoder output) the projected
  (batch, Lk, d) K and V and their gradients are the largest buffers left
  once the logits are blocked; computed per block they never exist whole.
  Any other kernel or mode runs the plain Serial.
  """

  def __init__(self, projections, attention, output):
    super().__init__(projections, attention, output, name='Serial')

  def forward(self, inputs):
    projections, attention, output = self.sublayers
    q_in, k_in, v_in, mask = inputs
    attend = (
      attention.kernel_for(q_in, k_in).attend_projecting
      if attention.mode in ('train', 'eval')
      else None
    )
    if attend is None:
      return super().forward(inputs)
    (w_q, w_k, w_v), _, w_out = self.weights
    (s_q, _, _), _, s_out = self.state
    dense_q = projections.sublayers[0]

    def project(dense, weights, state):
      return lambda x: dense.pure_fn(x, weights, state, None)[0]

    # The rng Serial would hand to PureAttention (its second sublayer).
    attention_rng = (
      None if self.rng is None else fastmath.random.split(self.rng, 3)[1]
    )
    activations = attend(
      project(dense_q, w_q, s_q)(q_in),
      k_in,
      v_in,
      mask,
      attention.n_heads,
      dropout_rate=attention.dropout_rate,
      dropout_rng=attention_rng,
      project_kv=dense_kv_projection,
      kv_params=(w_k, w_v),
    )
    return project(output, w_out, s_out)(activations), mask


@gin.configurable('QkvAttentionQKV', module='trax_qkv', denylist=['mode'])
def AttentionQKV(
  d_feature,
  n_heads=1,
  dropout=0.0,
  mode='train',
  cache_KV_in_predict=False,
  q_sparsity=None,
  result_sparsity=None,
  implementation='reference',
):
  """Maps `(AQ, AK, AV, mask)` to `(new_A, mask)`: projected attention.

  Data flow, as in trax 1.4.1:

      AQ --Dense--> Q --\\
      AK --Dense--> K ---PureAttention--> heads merged --Dense--> new_A
      AV --Dense--> V --/

  AQ comes from one source (the decoder, in encoder-decoder attention) and
  AK, AV from another (the encoder). With `cache_KV_in_predict` in 'predict'
  mode the K and V projections are computed once and cached, since the encoder
  output does not change while decoding.

  Args:
    d_feature: feature size of Q, K, V and of the output.
    n_heads: number of attention heads; must divide d_feature.
    dropout: attention-weight dropout rate in [0, 1), 'train' mode only.
    mode: one of 'train', 'eval', 'predict', 'viz'.
    cache_KV_in_predict: cache the K and V projections in 'predict' mode.
    q_sparsity: None (Dense), 'noop' (no projection) or an int: Trax's
        factored sparse projection for the queries.
    result_sparsity: the same choice for the output projection.
    implementation: formulation of the attention math (see PureAttention);
        any but 'reference' also projects with `RowsDense`.

  Returns:
    A layer with the built-in's weights tree: Wq, bq, Wk, bk, Wv, bv, Wo, bo.
  """
  checks.check_n_heads(n_heads)
  checks.check_d_feature(d_feature, n_heads)
  checks.check_dropout(dropout)
  checks.check_mode(mode)
  checks.check_sparsity('q_sparsity', q_sparsity, d_feature)
  checks.check_sparsity('result_sparsity', result_sparsity, d_feature)

  dense = RowsDense if kernels.projects_rows(implementation) else core.Dense

  def _Projection(layer_sparsity):
    if layer_sparsity is None:
      return dense(d_feature)
    if layer_sparsity == 'noop':
      return cb.Serial()
    return cb.Serial(
      sparsity.FactoredDense(layer_sparsity, d_feature, d_feature),
      sparsity.LocallyConvDense(
        layer_sparsity,
        d_feature // layer_sparsity,
        mode=mode,
        kernel_size=3,
        length_kernel_size=3,
      ),
    )

  cached_kv = cache_KV_in_predict and mode == 'predict'

  def _KVProjection():
    if cached_kv:
      return cb.Cache(dense(d_feature))
    return dense(d_feature)

  # Plain Dense projections (no sparsity, no cache) can be fused into the
  # key blocks of a kernel that projects them there.
  fusable = (
    kernels.may_project_in_blocks(implementation)
    and q_sparsity is None
    and result_sparsity is None
    and not cached_kv
  )
  attention = (KeyBlockProjectedAttention if fusable else cb.Serial)(
    cb.Parallel(_Projection(q_sparsity), _KVProjection(), _KVProjection()),
    (
      CachedKVPureAttention
      if cached_kv and not kernels.keeps_trax_state(implementation)
      else PureAttention
    )(
      n_heads=n_heads, dropout=dropout, mode=mode, implementation=implementation
    ),
    _Projection(result_sparsity),
  )
  # The built-in is decorated with @assert_shape, which wraps it as
  # Serial(AssertShape, layer, AssertShape). Trax splits rngs per sublayer, so
  # the same three-layer wrapper is needed for identical init and dropout keys.
  wrapped = AssertFunction('bSq,blk,blv,b1xl->bSd,b1xl', attention)
  return CheckedSerial(*wrapped.sublayers, check_inputs=checks.check_qkv_inputs)


@gin.configurable('QkvAttention', module='trax_qkv', denylist=['mode'])
def Attention(
  d_feature, n_heads=1, dropout=0.0, mode='train', implementation='reference'
):
  """Maps `(x, mask)` to `(new_x, mask)`: multi-head self-attention.

  `trax.layers.Attention` (the encoder self-attention of Trax's
  Transformers) is `AttentionQKV` with Q, K and V all read from x; so is
  this, with our `AttentionQKV`; x is (batch, L, d_feature), mask (batch,
  1, 1, L).

  Args:
    d_feature: feature size of x, Q, K, V and the output.
    n_heads: number of attention heads; must divide d_feature.
    dropout: attention-weight dropout rate in [0, 1), 'train' mode only.
    mode: one of 'train', 'eval', 'predict', 'viz'.
    implementation: a kernel name or 'auto' (see `PureAttention`).

  Returns:
    A layer with the built-in's tree and weights.
  """
  layer = cb.Serial(
    cb.Select([0, 0, 0]),
    AttentionQKV(
      d_feature,
      n_heads=n_heads,
      dropout=dropout,
      mode=mode,
      implementation=implementation,
    ),
  )
  # The built-in's @assert_shape wrapper: part of its tree (see AttentionQKV).
  wrapped = AssertFunction('bld,b11l->bld,b11l', layer)
  return CheckedSerial(*wrapped.sublayers, check_inputs=_check_self_inputs)


def _check_self_inputs(input_signature):
  if (
    not isinstance(input_signature, (tuple, list)) or len(input_signature) != 2
  ):
    raise TypeError(
      f'inputs must be a tuple (x, mask); got {type(input_signature).__name__}.'
    )
  x, mask = input_signature
  checks.check_qkv_inputs((x, x, x, mask))
