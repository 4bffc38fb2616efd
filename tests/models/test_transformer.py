"""Built-in vs trax_qkv cross-attention inside trax.models.Transformer."""

import functools
import os
import tempfile

import gin
from helpers import TINY_TRANSFORMER
from helpers import assert_trees_equal
from helpers import walk_layers
import jax
import numpy as np
import pytest
import trax
from trax import layers as tl
from trax import shapes
from trax.supervised import decoding as trax_decoding

import trax_qkv
from trax_qkv.benchmarks import python_loop_decoding
from trax_qkv.supervised import decoding

VOCAB = 40
CONFIG = TINY_TRANSFORMER
RNG = jax.random.PRNGKey(0)


def _tokens(batch=3, src_len=7, tgt_len=6, seed=0):
  rs = np.random.RandomState(seed)
  src = rs.randint(1, VOCAB, size=(batch, src_len)).astype(np.int32)
  tgt = rs.randint(1, VOCAB, size=(batch, tgt_len)).astype(np.int32)
  src[0, -2:] = 0  # padding, so the cross-attention mask matters
  return src, tgt


def _transformer(cross_attention='reference', **kwargs):
  """trax.models.Transformer(VOCAB, ...) with `cross_attention`."""
  with trax_qkv.use_attention(cross_attention=cross_attention):
    return trax.models.Transformer(VOCAB, **kwargs)


def _models(mode, dropout=0.0):
  builtin = trax.models.Transformer(VOCAB, mode=mode, dropout=dropout, **CONFIG)
  plugin = _transformer(mode=mode, dropout=dropout, **CONFIG)
  return builtin, plugin


def _count(layer, cls_name):
  own = int(type(layer).__name__ == cls_name)
  return own + sum(_count(sub, cls_name) for sub in layer.sublayers)


def test_only_cross_attention_is_replaced():
  builtin, plugin = _models('eval')
  assert not any(
    type(layer).__module__.startswith('trax_qkv')
    for layer in walk_layers(builtin)
  )
  plugin_layers = [
    layer
    for layer in walk_layers(plugin)
    if type(layer).__module__.startswith('trax_qkv')
  ]
  # One CheckedSerial + one PureAttention per decoder layer; nothing else.
  assert sorted(type(layer).__name__ for layer in plugin_layers) == sorted(
    ['CheckedSerial', 'PureAttention'] * CONFIG['n_decoder_layers']
  )
  # Encoder self-attention and decoder causal attention stay Trax's.
  assert _count(plugin, 'DotProductCausalAttention') == _count(
    builtin, 'DotProductCausalAttention'
  )


@pytest.mark.slow
@pytest.mark.stack
@pytest.mark.parametrize('mode,dropout', [('eval', 0.0), ('train', 0.2)])
def test_logits_and_gradients_identical(mode, dropout):
  builtin, plugin = _models(mode, dropout)
  src, tgt = _tokens()
  sig = shapes.signature((src, tgt))
  w, s = builtin.init(sig, rng=RNG)
  w_plugin, s_plugin = plugin.init(sig, rng=RNG)
  assert_trees_equal(w, w_plugin)
  rng = jax.random.PRNGKey(5)

  def loss(model):
    def f(weights):
      (logits, _), _ = model.pure_fn((src, tgt), weights, s, rng)
      return (logits**2).mean(), logits

    return jax.value_and_grad(f, has_aux=True)(w)

  (_, logits_b), grads_b = loss(builtin)
  (_, logits_p), grads_p = loss(plugin)
  assert_trees_equal(logits_b, logits_p)
  assert_trees_equal(grads_b, grads_p)


def _eval_and_predict(cross_attention):
  """Trax's eval-vs-predict check, from one set of eval weights."""
  model_eval = _transformer(cross_attention, mode='eval', dropout=0.0, **CONFIG)
  model_predict = _transformer(
    cross_attention, mode='predict', dropout=0.0, **CONFIG
  )
  src, tgt = _tokens()
  model_eval.init(shapes.signature((src, tgt)), rng=RNG)
  logits_eval, _ = model_eval((src, tgt))
  with tempfile.TemporaryDirectory() as tmp:  # predict nests weights in Cache
    path = os.path.join(tmp, 'model.pkl.gz')
    model_eval.save_to_file(path)
    model_predict.init_from_file(
      path,
      weights_only=True,
      input_signature=shapes.signature((src, tgt[:, :1])),
    )
  shifted = np.pad(tgt, ((0, 0), (1, 0)))[:, :-1]  # predict mode doesn't shift
  steps = [
    model_predict((src, shifted[:, i : i + 1]))[0] for i in range(tgt.shape[1])
  ]
  return logits_eval, np.concatenate(steps, axis=1)


@pytest.mark.slow
def test_eval_matches_step_by_step_predict():
  logits_eval, logits_predict = _eval_and_predict('reference')
  np.testing.assert_allclose(logits_eval, logits_predict, rtol=1e-4, atol=1e-5)


def _trained_eval_weights():
  model = trax.models.Transformer(VOCAB, mode='eval', dropout=0.0, **CONFIG)
  src, tgt = _tokens()
  model.init(shapes.signature((src, tgt)), rng=RNG)
  return model, src


@pytest.mark.slow
@pytest.mark.stack
def test_greedy_decoding_identical():
  model, src = _trained_eval_weights()
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'model.pkl.gz')
    model.save_to_file(path)
    decoded = {}
    for name in ('trax', 'reference'):
      predict = _transformer(name, mode='predict', dropout=0.0, **CONFIG)
      predict.init_from_file(
        path,
        weights_only=True,
        input_signature=shapes.signature((src, src[:, :1])),
      )
      decoded[name] = trax_decoding.autoregressive_sample(
        predict,
        src,
        batch_size=len(src),
        temperature=0.0,
        max_length=8,
        eos_id=1,
      )
    assert np.array_equal(decoded['trax'], decoded['reference'])


@pytest.mark.slow
def test_predict_model_sizes_decoder_caches_only_in_its_scope():
  model, src = _trained_eval_weights()
  sources = [row.tolist() for row in src]
  model_fn = functools.partial(_transformer, dropout=0.0, **CONFIG)

  def longest_cache(layer):
    return max(
      x.shape[1]
      for x in jax.tree_util.tree_leaves(layer.state)
      if np.ndim(x) == 3 and x.shape[0] == 3 * CONFIG['n_heads']
    )

  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'model.pkl.gz')
    model.save_to_file(path)
    short = decoding.predict_model(model_fn, path, 3, src.shape[1], 8)
    # Built after `short`, outside the scope: Trax's default size.
    default = decoding.predict_model(model_fn, path, 3, src.shape[1])
    assert (longest_cache(short), longest_cache(default)) == (8, 2048)
    decoded = [
      python_loop_decoding.greedy_decode(m, sources, 3, src.shape[1], 8)
      for m in (short, default)
    ]
  assert decoded[0] == decoded[1]


@pytest.mark.slow
@pytest.mark.parametrize(
  'direction', ['builtin_to_plugin', 'plugin_to_builtin']
)
@pytest.mark.parametrize('mode', ['eval', 'predict'])
def test_checkpoints_cross_load(direction, mode):
  src, tgt = _tokens()
  source_eval, target_eval = _models('eval')
  if direction == 'plugin_to_builtin':
    source_eval, target_eval = target_eval, source_eval
  source_eval.init(shapes.signature((src, tgt)), rng=jax.random.PRNGKey(9))
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'model.pkl.gz')
    source_eval.save_to_file(path)
    source, target = (
      (source_eval, target_eval)
      if mode == 'eval'
      else (
        _models('predict')
        if direction == 'builtin_to_plugin'
        else _models('predict')[::-1]
      )
    )
    x = (src, tgt) if mode == 'eval' else (src, tgt[:, :1])
    for model in (source, target):
      model.init_from_file(
        path, weights_only=True, input_signature=shapes.signature(x)
      )
    assert_trees_equal(source(x), target(x))


@pytest.mark.slow
@pytest.mark.stack
def test_loop_checkpoint_loads_into_plugin():
  """A checkpoint written by training.Loop for the built-in model."""
  from trax.supervised import training

  src, tgt = _tokens(batch=4)

  def batches():
    while True:
      yield src, tgt, (tgt > 0).astype(np.float32)

  task = training.TrainTask(
    batches(), tl.WeightedCategoryCrossEntropy(), trax.optimizers.Adam(1e-3)
  )
  builtin_train = trax.models.Transformer(VOCAB, mode='train', **CONFIG)
  with tempfile.TemporaryDirectory() as tmp:
    loop = training.Loop(
      builtin_train, task, output_dir=tmp, checkpoint_at=lambda step: step == 2
    )
    loop.run(2)
    ckpt = os.path.join(tmp, 'model.pkl.gz')
    builtin, plugin = _models('eval')
    for model in (builtin, plugin):
      model.init_from_file(
        ckpt, weights_only=True, input_signature=shapes.signature((src, tgt))
      )
    assert_trees_equal(builtin((src, tgt)), plugin((src, tgt)))


def test_gin_binding_switches_existing_transformer_config():
  gin.clear_config()
  try:
    gin.parse_config("""
        import trax_qkv
        Transformer.input_vocab_size = 40
        Transformer.d_model = 32
        Transformer.d_ff = 64
        Transformer.n_heads = 4
        Transformer.n_encoder_layers = 1
        Transformer.n_decoder_layers = 1
        trax_qkv.EncoderDecoderAttention.implementation = 'reference'
    """)
    model = trax.models.Transformer(mode='eval')
    ours = [
      type(layer).__name__
      for layer in walk_layers(model)
      if type(layer).__module__ == 'trax_qkv.layers.attention'
    ]
    assert sorted(ours) == ['CheckedSerial', 'PureAttention']
  finally:
    gin.clear_config()
  # Without the binding the built-in layer comes back.
  model = trax.models.Transformer(VOCAB, mode='eval', **CONFIG)
  assert not any(
    type(layer).__module__.startswith('trax_qkv')
    for layer in walk_layers(model)
  )


def test_registry_accepts_user_layers_and_rejects_unknown_names():
  calls = []

  def my_attention(d_feature, **kwargs):
    calls.append(kwargs)
    return tl.AttentionQKV(d_feature, **kwargs)

  assert {'trax', 'reference', 'fused', 'chunked', 'cudnn', 'auto'} <= set(
    trax_qkv.attention_implementations('cross_attention')
  )
  trax_qkv.register_attention('cross_attention', 'mine', my_attention)
  assert 'mine' in trax_qkv.attention_implementations('cross_attention')
  _transformer('mine', **CONFIG)
  assert len(calls) == CONFIG['n_decoder_layers']
  assert calls[0]['cache_KV_in_predict'] is True
  with pytest.raises(
    ValueError,
    match=(
      "cross_attention implementation must be one of .*'reference'.*got 'nope'"
    ),
  ):
    _transformer('nope', **CONFIG)


def test_use_attention_scopes_every_transformer_built_inside():
  with trax_qkv.use_attention(cross_attention='fused'):
    inside = trax.models.Transformer(VOCAB, mode='eval', **CONFIG)
  outside = trax.models.Transformer(VOCAB, mode='eval', **CONFIG)
  fused = [
    layer
    for layer in walk_layers(inside)
    if isinstance(layer, trax_qkv.PureAttention)
  ]
  assert len(fused) == CONFIG['n_decoder_layers']
  assert all(layer._implementation == 'fused' for layer in fused)
  assert not any(
    type(layer).__module__.startswith('trax_qkv')
    for layer in walk_layers(outside)
  )
  with pytest.raises(ValueError, match="got 'nope'"):
    with trax_qkv.use_attention(cross_attention='nope'):
      pass
