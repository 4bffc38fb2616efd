"""Every checkpoint Trax 1.4.1's own writers produce loads with trax_qkv
imported, leaf for leaf as Trax's own reading (plain pickle) loads it.

Each file is written by Trax's code in the test: `trainer_lib.train` (the
`Trainer.save_state` path of Trax's trainer before `Loop`), `training.Loop`,
`Layer.save_to_file`, the data counters and `trax.rl`'s files. "Plain" is
the same load inside `patches.trax_checkpoint_reading()`, which gives Trax
back its own `pickle` and `np_from_file`.
"""

import collections
import contextlib
import gzip
import os
import pickle
import shutil
import types

from helpers import TINY_TRANSFORMER
from helpers import RunsCode
from helpers import assert_loads_as_pickle
from helpers import assert_same
from helpers import assert_trees_equal
import jax.numpy as jnp
import numpy as np
import pytest
import trax
from trax import layers as tl
from trax import shapes
from trax.data import inputs as trax_inputs
from trax.layers import base as trax_layers_base
from trax.supervised import decoding as trax_decoding
from trax.supervised import history as trax_history
from trax.supervised import lr_schedules
from trax.supervised import trainer_lib
from trax.supervised import training as trax_training

import trax_qkv
from trax_qkv import checkpoint_files
from trax_qkv import patches
from trax_qkv.models import registry
from trax_qkv.supervised import checkpointing

VOCAB = 20
# One layer each side: what is checked is how files are written and read,
# and a smaller model's training step compiles faster.
CONFIG = dict(
  TINY_TRANSFORMER, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0
)
# Trax's own reading, then the one trax_qkv installs.
READINGS = (
  ('plain', patches.trax_checkpoint_reading),
  ('safe', contextlib.nullcontext),
)
SOURCES = np.array(
  [[3, 4, 5, 6, 7, 1], [8, 9, 10, 1, 0, 0], [11, 12, 13, 14, 1, 0]], np.int32
)


def _model(mode='train', implementation=None):
  """The tiny Transformer; with `implementation`, trax_qkv's attention in
  every site."""
  if implementation is None:
    return trax.models.Transformer(VOCAB, mode=mode, **CONFIG)
  with trax_qkv.use_attention(
    **{site: implementation for site in registry.SITES}
  ):
    return trax.models.Transformer(VOCAB, mode=mode, **CONFIG)


def _stream(unused_n_devices=1):
  rng = np.random.RandomState(0)
  while True:
    tokens = rng.randint(2, VOCAB, size=(4, 6)).astype(np.int32)
    yield tokens, tokens, np.ones_like(tokens, np.float32)


def _train_task():
  return trax_training.TrainTask(
    _stream(), tl.WeightedCategoryCrossEntropy(), trax.optimizers.Adam(0.01)
  )


@pytest.fixture(scope='module')
def written(tmp_path_factory):
  """{writer: directory} of two training steps, each by Trax's own code."""
  base = tmp_path_factory.mktemp('trax_writers')
  state = trainer_lib.train(
    str(base / 'trainer_lib'),
    model=_model,
    inputs=trax_inputs.Inputs(_stream),
    optimizer=trax.optimizers.Adam,
    steps=2,
    eval_steps=1,
    eval_frequency=1,
    random_seed=0,
    use_loop=False,
    save_graphs=False,
  )
  assert state.step == 2
  loop = trax_training.Loop(
    _model(),
    _train_task(),
    output_dir=str(base / 'loop'),
    checkpoint_at=lambda step: step == 2,
    random_seed=0,
  )
  loop.run(2)
  return {'trainer_lib': base / 'trainer_lib', 'loop': base / 'loop'}


def _copy(written, writer, tmp_path):
  copy = tmp_path / writer
  shutil.copytree(written[writer], copy)
  return copy


@pytest.mark.slow
@pytest.mark.parametrize('writer', ['trainer_lib', 'loop'])
def test_every_file_loads_as_with_plain_pickle(written, writer):
  names = sorted(os.listdir(written[writer]))
  assert 'model.pkl.gz' in names
  if writer == 'loop':
    assert {'model.weights.npy.gz', 'data_counters0.pkl'} <= set(names)
  assert_loads_as_pickle(written[writer])


def test_the_trainer_lib_checkpoint_holds_what_the_allow_list_names(written):
  """The writer this package once refused: its History, and in it the
  defaultdicts of lists, come back as Trax's objects."""
  meta = checkpoint_files.unpickle_from_file(
    str(written['trainer_lib'] / 'model.pkl.gz'), gzip=True
  )
  history = meta['history']
  assert isinstance(history, trax_history.History)
  assert history.modes == ['eval', 'train']
  assert history.get('train', 'metrics/loss')[-1][0] == 2
  values = history._values['train']
  assert type(values) is collections.defaultdict
  assert values.default_factory is list


def test_the_plain_baseline_is_trax_own_reading(tmp_path):
  """READINGS' 'plain' is Trax's reading, not ours under another name:
  its modules read with the standard `pickle`, and a checkpoint holding
  an object outside our allow-list loads there and is refused outside."""
  path = str(tmp_path / 'odd.pkl.gz')
  with gzip.open(path, 'wb') as f:
    pickle.dump({'step': 1, 'odd': types.SimpleNamespace(a=1)}, f)
  with patches.trax_checkpoint_reading():
    for module in patches._CHECKPOINT_READERS:
      assert module.pickle is pickle
    # Both names Trax's code reads it by: Trax's own function.
    assert tl.np_from_file is patches._original_np_from_file
    assert trax_layers_base.np_from_file is patches._original_np_from_file
    assert trax_training.unpickle_from_file(path, gzip=True)['odd'].a == 1
  assert tl.np_from_file is checkpoint_files.np_from_file
  assert trax_layers_base.np_from_file is checkpoint_files.np_from_file
  with pytest.raises(checkpoint_files.UnsafeCheckpointError):
    trax_training.unpickle_from_file(path, gzip=True)


@pytest.mark.parametrize('writer', ['trainer_lib', 'loop'])
@pytest.mark.parametrize('weights_only', [True, False])
def test_init_from_file_loads_as_trax_does(written, writer, weights_only):
  path = str(written[writer] / 'model.pkl.gz')
  loaded = []
  for _, reading in READINGS:
    model = _model('eval')
    with reading():
      model.init_from_file(path, weights_only=weights_only)
    loaded.append((model.weights, model.state))
  assert_trees_equal(loaded[0], loaded[1])


def _trainer(output_dir):
  return trainer_lib.Trainer(
    _model,
    tl.WeightedCategoryCrossEntropy(),
    trax.optimizers.Adam,
    lr_schedules.multifactor(),
    trax_inputs.Inputs(_stream),
    output_dir=str(output_dir),
    random_seed=0,
  )


@pytest.mark.slow
def test_trainer_lib_restores_its_checkpoint(written, tmp_path):
  restored = []
  for name, reading in READINGS:
    directory = _copy(written, 'trainer_lib', tmp_path / name)
    with reading():
      trainer = _trainer(directory)
    restored.append(trainer)
    assert trainer.step == 2
  plain, safe = restored
  assert_trees_equal(plain.model_weights, safe.model_weights)
  assert_trees_equal(plain.model_state, safe.model_state)
  assert_trees_equal(plain._opt_state.slots, safe._opt_state.slots)
  assert plain._history.to_dict() == safe._history.to_dict()
  # ... and trains on from there, writing step 3.
  safe.train_epoch(1, 0)
  safe.save_state(keep=False)
  assert checkpointing.checkpoint_step(str(safe._output_dir)) == 3


@pytest.mark.parametrize('writer', ['trainer_lib', 'loop'])
@pytest.mark.parametrize(
  'loop_class', [trax_training.Loop, checkpointing.ResumableLoop]
)
def test_loop_and_our_resume_restore_it(written, writer, loop_class, tmp_path):
  """Trax's Loop and trax_qkv's ResumableLoop (the resume of trax-qkv-train
  and trax-qkv-validate) restore either writer's checkpoint as Trax's own
  reading does."""
  restored = []
  for name, reading in READINGS:
    directory = _copy(written, writer, tmp_path / name)
    with reading():
      loop = loop_class(_model(), _train_task(), output_dir=str(directory))
    assert loop.step == 2
    restored.append(loop)
  plain, safe = restored
  assert_trees_equal(plain.model.weights, safe.model.weights)
  assert_trees_equal(plain.model.state, safe.model.state)
  assert_trees_equal(
    plain._trainer_per_task[0].slots, safe._trainer_per_task[0].slots
  )
  assert plain.history.to_dict() == safe.history.to_dict()
  if writer == 'trainer_lib':  # Trax's model weights, not fresh ones
    trainer = _trainer(_copy(written, writer, tmp_path / 'trainer'))
    assert_trees_equal(safe.model.weights, trainer.model_weights)


@pytest.mark.slow
@pytest.mark.stack
@pytest.mark.parametrize('implementation', ['reference', 'auto'])
def test_our_layers_in_every_site_decode_the_trainer_lib_checkpoint(
  written, implementation
):
  path = str(written['trainer_lib'] / 'model.pkl.gz')
  signature = shapes.signature((SOURCES, SOURCES[:, :1]))
  decoded = []
  for chosen in (None, implementation):
    model = _model('predict', chosen)
    model.init_from_file(path, weights_only=True, input_signature=signature)
    decoded.append(
      trax_decoding.autoregressive_sample(
        model,
        SOURCES,
        batch_size=len(SOURCES),
        temperature=0.0,
        max_length=10,
        eos_id=1,
      )
    )
  assert decoded[0].shape[1] > 1
  assert np.array_equal(decoded[0], decoded[1])


def test_layer_save_to_file_and_data_counters_load_as_pickle(tmp_path):
  model = tl.Serial(tl.Dense(3), tl.BatchNorm(axis=(0,)))
  x = np.random.RandomState(0).randn(4, 5).astype(np.float32)
  model.init(shapes.signature(x))
  model(x)  # BatchNorm's running statistics: state beside the weights
  for weights_only in (False, True):
    path = tmp_path / f'layer_{weights_only}.pkl.gz'
    model.save_to_file(
      str(path), weights_only=weights_only, input_signature=shapes.signature(x)
    )
  trax_inputs.save_data_counters(str(tmp_path), host_id=0)
  assert_loads_as_pickle(tmp_path)
  restored = tl.Serial(tl.Dense(3), tl.BatchNorm(axis=(0,)))
  restored.init_from_file(str(tmp_path / 'layer_False.pkl.gz'))
  assert_same(list(restored.weights), list(model.weights))
  assert_same(list(restored.state), list(model.state))


def test_trax_rl_files_load_as_pickle(tmp_path):
  from trax.rl import task as rl_task

  trajectory = rl_task.Trajectory(np.zeros(3, np.float32))
  trajectory.extend(
    action=1,
    dist_inputs=np.ones(2),
    reward=0.5,
    done=False,
    new_observation=np.ones(3, np.float32),
  )
  path = tmp_path / 'task_epoch1.pkl'
  trax_training.pickle_to_file([trajectory], str(path), gzip=True)
  (loaded,) = trax_training.unpickle_from_file(str(path), gzip=True)
  assert repr(loaded) == repr(trajectory)
  # An Agent's own file, by its own save_to_file and init_from_file (an
  # Agent needs a gym environment, and gym fails on numpy 2).
  from trax.rl import training as rl_training

  def agent(epoch, returns):
    return types.SimpleNamespace(
      _output_dir=str(tmp_path / 'rl'),
      _task=types.SimpleNamespace(save_to_file=lambda path: None),
      _epoch=epoch,
      _avg_returns=returns,
      _eval_temperatures=[0.0],
      _avg_returns_temperatures={0.0: returns},
    )

  os.makedirs(tmp_path / 'rl')
  rl_training.Agent.save_to_file(agent(3, [np.float32(0.5), 1.0]))
  assert_loads_as_pickle(tmp_path / 'rl')
  restored = agent(0, [])
  rl_training.Agent.init_from_file(restored)
  assert (restored._epoch, restored._avg_returns) == (3, [0.5, 1.0])


def test_bfloat16_weights_load_as_pickle(tmp_path):
  """Trainer pickles weights inline; bfloat16 ones name ml_dtypes."""
  weights = [np.arange(4, dtype=np.float32).astype(jnp.bfloat16)]
  trax_training.pickle_to_file(
    {'flat_weights': weights, 'step': 1}, str(tmp_path / 'm.pkl.gz'), True
  )
  assert_loads_as_pickle(tmp_path)


# ----------------------------------------------- what stays refused, and why


def _write(path, obj):
  with gzip.open(path, 'wb') as f:
    pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)


def test_a_history_carrying_a_payload_is_refused(written, tmp_path):
  path = tmp_path / 'model.pkl.gz'
  meta = checkpoint_files.unpickle_from_file(
    str(written['trainer_lib'] / 'model.pkl.gz'), gzip=True
  )
  meta['history']._values['train']['planted'] = RunsCode(tmp_path / 'x')
  _write(path, meta)
  with pytest.raises(
    checkpoint_files.UnsafeCheckpointError, match='refers to posix.system'
  ):
    _model('eval').init_from_file(str(path))
  assert not (tmp_path / 'x').exists()


@pytest.mark.parametrize(
  'factory,shown',
  [(os.system, 'posix.system'), (gzip.open, 'gzip.open')],
)
def test_a_defaultdict_with_another_factory_is_refused(
  tmp_path, factory, shown
):
  path = tmp_path / 'model.pkl.gz'
  _write(path, {'history': collections.defaultdict(factory)})
  with pytest.raises(checkpoint_files.UnsafeCheckpointError, match=shown):
    checkpoint_files.unpickle_from_file(str(path), gzip=True)


def test_an_admitted_function_as_factory_is_refused(tmp_path):
  """A factory that passes find_class but builds no empty value."""
  path = tmp_path / 'model.pkl.gz'
  payload = (
    b'\x80\x04\x8c\x0bcollections\x8c\x0bdefaultdict\x93'
    b'\x8c\x07_codecs\x8c\x06encode\x93\x85R.'
  )
  pickle.loads(payload)  # what plain pickle builds from it
  path.write_bytes(gzip.compress(payload))
  with pytest.raises(
    checkpoint_files.UnsafeCheckpointError,
    match=r'holds a defaultdict whose factory is <built-in function encode>',
  ):
    checkpoint_files.unpickle_from_file(str(path), gzip=True)


def test_trusting_opens_one_file_for_one_block(tmp_path):
  marker = tmp_path / 'marker'
  trusted, other = tmp_path / 'trusted.pkl.gz', tmp_path / 'other.pkl.gz'
  for path in (trusted, other):
    _write(path, {'flat_weights': [], 'x': RunsCode(marker)})
  with checkpoint_files.trusting(trusted):
    with pytest.raises(checkpoint_files.UnsafeCheckpointError):
      trax_training.unpickle_from_file(str(other), gzip=True)
    assert not marker.exists()
    trax_training.unpickle_from_file(str(trusted), gzip=True)
  assert marker.exists()  # the trusted file's own code ran
  marker.unlink()
  with pytest.raises(
    checkpoint_files.UnsafeCheckpointError, match='trusting\\(path\\)'
  ):
    trax_training.unpickle_from_file(str(trusted), gzip=True)
  assert not marker.exists()
  with pytest.raises(TypeError, match='trusting takes file paths'):
    with checkpoint_files.trusting(open(trusted, 'rb')):
      pass
