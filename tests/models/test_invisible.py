"""`import trax_qkv` is invisible until a choice is made, and the records
(Trax's saved config.gin, the layers' callers) say what was built."""

import os
import subprocess
import sys
import threading

import gin
from helpers import TINY_TRANSFORMER
from helpers import walk_layers
import numpy as np
import pytest
import trax
from trax.models import transformer as trax_transformer
from trax.supervised import trainer_lib

import trax_qkv
from trax_qkv import import_patches
from trax_qkv.models import registry

VOCAB = 20
MODEL = dict(TINY_TRANSFORMER, n_encoder_layers=1, n_decoder_layers=1)

# Trains a tiny Transformer one step with `training.Loop`, which writes
# config.gin beside the checkpoint; run here and in a plain-Trax process.
LOOP = """
import numpy as np, trax
from trax import layers as tl
from trax.supervised import training

def loop_config(output_dir, model_fn):
  src = np.arange(1, 9, dtype=np.int32).reshape(2, 4)
  batches = iter(lambda: (src, src, np.ones_like(src, np.float32)), None)
  task = training.TrainTask(
      batches, tl.WeightedCategoryCrossEntropy(), trax.optimizers.Adam(0.01))
  evals = training.EvalTask(batches, [tl.WeightedCategoryCrossEntropy()])
  training.Loop(model_fn(mode='train'), [task], eval_tasks=[evals],
                output_dir=output_dir).run(1)  # step 1 writes config.gin
  with open(output_dir + '/config.gin') as f:
    return f.read()
"""
PLAIN = """
import importlib.util, sys, gin
spec = importlib.util.spec_from_file_location('early', sys.argv[1])
early = importlib.util.module_from_spec(spec)
spec.loader.exec_module(early)
early.install()  # patch 6 alone: plain Trax, imported in seconds
exec(sys.argv[2])
import trax
gin.clear_config()  # as the test's own process starts each test
loop_config(sys.argv[3], lambda mode: trax.models.Transformer(
    20, mode=mode, **eval(sys.argv[5])))
gin.clear_config()
gin.parse_config_file(sys.argv[4])
assert 'trax_qkv' not in sys.modules
"""
namespace = {}
exec(LOOP, namespace)
loop_config = namespace['loop_config']


def _transformer(mode='train'):
  return trax.models.Transformer(VOCAB, mode=mode, **MODEL)


def _cores(model, package):
  return [
    type(layer).__name__
    for layer in walk_layers(model)
    if type(layer).__name__ in ('PureAttention', 'DotProductCausalAttention')
    and type(layer).__module__.startswith(package)
  ]


@pytest.mark.slow
def test_saved_config_is_plain_trax_until_chosen_then_names_the_choice(
  tmp_path,
):
  ours = loop_config(str(tmp_path / 'ours'), _transformer)
  subprocess.run(
    [
      sys.executable, '-c', PLAIN, import_patches.__file__, LOOP,
      str(tmp_path / 'plain'), str(tmp_path / 'ours' / 'config.gin'),
      repr(MODEL),
    ],
    capture_output=True, text=True, check=True,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )  # fmt: skip
  plain = (tmp_path / 'plain' / 'config.gin').read_text()
  assert plain == ours  # and plain Trax parsed ours
  assert 'trax_qkv' not in ours and 'Attention' in ours

  gin.clear_config()
  # trainer_lib builds the train and the eval model, each a call of model.
  src = np.arange(1, 9, dtype=np.int32).reshape(2, 4)
  batches = lambda n_devices: iter(lambda: (src, src, src > 0), None)  # noqa: E731
  loop = trainer_lib.train(
    str(tmp_path / 'auto'),
    model=trax_qkv.with_attention(_transformer, cross_attention='auto'),
    inputs=lambda: trax.data.inputs.Inputs(batches, batches),
    steps=1, eval_steps=1, eval_frequency=1,
  )  # fmt: skip
  for model in (loop.model, loop.eval_model):
    assert _cores(model, 'trax_qkv') == ['PureAttention']
  config = (tmp_path / 'auto' / 'config.gin').read_text()
  assert "EncoderDecoderAttention.implementation = 'auto'" in config
  assert 'EncoderSelfAttention' not in config  # nothing chosen there
  gin.clear_config()
  gin.parse_config(config)
  rebuilt = _transformer('eval')
  assert _cores(rebuilt, 'trax_qkv') == ['PureAttention']
  assert {
    layer._implementation
    for layer in walk_layers(rebuilt)
    if hasattr(layer, '_implementation')
  } == {'auto'}


def _callers(model):
  return [(layer.name, layer._caller) for layer in walk_layers(model)]


@pytest.mark.parametrize('implementation', [None, 'reference'])
def test_every_layer_names_the_model_line_as_plain_trax(
  implementation, monkeypatch
):
  with trax_qkv.use_attention(self_attention=implementation):
    routed = _callers(_transformer())
  monkeypatch.setattr(trax_transformer, 'tl', trax.layers)  # plain Trax
  assert routed == _callers(_transformer())  # what LayerError names
  assert any(
    caller['filename'] == trax_transformer.__file__ and name == 'PureAttention'
    for name, caller in routed
  )


def test_a_block_ends_with_an_exception_and_stays_in_its_thread():
  with pytest.raises(RuntimeError):
    with trax_qkv.use_attention(cross_attention='reference'):
      raise RuntimeError
  assert _cores(_transformer(), 'trax_qkv') == []
  built = {}

  def build(key):
    built[key] = _cores(_transformer(), 'trax_qkv')

  with trax_qkv.use_attention(cross_attention='reference'):
    thread = threading.Thread(target=build, args=('thread',))
    thread.start()
    thread.join()
    build('block')
  assert built == {'thread': [], 'block': ['PureAttention']}


def test_dispatchers_take_the_builtins_arguments_as_given():
  for site, dispatcher in registry.DISPATCHERS.items():
    args = (16, 4)  # d_feature, n_heads: positional, as the built-in takes
    for implementation in (None, 'reference'):
      layer = dispatcher(*args, implementation=implementation, mode='eval')
      ours = any(
        type(part).__module__.startswith('trax_qkv')
        for part in walk_layers(layer)
      )
      assert ours == (implementation is not None), site


def test_a_factory_that_refuses_an_argument_is_named_with_the_model(
  monkeypatch,
):
  def narrow(d_feature, n_heads, dropout, mode, cache_KV_in_predict=False):
    del cache_KV_in_predict  # and no **kwargs
    return trax.layers.AttentionQKV(d_feature, n_heads, dropout, mode)

  monkeypatch.setitem(registry._REGISTRY['cross_attention'], 'narrow', narrow)
  with trax_qkv.use_attention(cross_attention='narrow'):
    _transformer()  # Transformer passes nothing else
    with pytest.raises(TypeError) as error:
      trax.models.ConfigurableTransformer(VOCAB, **MODEL)
  message = str(error.value)
  assert 'trax.models.research.configurable_transformer.' in message
  assert "'q_sparsity'" in message and '**kwargs' in message


def test_with_attention_from_gin():
  gin.parse_config(
    'import trax_qkv\n'
    'import trax.models\n'
    'trax_qkv.with_attention.model = @trax.models.Transformer\n'
    "trax_qkv.with_attention.cross_attention = 'reference'\n"
  )
  model_fn = gin.get_configurable('trax_qkv.with_attention')()
  model = model_fn(VOCAB, mode='eval', **MODEL)
  assert _cores(model, 'trax_qkv') == ['PureAttention']
