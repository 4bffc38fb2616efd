import os
import shutil
import sys
import tempfile

import pytest

# Keep TensorFlow's C++ start-up chatter out of test logs.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')


def pytest_configure(config):
  """One XLA compilation cache for the whole run: both xdist workers and
  every process the tests start (they inherit the environment) share it.
  The suite builds the same tiny Transformers in many tests and commands,
  and on XLA:CPU compiling their programs is most of a test's time; a
  program read from the cache is the one that was compiled, so every
  result is the same. JAX_COMPILATION_CACHE_DIR, when set, is used as is
  (e.g. to keep the cache between runs of the quick loop)."""
  if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
    # Set once, by the controller, before the workers start.
    config._xla_cache_dir = tempfile.mkdtemp(prefix='trax_qkv_tests_xla_')
    os.environ['JAX_COMPILATION_CACHE_DIR'] = config._xla_cache_dir
  # Tiny programs compile in well under JAX's default thresholds.
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
  jax = sys.modules.get('jax')
  if jax is not None:  # a plugin imported it: jax read the variables then
    jax.config.update(
      'jax_compilation_cache_dir', os.environ['JAX_COMPILATION_CACHE_DIR']
    )
    jax.config.update(
      'jax_persistent_cache_min_compile_time_secs',
      float(os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS']),
    )
    jax.config.update(
      'jax_persistent_cache_min_entry_size_bytes',
      int(os.environ['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES']),
    )


def pytest_collection_modifyitems(config, items):
  """`stack` picks slow tests for CI's newest leg, which runs the quick
  loop besides (-m "not slow or stack"): a `stack` test that is not also
  `slow` would mean nothing there, so it is an error."""
  del config
  loose = [
    item.nodeid
    for item in items
    if item.get_closest_marker('stack') and not item.get_closest_marker('slow')
  ]
  if loose:
    raise pytest.UsageError(f'marked stack but not slow: {loose}')


def pytest_unconfigure(config):
  if getattr(config, '_xla_cache_dir', None):
    shutil.rmtree(config._xla_cache_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_gin_config():
  """Every test starts and ends with no gin bindings: tests share processes,
  and a binding left by one (e.g. a config's bucket boundaries) would
  silently change what the next one trains."""
  import gin

  gin.clear_config()
  yield
  gin.clear_config()
