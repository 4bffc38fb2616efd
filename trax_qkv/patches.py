"""Every change trax_qkv makes to Trax's own code, listed in one place.

`apply()` runs once, when `trax_qkv` is imported (calling it again does
nothing). None of these changes numerics or a model: the first three fix
crashes of trax 1.4.1 on current JAX, the fourth keeps checkpoint files
from running code, the fifth lets `training.Loop` restore what Trax's
older trainer wrote, the sixth cuts most of the time importing Trax
takes, the seventh most of the time building a model takes, the eighth
makes trax.models' attention selectable, building Trax's own layers
until a user chooses, and the ninth lets Trax from GitHub master import
on current TensorFlow. They are written for the trax and jax
versions that trax_qkv's own package metadata requires (setup.cfg); with
others `apply()` warns.

1. `trax.fastmath.numpy.tree_unflatten`: resuming `training.Loop` from a
   checkpoint crashed: it tests `tree in copy_from_tree` (markers such as
   `None` and `()`), which compares each array leaf with `()`, and current
   JAX refuses `array == tuple`. Array leaves are never markers, so the test
   is skipped for them.
2. `trax.layers.acceleration.for_n_devices`: data parallelism
   (`Loop(..., n_devices>1)`) called `jax.device_put_replicated`, which JAX
   removed. The same copies are put on the devices with `jax.device_put` and
   a sharding over the leading axis, which is what `pmap` reads.
3. `trax.layers.acceleration.on_cpu`: Trax moves optimizer slots `on_cpu`,
   which now collapses such a sharded array onto CPU device 0 and `pmap`
   rejects it; an array already in CPU memory is left where it is, and on
   a CPU backend restored (numpy) slots are placed as fresh ones are, so
   a resumed run's training step is the program it compiled before.
4. `pickle` in `trax.supervised.training`, `trax.layers.base`,
   `trax.data.inputs` and `trax.rl.training`, and `trax.layers.np_from_file`:
   every checkpoint, weight, optimizer-slot, data-counter and RL file Trax
   reads (`Loop`, `init_from_file`, `trainer_lib`, `trax.rl`) goes through
   `trax_qkv.checkpoint_files`, which refuses objects that no checkpoint
   holds (unpickling them could run code) and reports a truncated weights
   or slots file instead of returning fewer arrays. Writing is Trax's.
5. `trax.supervised.history.History.from_dict`: `Loop` restores a
   checkpoint's history with it, and a checkpoint of `trainer_lib.Trainer`
   (Trax's trainer before `Loop`) holds the `History` itself, not its dict,
   so `Loop` crashed on one (`'History' object has no attribute 'items'`).
   A `History` is read as the dict it holds.
6. `inspect` in `trax.layers.assert_shape`: importing Trax spent most of
   its time building every stack frame's source context for the messages
   of `@assert_shape`; the frames alone give the same messages. This one
   must be in place before Trax is imported: `trax_qkv.import_patches`
   holds it (and the version guard), and `trax_qkv/__init__` installs it
   first.
7. `trax.layers.Serial.init_weights_and_state`: to pass each sublayer's
   output signature to the next, Trax traces the sublayer abstractly
   (`_forward_abstract`) after initializing it. A Serial sublayer has just
   worked its own output out, sublayer by sublayer, while initializing, so
   tracing it again repeated the work of every level below: model building
   grew with depth times size (for a 2+2-layer Transformer, two thirds of
   `init`). A plain Serial's outputs from its own `init` are used when its
   inputs are the same; every other layer is traced as before, so the
   weights, state and errors are Trax's (tests/test_patches.py).
8. `tl` in the modules of trax.models that build attention, and the
   default arguments that hold an attention layer: each module listed in
   a site's record (`models.registry.SITES`: transformer, rnn, rezero,
   configurable_transformer) sees `trax.layers` through a
   `registry.LayersView`, where the site's name is a `registry.Dispatcher`
   and every other name is `trax.layers`'s, looked up when used; each
   default that holds the site's layer (configurable_transformer's and
   transformer2's six `*attention_type=`) becomes a `Dispatcher` of it.
   With nothing chosen a dispatcher builds what Trax would, invisibly
   (the registry's docstring), so no model changes until a choice is
   made. A module whose `tl` is not `trax.layers`, or that cannot be
   imported, and a default that no longer holds Trax's layer, are left
   as they are, with one warning; `import trax_qkv` never fails on them.
9. `tf_estimator` in `trax.data.tf_inputs`, in Trax from GitHub master
   only: there the module imports `tensorflow.estimator` when Trax is
   imported, for `ModeKeys` alone, and TensorFlow 2.16 and later have
   none. Recognised by that line of the module's source, it reads
   `ModeKeys` from trax_qkv instead; like patch 6 it must be in place
   before Trax is imported, and `trax_qkv.import_patches` holds it.
"""

import contextlib
import importlib
import importlib.metadata
import pickle
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from trax import fastmath
import trax.data
from trax.data import inputs as trax_inputs
import trax.layers
from trax.layers import acceleration
from trax.layers import base as trax_layers_base
from trax.layers import combinators as trax_combinators
from trax.rl import training as trax_rl_training
from trax.supervised import history as trax_history
from trax.supervised import training as trax_training

from trax_qkv import checkpoint_files
from trax_qkv import import_patches
from trax_qkv.import_patches import PATCHED_PACKAGES  # noqa: F401
from trax_qkv.import_patches import required_versions
from trax_qkv.import_patches import untested_versions
from trax_qkv.models import registry

# The module itself: `trax.fastmath.numpy` as an attribute is the backend's
# numpy (jax.numpy), not this file.
fastmath_numpy = importlib.import_module('trax.fastmath.numpy')
_original_tree_unflatten = fastmath_numpy.tree_unflatten
_original_on_cpu = acceleration.on_cpu
_original_np_from_file = trax_layers_base.np_from_file
_original_history_from_dict = trax_history.History.from_dict.__func__
_original_serial_init = trax_combinators.Serial.init_weights_and_state
_CHECKPOINT_READERS = (
  trax_training,
  trax_layers_base,
  trax_inputs,
  trax_rl_training,
)
_applied = False


class UntestedVersionWarning(UserWarning):
  """trax_qkv patches a Trax or JAX version it was not written for."""


def _tree_unflatten(flat, tree, copy_from_tree=None):
  if copy_from_tree is not None and isinstance(tree, (jax.Array, np.ndarray)):
    copy_from_tree = None  # an array is never one of the markers
  return _original_tree_unflatten(flat, tree, copy_from_tree=copy_from_tree)


def _for_n_devices(x, n_devices):
  """Replicates `x` for `n_devices`: Trax's, without the removed API."""
  if n_devices <= 1:
    return x
  return replicate(x, jax.local_devices()[:n_devices])


def replicate(x, devices):
  """Each leaf of `x` copied onto `devices` (this process's), stacked on a
  new leading axis sharded over them: what `pmap` reads."""
  mesh = jax.sharding.Mesh(np.array(devices), ('devices',))
  sharding = jax.sharding.NamedSharding(
    mesh, jax.sharding.PartitionSpec('devices')
  )

  def copies(leaf):
    leaf = np.asarray(leaf)
    return jax.device_put(
      np.broadcast_to(leaf, (len(devices),) + leaf.shape), sharding
    )

  return fastmath.nested_map(copies, x)


def _on_cpu(x):
  """Puts `x` in CPU memory; arrays already there keep their sharding.

  Where the default device is a CPU, a host (numpy) leaf becomes an
  uncommitted array there, as the slots of a fresh Trainer are: slots
  restored from a checkpoint committed to CPU 0 would lower the training
  step to another program, which a resumed run would compile again.
  """
  host_is_default = jax.default_backend() == 'cpu'

  def move(leaf):
    if isinstance(leaf, jax.Array) and all(
      d.platform == 'cpu' for d in leaf.devices()
    ):
      return leaf
    if host_is_default and isinstance(leaf, np.ndarray):
      return jnp.asarray(leaf)
    return _original_on_cpu(leaf)

  return fastmath.nested_map(move, x)


def _history_from_dict(cls, json_object):
  if isinstance(json_object, trax_history.History):
    json_object = json_object.to_dict()
  return _original_history_from_dict(cls, json_object)


def _serial_init_weights_and_state(self, input_signature):
  """Trax's `Serial.init_weights_and_state`, reusing the output signature a
  plain Serial sublayer found while initializing (patch 7)."""
  weights, states = [], []
  stack = input_signature
  for sublayer in self.sublayers:
    inputs = trax_combinators.inputs_from_stack(stack, sublayer.n_in)
    weights_or_marker, state_or_marker = sublayer.init(inputs, use_cache=True)
    # Subclasses (`@assert_shape`'s checks among them) have their own
    # forward: only Serial's own is known to give the stack it built.
    found = getattr(sublayer, '_trax_qkv_init_signatures', None)
    if (
      type(sublayer).forward is trax_combinators.Serial.forward
      and found is not None
      and found[0] == trax.shapes.signature(inputs)
    ):
      outputs = found[1]
    else:
      outputs, _ = sublayer._forward_abstract(inputs)
    stack = trax_combinators.outputs_onto_stack(outputs, stack, sublayer.n_in)
    weights.append(weights_or_marker)
    states.append(state_or_marker)
  self.state = tuple(states)
  self.weights = tuple(weights)
  # As the abstract trace gives them: ShapeDtypes, never the arrays or
  # tracers (a layer initialized inside a traced function) of inputs that
  # the sublayers passed through; compared by shape and dtype.
  self._trax_qkv_init_signatures = (
    trax.shapes.signature(input_signature),
    trax.shapes.signature(stack),
  )


def _route_attention():
  """Patch 8: trax.models builds each site's layer through a Dispatcher.

  Returns what could not be routed, in words ([] when all was)."""
  skipped = []

  def module(name):
    try:
      return importlib.import_module(name)
    except Exception as error:  # a Trax without it: the rest still routes
      skipped.append(f'{name} (cannot be imported: {error})')

  sites = registry.SITES.values()
  for name in sorted({m for site in sites for m in site.modules}):
    routed = module(name)
    tl = getattr(routed, 'tl', None)
    if routed is None or isinstance(tl, registry.LayersView):
      continue
    if tl is trax.layers:
      routed.tl = registry.LayersView(name)
    else:
      skipped.append(f'{name} (its tl is not trax.layers)')
  for module_name, function in registry.DEFAULT_HOLDERS:
    fn = getattr(module(module_name), function, None)
    defaults = getattr(fn, '__defaults__', None) or ()
    routed = tuple(
      registry.Dispatcher(site, d) if (site := registry.trax_site(d)) else d
      for d in defaults
    )
    if routed != defaults:
      fn.__defaults__ = routed
    elif not any(isinstance(d, registry.Dispatcher) for d in defaults):
      skipped.append(f"{module_name}.{function} (no default is Trax's layer)")
  return sorted(set(skipped))


def apply():
  """Applies patches 1-5, 7 and 8, and 6 if Trax was imported before
  trax_qkv (otherwise `import_patches` put 6 and 9 in place before Trax
  was imported); idempotent."""
  global _applied
  if _applied:
    return
  untested = untested_versions()
  if untested:
    wanted = ' and '.join(
      f'{package} {specifier}'
      for package, specifier in required_versions().items()
    )
    warnings.warn(
      f'trax_qkv was written for {wanted}; found {", ".join(untested)}. '
      'Its fixes to Trax (trax_qkv.patches) may not fit this version: '
      'run the test suite before trusting results.',
      UntestedVersionWarning,
      stacklevel=2,
    )
  # Recursive calls inside trax look the function up in its module.
  fastmath_numpy.tree_unflatten = _tree_unflatten
  fastmath.tree_unflatten = _tree_unflatten
  # `trax.layers` re-exports these; modules call them by either name.
  acceleration.for_n_devices = _for_n_devices
  trax.layers.for_n_devices = _for_n_devices
  acceleration.on_cpu = _on_cpu
  trax.layers.on_cpu = _on_cpu
  _set_checkpoint_readers(
    checkpoint_files.SafePickleModule(), checkpoint_files.np_from_file
  )
  trax_history.History.from_dict = classmethod(_history_from_dict)
  trax_combinators.Serial.init_weights_and_state = (
    _serial_init_weights_and_state
  )
  import_patches.install()  # if Trax was imported before trax_qkv
  skipped = _route_attention()
  if skipped:
    warnings.warn(
      'trax_qkv cannot select the attention of these parts of trax.models, '
      f"which keep Trax's own layers: {'; '.join(skipped)}.",
      UntestedVersionWarning,
      stacklevel=2,
    )
  _applied = True


def _set_checkpoint_readers(pickle_module, np_from_file):
  for module in _CHECKPOINT_READERS:
    module.pickle = pickle_module
  trax_layers_base.np_from_file = np_from_file
  trax.layers.np_from_file = np_from_file


@contextlib.contextmanager
def trax_checkpoint_reading():
  """Within the block Trax reads checkpoints its own way (patch 4 undone):
  for `trax-qkv-bench --only checkpoints`, which times both."""
  _set_checkpoint_readers(pickle, _original_np_from_file)
  try:
    yield
  finally:
    _set_checkpoint_readers(
      checkpoint_files.SafePickleModule(), checkpoint_files.np_from_file
    )
