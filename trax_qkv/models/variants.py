"""The projection variants of `trax_qkv.layers.variants`, registered in every
site as a user registers their own attention:

    trax_qkv.register_attention('cross_attention', 'no_projection', factory)

`factory` takes what trax.models passes to the site's built-in
(`d_feature`, then `n_heads`, `dropout`, `mode`, ... by keyword, and
model-specific ones such as `q_sparsity`) and returns a layer with the
built-in's inputs and outputs. After `import trax_qkv`:

    with trax_qkv.use_attention(self_attention='raw_values'):
      model = trax.models.Transformer(...)

or `trax-qkv-validate --implementations reference raw_values ...`
(docs/why_three_dense.md). 'auto' and the defaults never choose them.
"""

import functools

from trax_qkv.layers import variants
from trax_qkv.models import registry

P = variants.Projections
# name -> its Projections (None: the three Dense, one head), and what it
# takes away, in words.
VARIANTS = {
  'no_projection': (P('none', 'none', 'none'), 'Q, K and V unprojected'),
  'no_projection_temperature': (
    P('none', 'none', 'none', temperature=True),
    'Q, K and V unprojected, a learned temperature per head',
  ),
  'shared_projection': (P('dense', 'q', 'q'), 'one Dense for Q, K and V'),
  'raw_values': (P('dense', 'dense', 'none'), 'V unprojected'),
  'raw_queries_keys': (P('none', 'none', 'dense'), 'Q and K unprojected'),
  'shared_query_key': (P('dense', 'q', 'dense'), 'one Dense for Q and K'),
  'multi_query': (P('dense', 'head', 'head'), 'one K and V head for all'),
  'one_head': (None, 'one head'),
}
_PROJECTED = {
  registry.SELF_ATTENTION: variants.Attention,
  registry.CAUSAL_ATTENTION: variants.CausalAttention,
  registry.CROSS_ATTENTION: variants.AttentionQKV,
}


def _one_head(site, d_feature, n_heads=1, **kwargs):
  del n_heads  # the question is what one head loses
  return registry.SITES[site].ours(d_feature, n_heads=1, **kwargs)


def factory(site, name):
  """The layer factory of variant `name` in `site`."""
  projections, _ = VARIANTS[name]
  if projections is None:
    return functools.partial(_one_head, site)
  return functools.partial(_PROJECTED[site], projections)


def register():
  for site in registry.SITES:
    for name in VARIANTS:
      registry.register_attention(site, name, factory(site, name))


def costs(name, d_feature, n_heads):
  """(parameters, multiply-adds per token) of variant `name`'s projections
  in one attention layer of width `d_feature` (the output Dense included;
  'reference' for Trax's three Dense). Per token means per position, in
  self-attention, that is query, key and value at once, a shared Dense
  counted once."""
  projections, _ = VARIANTS.get(name, (None, None))
  projections = projections or P()
  dense, head = d_feature * d_feature, d_feature * d_feature // n_heads
  params = {'dense': dense + d_feature, 'head': head + d_feature // n_heads}
  # In self-attention Q, K and V are one input: a Dense shared with Q
  # ('q') computes nothing more than Q's.
  mults = {'dense': dense, 'head': head}
  kinds = (projections.q, projections.k, projections.v, 'dense')  # + output
  return (
    sum(params.get(kind, 0) for kind in kinds)
    + (n_heads if projections.temperature else 0),
    sum(mults.get(kind, 0) for kind in kinds),
  )


def cost_table(d_feature, n_heads):
  """Markdown: each variant's projections, parameters and multiply-adds."""
  rows = [
    '| variant | what changes | parameters | multiply-adds per token |',
    '|---|---|---:|---:|',
  ]
  for name, (_, change) in {
    'reference': (None, "Trax's layer: Q, K, V and output Dense"),
    **VARIANTS,
  }.items():
    params, mults = costs(name, d_feature, n_heads)
    rows.append(f'| `{name}` | {change} | {params:,} | {mults:,} |')
  return '\n'.join(rows)
