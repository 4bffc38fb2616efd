"""Shared test helpers: attention inputs, tree comparisons, data paths."""

import gzip
import importlib
import json
import os
import pickle
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trax_qkv import checkpoint_files
from trax_qkv.models import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(ROOT, '..', 'shared', 'data')
CONFIGS = os.path.join(ROOT, 'configs')


# The trax.models.Transformer / TransformerLM of the model-level tests:
# two layers, so that a site that repeats per layer is tested repeated.
# Vocabulary, mode and dropout are each test's own.
TINY_TRANSFORMER = dict(
  d_model=16,
  d_ff=32,
  n_encoder_layers=2,
  n_decoder_layers=2,
  n_heads=4,
  max_len=32,
)


# `layer` and every sublayer under it, depth first.
walk_layers = registry.walk


# XLA_FLAGS of a subprocess with two CPU devices. Their all-reduce waits
# for both devices' threads, and XLA aborts the process when one has not
# arrived within 40 s: on a 2-core machine shared with another test worker
# that happened in CI (SIGABRT, 'Termination timeout ... exceeded'). A
# slow step is not a failure of ours, so the bound is raised.
TWO_CPU_DEVICES = (
  '--xla_force_host_platform_device_count=2 '
  '--xla_cpu_collective_call_terminate_timeout_seconds=600'
)

TINY_LM = dict(d_model=16, d_ff=32, n_layers=2, n_heads=4, max_len=32)


def qkv_inputs(
  batch=2,
  lq=5,
  lk=7,
  d=16,
  d_k=None,
  d_v=None,
  seed=0,
  pad_from=None,
  mask_shape='padding',
):
  """Random (Q, K, V, mask); row 1 masks keys from `pad_from` on."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  q = jax.random.normal(keys[0], (batch, lq, d))
  k = jax.random.normal(keys[1], (batch, lk, d_k or d))
  v = jax.random.normal(keys[2], (batch, lk, d_v or d))
  rows = 1 if mask_shape == 'padding' else lq
  mask = np.ones((batch, 1, rows, lk), dtype=bool)
  if pad_from is not None:
    mask[-1, ..., pad_from:] = False
  if mask_shape == 'partial_rows':  # some query rows see fewer keys
    mask[0, 0, 1, lk // 2 :] = False
  return q, k, v, jnp.asarray(mask)


def leaves(tree):
  return jax.tree_util.tree_leaves(tree)


def assert_trees_equal(a, b):
  """Same structure and bit-identical leaves."""
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for x, y in zip(leaves(a), leaves(b)):
    assert np.asarray(x).dtype == np.asarray(y).dtype
    assert np.array_equal(np.asarray(x), np.asarray(y)), (
      f'max |diff| = {np.abs(np.asarray(x) - np.asarray(y)).max()}'
    )


def jitted_forward_and_gradients(f, cotangent, *args):
  """(f(*args), the gradients of sum(f(*args) * cotangent) with respect to
  each argument), jitted as one program: the tolerance tests of the
  kernels compare these, a program per function instead of one per
  operation. The forward pass is f's primal (as eval and predict run it),
  the gradients go through its custom VJP if it has one."""
  loss = lambda *x: jnp.sum(f(*x) * cotangent)  # noqa: E731
  argnums = tuple(range(len(args)))
  return jax.jit(lambda *x: (f(*x), jax.grad(loss, argnums)(*x)))(*args)


def require_shared_data(name):
  path = os.path.join(SHARED_DATA, name)
  if not os.path.isdir(path):
    pytest.skip(
      f'{path} is absent: the shared {name} data set is only '
      'available beside the project checkout (../shared/data).'
    )
  return path


def shared_data_dir(tmp_path):
  """The TFDS data directory that every test of the run shares (both
  xdist workers and the processes tests start), from a test's `tmp_path`
  or a directory `tmp_path_factory.mktemp` made: each data set and
  vocabulary is prepared in it once, under trax_qkv's data-dir lock, as by
  concurrent runs sharing a data_dir. Tests of data preparation itself
  use their own directory."""
  root = os.path.dirname(os.path.abspath(tmp_path))  # pytest's basetemp
  if os.environ.get('PYTEST_XDIST_WORKER'):
    root = os.path.dirname(root)  # the run's, above each worker's
  return os.path.join(root, 'shared_tfds')


def command(name):
  """The console command `trax_qkv.cli.<name>` (its build_parser and main),
  so that tests run it in-process."""
  return importlib.import_module(f'trax_qkv.cli.{name}')


# The one tiny model and data of every test that trains (trax-qkv-train's
# bindings and trax-qkv-validate's settings alike): a training step is
# compiled once per batch shape, so tests that share them read the
# run's XLA cache instead of compiling their own (docs/tests.md).
TINY_MODEL = dict(vocab_size=200, d_model=32, d_ff=64, n_layers=1, n_heads=4)
TINY_DATASET = 'trax_qkv_numbers/tiny'
TINY_BATCH_SIZE = 16


def tiny_train_bindings(tfds_dir, steps, eval_frequency=5, d_model=None):
  """gin bindings of a seconds-long trax-qkv-train run of the tiny model
  (`d_model`: another width, for tests of a checkpoint that does not fit)."""
  d_model = d_model or TINY_MODEL['d_model']
  return [
    f"trax_qkv.data.translation_data.dataset = '{TINY_DATASET}'",
    f"trax_qkv.data.translation_data.data_dir = '{tfds_dir}'",
    f'trax_qkv.data.translation_data.vocab_size = {TINY_MODEL["vocab_size"]}',
    f'Transformer.d_model = {d_model}',
    f'Transformer.d_ff = {2 * d_model}',
    f'Transformer.n_heads = {TINY_MODEL["n_heads"]}',
    f'Transformer.n_encoder_layers = {TINY_MODEL["n_layers"]}',
    f'Transformer.n_decoder_layers = {TINY_MODEL["n_layers"]}',
    f'train.steps = {steps}',
    f'train.eval_frequency = {eval_frequency}',
    'train.eval_steps = 1',
  ]


def tiny_validation_config(tfds_dir, steps, eval_every, **changes):
  """The ValidationConfig of a seconds-long run of the tiny model on tiny
  numbers (6 test sentences); `changes` are other settings."""
  from trax_qkv.validation import config as config_lib

  settings = dict(
    TINY_MODEL,
    dataset=TINY_DATASET,
    data_dir=str(tfds_dir),
    batch_size=TINY_BATCH_SIZE,
    max_test_sentences=6,
    n_beams=3,
    steps=steps,
    eval_every=eval_every,
  )
  return config_lib.ValidationConfig(**dict(settings, **changes))


def tiny_validate_flags(tfds_dir, output_dir, steps, eval_every, *more):
  """trax-qkv-validate flags of `tiny_validation_config`; `more` flags are
  added."""
  config = tiny_validation_config(tfds_dir, steps, eval_every)
  names = [*TINY_MODEL, 'dataset', 'data_dir', 'batch_size']
  names += ['max_test_sentences', 'n_beams', 'steps', 'eval_every']
  flags = []
  for name in names:
    flags += [f'--{name}', str(getattr(config, name))]
  return flags + [*more, '--output_dir', str(output_dir)]


class RunsCode:
  """Unpickling this runs a shell command that creates `marker`: the
  planted payload of the safe-reading tests."""

  def __init__(self, marker):
    self.marker = str(marker)

  def __reduce__(self):
    return (os.system, (f'touch {self.marker}',))


def plain_arrays(path):
  """The arrays of a `.npy.gz` file, read as Trax 1.4.1 reads them."""
  arrays = []
  with gzip.open(path) as f:
    while True:
      try:
        arrays.append(np.load(f, allow_pickle=False))
      except EOFError:  # the end of the file, and nothing else
        return arrays


def assert_same(a, b):
  """`a` and `b`, two unpickled checkpoints, hold the same: containers of
  the same types, bit-identical arrays, equal values and objects."""
  from trax import shapes

  if isinstance(a, dict):
    assert type(a) is type(b)
    assert sorted(a) == sorted(b)
    for key in a:
      assert_same(a[key], b[key])
  elif isinstance(a, (list, tuple)):
    assert type(a) is type(b) and len(a) == len(b)
    for x, y in zip(a, b):
      assert_same(x, y)
  elif isinstance(a, shapes.ShapeDtype):
    assert (a.shape, a.dtype) == (b.shape, b.dtype)
  elif hasattr(a, 'dtype'):
    assert np.asarray(a).dtype == np.asarray(b).dtype
    assert np.array_equal(np.asarray(a), np.asarray(b))
  elif hasattr(a, '__dict__'):  # Trax's History
    assert type(a) is type(b)
    assert_same(vars(a), vars(b))
  else:
    assert a == b


def assert_loads_as_pickle(directory):
  for name in sorted(os.listdir(directory)):
    path = os.path.join(directory, name)
    if name.endswith('.pkl.gz'):
      with gzip.open(path) as f:
        expected = pickle.load(f)
      assert_same(
        checkpoint_files.unpickle_from_file(path, gzip=True), expected
      )
    elif name.endswith('.pkl'):
      with open(path, 'rb') as f:
        expected = pickle.load(f)
      assert_same(checkpoint_files.unpickle_from_file(path), expected)
    elif name.endswith('.npy.gz'):
      assert_same(checkpoint_files.np_from_file(path), plain_arrays(path))


class Server:
  """A `trax-qkv-serve` process on a free port, its standard error kept."""

  def __init__(self, model_dir, *flags):
    self.model_dir = model_dir
    self.process = subprocess.Popen(
      [sys.executable, '-m', '_trax_qkv_cli', 'serve', '--model_dir',
       model_dir, '--port', '0', *flags],
      cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    self.log = []
    ready = threading.Event()

    def read():
      for line in self.process.stderr:
        self.log.append(line)
        if line.startswith('serving '):
          ready.set()
      ready.set()

    threading.Thread(target=read, daemon=True).start()
    ready.wait(300)
    found = [re.search(r'on (http://\S+)/$', line) for line in self.log]
    urls = [m.group(1) for m in found if m]
    assert urls, f'the server did not start:\n{"".join(self.log)}'
    self.url = urls[0]

  def post(self, path, body, raw=False):
    """(status, decoded JSON or raw bytes) of a POST."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(self.url + path, data=data, method='POST')
    try:
      with urllib.request.urlopen(request, timeout=300) as response:
        status, content = response.status, response.read()
    except urllib.error.HTTPError as e:
      status, content = e.code, e.read()
    return status, content if raw else json.loads(content)

  def get(self, path):
    with urllib.request.urlopen(self.url + path, timeout=60) as response:
      return response.read()

  def stop(self):
    if self.process.poll() is None:
      self.process.terminate()
      self.process.wait(120)
