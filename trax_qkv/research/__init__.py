"""Why AttentionQKV has three Dense layers: the mathematics of symmetric
scores (gram_bound) and the small tasks that test it (synthetic_tasks).
docs/why_three_dense.md reads their results."""
