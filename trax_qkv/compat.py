"""Fixes for trax 1.4.1 on current JAX, applied when trax_qkv is imported.

Only crashes are fixed here; no numerics change.

* Resuming `training.Loop` from a checkpoint crashes in
  `trax.fastmath.numpy.tree_unflatten`: it tests `tree in copy_from_tree`
  (markers such as `None` and `()`), which compares each array leaf with `()`,
  and current JAX refuses `array == tuple` with a TypeError. Array leaves are
  never markers, so we skip the test for them.
* Data parallelism (`Loop(..., n_devices>1)`) crashes in
  `trax.layers.acceleration.for_n_devices`: it calls
  `jax.device_put_replicated`, which JAX removed. We put the same copies on
  the devices with `jax.device_put` and a sharding over the leading axis,
  which is what `pmap` reads. Trax then moves optimizer slots `on_cpu`,
  which now collapses such an array onto CPU device 0 and `pmap` rejects it;
  an array already in CPU memory is left where it is.
"""

import importlib

import jax
import numpy as np
import trax.layers
from trax import fastmath
from trax.layers import acceleration

# The module itself: `trax.fastmath.numpy` as an attribute is the backend's
# numpy (jax.numpy), not this file.
fastmath_numpy = importlib.import_module('trax.fastmath.numpy')

_original_tree_unflatten = fastmath_numpy.tree_unflatten


def _tree_unflatten(flat, tree, copy_from_tree=None):
  if copy_from_tree is not None and isinstance(tree, (jax.Array, np.ndarray)):
    copy_from_tree = None  # an array is never one of the markers
  return _original_tree_unflatten(flat, tree, copy_from_tree=copy_from_tree)


def _for_n_devices(x, n_devices):
  """Replicates/broadcasts `x` for `n_devices` (trax's, without the removed API)."""
  if n_devices <= 1:
    return x
  devices = jax.local_devices()[:n_devices]
  mesh = jax.sharding.Mesh(np.array(devices), ('devices',))
  sharding = jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec('devices'))

  def replicate(leaf):
    leaf = np.asarray(leaf)
    return jax.device_put(np.broadcast_to(leaf, (n_devices,) + leaf.shape),
                          sharding)
  return fastmath.nested_map(replicate, x)


_original_on_cpu = acceleration.on_cpu


def _on_cpu(x):
  """Puts `x` in CPU memory; arrays already there keep their sharding."""
  def move(leaf):
    if isinstance(leaf, jax.Array) and all(
        d.platform == 'cpu' for d in leaf.devices()):
      return leaf
    return _original_on_cpu(leaf)
  return fastmath.nested_map(move, x)


def apply():
  # Recursive calls inside trax look the function up in its module.
  fastmath_numpy.tree_unflatten = _tree_unflatten
  fastmath.tree_unflatten = _tree_unflatten
  # `trax.layers` re-exports the function; modules call it by either name.
  acceleration.for_n_devices = _for_n_devices
  trax.layers.for_n_devices = _for_n_devices
  acceleration.on_cpu = _on_cpu
  trax.layers.on_cpu = _on_cpu
