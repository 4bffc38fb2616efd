"""The change to Trax made before Trax is imported, and the version guard.

This module imports no Trax: `trax_qkv/__init__` calls `install()` first,
then imports Trax, then applies the other changes (`trax_qkv.patches`,
which lists them all; this is its patch 6).

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
"""

import importlib.abc
import importlib.machinery
import importlib.metadata
import inspect
import sys

from packaging import requirements

# The packages whose code the patches change: their versions are guarded.
PATCHED_PACKAGES = ('trax', 'jax')

ASSERT_SHAPE_MODULE = 'trax.layers.assert_shape'


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


class _PatchingLoader(importlib.abc.Loader):
  """Executes the module with its own loader, then patches it."""

  def __init__(self, loader):
    self._loader = loader

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    self._loader.exec_module(module)
    speed_up(module)

  def __getattr__(self, name):  # get_source, get_filename, ...
    return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
  """Finds `trax.layers.assert_shape` as Python would, with a loader that
  patches it before any other module of Trax can use it."""

  def find_spec(self, fullname, path, target=None):
    if fullname != ASSERT_SHAPE_MODULE:
      return None
    sys.meta_path.remove(self)  # one module, imported once
    spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
    if spec is not None and spec.loader is not None:
      spec.loader = _PatchingLoader(spec.loader)
    return spec


def install():
  """Patches `trax.layers.assert_shape` when it is imported, or now if it
  already was, for the Trax versions trax_qkv requires; idempotent."""
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
