"""What a symmetric attention score can and cannot do: the Gram bound.

A head scores query i against key j as s_ij = <q_i, k_j> / sqrt(d_head).
When queries and keys are the same vectors, q_i = k_i = y_i -- no QK
projection (y = x), one shared Dense (y = x W + b), shared Q = K -- the
score matrix is a Gram matrix, and for every i, j

    s_ii - 2 s_ij + s_jj = |y_i - y_j|^2 / sqrt(d_head) >= 0,

so s_ij <= (s_ii + s_jj) / 2, with equality only where y_i = y_j. Three
consequences, each about the scores (and so about where the softmax
weight of a row peaks), none about what a model built on them computes:

1. A row that scores another key above itself sees a larger diagonal
   there: s_ij > s_ii implies s_jj > s_ii.
2. No mutual preference: s_ij > s_ii and s_ji > s_jj cannot both hold
   (by 1, each would need the other's diagonal larger than its own).
3. Where the diagonal is equal (s_ii = c for every i: inputs of equal
   norm and y = x), no row scores any key above itself: s_ij <= c.

A per-head temperature t > 0 multiplies every score of the head by t:
the bound and each consequence are unchanged, and so is the position of
every row's maximum; only how much weight the maximum gets moves.

A causal mask removes keys j > i from row i; the bound still holds for
the keys that remain, so consequence 1 holds for every visible key.

The functions here measure these on score matrices; the tests check the
bound on random Gram matrices and its consequences on trained layers.
"""

import numpy as np


def gram_scores(y, d_head=None):
  """s_ij = <y_i, y_j> / sqrt(d_head) for y of shape (..., n, d): the
  scores of a head whose queries and keys are both `y`."""
  y = np.asarray(y, np.float64)
  d_head = y.shape[-1] if d_head is None else d_head
  return np.einsum('...id,...jd->...ij', y, y) / np.sqrt(d_head)


def bound_excess(scores):
  """max over i, j of s_ij - (s_ii + s_jj) / 2 for square `scores` (...,
  n, n): <= 0 for a Gram matrix (up to rounding), > 0 where a pair breaks
  the bound."""
  scores = np.asarray(scores, np.float64)
  diag = np.diagonal(scores, axis1=-2, axis2=-1)
  mean = (diag[..., :, None] + diag[..., None, :]) / 2
  return float(np.max(scores - mean))


def mutual_pairs(scores, visible=None):
  """The number of pairs i < j that each score the other above
  themselves (s_ij > s_ii and s_ji > s_jj), summed over leading axes;
  `visible` (bool, broadcastable to scores) leaves out masked pairs."""
  scores = np.asarray(scores, np.float64)
  diag = np.diagonal(scores, axis1=-2, axis2=-1)
  above = scores > diag[..., :, None]  # row i prefers key j to itself
  if visible is not None:
    above &= np.asarray(visible, bool)
  both = above & np.swapaxes(above, -1, -2)
  return int(np.sum(np.triu(both, k=1)))


def off_diagonal_argmax_with_smaller_diagonal(scores, visible=None):
  """Rows whose maximum is on a key j != i with s_jj <= s_ii: what
  consequence 1 forbids for a Gram matrix. Returns their count."""
  scores = np.asarray(scores, np.float64)
  if visible is not None:
    scores = np.where(np.asarray(visible, bool), scores, -np.inf)
  n = scores.shape[-1]
  best = np.argmax(scores, axis=-1)  # (..., n)
  rows = np.arange(n)
  diag = np.diagonal(scores, axis1=-2, axis2=-1)
  best_diag = np.take_along_axis(diag, best, axis=-1)
  on_other = best != rows
  strictly_above = (
    np.take_along_axis(scores, best[..., None], -1)[..., 0] > diag
  )
  return int(np.sum(on_other & strictly_above & (best_diag <= diag)))
