"""trax-qkv-bench --only distributed: the scaling table's arithmetic and the
report; the timed layouts are the ones tests/supervised/test_distributed.py
proves equal."""

import numpy as np
import pytest
from trax import layers as tl
from trax import shapes

from trax_qkv.benchmarks import distributed


def test_gradient_bytes_count_every_float32_weight():
  model = tl.Serial(tl.Dense(3), tl.Dense(5))
  weights, _ = model.init(shapes.signature(np.zeros((1, 2), np.float32)))
  assert distributed.gradient_bytes(weights) == 4 * ((2 * 3 + 3) + (3 * 5 + 5))


@pytest.mark.slow
def test_scaling_table_is_a_ring_all_reduce_of_the_readme_models():
  rows = {row['model']: row for row in distributed.scaling_table()}
  multi30k = rows['Multi30k (README recipe)']
  # d 256, d_ff 1024, 3+3 layers, vocabulary 8192: about 9.8 M weights.
  assert 9e6 < multi30k['parameters'] < 11e6
  size = 4 * multi30k['parameters']
  for link, speed in distributed.BANDWIDTHS.items():
    seconds = multi30k['allreduce_seconds'][link]
    # Two hosts send each byte once; many, twice.
    assert np.isclose(seconds['2'], size / speed)
    assert np.isclose(seconds['64'], 2 * 63 / 64 * size / speed)
  table = distributed.markdown(
    dict(
      model='m',
      layouts={'one process': [1.0, 1.2], 'two processes': [1.1, 1.5]},
      ratios=[1.1, 1.25],
      scaling=list(rows.values()),
    )
  )
  assert '| two processes x 1 device (gloo) | 1.300 (1.100-1.500) |' in table
  assert '1.18 (1.10-1.25)' in table
  assert '| Multi30k (README recipe) | 9,' in table
