"""trax_qkv: drop-in AttentionQKV / PureAttention layers for Trax.

    import trax_qkv
    layer = trax_qkv.AttentionQKV(d_feature=256, n_heads=8, mode='train')

Importing the package registers its gin configurables under the module
`trax_qkv` (e.g. `@trax_qkv.AttentionQKV`) and makes the cross-attention of
`trax.models.Transformer` selectable (default: Trax's own layer, so no model
changes until you choose another).
"""

from trax_qkv import compat
from trax_qkv.layers import AttentionQKV
from trax_qkv.layers import PureAttention
from trax_qkv.transformer import CrossAttentionTransformer
from trax_qkv.transformer import EncoderDecoderAttention
from trax_qkv.transformer import cross_attention_implementations
from trax_qkv.transformer import register_cross_attention
from trax_qkv.transformer import use_cross_attention

__version__ = '0.1.0'

compat.apply()
