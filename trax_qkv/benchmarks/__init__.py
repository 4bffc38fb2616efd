"""Timing harness; nothing in the core imports it.

`kernels` (the attention math alone) and `timing` need JAX only; `layers`
compares the Trax layers and models with the built-in.
"""
