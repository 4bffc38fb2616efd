"""The trained measurement's stopping rule, as the page states it: the
reference's eval loss fell by less than 0.02 nats over its last 2,000
steps, in every seed."""

from trax_qkv.research import preregistered


def test_fall_is_over_the_last_2000_steps_and_none_without_them():
  curve = [[1, 9.0], [2000, 2.5], [4000, 2.1], [5000, 2.0], [6000, 1.95]]
  assert preregistered.fall(curve) == 2.1 - 1.95
  assert preregistered.fall(curve[:2]) is None  # no evaluation at step 0
  assert preregistered.fall(curve[:4]) is None  # none at step 3,000


def test_flattened_only_where_every_seed_fell_by_less_than_002():
  assert preregistered.flattened([0.0, 0.019, -0.01])  # a rise is flat too
  assert not preregistered.flattened([0.0, 0.02])  # "less than": not equal
  assert not preregistered.flattened([0.01, 0.05, 0.01])  # one seed falls
