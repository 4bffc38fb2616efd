"""Several validation runs in one table, and their models' attention maps
side by side (`trax-qkv-compare`; docs/why_three_dense.md).

Each run is an output directory of `trax-qkv-validate`: its summary.json
and one model directory per implementation.
"""

import collections
import json
import os
import re

import numpy as np

from trax_qkv import files
from trax_qkv.research import preregistered
from trax_qkv.research import statistics
from trax_qkv.validation import report

TABLE = 'comparison.md'
SEEDS_TABLE = 'seeds.md'


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


def _training_line(summary):
  """'`dataset`, N steps of batch B': what a run trained on, and how long."""
  return (
    f'`{summary["dataset"]}`, {summary["steps"]} steps of batch '
    f'{summary["config"]["batch_size"]}'
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
      f'{_training_line(summary)}, seed {summary["seed"]}; '
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
    lines += report.head_rows(summary, names)
    lines += report.score_rows([(summary, n) for n in names])
    lines.append('')
  return '\n'.join(lines)


# Config entries that may differ between the seeds of one experiment.
_PER_SEED = ('seed', 'output_dir')
SEED_ROWS = (
  ('eval loss', 'eval_loss', '{:.4f}'),
  ('eval token accuracy', 'eval_accuracy', '{:.4f}'),
  ('BLEU lowercased, greedy', 'bleu_lowercase', '{:.2f}'),
  ('BLEU lowercased, beam 4', 'beam_bleu_lowercase', '{:.2f}'),
  ('chrF, greedy', 'chrf', '{:.2f}'),
)


def across_seeds(values):
  """(mean, low, high): the mean of one value per seed and its 95 %
  t-interval (`statistics.interval`); None bounds for fewer than two
  seeds."""
  values = np.asarray(values, np.float64)
  if len(values) < 2:
    return float(values.mean()), None, None
  return statistics.interval(values)


def holm_line(p_values, baseline):
  """The sentence under a seeds table: Holm's correction over its paired
  t tests, {(model, label): p}."""
  reject, adjusted = statistics.holm(list(p_values.values()))
  found = [
    f'`{name}` {label} (adjusted p {p:.3f})'
    for (name, label), r, p in zip(p_values, reject, adjusted)
    if r
  ]
  return (
    f"Holm's correction over the {len(p_values)} paired t tests of the "
    f'rows "difference from `{baseline}`" across seeds (family-wise 5 %): '
    + (', '.join(found) if found else 'none significant')
    + f'; smallest adjusted p {min(adjusted):.3f}.'
  )


def interval(fmt, mean, low, high):
  """'+0.012 [-0.003, +0.027]', the interval marked * where it excludes 0."""
  if low is None:
    return fmt.format(mean) + ' (one seed)'
  sign = fmt.replace('{:', '{:+')
  star = ' *' if low > 0 or high < 0 else ''
  return f'{sign.format(mean)} [{sign.format(low)}, {sign.format(high)}]{star}'


def check_seeds(runs):
  """Raises ValueError unless `runs` ((dir, summary, names) each) are the
  seeds of one experiment: the same config but the seed, each seed once."""
  first = {k: v for k, v in runs[0][1]['config'].items() if k not in _PER_SEED}
  for run_dir, summary, _ in runs[1:]:
    config = summary['config']
    differ = sorted(
      k for k in set(first) | set(config)
      if k not in _PER_SEED and first.get(k) != config.get(k)
    )  # fmt: skip
    if differ:
      raise ValueError(
        f'seeds: {run_dir} differs from {runs[0][0]} in {differ}, not in '
        'its seed alone.'
      )
  seeds = [summary['seed'] for _, summary, _ in runs]
  if len(set(seeds)) != len(seeds):
    raise ValueError(f'seeds: each seed once; got {seeds}.')


# How the seeds table names and prints the pre-registered primary measure.
PRIMARY = (
  'eval loss at the last step',
  preregistered.PRIMARY_MEASURE,
  '{:.3f}',
)


def decision_lines(summaries, names, margin, baseline='reference'):
  """The pre-registered reading of the seeds' primary measure: each
  variant's decision against `baseline` (`statistics.decide`: Holm over
  the variants, TOST within `margin` nats), and whether the baseline's
  eval loss had flattened (`preregistered.flattened`)."""
  label, key, fmt = PRIMARY
  flat_steps, flat_fall = preregistered.FLAT_STEPS, preregistered.FLAT_FALL
  variants = [n for n in names if n != baseline]
  differences = {
    n: [s[n][key] - s[baseline][key] for s in summaries] for n in variants
  }
  decided = statistics.decide(differences, margin)
  lines = [
    '',
    f'Pre-registered decisions: {label}, variant − `{baseline}`, paired '
    f'by seed; equivalence margin ±{margin} nats; Holm over the '
    f'{len(variants)} variants for each claim (family-wise 5 %).',
    '',
    '| variant | difference [95 % interval] | adjusted p: worse / '
    'equivalent / better | decision |',
    '|---|---|---|---|',
  ]
  for n in variants:
    verdict, p = decided[n]
    lines.append(
      f'| `{n}` | {interval(fmt, *across_seeds(differences[n]))} '
      f'| {p["worse"]:.3f} / {p["equivalent"]:.3f} / {p["better"]:.3f} '
      f'| **{verdict}** |'
    )
  falls = [
    preregistered.fall(s[baseline]['eval_loss_curve'])
    if s[baseline].get('eval_loss_curve')
    else None
    for s in summaries
  ]
  if None in falls:
    flat = (
      f'not measured: a seed has no evaluation {flat_steps:,} steps '
      'before its last'
    )
  else:
    flat = (
      'fell by '
      + ', '.join(f'{f:.3f}' for f in falls)
      + ' nats (seeds in order): '
      + (
        f'flattened by the pre-registered rule (< {flat_fall} in every seed)'
        if preregistered.flattened(falls)
        else f'not flattened (≥ {flat_fall} in some seed): train on'
      )
    )
  lines += [
    '',
    f"`{baseline}`'s eval loss over its last {flat_steps:,} steps: {flat}.",
  ]
  return lines


def _bootstrap_rows(runs, references, baseline):
  """BLEU and chrF of the greedy decodes, each model's difference from
  `baseline` by paired bootstrap of the test sentences (the seeds' mean
  difference)."""
  from trax_qkv.supervised import scoring

  names = runs[0][2]
  summaries = [summary for _, summary, _ in runs]
  rows = []
  decodes = {n: [_decodes(run_dir, n) for run_dir, _, _ in runs] for n in names}
  for metric, label in (
    ('bleu_lowercase', 'BLEU lowercased'),
    ('chrf', 'chrF'),
  ):
    rows.append(
      f'| {label}, greedy, difference from `{baseline}`, paired bootstrap '
      f'({len(references)} test sentences) | '
      + ' | '.join(
        ''
        if n == baseline
        else interval(
          '{:.2f}',
          *scoring.paired_bootstrap(
            references,
            decodes[baseline],
            decodes[n],
            metric,
            summaries[0]['config']['bleu_tokenize'],
          ),
        )  # fmt: skip
        for n in names
      )
      + ' |'
    )
  return rows


def render_seeds(runs, references=None, baseline='reference', margin=None):
  """The seeds of one experiment in one table: per model, each score's
  mean ± sd over seeds, and its paired difference from `baseline` with a
  95 % interval across seeds (* where it excludes 0, each test on its
  own; Holm's correction over all of them under the table); with `references`
  (the test set's), BLEU and chrF also by paired bootstrap of the test
  sentences (`scoring.paired_bootstrap`, the seeds' mean difference).

  Args:
    runs: (run directory, summary, model names) of each seed.
    references: None, or the test set's reference translations.
    baseline: the model the others are compared with.
    margin: None, or the pre-registered equivalence margin of the eval
      loss (nats): with two or more seeds, the table ends with each
      variant's decision (`decision_lines`).
  """
  check_seeds(runs)
  names = runs[0][2]
  if baseline not in names:
    raise ValueError(f'seeds: no {baseline!r} model in {names}.')
  summaries = [summary for _, summary, _ in runs]
  c = summaries[0]['config']
  seeds = ', '.join(str(s['seed']) for s in summaries)
  lines = [
    f'{_training_line(summaries[0])}, attention varied in '
    f'{" and ".join(c["sites"])}; '
    f'{len(runs)} seed{"s" if len(runs) > 1 else ""} ({seeds}). '
    + report.model_line(c)
    + '.',
    '',
    '| | ' + ' | '.join(f'`{n}`' for n in names) + ' |',
    '|---|' + '---|' * len(names),
  ]
  p_values = {}
  for label, key, fmt in SEED_ROWS:
    values = {n: [s[n].get(key) for s in summaries] for n in names}
    if any(v is None for vs in values.values() for v in vs):
      continue
    if len(runs) > 1:
      for n in names:
        if n != baseline:
          p_values[n, label] = statistics.p_value(
            np.subtract(values[n], values[baseline])
          )
    lines.append(
      f'| {label}, mean ± sd | '
      + ' | '.join(_mean_sd(fmt, v) for v in values.values())
      + ' |'
    )
    lines.append(
      f'| {label}, difference from `{baseline}` | '
      + ' | '.join(
        ''
        if n == baseline
        else interval(
          fmt,
          *across_seeds(np.subtract(values[n], values[baseline])),
        )
        for n in names
      )
      + ' |'
    )
  if references is not None:
    lines += _bootstrap_rows(runs, references, baseline)
  # The attention measures, per layer, as the seeds' mean.
  mean = {
    n: {
      'cross_attention_heads': _mean_measures(
        summaries, n, 'cross_attention_heads'
      ),
      'self_attention_scores': _mean_measures(
        summaries, n, 'self_attention_scores', ('encoder', 'decoder')
      ),
    }
    for n in names
  }
  lines += report.head_rows(mean, names)
  lines += report.score_rows([(mean, n) for n in names])
  lines += initial_score_rows([run_dir for run_dir, _, _ in runs], names)
  lines += circuit_rows([run_dir for run_dir, _, _ in runs], names)
  if p_values:
    lines += ['', holm_line(p_values, baseline)]
  if margin is not None and len(runs) > 1:
    lines += decision_lines(summaries, names, margin, baseline)
  return '\n'.join(lines) + '\n'


_CIRCUIT_MEASURES = (
  ('QK circuit asymmetry', 'qk_asymmetry', '{:.2f}'),
  ('QK circuit trace ratio', 'qk_trace', '{:.2f}'),
  ('QK circuit effective rank', 'qk_rank', '{:.1f}'),
  ('OV circuit trace ratio', 'ov_trace', '{:.2f}'),
  ('OV circuit effective rank', 'ov_rank', '{:.1f}'),
)
# (title, circuits.json's group, measure, format); head importance is
# summarized per layer by the mean and the largest rise over its heads.
CIRCUIT_ROWS = (
  *((t, 'circuits', k, f) for t, k, f in _CIRCUIT_MEASURES),
  *(
    (f'{t}, initialized', 'initial_circuits', k, f)
    for t, k, f in _CIRCUIT_MEASURES
  ),
  ('head importance, mean loss rise', 'importance', np.mean, '{:.3f}'),
  ('head importance, largest loss rise', 'importance', np.max, '{:.3f}'),
)


def circuit_rows(run_dirs, names):
  """Table rows of the runs' circuits.json (`trax-qkv-circuits`): per
  part and layer, the seeds' mean of each measure (`CIRCUIT_ROWS`); []
  unless every run has one, and no row of a group a run lacks."""
  from trax_qkv.validation import trained_circuits

  measured = []
  for run_dir in run_dirs:
    path = os.path.join(run_dir, trained_circuits.CIRCUITS_FILE)
    if not os.path.exists(path):
      return []
    measured.append(files.read_json_object(path, 'circuit measures'))
  parts = [
    p for p in ('encoder', 'decoder', 'cross')
    if p in measured[0][names[0]]['circuits']
  ]  # fmt: skip
  where = {
    'circuits': 'trained weights',
    'initial_circuits': 'weights before training',
    'importance': f'{measured[0]["validation_pairs"]} validation pairs',
  }

  def per_layer(m, name, group, part, key):
    if group == 'importance':  # per layer, a rise per head
      return [key(heads) for heads in m[name][group][part]]
    return m[name][group][part][key]

  lines = []
  for part in parts:
    for title, group, key, fmt in CIRCUIT_ROWS:
      if not all(group in m[n] for m in measured for n in names):
        continue
      cells = [
        report.per_layer(
          np.mean([per_layer(m, n, group, part, key) for m in measured], 0),
          fmt,
        )
        for n in names
      ]
      lines.append(
        f'| {part} {title} (per layer, {where[group]}) | '
        + ' | '.join(cells)
        + ' |'
      )
  return lines


def _mean_sd(fmt, values):
  sd = np.std(values, ddof=1) if len(values) > 1 else 0.0
  return f'{fmt.format(np.mean(values))} ± {fmt.format(sd)}'


def _per_layer_mean(lists):
  """The mean per layer of per-layer lists; None where any is None (a
  measure of pairs of heads, for one head)."""
  return [
    None if None in column else float(np.mean(column))
    for column in zip(*lists, strict=True)
  ]


def initial_score_rows(run_dirs, names):
  """The self-attention score rows of the models as initialized, the
  seeds' mean (`trained_circuits.initial_scores`, in every run
  directory); [] where a run has none."""
  from trax_qkv.validation import trained_circuits

  found = []
  for run_dir in run_dirs:
    path = os.path.join(run_dir, trained_circuits.INITIAL_SCORES_FILE)
    if not os.path.exists(path):
      return []
    with open(path, encoding='utf-8') as f:
      found.append(json.load(f))
  per_seed = [
    {
      n: {'self_attention_scores': dict(seed[n], sentences=seed['sentences'])}
      for n in names
    }
    for seed in found
  ]
  mean = {
    n: {
      'self_attention_scores': _mean_measures(
        per_seed, n, 'self_attention_scores', ('encoder', 'decoder')
      )
    }
    for n in names
  }
  return report.score_rows([(mean, n) for n in names], ', initialized')


def _mean_measures(summaries, name, key, parts=None):
  """The seeds' mean of the per-layer measures `key` of model `name`
  ('cross_attention_heads', or 'self_attention_scores' with its `parts`);
  None where a seed has none."""
  found = [s[name].get(key) for s in summaries]
  if not all(found):
    return None

  def mean(measures):
    return {
      k: _per_layer_mean([m[k] for m in measures])
      for k in measures[0]
      if k != 'sentences'
    }

  if parts is None:
    return dict(mean(found), sentences=found[0]['sentences'])
  return dict(
    {part: mean([m[part] for m in found]) for part in parts},
    sentences=found[0]['sentences'],
  )


def _decodes(run_dir, name):
  with open(
    os.path.join(run_dir, f'decodes_{name}.txt'), encoding='utf-8'
  ) as f:
    return f.read().splitlines()


def reference_translations(summary, source_dir=None, data_dir=None):
  """The reference translations of a run's test sentences, in the order
  it decoded them: from the prepared data set it read, or, with
  `source_dir`, from that directory of parallel text prepared in
  `data_dir` here. TFDS orders a split by its examples' keys (here the
  line numbers), so the order is the run's wherever it is prepared."""
  from trax_qkv import data as data_lib
  from trax_qkv.data import pipeline

  keys = tuple(summary['keys'])
  dataset, where = summary['dataset'], summary['config']['data_dir']
  try:
    if source_dir is not None:
      dataset = data_lib.parallel_text_dataset(source_dir, *keys)
      where = data_dir or pipeline.DEFAULT_DATA_DIR
      with files.locked(where, pipeline.DATA_LOCK_FILE):
        pipeline.prepare_dataset(dataset, where)
    pairs = pipeline.load_split(dataset, 'test', keys, where)
  except Exception as e:  # tfds: a missing or unprepared data set
    raise ValueError(
      f'seeds: the test set of {dataset} cannot be read ({e}); prepare it '
      'as the runs did (trax-qkv-validate), or give its --source_dir.'
    ) from None
  return [target for _, target in pairs][: summary['test_sentences']]


# How a page embeds a seeds table: the command's run directories (relative
# to the page) on the first line, then render_seeds' output.
PAGE_BLOCK = re.compile(
  r'<!-- trax-qkv-compare --seeds (?P<dirs>[^\n]+?) -->\n'
  r'(?P<table>.*?)'
  r'<!-- end of trax-qkv-compare --seeds -->',
  re.S,
)


PageTable = collections.namedtuple('PageTable', 'dirs table margin')


def page_tables(text):
  """[PageTable] of the seeds tables that a page's `text` embeds between
  PAGE_BLOCK's markers, the first naming the run directories and, after
  them, `--margin NATS` where the table has decisions; each table must
  equal `render_seeds` of its directories with that margin (a test
  checks the docs' pages)."""
  tables = []
  for m in PAGE_BLOCK.finditer(text):
    dirs, margin = m['dirs'].split(), None
    if '--margin' in dirs:
      i = dirs.index('--margin')
      dirs, margin = dirs[:i], float(dirs[i + 1])
    tables.append(PageTable(dirs, m['table'], margin))
  return tables


def compare_seeds(
  run_dirs, output_dir, source_dir=None, data_dir=None, margin=None
):
  """Writes `SEEDS_TABLE`: the runs, seeds of one experiment, in one
  table with intervals (`render_seeds`, with the test set's references:
  `reference_translations`, and the decisions within `margin` where
  given); returns its text.

  Raises:
    ValueError: a run is not complete, the runs are not seeds of one
      experiment, or the test set cannot be read -- before any write.
  """
  runs = [(d, *load_run(d)) for d in run_dirs]
  check_seeds(runs)
  references = reference_translations(runs[0][1], source_dir, data_dir)
  text = '# Seeds\n\n' + render_seeds(runs, references, margin=margin)
  os.makedirs(output_dir, exist_ok=True)
  files.write_text(os.path.join(output_dir, SEEDS_TABLE), text)
  return text


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
