"""trax_qkv.patches: every change to Trax, applied once, version-guarded."""

import functools
import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import types
import warnings

import jax
import numpy as np
from packaging import requirements
import pytest
from trax import fastmath
from trax import shapes
import trax.layers
import trax.models
from trax.models import transformer as trax_transformer

import trax_qkv
from trax_qkv import import_patches
from trax_qkv import patches
from trax_qkv.models import registry


def _routed():
  """Patch 8's changes: each routed module's tl, each patched default."""
  views = {name: sys.modules[name].tl for name in _ROUTED_MODULES}
  defaults = [
    importlib.import_module(module).__dict__[function].__defaults__
    for module, function in registry.DEFAULT_HOLDERS
  ]
  return views, defaults


_ROUTED_MODULES = sorted(
  {m for site in registry.SITES.values() for m in site.modules}
)


def test_applied_on_import_and_idempotent(monkeypatch):
  patched = (
    fastmath.tree_unflatten,
    trax.layers.for_n_devices,
    trax.layers.on_cpu,
    _routed(),
  )
  assert fastmath.tree_unflatten is patches._tree_unflatten
  routed = trax_transformer.tl.AttentionQKV
  assert isinstance(routed, registry.Dispatcher)
  assert routed.site == 'cross_attention' and routed.builtin is None
  assert trax_transformer.tl.Dense is trax.layers.Dense  # the rest is trax's
  assert set(_ROUTED_MODULES) == {
    'trax.models.transformer',
    'trax.models.rnn',
    'trax.models.research.rezero',
    'trax.models.research.configurable_transformer',
  }
  monkeypatch.setattr(patches, '_applied', False)  # applied again, fully
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    patches.apply()
    assert patches._route_attention() == []  # nothing left to do
  assert (
    fastmath.tree_unflatten,
    trax.layers.for_n_devices,
    trax.layers.on_cpu,
    _routed(),
  ) == patched


def test_attention_routing_is_guarded_by_what_can_be_checked(monkeypatch):
  """A module whose tl is not trax.layers, one that cannot be imported and
  a default that no longer holds Trax's layer are left as they are, and
  said so; a default that wraps Trax's layer (functools.wraps) is routed,
  building the wrapper while nothing is chosen."""
  from trax.models import rnn
  from trax.models.research import configurable_transformer as ct
  from trax.models.research import transformer2

  other = types.SimpleNamespace(AttentionQKV=trax.layers.AttentionQKV)
  monkeypatch.setattr(rnn, 'tl', other)
  monkeypatch.setitem(sys.modules, 'trax.models.research.rezero', None)
  defaults = transformer2.Transformer2.__defaults__
  monkeypatch.setattr(
    transformer2.Transformer2,
    '__defaults__',
    tuple(
      trax.layers.Dense if isinstance(d, registry.Dispatcher) else d
      for d in defaults
    ),
  )
  calls = []

  @functools.wraps(trax.layers.CausalAttention)
  def wrapped(*args, **kwargs):
    calls.append(kwargs)
    return trax.layers.CausalAttention(*args, **kwargs)

  lm_defaults = ct.ConfigurableTransformerLM.__defaults__
  monkeypatch.setattr(
    ct.ConfigurableTransformerLM,
    '__defaults__',
    tuple(
      wrapped if isinstance(d, registry.Dispatcher) else d for d in lm_defaults
    ),
  )
  skipped = patches._route_attention()
  assert skipped == [
    'trax.models.research.rezero (cannot be imported: import of '
    'trax.models.research.rezero halted; None in sys.modules)',
    "trax.models.research.transformer2.Transformer2 (no default is Trax's "
    'layer)',
    'trax.models.rnn (its tl is not trax.layers)',
  ]
  assert rnn.tl is other
  routed = (
    inspect.signature(ct.ConfigurableTransformerLM)
    .parameters['attention_type']
    .default
  )
  assert isinstance(routed, registry.Dispatcher) and routed.builtin is wrapped
  ct.ConfigurableTransformerLM(20, d_model=16, d_ff=32, n_layers=1)
  assert len(calls) == 2  # ApplyAttentionLayer's two calling conventions


@pytest.mark.slow
@pytest.mark.stack
def test_import_succeeds_where_a_routed_module_is_gone():
  """One warning, and the models that remain are routed."""
  code = (
    'import sys, warnings\n'
    'import trax.models\n'
    'sys.modules["trax.models.research.rezero"] = None\n'
    'with warnings.catch_warnings(record=True) as caught:\n'
    '  warnings.simplefilter("always")\n'
    '  import trax_qkv\n'
    'print(len(caught), "rezero (cannot be imported" in str(caught[0]))\n'
    'print(type(trax.models.transformer.tl).__name__)\n'
    'print(type(trax.models.rnn.tl).__name__)\n'
  )
  done = subprocess.run(
    [sys.executable, '-c', code],
    capture_output=True,
    text=True,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
    check=True,
  )
  assert done.stdout.split() == ['1', 'True', 'LayersView', 'LayersView']


def test_installed_versions_are_the_tested_ones():
  assert patches.untested_versions() == []


def test_guarded_versions_come_from_our_package_metadata():
  required = patches.required_versions()
  declared = {
    requirement.name: requirement.specifier
    for requirement in map(
      requirements.Requirement, importlib.metadata.requires('trax_qkv')
    )
    if requirement.name in ('trax', 'jax')
  }
  assert required == declared
  assert set(required) == set(patches.PATCHED_PACKAGES)


def test_other_versions_warn(monkeypatch):
  real = importlib.metadata.version
  monkeypatch.setattr(
    patches.importlib.metadata,
    'version',
    lambda name: '1.5.0' if name == 'trax' else real(name),
  )
  assert patches.untested_versions() == ['trax 1.5.0']
  monkeypatch.setattr(patches, '_applied', False)
  required = patches.required_versions()
  with pytest.warns(
    patches.UntestedVersionWarning,
    match=re.escape(
      f'written for trax {required["trax"]} and jax {required["jax"]}; '
      'found trax 1.5.0'
    ),
  ):
    patches.apply()


@pytest.mark.parametrize(
  'jax_version,warns',
  [('0.10.2', False), ('0.12.0.1', False), ('0.13.0', True)],
)
def test_only_versions_outside_the_tested_range_warn(jax_version, warns):
  real = importlib.metadata.version
  with pytest.MonkeyPatch.context() as m:
    m.setattr(
      patches.importlib.metadata,
      'version',
      lambda name: jax_version if name == 'jax' else real(name),
    )
    assert patches.untested_versions() == (
      [f'jax {jax_version}'] if warns else []
    )


def test_trainer_loop_class_is_scoped():
  from trax.supervised import trainer_lib

  from trax_qkv.supervised import training

  original = trainer_lib.training.Loop

  class MyLoop(original):
    pass

  with training.trainer_loop_class(MyLoop):
    assert trainer_lib.training.Loop is MyLoop
  assert trainer_lib.training.Loop is original


# ------------------------------------------------- patch 6: importing Trax


def _decorator_line(message):
  """The source line a `Defined at FILE:LINE ...` message points to."""
  path, line = re.match(r'Defined at (.+):(\d+) ', message).groups()
  with open(path) as f:
    return f.read().splitlines()[int(line) - 1].strip()


def test_assert_shape_messages_still_name_the_decorator_line():
  assert_shape = sys.modules[import_patches.ASSERT_SHAPE_MODULE]
  assert isinstance(assert_shape.inspect, import_patches.FramesOnlyInspect)
  dense = trax.layers.Dense(4)  # a decorated class
  attention = trax.layers.DotProductCausalAttention()
  for layer in (dense, attention):
    for check in (layer._before_assert_fun, layer._after_assert_fun):
      assert _decorator_line(check._message).startswith('@assert_shape(')
  relu = trax.layers.Relu()  # a decorated function: Serial of checks
  for check in (relu.sublayers[0], relu.sublayers[-1]):
    assert _decorator_line(check._message).startswith('@assert_shape(')


def test_frames_only_stack_has_inspect_stacks_frames():
  def frames():
    fast = import_patches.FramesOnlyInspect().stack()
    return [row[0] for row in fast], [row.frame for row in inspect.stack()]

  fast, slow = frames()
  assert fast == slow and fast[0].f_code.co_name == 'frames'
  # A layer built at run time names its own caller, as before.
  check = trax.layers.AssertShape('ab')
  line = inspect.currentframe().f_lineno - 1
  assert check._message == f'Defined at {__file__}:{line}'


def test_installed_on_a_trax_already_imported(monkeypatch):
  assert_shape = sys.modules[import_patches.ASSERT_SHAPE_MODULE]
  monkeypatch.setattr(assert_shape, 'inspect', inspect)
  import_patches.install()
  assert isinstance(assert_shape.inspect, import_patches.FramesOnlyInspect)
  monkeypatch.setattr(
    import_patches.importlib.metadata,
    'version',
    lambda name: '1.5.0',
  )
  monkeypatch.setattr(assert_shape, 'inspect', inspect)
  import_patches.install()  # an untested Trax is left as it is
  assert assert_shape.inspect is inspect


@pytest.mark.slow
@pytest.mark.stack
def test_importing_trax_qkv_first_patches_before_trax_uses_it():
  # Trax's decorators run while `import trax_qkv` imports Trax: none of
  # them may call the real inspect.stack().
  code = (
    'import inspect, sys\n'
    'calls = []\n'
    'real = inspect.stack\n'
    'inspect.stack = lambda *a, **k: calls.append(1) or real(*a, **k)\n'
    'import trax_qkv\n'
    'module = sys.modules["trax.layers.assert_shape"]\n'
    'print(len(calls), type(module.inspect).__name__)\n'
    'print(trax_qkv.import_patches._Finder in map(type, sys.meta_path))\n'
  )
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  out = subprocess.run(
    [sys.executable, '-c', code],
    capture_output=True,
    text=True,
    env=env,
    check=True,
  ).stdout.split()
  assert out[-3:] == ['0', 'FramesOnlyInspect', 'False']


# ------------------------------------------------ patch 7: building a model


def _init_with(init_weights_and_state, model_fn, signature, monkeypatch):
  """(weights and state leaves, their tree, output signature) of a model
  built and initialized with `init_weights_and_state` as Serial's."""
  monkeypatch.setattr(
    trax.layers.Serial, 'init_weights_and_state', init_weights_and_state
  )
  model = model_fn()
  weights_and_state = model.init(signature, rng=jax.random.PRNGKey(3))
  leaves, tree = jax.tree_util.tree_flatten(weights_and_state)
  return (
    [np.asarray(x) for x in leaves],
    tree,
    model.output_signature(signature),
  )


@pytest.mark.parametrize('mode', ['train', 'predict'])
def test_serial_init_gives_trax_own_weights_and_state(mode, monkeypatch):
  """Every attention site ours and Trax's, in training and in predict mode
  (its caches are state): the same leaves, tree and output signature as
  Trax's own `Serial.init_weights_and_state` gives."""
  assert (
    trax.layers.Serial.init_weights_and_state
    is patches._serial_init_weights_and_state
  )

  def model_fn():
    sites = dict.fromkeys(('self_attention', 'cross_attention'), 'reference')
    with trax_qkv.use_attention(**sites):
      return trax.models.Transformer(
        30, d_model=16, d_ff=32, n_heads=2, n_encoder_layers=2,
        n_decoder_layers=2, mode=mode,
      )  # fmt: skip

  length = 1 if mode == 'predict' else 5
  signature = (
    shapes.ShapeDtype((2, 7), np.int32),
    shapes.ShapeDtype((2, length), np.int32),
  )
  ours = _init_with(
    patches._serial_init_weights_and_state, model_fn, signature, monkeypatch
  )
  trax_own = _init_with(
    patches._original_serial_init, model_fn, signature, monkeypatch
  )
  assert ours[1] == trax_own[1] and ours[2] == trax_own[2]
  assert len(ours[0]) == len(trax_own[0]) > 0
  for a, b in zip(ours[0], trax_own[0]):
    assert a.dtype == b.dtype and np.array_equal(a, b)


def test_serial_init_still_traces_layers_with_their_own_forward(monkeypatch):
  """A shape error inside a nested Serial is still Trax's LayerError, and a
  Serial subclass (its forward is not Serial's) is traced, not trusted."""
  traced = []

  class Doubling(trax.layers.Serial):
    def forward(self, xs):
      traced.append(1)
      return super().forward(xs) * 2

  inner = Doubling(trax.layers.Dense(3))
  model = trax.layers.Serial(trax.layers.Serial(inner), trax.layers.Dense(2))
  model.init(shapes.ShapeDtype((4, 5)))
  assert traced  # traced abstractly, by its parent
  broken = trax.layers.Serial(
    trax.layers.Serial(
      trax.layers.Dense(3), trax.layers.Fn('Bad', lambda x: x @ x)
    )
  )
  with pytest.raises(trax.layers.LayerError, match='Bad'):
    broken.init(shapes.ShapeDtype((4, 5)))


def test_serial_init_inside_a_traced_function():
  """Layers may be initialized on tracers (inputs of a jitted function)."""

  def init(x):
    inner = trax.layers.Serial(trax.layers.Dense(3), trax.layers.Serial())
    model = trax.layers.Serial(inner, trax.layers.Dense(2))
    weights, _ = model.init(x, rng=jax.random.PRNGKey(0))
    return weights

  weights = jax.eval_shape(init, jax.ShapeDtypeStruct((4, 5), np.float32))
  assert [w.shape for w in jax.tree_util.tree_leaves(weights)] == [
    (5, 3), (3,), (3, 2), (2,)
  ]  # fmt: skip


# ------------------------------------------ patch 9: Trax master's tf_inputs

MASTER_TF_INPUTS = """import tensorflow as tf
from tensorflow import estimator as tf_estimator
MODES = (tf_estimator.ModeKeys.TRAIN, tf_estimator.ModeKeys.EVAL)
def fails():
  raise RuntimeError('line 5')
"""


def test_master_estimator_import_is_bridged_in_that_module_only(tmp_path):
  path = tmp_path / 'tf_inputs.py'
  path.write_text(MASTER_TF_INPUTS)

  def load(patched):
    loader = importlib.machinery.SourceFileLoader('master_tf_inputs', str(path))
    if patched:
      loader = import_patches._PatchingLoader(
        loader, import_patches.TF_INPUTS_MODULE
      )
    spec = importlib.util.spec_from_loader('master_tf_inputs', loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module

  with pytest.raises(ImportError, match='estimator'):
    load(patched=False)  # TensorFlow 2.21: what master's Trax meets
  module = load(patched=True)
  assert module.MODES == ('train', 'eval')
  assert module.fails.__code__.co_firstlineno == 4  # lines kept
  with pytest.raises(ImportError):
    from tensorflow import estimator  # noqa: F401  # nowhere else
  # The installed Trax's module was bridged exactly where it needs it
  # (master); PyPI's 1.4.1 imports it inside a function and runs as it is.
  tf_inputs = importlib.import_module('trax.data.tf_inputs')
  assert import_patches.needs_mode_keys(inspect.getsource(tf_inputs)) == (
    getattr(tf_inputs, 'tf_estimator', None) is import_patches.ESTIMATOR
  )


def test_a_broken_trax_import_names_its_cause_and_a_fix(tmp_path):
  (tmp_path / 'trax').mkdir()
  (tmp_path / 'trax' / '__init__.py').write_text(
    'from tensorflow import estimator\n'
  )
  code = (
    'import sys, warnings\n'
    'warnings.simplefilter("always")\n'
    'import trax_qkv\n'
    'print(trax_qkv.import_patches._Finder in map(type, sys.meta_path))\n'
    'import trax_qkv.kernels  # without Trax, the kernels still import\n'
    'trax_qkv.AttentionQKV\n'
  )
  env = dict(os.environ, PYTHONPATH=str(tmp_path), TF_CPP_MIN_LOG_LEVEL='3')
  done = subprocess.run(
    [sys.executable, '-c', code], capture_output=True, text=True, env=env
  )
  assert done.returncode == 1 and done.stdout.split() == ['False']
  cause = (
    "importing Trax failed: ImportError: cannot import name 'estimator' "
    "from 'tensorflow'"
  )
  fix = "Install PyPI's release, which trax_qkv is tested with"
  warning = [line for line in done.stderr.splitlines() if 'Warning' in line]
  assert len(warning) == 1 and cause in warning[0] and fix in warning[0]
  assert f'ImportError: trax_qkv.AttentionQKV needs Trax: {cause}' in (
    done.stderr
  )
  other = import_patches.import_failure(ImportError('a stand-in'))
  assert other.startswith('importing Trax failed: ImportError: a stand-in.')
  assert "pip install 'trax==1.4.1' 'tensorflow==2.21.*'" in other


# Every attribute of a module (and of its classes, and its functions'
# defaults) that `import trax_qkv` changes, Trax imported first: README's
# "What `import trax_qkv` changes" names each of them. (Patch 6, `inspect`
# in `trax.layers.assert_shape`, is installed before Trax is imported, as
# `import trax_qkv` does: without it importing Trax takes 20 s more.)
CONFIGURABLE = 'trax.models.research.configurable_transformer.'
CHANGED_BY_IMPORT = sorted(
  [
    'trax.fastmath.numpy.tree_unflatten',  # 1
    'trax.fastmath.tree_unflatten',
    'trax.layers.acceleration.for_n_devices',  # 2
    'trax.layers.for_n_devices',
    'trax.layers.acceleration.on_cpu',  # 3
    'trax.layers.on_cpu',
    'trax.data.inputs.pickle',  # 4
    'trax.layers.base.pickle',
    'trax.rl.training.pickle',
    'trax.supervised.training.pickle',
    'trax.layers.base.np_from_file',
    'trax.layers.np_from_file',
    'trax.supervised.history.History.from_dict',  # 5
    'trax.layers.combinators.Serial.init_weights_and_state',  # 7
    'trax.models.transformer.tl',  # 8
    'trax.models.rnn.tl',
    'trax.models.research.rezero.tl',
    'trax.models.research.configurable_transformer.tl',
    CONFIGURABLE + 'ConfigurableTransformer.__defaults__',
    CONFIGURABLE + 'ConfigurableTransformerEncoder.__defaults__',
    CONFIGURABLE + 'ConfigurableTransformerLM.__defaults__',
    'trax.models.research.transformer2.Transformer2.__defaults__',
  ]
)

AUDIT = """
import importlib.util, inspect, sys
spec = importlib.util.spec_from_file_location('early', sys.argv[1])
early = importlib.util.module_from_spec(spec)
spec.loader.exec_module(early)
early.install()
import trax, trax.models, trax.rl.training
assert type(sys.modules['trax.layers.assert_shape'].inspect).__name__ == (
  'FramesOnlyInspect')

def snapshot():
  seen = {}
  for name, module in list(sys.modules.items()):
    if module is None or name.startswith(('trax_qkv', '__main__', '__mp_')):
      continue
    for attr, value in list(vars(module).items()):
      seen[name, attr] = value
      is_class, is_function = inspect.isclass(value), inspect.isfunction(value)
      if not (is_class or is_function) or value.__module__ != name:
        continue
      if is_class:
        for key, item in list(vars(value).items()):
          seen[name, f'{attr}.{key}'] = item
      else:
        seen[name, f'{attr}.__defaults__'] = value.__defaults__
  return seen

before = snapshot()
import trax_qkv
after = snapshot()
for (name, attr), value in sorted(after.items()):
  if (name, attr) in before and before[name, attr] is not value:
    print(f'{name}.{attr}')
  elif (name, attr) not in before and any(n == name for n, _ in before):
    if not inspect.ismodule(value):  # a submodule imported is no change
      print(f'added {name}.{attr}')
"""


def test_import_changes_what_readme_lists_and_nothing_else():
  tf_inputs = importlib.import_module('trax.data.tf_inputs')
  if getattr(tf_inputs, 'tf_estimator', None) is import_patches.ESTIMATOR:
    pytest.skip('Trax master cannot be imported before trax_qkv (patch 9)')
  done = subprocess.run(
    [sys.executable, '-c', AUDIT, import_patches.__file__],
    capture_output=True,
    text=True,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
    check=True,
  )
  assert sorted(done.stdout.splitlines()) == CHANGED_BY_IMPORT
