"""The changes to Trax made before Trax is imported, and the version guard.

This module imports no Trax: `trax_qkv/__init__` calls `install()` first,
then imports Trax, then applies the other changes (`trax_qkv.patches`,
which lists them all; these are its patches 6 and 9).

6. `inspect` in `trax.layers.assert_shape`: each `@assert_shape` decorator
   names its caller's file and line in its error message, found with
   `inspect.getframeinfo(inspect.stack()[1][0])`. `inspect.stack()` builds
   the source context of every frame on the stack, and for a frame of a
   file no module owns (the import machinery's frozen frames) it rescans
   every module in `sys.modules`. Trax decorates 65 layers while it is
   being imported, with TensorFlow's thousands of modules loaded and dozens
   of import frames on the stack, so importing `trax.layers` spends most of
   its time there (docs/tests.md has the measurement). The module is given
   an `inspect` whose `stack()` lists the frames alone; the one frame Trax
   asks `getframeinfo` about gets the same file and line, so every message
   is unchanged.
9. `tf_estimator` in `trax.data.tf_inputs` of Trax from GitHub master:
   there (not in 1.4.1, which imports it inside a function) the module
   begins with `from tensorflow import estimator as tf_estimator`, for
   `tf_estimator.ModeKeys.TRAIN` and `.EVAL` alone, and TensorFlow 2.16
   and later have no `tf.estimator`, so `import trax` fails. Where that
   line is in the module's source and TensorFlow has no estimator, the
   module is executed with the line reading `ModeKeys` from here instead:
   TensorFlow's own values, nothing else of the estimator API. Only that
   module sees it; `import tensorflow.estimator` still fails elsewhere.
"""

import importlib.abc
import importlib.machinery
import importlib.metadata
import inspect
import sys
import types

from packaging import requirements

# The packages whose code the patches change: their versions are guarded.
PATCHED_PACKAGES = ('trax', 'jax')

ASSERT_SHAPE_MODULE = 'trax.layers.assert_shape'
TF_INPUTS_MODULE = 'trax.data.tf_inputs'
# Patch 9: Trax master's import in TF_INPUTS_MODULE, and what replaces it.
ESTIMATOR_IMPORT = 'from tensorflow import estimator as tf_estimator'
MODE_KEYS_IMPORT = (
  'from trax_qkv.import_patches import ESTIMATOR as tf_estimator'
)
# tf.estimator.ModeKeys, the one part of the estimator API master reads.
ESTIMATOR = types.SimpleNamespace(
  ModeKeys=types.SimpleNamespace(TRAIN='train', EVAL='eval', PREDICT='infer')
)


def required_versions():
  """{package: specifier} of PATCHED_PACKAGES, as trax_qkv's installed
  metadata requires them (setup.cfg); {} when trax_qkv runs uninstalled."""
  try:
    required = importlib.metadata.requires('trax_qkv') or []
  except importlib.metadata.PackageNotFoundError:
    return {}
  found = {}
  for line in required:
    requirement = requirements.Requirement(line)
    if requirement.name in PATCHED_PACKAGES and not requirement.marker:
      found[requirement.name] = requirement.specifier
  return found


def untested_versions():
  """'package version' for each of PATCHED_PACKAGES whose installed version
  is not the one trax_qkv requires."""
  return [
    f'{package} {importlib.metadata.version(package)}'
    for package, specifier in required_versions().items()
    if importlib.metadata.version(package) not in specifier
  ]


class FramesOnlyInspect:
  """`inspect`, except that `stack()` lists the frames without their source
  context: rows whose element 0 is the frame, as `inspect.stack()`'s."""

  def __getattr__(self, name):
    return getattr(inspect, name)

  @staticmethod
  def stack(context=1):
    del context  # no row carries source context
    rows = []
    frame = sys._getframe(1)  # the caller's, as inspect.stack()'s first row
    while frame is not None:
      rows.append((frame,))
      frame = frame.f_back
    return rows


def speed_up(module):
  """Patch 6 on the imported `trax.layers.assert_shape`; idempotent."""
  if getattr(module, 'inspect', None) is inspect:
    module.inspect = FramesOnlyInspect()


def _tensorflow_has_estimator():
  try:
    from tensorflow import estimator  # noqa: F401
  except ImportError:
    return False
  return True


def needs_mode_keys(source):
  """Whether a `trax.data.tf_inputs` of this `source` needs patch 9:
  master's top-level estimator import, on a TensorFlow without one."""
  lines = source.splitlines()
  return ESTIMATOR_IMPORT in lines and not _tensorflow_has_estimator()


class _PatchingLoader(importlib.abc.Loader):
  """Executes the module with its own loader, then patches it (patch 6),
  or executes its source with master's estimator import replaced
  (patch 9, where `needs_mode_keys`)."""

  def __init__(self, loader, fullname):
    self._loader, self._fullname = loader, fullname

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    if self._fullname == ASSERT_SHAPE_MODULE:
      self._loader.exec_module(module)
      speed_up(module)
      return
    source = self._loader.get_source(module.__name__)
    if not needs_mode_keys(source):
      self._loader.exec_module(module)
      return
    lines = source.splitlines(keepends=True)
    at = [line.rstrip('\r\n') for line in lines].index(ESTIMATOR_IMPORT)
    lines[at] = MODE_KEYS_IMPORT + '\n'  # one line: tracebacks keep theirs
    filename = self._loader.get_filename(module.__name__)
    exec(compile(''.join(lines), filename, 'exec'), module.__dict__)

  def __getattr__(self, name):  # get_source, get_filename, ...
    return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
  """Finds the modules patches 6 and 9 change as Python would, with a
  loader that patches them before any other module of Trax can use them;
  leaves `sys.meta_path` once both are imported."""

  def __init__(self):
    self._waiting = {ASSERT_SHAPE_MODULE, TF_INPUTS_MODULE}

  def find_spec(self, fullname, path, target=None):
    if fullname not in self._waiting:
      return None
    self._waiting.discard(fullname)  # each imported once
    if not self._waiting:
      uninstall()
    spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
    if spec is not None and spec.loader is not None:
      spec.loader = _PatchingLoader(spec.loader, fullname)
    return spec


def uninstall():
  """Takes the finder off `sys.meta_path` (importing Trax failed, or it is
  done)."""
  sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]


def install():
  """Patches `trax.layers.assert_shape` and `trax.data.tf_inputs` when they
  are imported (or the first now, if it already was), for the Trax
  versions trax_qkv requires; idempotent."""
  module = sys.modules.get(ASSERT_SHAPE_MODULE)
  if isinstance(getattr(module, 'inspect', None), FramesOnlyInspect):
    return  # patched on import: the versions were checked then
  required = required_versions().get('trax')
  try:
    version = importlib.metadata.version('trax')
  except importlib.metadata.PackageNotFoundError:
    return
  if required is not None and version not in required:
    return  # patches.apply() warns about the version
  if module is not None:
    speed_up(module)
  elif not any(isinstance(finder, _Finder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Finder())


def import_failure(error):
  """What to tell a user whose installed Trax failed to import with
  `error` (an ImportError): its message, its cause where known, a fix."""
  message = f'importing Trax failed: {type(error).__name__}: {error}'
  if 'estimator' in str(error) and not _tensorflow_has_estimator():
    return (
      f'{message}. This Trax imports tensorflow.estimator, which '
      'TensorFlow 2.16 and later do not have; trax_qkv bridges it only in '
      "Trax master's trax/data/tf_inputs.py (patch 9 of trax_qkv.patches). "
      "Install PyPI's release, which trax_qkv is tested with: pip install "
      "'trax==1.4.1'."
    )
  return (
    f'{message}. trax_qkv is tested with trax 1.4.1 and tensorflow 2.21 '
    "(setup.cfg): pip install 'trax==1.4.1' 'tensorflow==2.21.*', then "
    'check that \'python -c "import trax"\' works. Without Trax only '
    'trax_qkv.kernels can be used.'
  )
