"""Every registered implementation (the kernels, the variants, 'trax')
builds and runs in every model of README's table, in every site it has."""

import jax
import numpy as np
import pytest
from test_every_model import EVERY_MODEL
from test_every_model import _inputs
from test_every_model import _kinds
from trax import shapes

import trax_qkv
from trax_qkv import kernels
from trax_qkv.models import registry

IMPLEMENTATIONS = sorted(
  set().union(*map(registry.attention_implementations, registry.SITES))
)


def _cannot_run(implementation):
  try:
    kernels.check_supported(implementation)
  except ValueError as error:
    return str(error)


@pytest.mark.parametrize('implementation', IMPLEMENTATIONS)
def test_builds_and_runs_in_every_model(implementation):
  # Every kernel and variant is registered in every site.
  assert all(
    implementation in registry.attention_implementations(site)
    for site in registry.SITES
  )
  refusal = implementation in kernels.names() and _cannot_run(implementation)
  everywhere = dict.fromkeys(registry.SITES, implementation)
  for name, (build, seq2seq) in sorted(EVERY_MODEL.items()):
    with trax_qkv.use_attention(**everywhere):
      if refusal:  # 'cudnn' without a GPU: its own error, nothing else
        with pytest.raises(ValueError, match='cannot run here'):
          build(mode='eval', dropout=0.0)
        continue
      model = build(mode='eval', dropout=0.0)
    assert bool(_kinds(model, 'trax_qkv')) == (implementation != 'trax'), name
    x = _inputs(seq2seq)
    model.init(shapes.signature(x), rng=jax.random.PRNGKey(0))
    y = jax.tree_util.tree_leaves(model(x))[0]
    assert y.shape[0] == 2 and np.isfinite(y).all(), name
