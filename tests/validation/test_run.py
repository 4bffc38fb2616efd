"""The main job end to end on a tiny corpus, and validate.py's interface."""

import dataclasses
import json

from helpers import command
from helpers import shared_data_dir
from helpers import tiny_validation_config
import jax
import numpy as np
import pytest

from trax_qkv.supervised import scoring
from trax_qkv.validation import compare
from trax_qkv.validation import config as config_lib
from trax_qkv.validation import report
from trax_qkv.validation import run as validation


@pytest.mark.parametrize(
  'name',
  [
    'train',
    'validate',
    'bench',
    'bench_kernels',
    'translate',
    'attention_map',
    'compare',
    'circuits',
  ],
)
def test_every_command_documents_every_flag(name, capsys):
  parser = command(name).build_parser()
  for action in parser._actions:
    assert action.help, action.option_strings
  with pytest.raises(SystemExit) as exit_info:
    command(name).main(['--help'])
  assert exit_info.value.code == 0
  assert f'usage: trax-qkv-{name.replace("_", "-")}' in capsys.readouterr().out


def test_validate_flags_are_the_config_fields_with_their_defaults():
  """Each setting's default and help is written once, in ValidationConfig."""
  parser = command('validate').build_parser()
  defaults = config_lib.from_flags(parser.parse_args([]))
  assert defaults == config_lib.ValidationConfig()
  help_text = ' '.join(parser.format_help().split())
  for field in dataclasses.fields(config_lib.ValidationConfig):
    assert f'--{field.name}' in help_text, field.name
    assert ' '.join(field.metadata['help'].split()) in help_text, field.name
  args = parser.parse_args(
    [
      '--keys',
      'de',
      'en',
      '--implementations',
      'trax',
      'auto',
      '--beam_sentences',
      '0',
    ]
  )
  config = config_lib.from_flags(args)
  assert config.keys == ('de', 'en')
  assert config.implementations == ('trax', 'auto')
  assert config.beam_sentences == 0


def test_scores_use_sacrebleu():
  perfect = scoring.scores(['a small dog runs .'], ['a small dog runs .'])
  assert perfect['bleu'] == pytest.approx(100.0)
  assert perfect['exact_match'] == 1.0
  cased = scoring.scores(['A small dog runs .'], ['a small dog runs .'])
  assert cased['bleu'] < 100.0 and cased['bleu_lowercase'] == pytest.approx(
    100.0
  )
  with pytest.raises(ValueError, match='1 hypotheses for 2 references'):
    scoring.scores(['x'], ['x', 'y'])
  # Single words (the numbers corpus's German): sacreBLEU says 0.00 for a
  # perfect translation; we say undefined, and why.
  words = scoring.scores(['einundzwanzig', 'neun'], ['einundzwanzig', 'neun'])
  assert words['bleu'] is None and words['bleu_lowercase'] is None
  assert 'no translation has 2 or more tokens' in words['bleu_undefined']
  assert words['chrf'] == pytest.approx(100.0)
  assert words['exact_match'] == 1.0
  three = scoring.scores(['a b c'], ['a b c'])
  assert three['bleu'] is None and 'has 4 or more' in three['bleu_undefined']


def test_paired_bootstrap_of_a_difference():
  references = [f'a small dog number {i} runs in the park .' for i in range(40)]
  worse = [r.replace('dog', 'cat') for r in references]
  half = references[:20] + worse[20:]
  # A system against itself: no difference, and no interval around it.
  assert scoring.paired_bootstrap(references, [worse], [worse]) == (0, 0, 0)
  delta, low, high = scoring.paired_bootstrap(
    references, [worse, worse], [references, half], n_samples=200
  )
  # The observed difference is the mean over the two seeds of sacreBLEU's.
  bleu = {
    name: scoring.scores(h, references)['bleu_lowercase']
    for name, h in (('worse', worse), ('ref', references), ('half', half))
  }
  expected = (
    (bleu['ref'] - bleu['worse']) + (bleu['half'] - bleu['worse'])
  ) / 2
  assert delta == pytest.approx(expected)
  assert 0 < low < delta < high
  with pytest.raises(ValueError, match='same number'):
    scoring.paired_bootstrap(references, [worse], [])
  with pytest.raises(ValueError, match='1 hypotheses for 40 references'):
    scoring.paired_bootstrap(references, [['x']], [['x']])


def test_bad_config_is_rejected_before_any_work(tmp_path):
  bad = config_lib.ValidationConfig(d_model=30, n_heads=4)
  with pytest.raises(ValueError, match=r'd_model \(30\) must be divisible'):
    validation.run_validation(bad, str(tmp_path / 'out'))
  with pytest.raises(ValueError, match='implementation must be one of'):
    validation.run_validation(
      config_lib.ValidationConfig(implementations=('nope',)),
      str(tmp_path / 'out'),
    )
  with pytest.raises(
    ValueError,
    match=r'sites must name one or more of '
    r"\('self_attention', 'causal_attention', "
    r"'cross_attention'\) \(the sites of model 'transformer'\); got "
    r"\('encoder',\)",
  ):
    validation.run_validation(
      config_lib.ValidationConfig(sites=('encoder',)), str(tmp_path / 'out')
    )
  with pytest.raises(ValueError, match='beam_sentences must be an int >= 0'):
    validation.run_validation(
      config_lib.ValidationConfig(beam_sentences=-1), str(tmp_path / 'out')
    )
  with pytest.raises(ValueError, match='n_beams must be a positive int'):
    validation.run_validation(
      config_lib.ValidationConfig(n_beams=0), str(tmp_path / 'out')
    )
  assert not (tmp_path / 'out').exists()


def _assert_same_attention_measures(summary, config, out):
  """trax and reference are the same model: the same parameters, heads
  and self-attention scores (each measured with the reference kernel),
  the scores in report.md too."""
  heads = summary['reference']['cross_attention_heads']
  assert heads == summary['trax']['cross_attention_heads']
  assert heads['sentences'] == config.max_test_sentences
  assert len(heads['divergence']) == config.n_layers
  assert 0 < heads['divergence'][0] < 1 and 0 < heads['peak'][0] <= 1
  assert summary['trax']['parameters'] == summary['reference']['parameters']
  scores = summary['reference']['self_attention_scores']
  assert scores == summary['trax']['self_attention_scores']
  for part in ('encoder', 'decoder'):
    assert len(scores[part]['asymmetry']) == config.n_layers
    assert 0 < scores[part]['diagonal'][0] < 1
  report = (out / 'report.md').read_text()
  assert '| encoder self-attention, weight on itself' in report


@pytest.mark.slow
def test_tiny_side_by_side_run_in_every_site_is_identical(tmp_path):
  """'reference' in encoder self-, decoder causal and cross-attention: the
  same losses, decodes (greedy and beam) and attention measures as Trax's
  layers; the report says what ran where; every file is written, and the
  commands that read a run (compare, circuits) read it. Evaluated on the
  whole validation split, each sentence once."""
  config = tiny_validation_config(
    shared_data_dir(tmp_path), 12, 6,
    beam_sentences=2, heatmap_sentences=2, score_sentences=3, eval_batches=0,
    sites=('self_attention', 'causal_attention', 'cross_attention'),
  )  # fmt: skip
  out = tmp_path / 'out'
  summary = validation.run_validation(config, str(out), log=lambda _: None)
  for name in (
    'report.md',
    'summary.json',
    'loss_curves.png',
    'cross_attention_0.png',
    'cross_attention_1.png',
    'decodes_trax.txt',
    'decodes_reference.txt',
    'decodes_beam_trax.txt',
    'decodes_beam_reference.txt',
  ):
    assert (out / name).stat().st_size > 0, name
  assert (out / 'decodes_beam_trax.txt').read_text() == (
    out / 'decodes_beam_reference.txt'
  ).read_text()
  assert summary['reference']['beam_sentences'] == 2
  assert json.loads((out / 'summary.json').read_text()) == json.loads(
    json.dumps(summary, default=str)
  )
  assert summary['steps'] == 12
  curve = summary['reference']['eval_loss_curve']
  assert [step for step, _ in curve] == [1, 6, 12]  # eval_at's steps
  assert curve[-1][1] == summary['reference']['eval_loss']
  assert curve == summary['trax']['eval_loss_curve']
  assert summary['max_loss_diff'] == 0.0
  assert summary['identical_decodes'] == 1.0
  for label in ('trax', 'reference'):
    for key in (
      'bleu',
      'bleu_lowercase',
      'exact_match',
      'final_loss',
      'train_seconds',
    ):
      assert key in summary[label]
  assert summary['trax']['final_loss'] == summary['reference']['final_loss']
  assert 'Max |difference|' in (out / 'report.md').read_text()
  assert summary['trax']['step_ms'] > 0
  assert '| training step, median (ms) |' in (out / 'report.md').read_text()
  assert 'training time' not in (out / 'report.md').read_text()
  _assert_same_attention_measures(summary, config, out)
  _assert_compare_reads_the_run(summary, out)
  assert summary['environment']['jax'] == jax.__version__
  assert 'Ran on Python ' in (out / 'report.md').read_text()
  _assert_every_site_reference_and_circuits(summary, config, out, tmp_path)
  # The same output_dir with another model size: refused, nothing touched.
  before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
  with pytest.raises(ValueError, match=r'other settings \(d_model 32 -> 64\)'):
    validation.run_validation(dataclasses.replace(config, d_model=64), str(out))
  assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def _assert_compare_reads_the_run(summary, out):
  """trax-qkv-compare: the table of the run, and both models' maps."""
  assert (
    command('compare').main(
      ['--runs', str(out), '--sources', 'one', '--output_dir', str(out / 'cmp')]
    )
    == 0
  )
  table = (out / 'cmp' / 'comparison.md').read_text()
  assert '| | `trax` | `reference` |' in table
  row = f'| parameters | {summary["trax"]["parameters"]:,} |'
  assert row in table
  head_rows = report.head_rows(summary, ['trax', 'reference'])
  assert len(head_rows) == len(report.HEAD_ROWS)
  assert all(r in table for r in head_rows)  # as report.md shows them
  assert (out / 'cmp' / 'maps_0.png').stat().st_size > 0
  assert (
    command('compare').main(
      [
        '--runs',
        str(out),
        '--sources',
        'a',
        'b',
        '--output_dir',
        str(out / 'x'),
      ]
    )
    == 2
  )
  assert not (out / 'x').exists()


def _assert_sentence_attention_is_trax_own(out, measured):
  """circuits.json's first test sentence's encoder self-attention is what
  Trax's own layers hold in 'viz' mode, each PureAttention's weights."""
  from trax import shapes

  from trax_qkv.models import registry
  from trax_qkv.supervised import model_dir
  from trax_qkv.validation import trained_circuits as tc

  config = tc._run_config(str(out))
  data = tc._prepared_data(config)
  source, source_ids, target_ids = tc._test_sentences(
    config, data, data.vocab(), 1
  )
  assert measured['sentence']['source'] == source[0]
  assert len(measured['sentence']['tokens']) == len(source_ids[0])
  found = model_dir.load(str(out / 'trax'))
  viz = model_dir.model_fn(found.settings)(mode='viz')
  batch = (np.asarray(source_ids), np.asarray(target_ids))
  viz.init_from_file(
    found.checkpoint, weights_only=True, input_signature=shapes.signature(batch)
  )
  viz(batch)
  trax_own = [
    np.asarray(core.state)[0]
    for site, layer in registry.attention_sites(viz)
    if site == registry.SELF_ATTENTION
    for core in registry.walk(layer)
    if type(core).__name__ == 'PureAttention'
  ]
  for name in ('trax', 'reference'):
    read = measured[name]['sentence_attention']
    assert len(read) == len(trax_own) == 1  # the tiny model's one layer
    np.testing.assert_allclose(read[0], trax_own[0], atol=6e-4, rtol=0)


def _assert_every_site_reference_and_circuits(summary, config, out, tmp_path):
  """The report says what ran where; trax-qkv-circuits reads the same
  weights the same, in every site."""
  assert summary['trax']['eval_loss'] == summary['reference']['eval_loss']
  assert summary['reference']['attention'] == {
    'self_attention': 'reference',
    'causal_attention': 'reference',
    'cross_attention': 'reference',
  }
  assert set(summary['trax']['attention'].values()) == {'trax'}
  assert (
    '| attention: encoder self / decoder causal / cross | '
    'trax / trax / trax | reference / reference / reference |'
  ) in (out / 'report.md').read_text()
  saved = json.loads((out / 'reference' / 'model.json').read_text())
  assert saved['attention']['causal_attention'] == 'reference'
  assert command('circuits').main([str(out)]) == 0
  measured = json.loads((out / 'circuits.json').read_text())
  assert measured['trax'] == measured['reference']
  trained = measured['reference']
  assert trained['initial_circuits'] != trained['circuits']  # it trained
  assert set(measured['trax']['circuits']) == {'encoder', 'decoder', 'cross'}
  assert len(measured['trax']['importance']['cross']) == config.n_layers
  assert measured['validation_pairs'] > 0
  _assert_sentence_attention_is_trax_own(out, measured)
  loaded = [(str(out), *compare.load_run(str(out)))]
  rows = compare.circuit_rows([str(out)], loaded[0][2])
  assert len(rows) == 3 * len(compare.CIRCUIT_ROWS)
  assert any(r.startswith('| decoder QK circuit asymmetry') for r in rows)
  assert command('circuits').main([str(tmp_path)]) == 2  # not a run
  # The self-attention scores as initialized: the two models are one
  # model (bit-identical layers, one seed), and training moved them.
  assert command('circuits').main(['--initial_scores', str(out)]) == 0
  initial = json.loads((out / 'initial_scores.json').read_text())
  assert initial['sentences'] == config.score_sentences
  assert initial['trax'] == initial['reference']
  trained_scores = summary['reference']['self_attention_scores']
  assert initial['reference']['encoder'] != trained_scores['encoder']
  rows = compare.initial_score_rows([str(out)], ['trax', 'reference'])
  assert any(
    r.startswith('| encoder self-attention, weight on itself, initialized')
    for r in rows
  )
  assert command('circuits').main(['--source_dir', 'x', str(out)]) == 2
