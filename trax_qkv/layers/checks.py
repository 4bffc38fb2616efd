"""Argument and input-signature checks shared by the attention layers.

Each check raises a ValueError or TypeError that names the parameter and the
expected form, so that mistakes surface at construction or at `init`, before
any weights are made, instead of as a shape error deep inside JAX.
"""

import numbers

import numpy as np

MODES = ('train', 'eval', 'predict', 'viz')


def _is_int(x):
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_positive_int(name, value):
  if not _is_int(value):
    raise TypeError(f'{name} must be a positive int; got {value!r}.')
  if value < 1:
    raise ValueError(f'{name} must be a positive int (>= 1); got {value!r}.')


def check_n_heads(n_heads):
  check_positive_int('n_heads', n_heads)


def check_d_feature(d_feature, n_heads):
  check_positive_int('d_feature', d_feature)
  if d_feature % n_heads:
    raise ValueError(
      f'd_feature ({d_feature}) must be divisible by n_heads ({n_heads}): '
      f'each head gets d_feature // n_heads features.'
    )


def check_dropout(dropout):
  if not isinstance(dropout, numbers.Real) or isinstance(dropout, bool):
    raise TypeError(f'dropout must be a float in [0, 1); got {dropout!r}.')
  if not 0.0 <= dropout < 1.0:
    raise ValueError(f'dropout must be in [0, 1); got {dropout!r}.')


def check_mode(mode):
  if mode not in MODES:
    raise ValueError(f'mode must be one of {MODES}; got {mode!r}.')


def check_sparsity(name, sparsity, d_feature):
  """None (Dense), 'noop' (identity) or an int that divides d_feature."""
  if sparsity is None or sparsity == 'noop':
    return
  if not _is_int(sparsity) or sparsity < 1 or d_feature % sparsity:
    raise ValueError(
      f"{name} must be None, 'noop' or a positive int that divides "
      f'd_feature ({d_feature}); got {sparsity!r}.'
    )


def _check_float(name, x):
  if not np.issubdtype(np.dtype(x.dtype), np.floating):
    raise TypeError(
      f'{name} must be a floating-point array (float32, bfloat16, ...); '
      f'got dtype {x.dtype}.'
    )


def _check_rank3(name, x):
  if len(x.shape) != 3:
    raise ValueError(
      f'{name} must have shape (batch, length, features); got {x.shape}.'
    )


def check_qkv_inputs(inputs, n_heads=None):
  """Checks a (Q, K, V, mask) tuple of arrays or ShapeDtypes.

  With `n_heads` (PureAttention: already projected inputs) Q and K must share a
  feature size and Q, V features must be divisible by n_heads; without it
  (AttentionQKV: raw activations, projected by Dense) feature sizes are free.
  """
  if not isinstance(inputs, (tuple, list)) or len(inputs) != 4:
    raise TypeError(
      'inputs must be a tuple (Q, K, V, mask); '
      f'got {type(inputs).__name__} of length '
      f'{len(inputs) if hasattr(inputs, "__len__") else "?"}.'
    )
  q, k, v, mask = inputs
  for name, x in (('Q', q), ('K', k), ('V', v)):
    _check_rank3(name, x)
    _check_float(name, x)
  batch, lq, lk = q.shape[0], q.shape[1], k.shape[1]
  if not k.shape[0] == v.shape[0] == batch:
    raise ValueError(
      'Q, K and V must have the same batch size; got batch sizes '
      f'{q.shape[0]}, {k.shape[0]}, {v.shape[0]}.'
    )
  if v.shape[1] != lk:
    raise ValueError(
      f'K and V must have the same length; got K {k.shape} and V {v.shape}.'
    )
  if n_heads is not None:
    _check_projected(q, k, v, n_heads)
  if mask is not None:
    _check_mask(mask, batch, lq, lk)


def _check_projected(q, k, v, n_heads):
  if q.shape[2] != k.shape[2]:
    raise ValueError(
      'Q and K must have the same feature size; got Q '
      f'{q.shape} and K {k.shape}.'
    )
  for name, x in (('Q', q), ('V', v)):
    if x.shape[2] % n_heads:
      raise ValueError(
        f'{name} feature size ({x.shape[2]}) must be divisible by n_heads '
        f'({n_heads}).'
      )


def _check_mask(mask, batch, lq, lk):
  shape = tuple(mask.shape)
  if (
    len(shape) != 4
    or shape[0] not in (1, batch)
    or shape[1] != 1
    or shape[2] not in (1, lq)
    or shape[3] != lk
  ):
    raise ValueError(
      'mask must be broadcastable to (batch, 1, Lq, Lk) = '
      f'({batch}, 1, {lq}, {lk}), i.e. shape (batch or 1, 1, 1 or Lq, '
      f'Lk); got {shape}.'
    )


def check_causal_inputs(inputs):
  """Checks a per-head (Q, K, V) tuple of arrays or ShapeDtypes: each
  (batch * heads, L, d_head), one length for all three."""
  if not isinstance(inputs, (tuple, list)) or len(inputs) != 3:
    raise TypeError(
      'inputs must be a tuple (Q, K, V); '
      f'got {type(inputs).__name__} of length '
      f'{len(inputs) if hasattr(inputs, "__len__") else "?"}.'
    )
  q, k, v = inputs
  for name, x in (('Q', q), ('K', k), ('V', v)):
    _check_rank3(name, x)
    _check_float(name, x)
  if not q.shape[:2] == k.shape[:2] == v.shape[:2]:
    raise ValueError(
      'Q, K and V must have the same (batch * heads, length); got Q '
      f'{q.shape}, K {k.shape} and V {v.shape}.'
    )
  if q.shape[2] != k.shape[2]:
    raise ValueError(
      'Q and K must have the same feature size; got Q '
      f'{q.shape} and K {k.shape}.'
    )
