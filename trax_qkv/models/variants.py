"""The projection variants of `trax_qkv.layers.variants`, registered in every
site as a user registers their own attention:

    trax_qkv.register_attention('cross_attention', 'no_projection', factory)

`factory` takes what trax.models passes to the site's built-in
(`d_feature`, then `n_heads`, `dropout`, `mode`, ... by keyword) and
returns a layer with the built-in's inputs and outputs. After `import
trax_qkv`:

    with trax_qkv.use_attention(cross_attention='no_projection'):
      model = trax.models.Transformer(...)

or `trax-qkv-validate --implementations reference no_projection
shared_projection one_head` (docs/why_three_dense.md). 'auto' and the
defaults never choose them.
"""

import functools

from trax_qkv.layers import variants
from trax_qkv.models import registry

# name -> what it changes; `projection` of `trax_qkv.layers.variants`.
VARIANTS = {
  'no_projection': 'none',
  'shared_projection': 'shared',
  'one_head': None,  # the three Dense, one head
}
_PROJECTED = {
  'self_attention': variants.Attention,
  'causal_attention': variants.CausalAttention,
  'cross_attention': variants.AttentionQKV,
}


def _one_head(site, d_feature, n_heads=1, **kwargs):
  del n_heads  # the question is what one head loses
  return registry.SITES[site].ours(d_feature, n_heads=1, **kwargs)


def factory(site, name):
  """The layer factory of variant `name` in `site`."""
  projection = VARIANTS[name]
  if projection is None:
    return functools.partial(_one_head, site)
  return functools.partial(_PROJECTED[site], projection)


def register():
  for site in registry.SITES:
    for name in VARIANTS:
      registry.register_attention(site, name, factory(site, name))
