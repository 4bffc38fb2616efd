"""Fixes for trax 1.4.1 on current JAX, applied when trax_qkv is imported.

Only crashes are fixed here; no numerics change.

* Resuming `training.Loop` from a checkpoint crashes in
  `trax.fastmath.numpy.tree_unflatten`: it tests `tree in copy_from_tree`
  (markers such as `None` and `()`), which compares each array leaf with `()`,
  and current JAX refuses `array == tuple` with a TypeError. Array leaves are
  never markers, so we skip the test for them.
"""

import importlib

import jax
import numpy as np
from trax import fastmath

# The module itself: `trax.fastmath.numpy` as an attribute is the backend's
# numpy (jax.numpy), not this file.
fastmath_numpy = importlib.import_module('trax.fastmath.numpy')

_original_tree_unflatten = fastmath_numpy.tree_unflatten


def _tree_unflatten(flat, tree, copy_from_tree=None):
  if copy_from_tree is not None and isinstance(tree, (jax.Array, np.ndarray)):
    copy_from_tree = None  # an array is never one of the markers
  return _original_tree_unflatten(flat, tree, copy_from_tree=copy_from_tree)


def apply():
  # Recursive calls inside trax look the function up in its module.
  fastmath_numpy.tree_unflatten = _tree_unflatten
  fastmath.tree_unflatten = _tree_unflatten
