"""Every model of trax.models that builds attention, under `use_attention`:
trax_qkv's layers in every site, and Trax's model bit for bit."""

import functools
import importlib
import inspect
import sys
import unittest

import gin
from helpers import assert_trees_equal
from helpers import walk_layers
import jax
import numpy as np
import pytest
import trax
from trax import shapes
from trax.models.research import configurable_transformer as ct

import trax_qkv
from trax_qkv.models import registry

VOCAB = 20
RNG = jax.random.PRNGKey(0)
DROPOUT_RNG = jax.random.PRNGKey(5)
EVERY_SITE = dict.fromkeys(registry.SITES, 'reference')
# Trax's attention cores: none may be left where every site is ours.
TRAX_CORES = {
  'PureAttention',
  'DotProductCausalAttention',
  'DotProductAttention',
}
TINY = dict(d_model=16, d_ff=32, n_heads=4, max_len=16)
M = trax.models


def _seq2seq(model, **kwargs):
  return functools.partial(
    model, VOCAB, n_encoder_layers=1, n_decoder_layers=1, **TINY, **kwargs
  )


def _decoder(model, **kwargs):
  return functools.partial(model, VOCAB, n_layers=1, **TINY, **kwargs)


# name -> (build(mode, dropout), whether it reads (source, target) or tokens)
MODELS = {
  'LSTMSeq2SeqAttn': (
    lambda mode, dropout: M.LSTMSeq2SeqAttn(
      VOCAB,
      VOCAB,
      d_model=16,
      n_encoder_layers=1,
      n_decoder_layers=1,
      n_attention_heads=4,
      attention_dropout=dropout,
      mode=mode,
    ),
    True,
  ),
  'ReZeroTransformer': (_seq2seq(M.ReZeroTransformer), True),
  'ReZeroTransformerEncoder': (
    _decoder(M.ReZeroTransformerEncoder, n_classes=3),
    False,
  ),
  'ReZeroTransformerDecoder': (_decoder(M.ReZeroTransformerDecoder), False),
  'ReZeroTransformerLM': (_decoder(M.ReZeroTransformerLM), False),
  'ConfigurableTransformer': (_seq2seq(M.ConfigurableTransformer), True),
  'ConfigurableTransformerEncoder': (
    _decoder(M.ConfigurableTransformerEncoder, n_classes=3),
    False,
  ),
  'ConfigurableTransformerLM': (_decoder(M.ConfigurableTransformerLM), False),
  'Transformer2': (_seq2seq(M.Transformer2), True),
  # Reached through trax.models.transformer's blocks, not listed by name.
  'SkippingTransformerLM': (_decoder(M.SkippingTransformerLM), False),
  'EveryOtherLayerDropTransformerLM': (
    _decoder(M.EveryOtherLayerDropTransformerLM),
    False,
  ),
  'LayerDropTransformerLM': (_decoder(M.LayerDropTransformerLM), False),
}
# The Transformer family of trax.models.transformer (its own tests are in
# test_transformer.py): with MODELS, every model of README's table.
EVERY_MODEL = dict(
  MODELS,
  Transformer=(_seq2seq(M.Transformer), True),
  TransformerEncoder=(_decoder(M.TransformerEncoder, n_classes=3), False),
  TransformerLM=(_decoder(M.TransformerLM), False),
  TransformerDecoder=(_decoder(M.TransformerDecoder), False),
)


def _inputs(seq2seq, length=6):
  rs = np.random.RandomState(0)
  src = rs.randint(1, VOCAB, size=(2, length)).astype(np.int32)
  src[1, -2:] = 0  # padding, so that the masks matter
  if not seq2seq:
    return src
  return src, rs.randint(1, VOCAB, size=(2, length)).astype(np.int32)


def _pair(name, mode, dropout=0.0):
  build, _ = EVERY_MODEL[name]
  builtin = build(mode=mode, dropout=dropout)
  with trax_qkv.use_attention(**EVERY_SITE):
    plugin = build(mode=mode, dropout=dropout)
  return builtin, plugin


def _kinds(model, package):
  return {
    type(layer).__name__
    for layer in walk_layers(model)
    if type(layer).__module__.split('.')[0] == package
  }


@pytest.mark.parametrize('name', sorted(MODELS))
def test_every_site_ours_and_train_mode_bit_for_bit(name):
  builtin, plugin = _pair(name, 'train', dropout=0.2)
  assert TRAX_CORES & _kinds(builtin, 'trax')
  assert not TRAX_CORES & _kinds(plugin, 'trax')
  assert {'PureAttention', 'DotProductCausalAttention'} & _kinds(
    plugin, 'trax_qkv'
  )
  x = _inputs(MODELS[name][1])
  w, s = builtin.init(shapes.signature(x), rng=RNG)
  assert_trees_equal((w, s), plugin.init(shapes.signature(x), rng=RNG))

  def outputs_and_gradients(model):
    def loss(weights):
      y, _ = model.pure_fn(x, weights, s, DROPOUT_RNG)
      first = jax.tree_util.tree_leaves(y)[0]
      return (first.astype(np.float32) ** 2).mean(), y

    return jax.value_and_grad(loss, has_aux=True)(w)

  ((_, y_builtin), g_builtin) = outputs_and_gradients(builtin)
  ((_, y_plugin), g_plugin) = outputs_and_gradients(plugin)
  assert_trees_equal(y_builtin, y_plugin)
  assert_trees_equal(g_builtin, g_plugin)
  # Dropout ran: another key gives other outputs (for the first leaf).
  other, _ = plugin.pure_fn(x, w, s, jax.random.PRNGKey(6))
  assert not np.array_equal(
    jax.tree_util.tree_leaves(other)[0], jax.tree_util.tree_leaves(y_plugin)[0]
  )


SEQ2SEQ = sorted(name for name, (_, seq2seq) in MODELS.items() if seq2seq)


@pytest.mark.parametrize('name', SEQ2SEQ)
def test_eval_and_predict_bit_for_bit_state_included(name):
  builtin, plugin = _pair(name, 'eval')
  src, tgt = _inputs(True)
  w, s = builtin.init(shapes.signature((src, tgt)), rng=RNG)
  assert_trees_equal(
    builtin.pure_fn((src, tgt), w, s, RNG),
    plugin.pure_fn((src, tgt), w, s, RNG),
  )
  builtin, plugin = _pair(name, 'predict')
  step = shapes.signature((src, tgt[:, :1]))
  w, s_builtin = builtin.init(step, rng=RNG)
  w_plugin, s_plugin = plugin.init(step, rng=RNG)
  assert_trees_equal((w, s_builtin), (w_plugin, s_plugin))
  for i in range(3):  # decoding steps: outputs and every cache the same
    y_builtin, s_builtin = builtin.pure_fn(
      (src, tgt[:, i : i + 1]), w, s_builtin, RNG
    )
    y_plugin, s_plugin = plugin.pure_fn(
      (src, tgt[:, i : i + 1]), w, s_plugin, RNG
    )
    assert_trees_equal((y_builtin, s_builtin), (y_plugin, s_plugin))


LMS = sorted(
  name
  for name, (_, seq2seq) in EVERY_MODEL.items()
  if not seq2seq and 'Encoder' not in name
)


@pytest.mark.parametrize('name', LMS)
def test_lm_predict_mode_bit_for_bit_state_included(name):
  builtin, plugin = _pair(name, 'predict')
  tokens = _inputs(False)
  step = shapes.signature(tokens[:, :1])
  w, s_builtin = builtin.init(step, rng=RNG)
  w_plugin, s_plugin = plugin.init(step, rng=RNG)
  assert_trees_equal((w, s_builtin), (w_plugin, s_plugin))
  for i in range(3):
    y_builtin, s_builtin = builtin.pure_fn(
      tokens[:, i : i + 1], w, s_builtin, RNG
    )
    y_plugin, s_plugin = plugin.pure_fn(tokens[:, i : i + 1], w, s_plugin, RNG)
    assert_trees_equal((y_builtin, s_builtin), (y_plugin, s_plugin))


CORES = TRAX_CORES | {'PureAttention', 'DotProductCausalAttention'}


@pytest.mark.parametrize('chosen', [{}, EVERY_SITE])
def test_attention_sites_name_every_attention_layer_of_every_model(chosen):
  """`registry.attention_sites`, what reads a built model's attention by
  site: every attention core of every model, Trax's or ours, lies in one
  layer a site built, named as the model builds it (the LSTM's one
  AttentionQKV is its cross-attention)."""
  for name, (build, _) in sorted(EVERY_MODEL.items()):
    with trax_qkv.use_attention(**chosen):
      model = build(mode='eval', dropout=0.0)
    sites = registry.attention_sites(model)
    cores = [
      layer for layer in walk_layers(model) if type(layer).__name__ in CORES
    ]
    in_sites = [
      layer
      for _, site_layer in sites
      for layer in walk_layers(site_layer)
      if type(layer).__name__ in CORES
    ]
    assert cores and in_sites == cores, name
    assert registry.site_of(sites[0][1]) == sites[0][0]
    if name in ('Transformer', 'LSTMSeq2SeqAttn'):
      expected = {
        'Transformer': [
          'self_attention',
          'causal_attention',
          'cross_attention',
        ],
        'LSTMSeq2SeqAttn': ['cross_attention'],
      }[name]
      assert [site for site, _ in sites] == expected, name
  assert registry.site_of(trax.layers.Dense(2)) is None


def _builds(name, mode='eval'):
  """The trax_qkv and Trax attention layers in a freshly built model."""
  model = MODELS[name][0](mode=mode, dropout=0.0)
  return _kinds(model, 'trax_qkv'), _kinds(model, 'trax') & TRAX_CORES


def test_nothing_chosen_builds_what_trax_layers_holds(monkeypatch):
  """A user's own `trax.layers.AttentionQKV` is what trax.models builds
  where no site is chosen, as it would be without trax_qkv."""
  built = []

  def my_attention(*args, **kwargs):
    built.append(kwargs)
    return original(*args, **kwargs)

  original = trax.layers.AttentionQKV
  monkeypatch.setattr(trax.layers, 'AttentionQKV', my_attention)
  trax.models.Transformer(VOCAB, n_encoder_layers=1, n_decoder_layers=1, **TINY)
  trax.models.LSTMSeq2SeqAttn(VOCAB, VOCAB, d_model=16, mode='predict')
  assert [kwargs.get('cache_KV_in_predict') for kwargs in built] == [True] * 2
  assert _builds('LSTMSeq2SeqAttn') == (set(), {'PureAttention'})


def test_default_arguments_stay_trax_outside_a_block_and_follow_gin(
  monkeypatch,
):
  ours = ({'DotProductCausalAttention'}, set())
  # Bound when Trax was imported: replacing trax.layers' layer later does
  # not reach them, as it would not without trax_qkv.
  monkeypatch.setattr(trax.layers, 'CausalAttention', None)
  assert _builds('ConfigurableTransformerLM') == (
    set(),
    {'DotProductCausalAttention'},
  )
  gin.parse_config("trax_qkv.DecoderSelfAttention.implementation = 'reference'")
  assert _builds('ConfigurableTransformerLM') == ours
  gin.clear_config()
  gin.parse_config(
    'import trax_qkv\n'
    'ConfigurableTransformerLM.attention_type = @trax_qkv.QkvCausalAttention'
  )
  assert _builds('ConfigurableTransformerLM') == ours


def test_apply_attention_layer_calling_conventions():
  """configurable_transformer tries the efficient layers' keywords first
  and falls back on a TypeError: every dispatcher gives it one."""
  default = (
    inspect.signature(ct.ConfigurableTransformerLM)
    .parameters['attention_type']
    .default
  )
  assert isinstance(default, registry.Dispatcher)
  with trax_qkv.use_attention(causal_attention='reference'):
    attention = ct.ApplyAttentionLayer(
      default,
      16,
      4,
      4,
      4,
      causal=True,
      masked=True,
      attention_dropout=0.0,
      output_dropout=0.0,
      attention_chunk_size=0,
      mode='eval',
    )
  assert 'DotProductCausalAttention' in _kinds(attention, 'trax_qkv')
  for dispatcher in registry.DISPATCHERS.values():
    with pytest.raises(TypeError):
      dispatcher(n_heads=4, d_qk=4, d_v=4, causal=True, mode='eval')


# Trax's own tests of the models that build attention (trax 1.4.1).
TRAX_TESTS = {
  'trax.models.transformer_test': 5,
  'trax.models.rnn_test': 3,
  'trax.models.research.rezero_test': 3,
  'trax.models.research.configurable_transformer_test': 15,
  'trax.models.research.transformer2_test': 6,
}


@pytest.mark.slow
@pytest.mark.parametrize('module', sorted(TRAX_TESTS))
def test_trax_own_tests_pass_with_every_model_built_under_the_block(
  module, monkeypatch
):
  built = []  # every layer the block builds, counted, else it proves nothing
  for site in registry.SITES:

    def counted(*args, _site=site, **kwargs):
      built.append(_site)
      return registry.SITES[_site].ours(*args, **kwargs)

    monkeypatch.setitem(registry._REGISTRY[site], 'counted', counted)
  suite = unittest.defaultTestLoader.loadTestsFromModule(
    importlib.import_module(module)
  )
  result = unittest.TestResult()
  with trax_qkv.use_attention(**dict.fromkeys(registry.SITES, 'counted')):
    suite.run(result)
  assert result.testsRun == TRAX_TESTS[module]
  assert not result.failures and not result.errors, (
    result.failures + result.errors
  )
  assert built  # > 0 layers of ours built by Trax's own tests


# How Trax's own configs (google/trax, trax/supervised/configs) bind the
# models above and their attention, the lines that put trax_qkv's layer
# there (a later binding wins in gin: they go at the end; where a config
# binds Trax's layer itself, one more rebinds it to the dispatcher) and
# the Trax attention core that it replaces.
# docs/tests.md: the same lines checked on the files themselves.
TRAX_CONFIGS = {
  'lstm_seq2seq_wmt_ende.gin': (
    'train.model = @trax.models.LSTMSeq2SeqAttn',
    "trax_qkv.EncoderDecoderAttention.implementation = 'reference'",
    'PureAttention',
  ),
  'rezero_wmt_ende_16gb_adafactor_testing.gin': (
    'train.model = @trax.models.ReZeroTransformer\n'
    'ReZeroTransformer.input_vocab_size = 256',
    "trax_qkv.DecoderSelfAttention.implementation = 'reference'",
    'DotProductCausalAttention',
  ),
  'reformer_addition.gin': (
    'train.model = @trax.models.ConfigurableTransformerLM\n'
    'ConfigurableTransformerLM.vocab_size = 256\n'
    'ConfigurableTransformerLM.attention_type = @CausalAttention',
    'ConfigurableTransformerLM.attention_type = @trax_qkv.DecoderSelfAttention'
    "\ntrax_qkv.DecoderSelfAttention.implementation = 'reference'",
    'DotProductCausalAttention',
  ),
  'sparse_lm1b_pretrain_16gb.gin': (
    'attn_type = @CausalAttention\n'
    'train.model = @trax.models.ConfigurableTransformerLM\n'
    'ConfigurableTransformerLM.vocab_size = 256\n'
    'ConfigurableTransformerLM.attention_type = %attn_type',
    'attn_type = @trax_qkv.DecoderSelfAttention\n'
    "trax_qkv.DecoderSelfAttention.implementation = 'reference'",
    'DotProductCausalAttention',
  ),
}


@pytest.mark.parametrize('config', sorted(TRAX_CONFIGS))
def test_one_line_puts_trax_qkv_into_trax_configs(config, monkeypatch):
  bindings, lines, replaced = TRAX_CONFIGS[config]
  *rebinding, choice = lines.split('\n')

  def cores(*lines):
    gin.clear_config()
    gin.parse_config('\n'.join(('import trax.models', *lines)))
    model = gin.query_parameter('train.model').scoped_configurable_fn
    model = model(mode='eval')
    return _kinds(model, 'trax') & TRAX_CORES, _kinds(model, 'trax_qkv')

  builtin, _ = cores(bindings)
  # The dispatcher alone, nothing chosen, is Trax's layer.
  assert builtin and cores(bindings, 'import trax_qkv', *rebinding)[1] == set()
  theirs, ours = cores(bindings, 'import trax_qkv', lines)
  assert replaced in builtin and replaced not in theirs and replaced in ours
  if not rebinding:  # the choice reaches the model through patch 8 only
    for name in {m for site in registry.SITES.values() for m in site.modules}:
      monkeypatch.setattr(sys.modules[name], 'tl', trax.layers)
    assert cores(bindings, 'import trax_qkv', lines)[1] == set()
