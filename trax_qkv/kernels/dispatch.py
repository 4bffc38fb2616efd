"""One record per kernel, and the one place that picks the kernel that runs.

A kernel is a module of pure JAX functions plus a `Kernel` record here:
what it computes for full attention, for causal attention and for the
predict-mode cache read, where it cannot run, and when 'auto' picks it.
The layers, the registry of trax.models' sites, gin, `use_attention` and
the benchmarks all read `KERNELS`, so a new kernel is its module and one
record: an entry of `_BUILTIN_KERNELS`, or a `register` call.
"""

from collections.abc import Callable
import dataclasses
import math

import jax

from trax_qkv.kernels import causal
from trax_qkv.kernels import chunked
from trax_qkv.kernels import cudnn
from trax_qkv.kernels import fused
from trax_qkv.kernels import reference

AUTO = 'auto'  # not a kernel: the name under which `choose` picks one
# 'chunked' wins for at most FEW_QUERIES queries over at least
# CHUNKED_MIN_KEYS keys, where the (Lq, Lk) logits and the projected K and V
# are what fills memory.
FEW_QUERIES = 64
CHUNKED_MIN_KEYS = 4096
# The reference wins when all (batch, heads, Lq, Lk) logits fit in this many
# floats (4 MB): nothing to tile, and its backward, which keeps the weights
# instead of recomputing them, is the cheaper one there.
REFERENCE_MAX_LOGITS = 2**20
# The kernel of Trax's own math: the default, and what the built-in runs.
REFERENCE = 'reference'


@dataclasses.dataclass(frozen=True)
class Call:
  """What 'auto' and the support checks see of one attention call.

  Attributes:
    q_shape, k_shape: (batch, Lq, d) and (batch, Lk, d); per-head causal
      attention passes (batch * heads, L, d_head) with n_heads 1.
    dtype: the dtype of q.
    n_heads: heads split out of the feature axis.
    dropout_rate: the rate in effect (0 outside 'train' mode).
    causal: causal self-attention (`DotProductCausalAttention`).
    predict: a predict-mode step over a key/value cache.
  """

  q_shape: tuple
  k_shape: tuple
  dtype: object
  n_heads: int = 1
  dropout_rate: float = 0.0
  causal: bool = False
  predict: bool = False

  @property
  def n_logits(self):
    """Elements of the (batch, heads, Lq, Lk) logits."""
    return self.q_shape[0] * self.n_heads * self.q_shape[1] * self.k_shape[1]


def _never(call):
  del call
  return False


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One implementation of the attention math.

  Attributes:
    name: its name in `implementation=`, gin, `use_attention` and reports.
    attend: f(q, k, v, mask, n_heads, dropout_rate=, dropout_rng=) ->
      float32 (batch, Lq, d_v), shapes as in `reference.dot_product_attention`.
    causal: f(q, k, v, dropout_rate=, dropout_rng=) -> float32 (rows, L,
      d_v): causal self-attention of per-head (rows, L, d_head) inputs.
    cached: f(q, ks, vs, index, mask) -> float32 (rows, new, d_v): predict
      mode, `new` queries at positions index.. over (rows, max_length, d)
      key/value caches; `mask` (1, new, max_length) marks what each query
      may see.
    unsupported_reason: f(dtype, dropout_rate) -> None where it can run,
      else why not (dtype None: not known yet).
    auto_when: f(Call) -> bool: whether 'auto' may pick it.
    auto_priority: the order in which 'auto' asks the kernels' `auto_when`,
      lowest first; the first that says True (and can run) runs.
    attend_projecting: None, or `attend` that also takes `project_kv` and
      `kv_params` and projects K and V one key block at a time
      (`layers.attention.KeyBlockProjectedAttention`).
    exact: it is Trax's `_per_head_attention`, operation for operation, so
      its outputs and gradients are the built-in layers' bit for bit. The
      layers then project with Trax's `Dense` (any other kernel gets
      `RowsDense`: the same weights, faster gradients) and may keep a
      cached K and V split into heads (`CachedKVAttention`).
    trax_state: its layers keep Trax's state tree in 'predict' mode (the
      projected K and V of `AttentionQKV(cache_KV_in_predict=True)` as
      Trax's `Cache` holds them), so checkpoints and decoding states move
      to and from the built-in; any other kernel may keep its own
      (`layers.attention.CachedKVPureAttention`).
    matmuls_per_logit: (forward, backward) matmuls per computed logit, for
      the roof bench's ceilings; None where not counted.
    logits_computed: f(Call) -> the (query, key) logits one pass computes
      (a blockwise kernel pads, and computes masked triangles); None where
      not counted.
  """

  name: str
  attend: Callable
  causal: Callable
  cached: Callable
  unsupported_reason: Callable = lambda dtype, dropout_rate: None
  auto_when: Callable = _never
  auto_priority: float = math.inf
  attend_projecting: Callable | None = None
  exact: bool = False
  trax_state: bool = False
  matmuls_per_logit: tuple | None = None
  logits_computed: Callable | None = None


def _reference_attend(q, k, v, mask, n_heads, **dropout):
  return reference.dot_product_attention(q, k, v, mask, n_heads, **dropout)[0]


def _reference_causal(q, k, v, **dropout):
  return reference.per_head_attention(
    q, k, v, causal_mask(q.shape[1]), **dropout
  )[0]


def _reference_cached(q, ks, vs, index, mask):
  del index
  return reference.per_head_attention(q, ks, vs, mask)[0]


def _blockwise_cached(q, ks, vs, index, mask):
  del mask  # the blocks past index + new are never visited
  return causal.cached_attention(q, ks, vs, index)


def _cudnn_cached(q, ks, vs, index, mask):
  del index
  return cudnn.cudnn_attention(q, ks, vs, mask[:, None], 1)


def _blockwise_logits(call):
  rows_or_batch, lq, _ = call.q_shape
  if call.causal:
    return causal.logits_computed(rows_or_batch, lq)
  return fused.logits_computed(rows_or_batch, call.n_heads, lq, call.k_shape[1])


def _reference_wins(call):
  # On a GPU the loop steps of the blockwise kernels run one after another
  # and lose to XLA's own fusions of the reference (docs/benchmarks.md).
  if jax.default_backend() == 'gpu':
    return True
  if call.predict:
    # A cache of one block: the blockwise read would do the reference's
    # work in a loop.
    return call.k_shape[1] <= causal.CACHE_BLOCK_SIZE
  return call.n_logits <= REFERENCE_MAX_LOGITS


_BUILTIN_KERNELS = (
  Kernel(
    REFERENCE,
    _reference_attend,
    _reference_causal,
    _reference_cached,
    auto_when=_reference_wins,
    auto_priority=2,
    exact=True,
    trax_state=True,
    # It keeps the weights for its backward; it computes every logit.
    matmuls_per_logit=(2, 4),
    logits_computed=lambda call: call.n_logits,
  ),
  Kernel(
    'fused',
    fused.fused_attention,
    causal.causal_attention,
    _blockwise_cached,
    auto_when=lambda call: True,
    auto_priority=3,
    # Its backward recomputes q k^T from the saved logsumexp.
    matmuls_per_logit=(2, 5),
    logits_computed=_blockwise_logits,
  ),  # whatever is left
  Kernel(
    'chunked',
    chunked.chunked_attention,
    lambda q, k, v, **dropout: causal.causal_attention(
      q, k, v, block_size=chunked.DEFAULT_BLOCK_SIZE, **dropout
    ),
    _blockwise_cached,
    auto_when=lambda call: (
      not call.causal
      and call.q_shape[1] <= FEW_QUERIES
      and call.k_shape[1] >= CHUNKED_MIN_KEYS
    ),
    auto_priority=1,
    attend_projecting=chunked.chunked_attention,
  ),
  Kernel(
    'cudnn',
    cudnn.cudnn_attention,
    cudnn.cudnn_causal_attention,
    _cudnn_cached,
    unsupported_reason=cudnn.unsupported_reason,
    auto_when=lambda call: True,
    auto_priority=0,
  ),
)
KERNELS = {kernel.name: kernel for kernel in _BUILTIN_KERNELS}


def register(kernel):
  """Adds `kernel` (a `Kernel`) under its name.

  Raises:
    TypeError: not a `Kernel`.
    ValueError: the name is taken (or is 'auto').
  """
  if not isinstance(kernel, Kernel):
    raise TypeError(
      f'kernel must be a trax_qkv.kernels.Kernel; got {kernel!r}.'
    )
  if kernel.name in KERNELS or kernel.name == AUTO:
    raise ValueError(f'a kernel named {kernel.name!r} exists already.')
  KERNELS[kernel.name] = kernel


def unregister(name):
  """Removes a kernel added by `register`."""
  if any(kernel.name == name for kernel in _BUILTIN_KERNELS):
    raise ValueError(f'{name!r} is built in and cannot be removed.')
  KERNELS.pop(name, None)


def names():
  """Every name `implementation=` accepts: the kernels, then 'auto'."""
  return tuple(KERNELS) + (AUTO,)


def check_implementation(implementation, name='implementation'):
  """Raises ValueError unless `implementation` is one of `names()`."""
  if implementation not in names():
    raise ValueError(
      f'{name} must be one of {names()}; got {implementation!r}.'
    )


def check_supported(implementation, dtype=None, dropout_rate=0.0):
  """Raises ValueError saying why `implementation` cannot run here, if it
  cannot ('auto' always can: it picks one that does)."""
  check_implementation(implementation)
  if implementation == AUTO:
    return
  reason = KERNELS[implementation].unsupported_reason(dtype, dropout_rate)
  if reason:
    raise ValueError(
      f'implementation={implementation!r} cannot run here: {reason}. Use '
      "implementation='auto', which runs a kernel that can."
    )


def projects_rows(implementation):
  """Whether layers running `implementation` project with `RowsDense`:
  every implementation but an exact kernel (`Kernel.exact`)."""
  kernel = KERNELS.get(implementation)
  return kernel is None or not kernel.exact


def keeps_trax_state(implementation):
  """Whether layers running `implementation` keep Trax's state tree
  (`Kernel.trax_state`; 'auto' does not)."""
  kernel = KERNELS.get(implementation)
  return kernel is not None and kernel.trax_state


def may_project_in_blocks(implementation):
  """Whether `implementation` may run a kernel with `attend_projecting`."""
  if implementation == AUTO:
    return any(k.attend_projecting for k in KERNELS.values())
  kernel = KERNELS.get(implementation)
  return kernel is not None and kernel.attend_projecting is not None


def choose(call):
  """The name of the kernel 'auto' runs for `call` (a `Call`)."""
  for kernel in sorted(KERNELS.values(), key=lambda k: k.auto_priority):
    if kernel.unsupported_reason(
      call.dtype, call.dropout_rate
    ) is None and kernel.auto_when(call):
      return kernel.name
  raise AssertionError("no kernel takes this call; 'fused' takes any.")


def resolve(implementation, call):
  """The kernel that runs `call` when `implementation` is asked for.

  Args:
    implementation: a name of `names()`.
    call: the `Call` to run.

  Returns:
    The `Kernel`: for 'auto' the one `choose` picks, else the one named.

  Raises:
    ValueError: an unknown name, or a kernel that cannot run here
      (`check_supported`).
  """
  if implementation == AUTO:
    return KERNELS[choose(call)]
  check_supported(implementation, call.dtype, call.dropout_rate)
  return KERNELS[implementation]


def causal_mask(length):
  """(1, length, length) bool: query i may attend to keys 0..i."""
  return jax.numpy.tril(jax.numpy.ones((1, length, length), bool))


def attend(
  q,
  k,
  v,
  mask,
  n_heads,
  dropout_rate=0.0,
  dropout_rng=None,
  implementation=REFERENCE,
):
  """Multi-head attention with the kernel `implementation` resolves to.

  Args:
    q: (batch, Lq, d) projected queries.
    k: (batch, Lk, d) projected keys.
    v: (batch, Lk, d_v) projected values.
    mask: None, or broadcastable to (batch, 1, Lq, Lk); nonzero = attend.
    n_heads: number of heads; divides d and d_v.
    dropout_rate: attention-weight dropout in [0, 1).
    dropout_rng: JAX PRNG key, needed when dropout_rate > 0.
    implementation: one of `names()`.

  Returns:
    float32 (batch, Lq, d_v) activations.
  """
  kernel = resolve(
    implementation, Call(q.shape, k.shape, q.dtype, n_heads, dropout_rate)
  )
  return kernel.attend(
    q, k, v, mask, n_heads, dropout_rate=dropout_rate, dropout_rng=dropout_rng
  )
