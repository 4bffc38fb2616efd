"""The trained-model measurement's plan, fixed before its runs.

docs/why_three_dense.md ("The trained-model measurement") states it; the
command that applies it (`trax-qkv-compare --seeds ... --margin`) and the
figures that draw it read it here, so that the page, the decisions and
the pictures cannot drift apart.
"""

# Eval loss (cross-entropy per target token, nats) on the whole validation
# split at the last step, paired by seed: the key in validate's
# summary.json.
PRIMARY_MEASURE = 'eval_loss'
# Nats: a 5 % change in perplexity, the smallest difference a user
# choosing a layer would act on.
MARGIN = 0.05
# Trained until the baseline's eval loss has flattened: it fell by less
# than FLAT_FALL nats over its last FLAT_STEPS steps, in every seed.
FLAT_STEPS = 2000
FLAT_FALL = 0.02


def fall(curve, steps=FLAT_STEPS):
  """How much an eval loss curve ([[step, loss]]) fell over its last
  `steps` steps; None where it has no evaluation that far back."""
  last_step, last = curve[-1]
  earlier = [loss for step, loss in curve if step == last_step - steps]
  return earlier[0] - last if earlier else None


def flattened(falls):
  """Whether every seed's fall (`fall` of each seed's curve) is below
  FLAT_FALL."""
  return all(f < FLAT_FALL for f in falls)
