"""What trained and synthetic models say about attention: where answers
about attention, rather than models that use it, are computed.

gram_bound         the mathematics of symmetric scores (proven bounds)
synthetic_tasks    small tasks where the bound bites; synthetic_runs runs
                   them resumably and writes their table
head_measures      entropy, Jensen-Shannon divergence and argmax agreement
                   of attention weights; a position's weight on itself
circuits           the QK and OV circuits of each head, head importance
self_attention_scores
                   the scores a trained Transformer's self-attention
                   computes, per site
statistics         paired t intervals, Holm, TOST: the pre-registered rule
preregistered      the trained measurement's plan: primary measure,
                   margin, when training has flattened
figures            matplotlib figures; why_figures draws the page's from
                   its committed runs

Nothing in the core (kernels, layers, models) or the pipeline (data,
supervised) imports it; validation's reports and the commands do.
"""
