"""trax_qkv.patches: every change to Trax, applied once, version-guarded."""

import importlib.metadata
import warnings

import pytest
from trax import fastmath
import trax.layers
from trax.models import transformer as trax_transformer

import trax_qkv
from trax_qkv import patches


def test_applied_on_import_and_idempotent():
  patched = (
    fastmath.tree_unflatten,
    trax.layers.for_n_devices,
    trax.layers.on_cpu,
    trax_transformer.tl,
  )
  assert fastmath.tree_unflatten is patches._tree_unflatten
  assert trax_transformer.tl.AttentionQKV is trax_qkv.EncoderDecoderAttention
  assert trax_transformer.tl.Dense is trax.layers.Dense  # the rest is trax's
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    patches.apply()
  assert (
    fastmath.tree_unflatten,
    trax.layers.for_n_devices,
    trax.layers.on_cpu,
    trax_transformer.tl,
  ) == patched


def test_installed_versions_are_the_tested_ones():
  assert patches.untested_versions() == []


def test_guarded_versions_come_from_our_package_metadata():
  required = patches.required_versions()
  pins = [
    line
    for line in importlib.metadata.requires('trax_qkv')
    if line.startswith(('trax==', 'jax=='))
  ]
  assert sorted(f'{name}{spec}' for name, spec in required.items()) == (
    sorted(pins)
  )


def test_other_versions_warn(monkeypatch):
  real = importlib.metadata.version
  monkeypatch.setattr(
    patches.importlib.metadata,
    'version',
    lambda name: '1.5.0' if name == 'trax' else real(name),
  )
  assert patches.untested_versions() == ['trax 1.5.0']
  monkeypatch.setattr(patches, '_applied', False)
  with pytest.warns(
    patches.UntestedVersionWarning,
    match=r'written for trax ==1\.4\.1 and jax ==0\.10\.2; '
    r'found trax 1\.5\.0',
  ):
    patches.apply()


def test_trainer_loop_class_is_scoped():
  from trax.supervised import trainer_lib

  from trax_qkv.supervised import training

  original = trainer_lib.training.Loop

  class MyLoop(original):
    pass

  with training.trainer_loop_class(MyLoop):
    assert trainer_lib.training.Loop is MyLoop
  assert trainer_lib.training.Loop is original
