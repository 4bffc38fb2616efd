"""trax_qkv.patches: every change to Trax, applied once, version-guarded."""

import importlib.metadata
import re
import warnings

from packaging import requirements
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
