"""Several validation runs in one table, and their models' attention maps
side by side (`trax-qkv-compare`; docs/why_three_dense.md).

Each run is an output directory of `trax-qkv-validate`: its summary.json
and one model directory per implementation.
"""

import json
import os

from trax_qkv import files
from trax_qkv.validation import report

TABLE = 'comparison.md'


def load_run(run_dir):
  """(summary, model names in the run's order) of a validation run."""
  path = os.path.join(run_dir, 'summary.json')
  try:
    with open(path, encoding='utf-8') as f:
      summary = json.load(f)
  except FileNotFoundError:
    raise ValueError(
      f'runs: {run_dir} has no summary.json; give output directories of '
      'completed trax-qkv-validate runs.'
    ) from None
  return summary, list(summary['config']['implementations'])


def _pct(value):
  return 'n/a' if value is None else f'{value:.1%}'


def _num(fmt):
  return lambda value: 'n/a' if value is None else fmt.format(value)


ROWS = (
  ('parameters', 'parameters', _num('{:,}')),
  ('final training loss', 'final_loss', _num('{:.4f}')),
  ('eval loss', 'eval_loss', _num('{:.4f}')),
  ('exact match, greedy', 'exact_match', _pct),
  ('exact match, beam 4', 'beam_exact_match', _pct),
  ('BLEU lowercased, greedy', 'bleu_lowercase', _num('{:.2f}')),
  ('BLEU lowercased, beam 4', 'beam_bleu_lowercase', _num('{:.2f}')),
  ('chrF, greedy', 'chrf', _num('{:.2f}')),
)


def render_table(runs):
  """One markdown table per run: a column per model, a row per measure.

  Args:
    runs: (title, summary, model names) of each run.
  """
  lines = []
  for title, summary, names in runs:
    c = summary['config']
    lines += [
      f'### {title}',
      '',
      f'`{summary["dataset"]}`, {summary["steps"]} steps of batch '
      f'{c["batch_size"]}, seed {summary["seed"]}; '
      f'{summary["test_sentences"]} test sentences (beam search: '
      f'{summary[names[0]].get("beam_sentences")}). '
      + report.model_line(c)
      + '.',
      '',
      '| | ' + ' | '.join(f'`{n}`' for n in names) + ' |',
      '|---|' + '---|' * len(names),
    ]
    for label, key, fmt in ROWS:
      lines.append(
        f'| {label} | '
        + ' | '.join(fmt(summary[n].get(key)) for n in names)
        + ' |'
      )
    for label, key in report.HEAD_ROWS:
      heads = [summary[n].get('cross_attention_heads') for n in names]
      lines.append(
        f'| cross-attention {label}, per layer | '
        + ' | '.join(report.per_layer(h[key]) if h else 'n/a' for h in heads)
        + ' |'
      )
    lines += report.score_rows([(summary, n) for n in names])
    lines.append('')
  return '\n'.join(lines)


def plot_side_by_side(maps, path, title):
  """The cross-attention of several models for one sentence in one PNG: a
  row per (model, layer), a column per head.

  Args:
    maps: (model name, source tokens, target tokens, per layer (heads, Lq,
      Lk) weights) of each model.
    path: the PNG file to write.
    title: the figure's title.
  """
  from matplotlib.font_manager import FontProperties

  plt = report.pyplot()
  texts = [t for m in maps for t in m[1] + m[2]] + [title]
  font = report.font_for(texts)
  properties = FontProperties(fname=font) if font else FontProperties()
  rows = [
    (name, i, w) for name, _, _, layers in maps for i, w in enumerate(layers)
  ]
  columns = max(w.shape[0] for _, _, w in rows)
  fig, axes = plt.subplots(
    len(rows),
    columns,
    squeeze=False,
    figsize=(1.9 * columns + 1, 1.9 * len(rows) + 1),
  )
  tokens = {name: (src, tgt) for name, src, tgt, _ in maps}
  for r, (name, layer, weights) in enumerate(rows):
    src, tgt = tokens[name]
    for h in range(columns):
      if h < weights.shape[0]:
        report.draw_head(
          axes[r][h], weights[h], src, tgt, f'{name} L{layer + 1} H{h + 1}',
          properties, size=5,
        )  # fmt: skip
      else:
        axes[r][h].axis('off')
  fig.suptitle(title, fontsize=9, fontproperties=properties)
  fig.tight_layout()
  report.save_png(fig, path, dpi=90)


def compare(run_dirs, sources, output_dir, log=print):
  """Writes `TABLE` (every run's table) and maps_<i>.png (run i's models'
  cross-attention for `sources[i]`, each model translating it greedily)
  into `output_dir`; returns the table's text.

  Raises:
    ValueError: a run is not complete, or runs and sources differ in number
      -- before anything is written.
  """
  from trax_qkv.supervised import attention_maps

  if len(sources) != len(run_dirs):
    raise ValueError(
      f'sources must give one sentence per run ({len(run_dirs)}); got '
      f'{len(sources)}.'
    )
  runs = [load_run(d) for d in run_dirs]
  os.makedirs(output_dir, exist_ok=True)
  text = '# Comparison\n\n' + render_table(
    [
      (os.path.basename(os.path.normpath(d)), s, n)
      for d, (s, n) in zip(run_dirs, runs)
    ]
  )
  for i, (run_dir, source, (_, names)) in enumerate(
    zip(run_dirs, sources, runs)
  ):
    maps = []
    for name in names:
      log(f'attention map: {run_dir} {name}')
      src, tgt, weights, _ = attention_maps.for_sentence(
        os.path.join(run_dir, name), source
      )
      maps.append((name, src, tgt, weights))
    picture = f'maps_{i}.png'
    plot_side_by_side(maps, os.path.join(output_dir, picture), f'"{source}"')
    text += f'\n![cross-attention, {os.path.basename(run_dir)}]({picture})\n'
  files.write_text(os.path.join(output_dir, TABLE), text)
  return text
