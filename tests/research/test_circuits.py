"""The circuits read from a model's weights are the ones its layers run."""

import jax
import numpy as np
import pytest
import trax
from trax import layers as tl
from trax import shapes

import trax_qkv
from trax_qkv.models import registry
from trax_qkv.models import variants as registered_variants
from trax_qkv.research import circuits

D, HEADS, L = 8, 2, 5
IMPLEMENTATIONS = ('reference', *registered_variants.VARIANTS)


def test_circuit_measures_on_hand_made_matrices():
  projector = np.diag([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
  assert circuits.circuit_measures(projector) == pytest.approx(
    dict(asymmetry=0.0, trace=1.0, rank=3.0)
  )
  assert circuits.circuit_measures(-projector)['trace'] == pytest.approx(-1)
  rotation = np.array([[0.0, -1.0], [1.0, 0.0]])  # antisymmetric, traceless
  assert circuits.circuit_measures(rotation) == pytest.approx(
    dict(asymmetry=2.0, trace=0.0, rank=2.0)
  )
  # One direction much larger than the other: effective rank near 1.
  assert 1 < circuits.circuit_measures(np.diag([1.0, 1e-3]))['rank'] < 1.01


def _predicted(heads, x_q, x_kv, causal):
  """The attention output the head matrices imply, biases zero."""
  out = 0
  for w_q, w_k, w_v, w_o in heads:
    s = (x_q @ w_q) @ (x_kv @ w_k).T / np.sqrt(w_k.shape[1])
    if causal:
      s = np.where(np.tril(np.ones(s.shape, bool)), s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    out = out + a @ (x_kv @ w_v) @ w_o
  return out


def _zero_biases(layer, rng):
  """Random weights, biases 0, temperatures away from 1."""
  for leaf in circuits.leaves(layer):
    name = type(leaf).__name__
    if name == 'Dense':
      w, b = leaf.weights
      leaf.weights = (w, np.zeros_like(b))
    elif name == 'InputProjections':
      leaf.weights = tuple(
        (w[0], np.zeros_like(w[1]))
        if isinstance(w, tuple)
        else rng.normal(size=w.shape).astype(np.float32)
        for w in leaf.weights
      )


@pytest.mark.parametrize('name', IMPLEMENTATIONS)
def test_head_matrices_give_the_layers_own_output(name):
  """Per site, the block output recomputed from `head_matrices` (the QK
  and OV circuits) equals the layer's: each projection, head slice,
  shared or missing Dense and temperature is read as the layer uses it."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(1, L, D)).astype(np.float32)
  y = rng.normal(size=(1, L + 2, D)).astype(np.float32)
  mask = np.ones((1, 1, 1, L + 2), bool)
  site_inputs = {
    'self_attention': (x, mask[..., :L]),
    'causal_attention': x,
    'cross_attention': (x, y, y, mask),
  }
  for site, inputs in site_inputs.items():
    layer = registry.build(site, name, D, n_heads=HEADS, mode='eval')
    layer.init(shapes.signature(inputs), rng=jax.random.PRNGKey(1))
    _zero_biases(layer, rng)
    got = layer(inputs)
    got = np.asarray(got[0] if isinstance(got, tuple) else got)[0]
    [(_, block)] = circuits.attention_blocks(layer)
    heads = circuits.head_matrices(block, name, HEADS)
    assert len(heads) == (1 if name == 'one_head' else HEADS)
    kv = y[0] if site == 'cross_attention' else x[0]
    want = _predicted(heads, x[0], kv, site == 'causal_attention')
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _transformer(attention, n_encoder_layers=1, batch=1, seed=0):
  """A tiny Transformer in eval mode with `attention` in its sites."""
  x = np.ones((batch, L), np.int32)
  with trax_qkv.use_attention(**attention):
    model = trax.models.Transformer(
      20, d_model=D, d_ff=16, n_encoder_layers=n_encoder_layers,
      n_decoder_layers=1, n_heads=HEADS, mode='eval',
    )  # fmt: skip
  model.init(shapes.signature((x, x)), rng=jax.random.PRNGKey(seed))
  return model


def test_what_the_mathematics_says_of_the_variants_circuits():
  """Unprojected and shared query-key forms are symmetric and positive
  semi-definite in every site; Trax's projections are neither."""
  sites = ('self_attention', 'causal_attention', 'cross_attention')
  for name, symmetric in (
    ('reference', False),
    ('no_projection', True),
    ('shared_query_key', True),
  ):
    attention = dict.fromkeys(sites, name)
    model = _transformer(attention)
    measured = circuits.model_circuits(model, attention, HEADS)
    assert set(measured) == {'encoder', 'decoder', 'cross'}
    for part in measured.values():
      if symmetric:
        assert part['qk_asymmetry'] == [pytest.approx(0.0, abs=1e-6)]
        assert part['qk_trace'] == [pytest.approx(1.0)]
      else:
        assert part['qk_asymmetry'][0] > 0.5
        assert abs(part['qk_trace'][0]) < 0.9
    if name == 'no_projection':  # each head: the identity on its slice
      assert measured['encoder']['qk_rank'] == [pytest.approx(D / HEADS)]


@pytest.fixture(scope='module')
def tiny_model():
  attention = {'self_attention': 'reference'}
  return _transformer(attention, n_encoder_layers=2, batch=2, seed=3), attention


def test_mean_loss_is_trax_cross_entropy(tiny_model):
  model, _ = tiny_model
  rng = np.random.default_rng(1)
  src = rng.integers(1, 20, size=(3, L)).astype(np.int32)
  tgt = rng.integers(1, 20, size=(3, L)).astype(np.int32)
  tgt[1, 3:] = 0
  weights = (tgt != 0).astype(np.float32)
  logits = model((src, tgt))[0]
  trax_loss = tl.WeightedCategoryCrossEntropy()((logits, tgt, weights))
  got = circuits.mean_loss(model, [(src, tgt, weights)])
  assert got == pytest.approx(float(trax_loss), rel=1e-5)


def test_head_importance_masks_that_head_alone(tiny_model):
  """A head that writes nothing (its W_V and b_V columns zero) has
  importance 0 exactly; the others do not; the weights are restored."""
  model, attention = tiny_model
  (_, block), *_ = circuits.attention_blocks(model)  # encoder layer 1
  leaves = circuits.leaves(block)
  dense_v = [leaf for leaf in leaves if type(leaf).__name__ == 'Dense'][2]
  w, b = dense_v.weights
  w, b = np.array(w), np.array(b)
  w[:, : D // HEADS], b[: D // HEADS] = 0, 0
  dense_v.weights = (w, b)
  weights = jax.tree_util.tree_leaves(model.weights)
  rng = np.random.default_rng(2)
  src = rng.integers(1, 20, size=(4, L)).astype(np.int32)
  tgt = rng.integers(1, 20, size=(4, L)).astype(np.int32)
  batches = [(src, tgt, np.ones_like(tgt, np.float32))]
  got = circuits.head_importance(model, attention, HEADS, batches)
  assert set(got) == {'loss', 'encoder'}
  assert got['loss'] == pytest.approx(circuits.mean_loss(model, batches))
  (first, second), other_layer = got['encoder']
  assert first == 0.0 and second != 0.0
  assert all(v != 0.0 for v in other_layer)
  after = jax.tree_util.tree_leaves(model.weights)
  assert all(np.array_equal(a, b) for a, b in zip(weights, after, strict=True))


def test_one_head_owns_every_feature():
  assert circuits.head_slices('one_head', HEADS, D) == [slice(0, D)]
  assert circuits.head_slices('multi_query', HEADS, D) == [
    slice(0, D // 2),
    slice(D // 2, D),
  ]
