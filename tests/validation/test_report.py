"""Reports: attention maps in any script, progress of long work, seeds."""

import io
import json
import os
import warnings

from matplotlib import font_manager
import numpy as np
import pytest

from trax_qkv.supervised.progress import Progress
from trax_qkv.validation import environment
from trax_qkv.validation import report


def _installed_fonts():
  return sorted(
    {
      f.fname
      for f in font_manager.fontManager.ttflist
      if 'LastResort' not in f.fname
    }
  )


def test_font_for_picks_a_font_with_every_glyph():
  default = font_manager.findfont(font_manager.FontProperties())
  assert report.font_for(['Hund läuft', 'dog runs']) == default
  # A character the default font lacks but another installed font has.
  lacking = None
  for path in _installed_fonts():
    extra = sorted(report._charmap(path) - report._charmap(default))
    extra = [c for c in extra if chr(c).isprintable() and c > 0x7F]
    if extra:
      lacking = chr(extra[0])
      break
  if lacking is None:
    pytest.skip('every installed font covers the same characters')
  chosen = report.font_for(['ab', lacking])
  assert chosen != default
  assert ord(lacking) in report._charmap(chosen)
  assert report.font_for(['\U0010fffd']) is None  # a private-use code point


def test_heatmap_of_a_japanese_sentence_draws_no_empty_boxes(tmp_path):
  """matplotlib warns 'Glyph ... missing from font' for each character it
  draws as an empty box; the map uses a font with the glyphs, or token
  indices where no installed font has them."""
  source, target = ['犬', 'が', '走る', '<eos>'], ['A', 'dog', 'runs', '<eos>']
  weights = [np.random.RandomState(0).dirichlet(np.ones(4), (2, 4))] * 2
  path = tmp_path / 'map.png'
  with warnings.catch_warnings():
    warnings.filterwarnings('error', message='.*missing from font')
    font = report.plot_heatmaps(
      weights, source, target, str(path), '犬が走る -> A dog runs'
    )
  assert path.stat().st_size > 0
  if font is not None:
    assert {ord(c) for c in '犬が走る'} <= report._charmap(font)


def test_progress_logs_lines_when_not_on_a_terminal():
  lines = []
  with Progress(20, 'decoding', lines.append, stream=io.StringIO()) as p:
    for _ in range(20):
      p.update(loss=1.5)
  # One line per tenth of the work (2 batches), the last at 20/20.
  assert len(lines) == 10
  assert lines[0].startswith('decoding: 2/20 (') and 'loss 1.5' in lines[0]
  assert lines[-1].startswith('decoding: 20/20 (')


def test_environment_names_this_process_stack_and_cpu():
  import platform

  import jax

  e = environment.describe()
  assert e['python'] == platform.python_version()
  assert (e['jax'], e['backend']) == (jax.__version__, jax.default_backend())
  assert e['trax'] == '1.4.1'
  assert e['cpu']
  assert e['cpu_vector_flags'] == sorted(e['cpu_vector_flags'])
  assert all(
    f.startswith(('sse4', 'avx', 'fma', 'amx')) for f in e['cpu_vector_flags']
  )


def test_report_says_what_the_run_ran_on():
  e = {
    'python': '3.13.0',
    'trax_qkv': '0.4.0',
    'trax': '1.4.1',
    'jax': '0.12.0.1',
    'jaxlib': '0.12.0.1',
    'tensorflow': '2.21.0',
    'numpy': '2.5.5',
    'backend': 'cpu',
    'device': 'cpu',
    'cpu': 'Intel(R) Xeon(R) Processor',
    'cpu_vector_flags': ['avx', 'avx2', 'avx512f', 'fma', 'sse4_2'],
    'xla_flags': '',
  }
  line = (
    'Python 3.13.0, trax 1.4.1, jax 0.12.0.1 (jaxlib 0.12.0.1), tensorflow '
    '2.21.0, numpy 2.5.5, trax_qkv 0.4.0; CPU Intel(R) Xeon(R) Processor '
    '(AVX-512).'
  )
  assert environment.one_line(e) == line
  on_gpu = dict(e, backend='gpu', device='NVIDIA H100 80GB HBM3')
  assert '; NVIDIA H100 80GB HBM3, CPU Intel' in environment.one_line(on_gpu)
  assert environment.one_line(
    dict(e, cpu_vector_flags=['avx2'], xla_flags='--xla_cpu_max_isa=AVX2')
  ).endswith('Processor (AVX2); XLA_FLAGS `--xla_cpu_max_isa=AVX2`.')


def _seed_run(tmp_path, seed, eval_losses, decodes, **config):
  """A validation run's directory as trax-qkv-validate leaves it: its
  summary.json (the entries the seeds table reads) and greedy decodes."""
  run_dir = tmp_path / f'seed{seed}'
  run_dir.mkdir()
  base = dict(d_model=16, d_ff=32, n_layers=1, n_heads=2, dropout=0.0)
  base.update(batch_size=8, sites=['self_attention', 'causal_attention'])
  base.update(config, seed=seed, bleu_tokenize='13a')
  base['implementations'] = list(eval_losses)
  summary = dict(
    seed=seed, config=base, test_sentences=len(decodes['reference']),
    dataset='trax_qkv_numbers', steps=100,
  )  # fmt: skip
  for name, loss in eval_losses.items():
    summary[name] = dict(eval_loss=loss, eval_accuracy=1 - loss)
    (run_dir / f'decodes_{name}.txt').write_text('\n'.join(decodes[name]))
  (run_dir / 'summary.json').write_text(json.dumps(summary))
  return str(run_dir)


def test_seeds_table_gives_intervals_and_marks_only_those_excluding_zero(
  tmp_path,
):
  from trax_qkv.validation import compare

  references = [f'the dog number {i} runs in the big park .' for i in range(30)]
  cat = [r.replace('dog', 'cat') for r in references]
  decodes = {'reference': references, 'worse': cat, 'same': references}
  runs = [
    _seed_run(
      tmp_path,
      seed,
      dict(reference=1.0 + d, worse=1.5 + d, same=1.0 + e),
      decodes,
    )
    for seed, d, e in ((0, 0.0, 0.1), (1, 0.1, -0.1), (2, -0.1, 0.05))
  ]
  loaded = [(d, *compare.load_run(d)) for d in runs]
  table = compare.render_seeds(loaded, references)
  assert table.startswith(
    '`trax_qkv_numbers`, 100 steps of batch 8, attention varied in '
    'self_attention and causal_attention; 3 seeds (0, 1, 2). Transformer'
  )
  assert '1 seed (0).' in compare.render_seeds(loaded[:1])
  cells = {
    row[0]: row[1:]
    for row in (
      [c.strip() for c in line.strip('|').split('|')]
      for line in table.splitlines()
      if line.startswith('| ')
    )
  }
  # 'worse' is 0.5 worse in every seed: its interval excludes 0.
  assert cells['eval loss, mean ± sd'] == [
    '1.0000 ± 0.1000', '1.5000 ± 0.1000', '1.0167 ± 0.1041'
  ]  # fmt: skip
  _, worse, same = cells['eval loss, difference from `reference`']
  assert worse == '+0.5000 [+0.5000, +0.5000] *'
  assert same.endswith(']')  # an interval that includes 0: no mark
  bootstrap = ', greedy, difference from `reference`, paired bootstrap (30 '
  _, worse, same = cells['BLEU lowercased' + bootstrap + 'test sentences)']
  assert worse.endswith('*') and worse.startswith('-')
  assert same == '+0.00 [+0.00, +0.00]'
  other = _seed_run(
    tmp_path, 3, dict(reference=1.0, worse=1.5, same=1.0), decodes, d_model=32
  )
  with pytest.raises(ValueError, match=r"differs from .* in \['d_model'\]"):
    compare.check_seeds(loaded + [(other, *compare.load_run(other))])
  # A page embeds the table between markers naming its runs.
  page = (
    'Intro.\n\n<!-- trax-qkv-compare --seeds seed0 seed1 seed2 -->\n'
    + table
    + '<!-- end of trax-qkv-compare --seeds -->\n\nMore.\n'
  )
  assert compare.page_tables(page) == [
    (['seed0', 'seed1', 'seed2'], table, None)
  ]


def test_seeds_table_ends_with_the_pre_registered_decisions(tmp_path):
  """With a margin: each variant labelled by statistics.decide on the
  eval loss, and whether the baseline's eval loss had flattened; a page's
  marker carries the margin."""
  from helpers import command

  from trax_qkv.validation import compare

  references = ['a b c d .'] * 3
  offsets = dict(reference=0.0, worse=0.3, same=0.0, noisy=0.0)
  spread = dict(reference=0.0, worse=0.01, same=0.001, noisy=0.2)
  decodes = dict.fromkeys(offsets, references)
  runs = []
  for seed, sign in ((0, 1), (1, -1), (2, 0)):
    losses = {n: 2.0 + offsets[n] + sign * spread[n] for n in offsets}
    run_dir = _seed_run(tmp_path, seed, losses, decodes)
    runs.append((run_dir, *compare.load_run(run_dir)))
    # The baseline fell 0.01 nats over its last 2,000 steps in each seed.
    curve = [[1, 9.0], [1000, 2.5], [2000, 2.01], [3000, 2.005]]
    curve.append([4000, losses['reference']])
    curve[2][1] = losses['reference'] + 0.01
    runs[-1][1]['reference']['eval_loss_curve'] = curve
  table = compare.render_seeds(runs, margin=0.05)
  rows = {
    line.split('|')[1].strip(): [c.strip() for c in line.split('|')[2:-1]]
    for line in table.splitlines()
    if line.startswith('| `')
  }
  assert rows['`worse`'][0].startswith('+0.300 [')
  assert rows['`worse`'][2] == '**worse**'
  assert rows['`same`'][2] == '**equivalent**'
  assert rows['`noisy`'][2] == '**undecided**'
  assert 'Holm over the 3 variants' in table
  assert (
    "`reference`'s eval loss over its last 2,000 steps: fell by 0.010, "
    '0.010, 0.010 nats (seeds in order): flattened by the pre-registered '
    'rule (< 0.02 in every seed).'
  ) in table
  assert 'decision' not in compare.render_seeds(runs)  # none unasked
  page = (
    '<!-- trax-qkv-compare --seeds s0 s1 s2 --margin 0.05 -->\n'
    + table
    + '<!-- end of trax-qkv-compare --seeds -->\n'
  )
  assert compare.page_tables(page) == [(['s0', 's1', 's2'], table, 0.05)]
  for bad in (['--margin', '0.05'], ['--seeds', 'a', '--margin', '0']):
    with pytest.raises(SystemExit):
      command('compare').main(bad + ['--output_dir', str(tmp_path / 'x')])
  assert not (tmp_path / 'x').exists()


def _write_weight_measures(run_dir, seed):
  """circuits.json and initial_scores.json of a fake seed, both models
  alike, the values moving with the seed."""
  measures = dict.fromkeys(
    ('qk_asymmetry', 'qk_trace', 'qk_rank', 'ov_trace', 'ov_rank'),
    [0.1 * seed, 1.0],
  )
  model = dict(
    circuits={'encoder': measures},
    initial_circuits={'encoder': dict(measures, qk_trace=[0.5, -0.5])},
    importance={'loss': 2.0, 'encoder': [[0.0, 0.3 * seed], [0.1, 0.1]]},
  )
  circuits = dict(validation_pairs=7, reference=model, other=model)
  (run_dir / 'circuits.json').write_text(json.dumps(circuits))
  at_init = dict(
    diagonal=[0.1 * seed], asymmetry=[0.0], entropy=[1.0], agreement=[0.5]
  )
  both = dict(encoder=at_init, decoder=at_init)
  (run_dir / 'initial_scores.json').write_text(
    json.dumps(dict(sentences=3, reference=both, other=both))
  )


def test_seeds_table_gives_the_measures_mean_over_seeds(tmp_path):
  from trax_qkv.validation import compare

  references = ['a b c d .'] * 3
  decodes = {'reference': references, 'other': references}
  runs = []
  for seed in range(3):
    run_dir = _seed_run(tmp_path, seed, dict(reference=1.0, other=1.0), decodes)
    _write_weight_measures(tmp_path / f'seed{seed}', seed)
    runs.append((run_dir, *compare.load_run(run_dir)))
    summary = runs[-1][1]
    summary['reference']['cross_attention_heads'] = dict(
      divergence=[0.1 * seed], agreement=[0.5], entropy=[1.0], peak=[0.4],
      sentences=3,
    )  # fmt: skip
    one_head = dict(divergence=[None], agreement=[None], entropy=[2.0 + seed])
    summary['other']['cross_attention_heads'] = dict(
      one_head, peak=[0.4], sentences=3
    )
    scores = dict(diagonal=[0.2 * seed], asymmetry=[0.0], **one_head)
    summary['other']['self_attention_scores'] = dict(
      encoder=scores, decoder=scores, sentences=3
    )
  rows = {
    line.split(' | ')[0]: line.split(' | ')[1:]
    for line in compare.render_seeds(runs).splitlines()
  }
  # Per layer, the mean over seeds (0, 0.1, 0.2) and over heads.
  qk = '| encoder QK circuit {} (per layer, {})'
  assert rows[qk.format('asymmetry', 'trained weights')][0] == '0.10 / 1.00'
  initial = qk.format('trace ratio, initialized', 'weights before training')
  assert rows[initial][0] == '0.50 / -0.50'
  largest = '| encoder head importance, largest loss rise (per layer, 7 '
  assert rows[largest + 'validation pairs)'][0] == '0.300 / 0.100'
  mean = '| encoder head importance, mean loss rise (per layer, 7 '
  assert rows[mean + 'validation pairs)'][1] == '0.150 / 0.100 |'
  # The attention measures: the seeds' mean; '-' for one head's pairs.
  heads = '| cross-attention, {} (per layer, 3 test sentences)'
  assert rows[heads.format('JS divergence between heads, bits')] == [
    '0.10', '- |'
  ]  # fmt: skip
  assert rows[heads.format('entropy of a head, bits')] == ['1.00', '3.00 |']
  scores = '| decoder self-attention, {} (per layer, 3 test sentences)'
  assert rows[scores.format('weight on itself')] == ['n/a', '0.20 |']
  assert rows[scores.format('argmax agreement between heads')][1] == '- |'
  assert rows[scores.format('weight on itself, initialized')] == [
    '0.10', '0.10 |'
  ]  # fmt: skip
  # No cell or title holds a '|' of its own: every row has a cell a model.
  _, table, holm = compare.render_seeds(runs).split('\n\n')
  for line in table.splitlines():
    assert line.count('|') == 4, line
  # Under the table, Holm's correction: the models are alike in every
  # seed, so no paired difference is significant.
  assert holm.startswith("Holm's correction over the ")
  assert holm.endswith('none significant; smallest adjusted p 1.000.\n')
  # Without circuits.json in every run: no circuit rows.
  (tmp_path / 'seed1' / 'circuits.json').unlink()
  assert 'circuit' not in compare.render_seeds(runs)


def test_seeds_references_are_read_in_the_runs_order_wherever_prepared(
  tmp_path,
):
  """The test split of a copy of the runs' parallel text, prepared
  elsewhere under another data set name, comes in the runs' order."""
  import shutil

  from helpers import command

  from trax_qkv import data
  from trax_qkv.validation import compare

  text = tmp_path / 'text'
  text.mkdir()
  lines = {
    'train': [f'zug {i}' for i in range(4)],
    'test': [f'satz {i} ist hier' for i in range(40)],
  }
  for split, sources in lines.items():
    (text / f'{split}.de').write_text('\n'.join(sources) + '\n')
    (text / f'{split}.en').write_text(
      '\n'.join(s.replace('satz', 'sentence') for s in sources) + '\n'
    )
  run_data = str(tmp_path / 'run_tfds')
  name = data.parallel_text_dataset(str(text), 'de', 'en')
  data.pipeline.prepare_dataset(name, run_data)
  summary = dict(
    dataset=name, keys=['de', 'en'], test_sentences=30,
    config=dict(data_dir=run_data),
  )  # fmt: skip
  runs_order = compare.reference_translations(summary)
  assert len(runs_order) == 30 and len(set(runs_order)) == 30
  assert runs_order != sorted(runs_order)  # TFDS shuffled: order matters
  copy = tmp_path / 'elsewhere'
  shutil.copytree(text, copy)
  here = compare.reference_translations(
    summary, str(copy), str(tmp_path / 'other_tfds')
  )
  assert here == runs_order
  with pytest.raises(ValueError, match='give its --source_dir'):
    compare.reference_translations(dict(summary, dataset='no_such_set'))
  with pytest.raises(SystemExit):  # --source_dir is for --seeds
    command('compare').main(
      ['--runs', 'a', '--sources', 'b', '--source_dir', str(copy),
       '--output_dir', str(tmp_path / 'x')]
    )  # fmt: skip
  assert not (tmp_path / 'x').exists()


@pytest.mark.slow
def test_why_three_dense_tables_are_the_commands_output(tmp_path):
  """docs/why_three_dense.md's results are `trax-qkv-compare --seeds`
  output of the runs committed under docs/runs/why_three_dense, each equal
  to the seeds.md the command wrote there."""
  from helpers import ROOT
  from helpers import require_shared_data
  from helpers import shared_data_dir

  from trax_qkv.validation import compare

  docs = os.path.join(ROOT, 'docs')
  with open(os.path.join(docs, 'why_three_dense.md'), encoding='utf-8') as f:
    blocks = compare.page_tables(f.read())
  experiments = [os.path.basename(os.path.dirname(b.dirs[0])) for b in blocks]
  assert experiments == ['self', 'cross']
  source = require_shared_data('multi30k')
  for dirs, table, margin in blocks:
    run_dirs = [os.path.join(docs, d) for d in dirs]
    runs = [(d, *compare.load_run(d)) for d in run_dirs]
    assert len(runs) >= 3  # seeds
    compare.check_seeds(runs)
    references = compare.reference_translations(
      runs[0][1], source, shared_data_dir(tmp_path)
    )
    assert compare.render_seeds(runs, references, margin=margin) == table
    seeds = os.path.join(os.path.dirname(run_dirs[0]), compare.SEEDS_TABLE)
    with open(seeds, encoding='utf-8') as f:
      assert f.read() == '# Seeds\n\n' + table


def test_holm_line_names_what_survives_the_correction():
  from trax_qkv.validation import compare

  line = compare.holm_line(
    {('a', 'eval loss'): 0.001, ('b', 'eval loss'): 0.5}, 'reference'
  )
  assert '`a` eval loss (adjusted p 0.002); smallest adjusted p 0.002.' in line
  assert '`b`' not in line and 'the 2 paired t tests' in line
