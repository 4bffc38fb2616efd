"""The Gram bound on random Gram matrices, and what breaks it."""

import numpy as np

from trax_qkv.research import gram_bound


def test_random_gram_matrices_keep_the_bound_and_its_consequences():
  rng = np.random.RandomState(0)
  for n, d in ((2, 1), (8, 3), (24, 32), (24, 64)):
    y = rng.randn(50, n, d) * rng.exponential(1, (50, n, 1))  # uneven norms
    scores = gram_bound.gram_scores(y)
    assert gram_bound.bound_excess(scores) <= 1e-9
    assert gram_bound.mutual_pairs(scores) == 0
    assert gram_bound.off_diagonal_argmax_with_smaller_diagonal(scores) == 0
    # A positive temperature changes no maximum and keeps the bound.
    assert np.array_equal(np.argmax(3.7 * scores, -1), np.argmax(scores, -1))
    # Some rows do peak elsewhere: the check is not vacuous.
    assert np.any(np.argmax(scores, -1) != np.arange(n))
  # Equal norms (y = x, LayerNorm'd without scale): every row peaks on
  # itself.
  y = rng.randn(20, 12, 16)
  y /= np.linalg.norm(y, axis=-1, keepdims=True)
  scores = gram_bound.gram_scores(y)
  assert np.array_equal(
    np.argmax(scores, -1), np.broadcast_to(np.arange(12), (20, 12))
  )


def test_a_query_key_form_that_is_not_a_gram_matrix_breaks_it():
  """Scores of separate W_Q, W_K: the mutual pattern a Gram head cannot
  have (each of a pair scores the other above itself)."""
  swap = np.array([[0.0, 1.0], [1.0, 0.0]])  # x_i W_Q W_K^T x_j for e_1, e_2
  assert gram_bound.bound_excess(swap) == 1.0
  assert gram_bound.mutual_pairs(swap) == 1
  assert gram_bound.off_diagonal_argmax_with_smaller_diagonal(swap) == 2
  # A causal mask hides the pair from one of its rows.
  assert gram_bound.mutual_pairs(swap, np.tril(np.ones((2, 2), bool))) == 0
