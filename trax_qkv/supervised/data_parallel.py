"""Data parallelism over every device of every process, for `training.Loop`.

Trax 1.4.1's `Loop` averages gradients with `psum` inside `pmap`, and on
JAX's distributed runtime that sum spans every device of every process.
But Trax takes that path only when *this process* has more than one device
(with one it jits a step that never leaves the process), and it splits
*this process's* whole batch over *its* devices. Across processes each
process must feed only its share of the global batch, and a process with
one device must still join the sum.

Here every process reads the same global batch; it is cut into one shard
per device of the run (`jax.device_count()`), as Trax's `reshape_by_device`
cuts it for one process with that many devices, and each process keeps the
shards of its own devices. Each device gets the random key Trax would give
it, and the step is Trax's pmapped update. Per-device losses and eval
metrics are gathered from every process before they are averaged, so every
process reports the run's loss, not its shard's. The numbers are thus those
of one process holding all the devices.

So that the step is Trax's own, this calls trax 1.4.1's private helpers
(`_average_multidevice_gradients`, `_model_with_ends`, `_model_with_metrics`,
`_combine_devices`); setup.cfg pins that version.
"""

import functools

import jax
from jax.experimental import multihost_utils
import numpy as np
from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes
from trax.fastmath import numpy as jnp
from trax.layers import acceleration
from trax.layers import base as layers_base
from trax.optimizers import trainer as trax_trainer
from trax.supervised import training

from trax_qkv import patches


def _local_positions():
  """Positions of this process's devices among all devices of the run,
  in the order `pmap` numbers them."""
  everything = jax.devices()
  return [everything.index(d) for d in jax.local_devices()]


def local_shards(x):
  """This process's shards of `x`, a global batch (or a stack of one entry
  per device of the run): leading axis = its devices."""
  n = jax.device_count()
  positions = _local_positions()

  def shards(leaf):
    leaf = np.asarray(leaf)
    if leaf.shape[0] % n:
      raise ValueError(
        f'the batch size ({leaf.shape[0]}) must be a multiple of the '
        f'number of devices of the run ({n}, over {jax.process_count()} '
        'processes); change the batch size or the number of processes.'
      )
    per_device = leaf.reshape((n, leaf.shape[0] // n) + leaf.shape[1:])
    return per_device[positions]

  return fastmath.nested_map(shards, x)


def device_keys(rng):
  """The keys of this process's devices: Trax's split of `rng` for all
  the devices of the run, then this process's entries."""
  keys = jnp.stack(fastmath.random.split(rng, jax.device_count()))
  return keys[np.asarray(_local_positions())]


def gather(x):
  """Per-device values of this process (leading axis: its devices) ->
  those of every device of the run, in device order, on every process."""
  return fastmath.nested_map(
    lambda leaf: np.asarray(
      multihost_utils.process_allgather(np.asarray(leaf), tiled=True)
    ),
    x,
  )


def replicate(x):
  """A copy of `x` on each of this process's devices (leading axis), even
  when it has only one: what the pmapped step reads."""
  return patches.replicate(x, jax.local_devices())


def unreplicate(x):
  return fastmath.nested_map(lambda leaf: leaf[0], x)


class ReplicatedModel(tl.Accelerate):
  """`tl.Accelerate` whose weights and state are always replicated on this
  process's devices, however many; only `Trainer` below uses it."""

  def _prepare_weights(self, weights):
    return replicate(weights)

  def _unreplicate(self, x):
    return unreplicate(x)

  def init(self, input_signature):
    weights, state = self.sublayer.init(input_signature, use_cache=True)
    self._weights = replicate(weights)
    self._state = replicate(state)
    return self._weights, self._state

  def replicate_state(self, state):
    self.sublayer.state = state
    self._state = replicate(state)

  @property
  def state(self):
    if self._state is layers_base.EMPTY_STATE:
      self._state = replicate(self.sublayer.state)
    return self._state

  @state.setter
  def state(self, state):
    self._state = state
    self.sublayer.state = unreplicate(state)


def _update_fn(forward_and_backward_fn, optimizer, adasum):
  """Trax's multi-device update (`optimizers.trainer._accelerate_update_fn`
  with n_devices > 1): the same pmapped step, gradients averaged over every
  device of the run."""

  @functools.partial(fastmath.pmap, axis_name='batch', donate_argnums=(0,))
  def update(weights_and_slots, step, opt_params, batch, state, rng):
    weights, slots = weights_and_slots
    (loss, state), gradients = forward_and_backward_fn(
      batch, weights, state, rng
    )
    gradients = trax_trainer._average_multidevice_gradients(
      gradients, adasum=adasum
    )
    weights, slots, stats = optimizer.tree_update(
      step, gradients, weights, slots, opt_params, store_slots=False
    )
    stats['loss'] = loss
    return (weights, slots), state, stats

  return update


class Trainer(optimizers.Trainer):
  """`optimizers.Trainer` for one process of several: same step and
  numbers as Trax's Trainer on one process holding all the devices.

  `one_step` takes the global batch and returns the loss of every device
  of the run (so `Loop`'s mean of it is the run's loss).
  """

  def __init__(self, model_with_loss, optimizer, adasum=False):
    # Not Trax's __init__: with one local device it would build the
    # single-process jitted step.
    self._model_with_loss = model_with_loss
    self._optimizer = optimizer
    self._n_devices = jax.local_device_count()
    self._adasum = adasum
    self._slots, self._opt_params = replicate(
      (optimizer.slots, optimizer.opt_params)
    )
    self._accelerated_model_with_loss = ReplicatedModel(
      model_with_loss, n_devices=self._n_devices
    )
    self._forward_and_backward_fn = fastmath.value_and_grad(
      model_with_loss.pure_fn, argnums=1, has_aux=True
    )
    self._accelerated_update_fn = _update_fn(
      self._forward_and_backward_fn, optimizer, adasum
    )

  @property
  def slots(self):
    return self._optimizer.slots

  @slots.setter
  def slots(self, slots):
    self._optimizer.slots = slots
    self._slots = replicate(slots)

  def one_step(self, batch, rng, step=0, learning_rate=None):
    if learning_rate is not None:
      self._opt_params['learning_rate'] = replicate(learning_rate)
    model = self._accelerated_model_with_loss
    (weights, slots), state, stats = self._accelerated_update_fn(
      (model.weights, self._slots),
      jnp.repeat(step, self._n_devices),
      self._opt_params,
      local_shards(batch),
      model.state,
      device_keys(rng),
    )
    model.weights = weights
    model.state = state
    self._slots = slots
    self._optimizer.slots = unreplicate(slots)
    stats['loss'] = gather(stats['loss'])
    return stats['loss'], stats


def init_trainer(loop, task):
  """`Loop._init_trainer`'s job (its standard path) with `Trainer`."""
  model_in_training = training._model_with_ends(
    loop._model, [task.loss_layer], shapes.signature(task.sample_batch)
  )
  task.optimizer.tree_init(model_in_training.weights)
  return Trainer(model_in_training, task.optimizer, adasum=loop._adasum)


def init_evaluator(eval_model, eval_task):
  """`Loop._init_evaluator`'s job: each process evaluates its shards of
  the global eval batch; the metrics are averaged over every device of the
  run, as Trax's `tl.jit_forward` averages them over one process's."""
  model_with_metrics = training._model_with_metrics(eval_model, eval_task)
  forward = fastmath.pmap(model_with_metrics.pure_fn, axis_name='batch')
  n = jax.device_count()

  def metrics_fn(batch, weights, state, rng):
    results, state = forward(
      local_shards(batch), weights, state, device_keys(rng)
    )
    results = acceleration._combine_devices(gather(results))
    return fastmath.nested_map(
      lambda y: tl.mean_or_pmean(n, y, axis=0), results
    ), state

  return training._Evaluator(
    weights=replicate(model_with_metrics.weights[1]),
    state=replicate(model_with_metrics.state[1]),
    metrics_fn=metrics_fn,
  )


def check_supported(loop):
  """Raises ValueError for Loop options this module does not run across
  processes."""
  if loop._use_memory_efficient_trainer:
    raise ValueError(
      'use_memory_efficient_trainer is not supported across processes; '
      'train with the standard trainer.'
    )
  if layers_base.N_WEIGHTS_SHARDS > 1:
    raise ValueError('n_weights_shards > 1 is not supported across processes.')
