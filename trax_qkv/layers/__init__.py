"""Trax layers over `trax_qkv.kernels`: drop-ins for trax 1.4.1's."""

from trax_qkv.layers.attention import Attention
from trax_qkv.layers.attention import AttentionQKV
from trax_qkv.layers.attention import PureAttention
from trax_qkv.layers.causal_attention import CausalAttention
from trax_qkv.layers.causal_attention import DotProductCausalAttention
