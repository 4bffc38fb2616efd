"""Trax layers over `trax_qkv.kernels`: drop-ins for trax 1.4.1's."""

from trax_qkv.layers.attention import AttentionQKV
from trax_qkv.layers.attention import PureAttention
