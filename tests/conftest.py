import os

import pytest

# Keep TensorFlow's C++ start-up chatter out of test logs.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')


@pytest.fixture(autouse=True)
def _fresh_gin_config():
  """Every test starts and ends with no gin bindings: tests share processes,
  and a binding left by one (e.g. a config's bucket boundaries) would
  silently change what the next one trains."""
  import gin

  gin.clear_config()
  yield
  gin.clear_config()
