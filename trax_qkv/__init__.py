"""trax_qkv: drop-in AttentionQKV / PureAttention layers for Trax.

    import trax_qkv
    layer = trax_qkv.AttentionQKV(d_feature=256, n_heads=8, mode='train')

Importing the package registers its gin configurables under the module
`trax_qkv` (e.g. `@trax_qkv.AttentionQKV`); it changes no existing model.
"""

from trax_qkv.layers import AttentionQKV
from trax_qkv.layers import PureAttention

__version__ = '0.1.0'
