"""The validation report: loss curves, attention maps and report.md.

Drawing is apart from the run, so that other commands (the attention-map
command) draw maps the same way.
"""

import functools

import numpy as np

from trax_qkv import files
from trax_qkv.models.registry import SITES
from trax_qkv.supervised import model_dir
from trax_qkv.validation import environment


def pyplot():
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  return plt


@functools.cache
def _charmap(path):
  from matplotlib import ft2font

  try:
    return frozenset(ft2font.FT2Font(path).get_charmap())
  except (OSError, RuntimeError, ValueError):
    return frozenset()


def font_for(texts):
  """Path of an installed font that has a glyph for every character of
  `texts`, or None if none has.

  matplotlib's default (DejaVu Sans) is tried first; it has no CJK glyphs,
  so a Japanese or Chinese label would otherwise be drawn as empty boxes.
  matplotlib's Last Resort font is never chosen: it maps every character
  to a placeholder box.
  """
  from matplotlib import font_manager

  needed = {ord(c) for text in texts for c in text if not c.isspace()}
  default = font_manager.findfont(font_manager.FontProperties())
  others = sorted(
    {
      f.fname
      for f in font_manager.fontManager.ttflist
      if 'LastResort' not in f.fname
    }
  )
  for path in [default] + others:
    if needed <= _charmap(path):
      return path
  return None


def save_png(fig, path, dpi):
  """Writes `fig` to `path` as PNG, whole (whatever its suffix: matplotlib
  would otherwise append '.png' to a path without one), or into `path`,
  a binary file object; and closes it."""
  if hasattr(path, 'write'):
    fig.savefig(path, dpi=dpi, format='png')
  else:
    with files.atomic_path(path) as tmp:
      fig.savefig(tmp, dpi=dpi, format='png')
  pyplot().close(fig)


def plot_loss_curves(histories, path):
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(7, 4))
  for (label, losses), style in zip(histories.items(), ('-', '--', ':', '-.')):
    ax.plot(
      np.arange(1, len(losses) + 1), losses, style, label=label, linewidth=1
    )
  ax.set_xlabel('step')
  ax.set_ylabel('training loss (cross-entropy)')
  ax.set_yscale('log')
  ax.legend()
  ax.set_title('Training loss, same seed and batches')
  fig.tight_layout()
  save_png(fig, path, dpi=120)


def draw_head(ax, weights, source_tokens, target_tokens, title, font, size=6):
  """One head's (Lq, Lk) weights on `ax`, cut to the tokens, which label
  the axes in `font` (FontProperties) at `size` points."""
  ax.imshow(
    weights[: len(target_tokens), : len(source_tokens)],
    cmap='viridis',
    vmin=0,
    aspect='auto',
  )
  ax.set_title(title, fontsize=size + 2)
  ax.set_xticks(range(len(source_tokens)))
  ax.set_xticklabels(
    source_tokens, rotation=90, fontsize=size, fontproperties=font
  )
  ax.set_yticks(range(len(target_tokens)))
  ax.set_yticklabels(target_tokens, fontsize=size, fontproperties=font)


def plot_heatmaps(weights, source_tokens, target_tokens, path, title):
  """One row per layer, one column per head, for one sentence, written to
  `path` (a file name or a binary file object).

  `weights` holds each layer's (heads, Lq, Lk) weights; the tokens label
  the axes in a font that has their glyphs. Where no installed font has
  them, the axes show token indices and the title says so.
  """
  from matplotlib.font_manager import FontProperties

  plt = pyplot()
  font = font_for(list(source_tokens) + list(target_tokens) + [title])
  if font is None:
    source_tokens = [str(i) for i in range(len(source_tokens))]
    target_tokens = [str(i) for i in range(len(target_tokens))]
    title = 'token indices: no installed font has the glyphs of this text'
  properties = FontProperties(fname=font) if font else FontProperties()
  n_layers, n_heads = len(weights), weights[0].shape[0]
  fig, axes = plt.subplots(
    n_layers,
    n_heads,
    squeeze=False,
    figsize=(2.6 * n_heads + 1, 2.4 * n_layers + 1),
  )
  for li, layer_weights in enumerate(weights):
    for h in range(n_heads):
      draw_head(
        axes[li][h],
        layer_weights[h],
        source_tokens,
        target_tokens,
        f'layer {li + 1} head {h + 1}',
        properties,
      )
  fig.suptitle(title, fontsize=9, fontproperties=properties)
  fig.tight_layout()
  save_png(fig, path, dpi=110)
  return font


def model_line(c):
  """The model of a run's config in words (configs before 0.5.0 lack
  `model`: a Transformer)."""
  if c.get('model', 'transformer') == 'lstm_seq2seq_attn':
    return (
      f'LSTMSeq2SeqAttn: {c["n_layers"]} LSTM encoder and {c["n_layers"]} '
      f'decoder layers joined by one AttentionQKV, d_model {c["d_model"]}, '
      f'{c["n_heads"]} heads, attention dropout {c["dropout"]}'
    )
  return (
    f'Transformer {c["n_layers"]}+{c["n_layers"]} layers, d_model '
    f'{c["d_model"]}, d_ff {c["d_ff"]}, {c["n_heads"]} heads, dropout '
    f'{c["dropout"]}'
  )


HEAD_ROWS = (
  ('JS divergence between heads, bits', 'divergence'),
  ('argmax agreement between heads', 'agreement'),
  ('entropy of a head, bits', 'entropy'),
  ('peak weight of a head', 'peak'),
)


def per_layer(values, fmt='{:.2f}'):
  """'0.41 / 0.38': a measure per layer; '-' for None (one head); 'n/a'
  where the run has no such measure (runs of earlier releases)."""
  if values is None:
    return 'n/a'
  return ' / '.join('-' if v is None else fmt.format(v) for v in values)


def measures_line(measures):
  """The head measures of one map in one line, per layer."""
  return (
    '; '.join(f'{t} {per_layer(measures.get(key))}' for t, key in HEAD_ROWS)
    + ' (per layer)'
  )


def head_rows(summary, labels):
  """The cross-attention head measures (`head_measures`), per layer;
  summaries before 0.5.0 lack them."""
  heads = [summary[label].get('cross_attention_heads') for label in labels]
  if not any(heads):
    return []
  n = max(h['sentences'] for h in heads if h)
  return [
    f'| cross-attention, {title} (per layer, {n} test sentences) | '
    + ' | '.join(per_layer(h and h.get(key)) for h in heads)
    + ' |'
    for title, key in HEAD_ROWS
  ]


SCORE_ROWS = (
  ('weight on itself', 'diagonal'),
  ('score asymmetry ‖S − Sᵀ‖ / ‖S‖', 'asymmetry'),
  ('entropy of a head, bits', 'entropy'),
  ('argmax agreement between heads', 'agreement'),
  ('argmax agreement between heads, off the diagonal', 'agreement_off_self'),
)


def score_rows(columns, suffix=''):
  """Table rows of the self-attention score measures per layer
  (`research.self_attention_scores`), a cell per (summary, model
  name) of `columns`, each title followed by `suffix`; [] where no model
  has them (older runs, the LSTM)."""
  scores = [s[name].get('self_attention_scores') for s, name in columns]
  if not any(scores):
    return []
  n = max(m['sentences'] for m in scores if m)
  return [
    f'| {part} self-attention, {title}{suffix} (per layer, {n} test '
    'sentences) | '
    + ' | '.join(per_layer(m and m[part].get(key)) for m in scores)
    + ' |'
    for part in ('encoder', 'decoder')
    for title, key in SCORE_ROWS
  ]


def render_report(summary, labels):
  """report.md: one column per implementation (its name as label)."""
  rows = [
    ('BLEU (sacreBLEU, cased)', 'bleu', '{:.2f}'),
    ('BLEU (lowercased)', 'bleu_lowercase', '{:.2f}'),
    ('chrF (sacreBLEU)', 'chrf', '{:.2f}'),
    ('exact match, greedy', 'exact_match', '{:.2%}'),
    (
      'BLEU lowercased, beam search (first N sentences)',
      'beam_bleu_lowercase',
      '{:.2f}',
    ),
    (
      'exact match, beam search (first N sentences)',
      'beam_exact_match',
      '{:.2%}',
    ),
    ('beam search: N sentences', 'beam_sentences', '{}'),
    ('final training loss', 'final_loss', '{:.6f}'),
    ('eval loss', 'eval_loss', '{:.4f}'),
    ('eval token accuracy', 'eval_accuracy', '{:.4f}'),
    ('parameters', 'parameters', '{:,}'),
    ('training step, median (ms)', 'step_ms', '{:.1f}'),
  ]
  c = summary['config']
  lines = [
    f'# trax_qkv validation: {" vs ".join(labels)}',
    '',
    f'Data set `{summary["dataset"]}` ({" -> ".join(summary["keys"])}), '
    f'{summary["test_sentences"]} test sentences, a shared vocabulary of '
    f'{summary["vocab_size"]} subwords ({c["vocab_size"]} requested). '
    + model_line(c)
    + '; '
    f'{summary["steps"]} steps of batch {c["batch_size"]}, Adam '
    f'{c["learning_rate"]} with {c["warmup_steps"]} warm-up steps, seed '
    f'{summary["seed"]}. All models see the same batches in the same '
    'order and start from the same weights.',
    '',
  ]
  # Older summaries lack it.
  if 'environment' in summary:
    lines += ['Ran on ' + environment.one_line(summary['environment']), '']
  lines += [
    '| metric | ' + ' | '.join(labels) + ' |',
    '|---|' + '---|' * len(labels),
  ]
  # Which layer ran in each site (summaries before 0.3 lack it); '-'
  # where the model has no such site.
  sites = model_dir.ARCHITECTURES[c.get('model', 'transformer')].sites
  cells = [
    ' / '.join(
      summary[label].get('attention', {}).get(site, '?')
      if site in sites
      else '-'
      for site in SITES
    )
    for label in labels
  ]
  lines.append(
    '| attention: encoder self / decoder causal / cross | '
    + ' | '.join(cells)
    + ' |'
  )
  for title, key, fmt in rows:
    cells = [
      fmt.format(summary[label][key])
      if summary[label].get(key) is not None
      else 'n/a'
      for label in labels
    ]
    lines.append(f'| {title} | ' + ' | '.join(cells) + ' |')
  lines += head_rows(summary, labels)
  lines += score_rows([(summary, label) for label in labels])
  first = summary[labels[0]]
  lines += [
    '',
    'sacreBLEU signatures: BLEU `'
    + first['bleu_signature']
    + '`, lowercased `'
    + first['bleu_lowercase_signature']
    + '`, chrF `'
    + first['chrf_signature']
    + '`.',
  ]
  undefined = {
    summary[label].get(key)
    for label in labels
    for key in ('bleu_undefined', 'beam_bleu_undefined')
  } - {None}
  lines += [line for reason in sorted(undefined) for line in ('', f'{reason}.')]
  lines += [
    '',
    'Training step: the median wall time of a step, so that what is paid '
    'once (compiling, the first batches) does not count; both models are '
    'timed the same way. What the layers cost: `trax-qkv-bench`. The '
    'decoding times in summary.json include compiling the search, which '
    'a model after the first may find in the compilation cache.',
  ]
  if 'max_loss_diff' in summary:
    lines += [
      '',
      f'Max |difference| between the per-step training losses: '
      f'**{summary["max_loss_diff"]:.3g}**; test sentences decoded '
      f'identically: **{summary["identical_decodes"]:.2%}**.',
    ]
  lines += [
    '',
    '![loss curves](loss_curves.png)',
    '',
    'Cross-attention per head: `cross_attention_*.png`; the head '
    'measures are defined in `trax_qkv.research.head_measures`.',
    '',
  ]
  return '\n'.join(lines)
