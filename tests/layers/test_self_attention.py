"""Self-attention sites: trax_qkv's Attention, CausalAttention and
DotProductCausalAttention against trax.layers, and every site of
trax.models' Transformer family switched by `use_attention`."""

import os
import re
import tempfile

import gin
from helpers import TINY_LM
from helpers import TINY_TRANSFORMER
from helpers import assert_trees_equal
from helpers import walk_layers
import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest
import trax
from trax import layers as tl
from trax import shapes

import trax_qkv

RNG = jax.random.PRNGKey(3)
FORWARD_RNG = jax.random.PRNGKey(11)
SITES = ('self_attention', 'causal_attention', 'cross_attention')
EVERY_SITE = {site: 'reference' for site in SITES}


def _x(batch=2, length=7, d=16, seed=0):
  return jax.random.normal(jax.random.PRNGKey(seed), (batch, length, d))


def _padding_mask(batch, length):
  mask = np.ones((batch, 1, 1, length), dtype=bool)
  mask[-1, ..., length - 2 :] = False
  return mask


def _init_both(builtin, ours, signature):
  return (builtin.init(signature, rng=RNG), ours.init(signature, rng=RNG))


def _assert_pair_identical(builtin, ours, inputs, loss_of_output=None):
  """Same init trees, outputs, state and gradients (with dropout in
  'train' mode: the same masks)."""
  signature = shapes.signature(inputs)
  (w_b, s_b), (w_o, s_o) = _init_both(builtin, ours, signature)
  assert str(builtin) == str(ours)
  assert_trees_equal(w_b, w_o)
  assert_trees_equal(s_b, s_o)
  out_b, state_b = builtin.pure_fn(inputs, w_b, s_b, FORWARD_RNG)
  out_o, state_o = ours.pure_fn(inputs, w_o, s_o, FORWARD_RNG)
  assert_trees_equal(out_b, out_o)
  assert_trees_equal(state_b, state_o)
  if loss_of_output is None:
    return state_o

  def grads(layer, weights, state):
    return jax.grad(
      lambda w: loss_of_output(layer.pure_fn(inputs, w, state, FORWARD_RNG)[0])
    )(weights)

  assert_trees_equal(grads(builtin, w_b, s_b), grads(ours, w_o, s_o))
  return state_o


def _first(outputs):
  return outputs[0] if isinstance(outputs, tuple) else outputs


def _loss(outputs):
  out = _first(outputs)
  return (out * np.linspace(-1, 1, out.size).reshape(out.shape)).sum()


@pytest.mark.parametrize('mode', ['train', 'eval', 'viz'])
def test_attention_identical(mode):
  x = _x()
  kw = dict(n_heads=4, dropout=0.2, mode=mode)
  _assert_pair_identical(
    tl.Attention(16, **kw),
    trax_qkv.Attention(16, **kw),
    (x, _padding_mask(2, 7)),
    _loss,
  )


@pytest.mark.parametrize('mode', ['train', 'eval', 'viz'])
@pytest.mark.parametrize('use_dconv', [False, True])
def test_causal_attention_identical(mode, use_dconv):
  kw = dict(n_heads=4, dropout=0.2, mode=mode, use_dconv=use_dconv)
  _assert_pair_identical(
    tl.CausalAttention(16, **kw),
    trax_qkv.CausalAttention(16, **kw),
    _x(),
    _loss,
  )


def test_dot_product_causal_attention_identical_and_viz_state():
  q, k, v = (_x(8, 6, 4, seed=s) for s in range(3))
  for mode in ('train', 'eval', 'viz'):
    kw = dict(dropout=0.3, mode=mode)
    builtin = tl.DotProductCausalAttention(**kw)
    ours = trax_qkv.DotProductCausalAttention(**kw)
    state = _assert_pair_identical(builtin, ours, (q, k, v), _loss)
  weights = state  # viz mode: (batch * heads, L, L), causal
  assert weights.shape == (8, 6, 6)
  assert np.all(np.triu(np.asarray(weights), k=1) == 0)


@pytest.mark.slow
@pytest.mark.stack
@hypothesis.settings(max_examples=8, deadline=None)
@hypothesis.given(
  batch=st.integers(1, 3),
  length=st.integers(1, 12),
  n_heads=st.sampled_from([1, 2, 4]),
  dropout=st.sampled_from([0.0, 0.25]),
)
def test_causal_attention_identical_over_shapes(
  batch, length, n_heads, dropout
):
  kw = dict(n_heads=n_heads, dropout=dropout, mode='train')
  _assert_pair_identical(
    tl.CausalAttention(8, **kw),
    trax_qkv.CausalAttention(8, **kw),
    _x(batch, length, 8, seed=length),
  )


def _predict_step_by_step(layer, x, weights):
  """Feeds x one position at a time; returns outputs and the final state."""
  layer.init(shapes.signature(x[:, :1]), rng=RNG)
  layer.weights = weights
  outputs = [layer(x[:, i : i + 1], rng=FORWARD_RNG) for i in range(x.shape[1])]
  return np.concatenate(outputs, axis=1), layer.state


def test_causal_attention_predict_cache_identical_and_equal_to_eval():
  x = _x(2, 9, 16)
  kw = dict(n_heads=4, max_inference_length=12)
  eval_layer = tl.CausalAttention(16, mode='eval', **kw)
  weights, _ = eval_layer.init(shapes.signature(x), rng=RNG)
  expected = eval_layer(x)
  out_b, state_b = _predict_step_by_step(
    tl.CausalAttention(16, mode='predict', **kw), x, weights
  )
  out_o, state_o = _predict_step_by_step(
    trax_qkv.CausalAttention(16, mode='predict', **kw), x, weights
  )
  assert_trees_equal(out_b, out_o)
  assert_trees_equal(state_b, state_o)  # key/value buffers and position
  np.testing.assert_allclose(out_o, expected, atol=1e-5)
  # Several positions in one call fill the cache as one at a time does.
  chunked = trax_qkv.CausalAttention(16, mode='predict', **kw)
  chunked.init(shapes.signature(x[:, :4]), rng=RNG)
  chunked.weights = weights
  first, rest = chunked(x[:, :4]), []
  for i in range(4, 9):
    rest.append(chunked(x[:, i : i + 1]))
  np.testing.assert_allclose(
    np.concatenate([first] + rest, axis=1), expected, atol=1e-5
  )


@pytest.mark.slow
@pytest.mark.parametrize('implementation', ['fused', 'chunked', 'auto'])
def test_causal_fast_paths_close_to_reference(implementation):
  x = _x(2, 33, 16)
  reference = trax_qkv.CausalAttention(16, n_heads=4, mode='eval')
  fast = trax_qkv.CausalAttention(
    16, n_heads=4, mode='eval', implementation=implementation
  )
  weights, state = reference.init(shapes.signature(x), rng=RNG)
  fast.init(shapes.signature(x), rng=RNG)

  def run(layer):
    return jax.value_and_grad(
      lambda w, x: _loss(layer.pure_fn(x, w, state, FORWARD_RNG)[0]),
      argnums=(0, 1),
    )(weights, x)

  (loss_r, grads_r), (loss_f, grads_f) = run(reference), run(fast)
  np.testing.assert_allclose(loss_f, loss_r, rtol=1e-5)
  for g_f, g_r in zip(
    jax.tree_util.tree_leaves(grads_f), jax.tree_util.tree_leaves(grads_r)
  ):
    np.testing.assert_allclose(g_f, g_r, atol=1e-5)


@pytest.mark.parametrize('implementation', ['fused', 'chunked', 'auto'])
def test_causal_fast_paths_in_predict_mode(implementation):
  x = _x(2, 9, 16)
  kw = dict(n_heads=4, max_inference_length=40)
  weights, _ = tl.CausalAttention(16, mode='eval', **kw).init(
    shapes.signature(x), rng=RNG
  )
  out_r, state_r = _predict_step_by_step(
    trax_qkv.CausalAttention(16, mode='predict', **kw), x, weights
  )
  out_f, state_f = _predict_step_by_step(
    trax_qkv.CausalAttention(
      16, mode='predict', implementation=implementation, **kw
    ),
    x,
    weights,
  )
  np.testing.assert_allclose(out_f, out_r, atol=1e-5)
  np.testing.assert_allclose(
    jax.tree_util.tree_leaves(state_f)[0],
    jax.tree_util.tree_leaves(state_r)[0],
    atol=1e-5,
  )
  assert int(jax.tree_util.tree_leaves(state_f)[-1]) == 9


def test_auto_in_predict_mode_asks_with_the_cache_length():
  """'auto' sees the cache a predict step reads, not its one new key."""
  q = _x(6, 1, 8)
  long_cache = 'reference' if jax.default_backend() == 'gpu' else 'fused'
  for max_length, expected in ((40, 'reference'), (2048, long_cache)):
    layer = trax_qkv.DotProductCausalAttention(
      max_inference_length=max_length, mode='predict', implementation='auto'
    )
    assert layer.implementation_for(q, q) == expected


def test_bad_inputs_raise_before_any_work():
  with pytest.raises(ValueError, match='max_inference_length'):
    trax_qkv.DotProductCausalAttention(max_inference_length=0)
  with pytest.raises(ValueError, match='divisible by n_heads'):
    trax_qkv.CausalAttention(10, n_heads=4)
  layer = trax_qkv.DotProductCausalAttention()
  q = shapes.ShapeDtype((2, 5, 4))
  with pytest.raises(ValueError, match='same .batch . heads, length.'):
    layer.init((q, shapes.ShapeDtype((2, 6, 4)), q))
  with pytest.raises(TypeError, match=r'tuple \(x, mask\)'):
    trax_qkv.Attention(16).init(shapes.ShapeDtype((2, 5, 16)))


# -- every site of trax.models -------------------------------------------------

LM = dict(TINY_LM, vocab_size=30)
TRANSFORMER = TINY_TRANSFORMER


def _plugin_layer_names(model):
  found = []

  def walk(layer):
    if type(layer).__module__.startswith('trax_qkv'):
      found.append(type(layer).__name__)
    for sub in layer.sublayers:
      walk(sub)

  walk(model)
  return sorted(set(found))


def test_importing_the_package_changes_no_model():
  for model in (
    trax.models.TransformerLM(mode='eval', **LM),
    trax.models.Transformer(30, mode='eval', **TRANSFORMER),
  ):
    assert _plugin_layer_names(model) == []


def test_use_attention_selects_each_site_alone():
  with trax_qkv.use_attention(causal_attention='reference'):
    lm = trax.models.TransformerLM(mode='eval', **LM)
    encoder = trax.models.TransformerEncoder(
      30, mode='eval', d_model=16, d_ff=32, n_layers=1, n_heads=4
    )
  assert _plugin_layer_names(lm) == ['DotProductCausalAttention']
  assert _plugin_layer_names(encoder) == []
  with trax_qkv.use_attention(self_attention='reference'):
    encoder = trax.models.TransformerEncoder(
      30, mode='eval', d_model=16, d_ff=32, n_layers=1, n_heads=4
    )
    with trax_qkv.use_attention(cross_attention='reference'):
      model = trax.models.Transformer(30, mode='eval', **TRANSFORMER)
  assert _plugin_layer_names(encoder) == ['CheckedSerial', 'PureAttention']
  # The inner block keeps the outer block's self-attention choice.
  assert _count_ours(model, 'PureAttention') == (
    TRANSFORMER['n_encoder_layers'] + TRANSFORMER['n_decoder_layers']
  )
  assert _plugin_layer_names(trax.models.TransformerLM(mode='eval', **LM)) == []


def _count_ours(model, name):
  return sum(
    type(layer).__name__ == name
    and type(layer).__module__.startswith('trax_qkv')
    for layer in walk_layers(model)
  )


def test_each_site_takes_a_registered_or_passed_layer_factory():
  calls = []

  def my_causal(d_feature, **kwargs):
    calls.append(kwargs)
    return tl.CausalAttention(d_feature, **kwargs)

  with trax_qkv.use_attention(causal_attention=my_causal):
    trax.models.TransformerLM(mode='eval', **LM)
  assert len(calls) == LM['n_layers']
  assert calls[0] == {'n_heads': 4, 'dropout': 0.1, 'mode': 'eval'}
  trax_qkv.register_attention(
    'self_attention', 'mine', lambda d, **kw: tl.Attention(d, **kw)
  )
  assert 'mine' in trax_qkv.attention_implementations('self_attention')
  assert 'mine' not in trax_qkv.attention_implementations('causal_attention')
  with trax_qkv.use_attention(self_attention='mine'):
    trax.models.TransformerEncoder(
      30, mode='eval', d_model=16, d_ff=32, n_layers=1, n_heads=4
    )
  with pytest.raises(ValueError, match='site must be one of'):
    trax_qkv.register_attention('decoder', 'x', tl.Attention)


def test_use_attention_rejects_unknown_names_before_building():
  names = trax_qkv.attention_implementations('causal_attention')
  assert {'trax', 'reference', 'auto', 'no_projection'} <= set(names)
  with pytest.raises(
    ValueError,
    match='causal_attention implementation must be one of '
    + re.escape(f"{names} or a layer factory; got 'nope'."),
  ):
    with trax_qkv.use_attention(causal_attention='nope'):
      raise AssertionError('the block must not run')
  with pytest.raises(
    ValueError,
    match=r"site must be one of \('self_attention"
    r"', 'causal_attention', 'cross_attention'\); got "
    r"'decoder'",
  ):
    with trax_qkv.use_attention(decoder='auto'):
      raise AssertionError('the block must not run')


def test_gin_binds_each_site():
  gin.clear_config()
  try:
    gin.parse_config("""
        trax_qkv.EncoderSelfAttention.implementation = 'reference'
        trax_qkv.DecoderSelfAttention.implementation = 'reference'
    """)
    model = trax.models.Transformer(30, mode='eval', **TRANSFORMER)
  finally:
    gin.clear_config()
  assert 'DotProductCausalAttention' in _plugin_layer_names(model)
  # Cross-attention stays built-in.
  assert _count_ours(model, 'PureAttention') == TRANSFORMER['n_encoder_layers']


@pytest.mark.slow
@pytest.mark.stack
@pytest.mark.parametrize('dropout', [0.0, 0.1])
def test_transformer_lm_identical_with_plugin_in_every_site(dropout):
  tokens = np.random.RandomState(0).randint(1, 30, (2, 10)).astype(np.int32)
  builtin = trax.models.TransformerLM(mode='train', dropout=dropout, **LM)
  with trax_qkv.use_attention(**EVERY_SITE):
    ours = trax.models.TransformerLM(mode='train', dropout=dropout, **LM)
  _assert_pair_identical(builtin, ours, tokens, _loss)


@pytest.mark.slow
@pytest.mark.stack
def test_transformer_identical_with_plugin_in_every_site():
  rs = np.random.RandomState(1)
  source = rs.randint(1, 30, (2, 9)).astype(np.int32)
  source[0, -3:] = 0
  target = rs.randint(1, 30, (2, 6)).astype(np.int32)
  builtin = trax.models.Transformer(
    30, mode='train', dropout=0.1, **TRANSFORMER
  )
  with trax_qkv.use_attention(**EVERY_SITE):
    ours = trax.models.Transformer(30, mode='train', dropout=0.1, **TRANSFORMER)
  assert len(_plugin_layer_names(ours)) == 3
  _assert_pair_identical(builtin, ours, (source, target), _loss)


MODELS = {
  'TransformerLM': (
    lambda mode: trax.models.TransformerLM(mode=mode, **LM),
    lambda: np.arange(1, 11, dtype=np.int32).reshape(2, 5),
  ),
  'TransformerEncoder': (
    lambda mode: trax.models.TransformerEncoder(
      30,
      n_classes=5,
      d_model=16,
      d_ff=32,
      n_layers=2,
      n_heads=4,
      max_len=32,
      mode=mode,
    ),
    lambda: np.array([[3, 4, 5, 0], [6, 7, 8, 9]], np.int32),
  ),
  'TransformerDecoder': (
    lambda mode: trax.models.TransformerDecoder(
      30, d_model=16, d_ff=32, n_layers=2, n_heads=4, max_len=32, mode=mode
    ),
    lambda: np.arange(1, 11, dtype=np.int32).reshape(2, 5),
  ),
  'Transformer': (
    lambda mode: trax.models.Transformer(30, mode=mode, **TRANSFORMER),
    lambda: (
      np.array([[3, 4, 5, 0], [6, 7, 8, 9]], np.int32),
      np.arange(1, 7, dtype=np.int32).reshape(2, 3),
    ),
  ),
}


@pytest.mark.slow
@pytest.mark.parametrize('name', list(MODELS))
def test_checkpoints_load_both_ways(name):
  build, inputs = MODELS[name]
  x = inputs()
  builtin = build('eval')
  with trax_qkv.use_attention(**EVERY_SITE):
    ours = build('eval')
  assert _plugin_layer_names(ours)
  for source, target in ((builtin, ours), (ours, builtin)):
    source.init(shapes.signature(x), rng=jax.random.PRNGKey(5))
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, 'model.pkl.gz')
      source.save_to_file(path)
      target.init_from_file(
        path, weights_only=True, input_signature=shapes.signature(x)
      )
    assert_trees_equal(source(x), target(x))


def test_trax_lm_checkpoint_decodes_identically_with_plugin_everywhere():
  builtin = trax.models.TransformerLM(mode='eval', **LM)
  builtin.init(shapes.signature(np.zeros((1, 8), np.int32)), rng=RNG)
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'lm.pkl.gz')
    builtin.save_to_file(path)

    def sample(model):
      model.init_from_file(
        path,
        weights_only=True,
        input_signature=shapes.ShapeDtype((1, 1), np.int32),
      )
      return trax.supervised.decoding.autoregressive_sample(
        model,
        batch_size=1,
        temperature=0.0,
        max_length=12,
        eos_id=-1,
        start_id=1,
      )

    expected = sample(trax.models.TransformerLM(mode='predict', **LM))
    with trax_qkv.use_attention(**EVERY_SITE):
      ours = trax.models.TransformerLM(mode='predict', **LM)
    assert _plugin_layer_names(ours) == ['DotProductCausalAttention']
    np.testing.assert_array_equal(sample(ours), expected)


def test_decoding_sizes_the_plugin_causal_cache_too():
  from trax_qkv.supervised import decoding

  model = trax.models.Transformer(30, mode='eval', **TRANSFORMER)
  x = (np.ones((2, 4), np.int32), np.ones((2, 3), np.int32))
  model.init(shapes.signature(x), rng=RNG)

  def model_fn(mode):
    with trax_qkv.use_attention(**EVERY_SITE):
      return trax.models.Transformer(30, mode=mode, **TRANSFORMER)

  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'model.pkl.gz')
    model.save_to_file(path)
    short = decoding.predict_model(model_fn, path, 2, 4, 8)
  caches = [
    x.shape[1]
    for x in jax.tree_util.tree_leaves(short.state)
    if np.ndim(x) == 3 and x.shape[0] == 2 * TRANSFORMER['n_heads']
  ]
  assert caches and set(caches) == {8}
