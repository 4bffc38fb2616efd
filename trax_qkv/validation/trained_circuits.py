"""What the trained weights of a validation run's models say:
`trax_qkv.research.circuits` of each model, written to circuits.json
beside its summary.json, for `trax-qkv-compare --seeds` to show.
"""

import os

import jax
import numpy as np
from trax import shapes

from trax_qkv import data as data_lib
from trax_qkv import files
from trax_qkv.research import circuits
from trax_qkv.research import self_attention_scores
from trax_qkv.supervised import attention_maps
from trax_qkv.supervised import model_dir
from trax_qkv.validation import config as config_lib

CIRCUITS_FILE = 'circuits.json'


def _run_config(run_dir):
  config = config_lib.read_run_config(run_dir)
  if config is None:
    raise ValueError(
      f'runs: {run_dir} has no {config_lib.RUN_CONFIG}; give output '
      'directories of trax-qkv-validate runs.'
    )
  return config


def _prepared_data(config, source_dir=None, data_dir=None):
  """The run's translation data, prepared (again) here: from `source_dir`
  and into `data_dir` where given, else where the run had them."""
  return data_lib.prepare_translation_data(
    config['dataset'],
    tuple(config['keys']),
    source_dir or config['source_dir'],
    data_dir or config['data_dir'],
    config['vocab_size'],
  )


def _test_sentences(config, data, vocab, n):
  """(sources, source ids, target ids) of the first `n` test sentences the
  run was tested on, each target its reference translation and EOS, as
  the run's summary measured them; `vocab` is `data`'s."""
  test = data_lib.load_split(data.name, 'test', data.keys, data.data_dir)
  test = test[: config['max_test_sentences'] or None][:n]
  sources = [s for s, _ in test]
  return (
    sources,
    data_lib.encode_with_eos(vocab, sources),
    data_lib.encode_with_eos(vocab, [t for _, t in test]),
  )


def _checked_models(run_dir, config):
  """{name: ModelDir} of the run's models, every one a trained
  Transformer, checked before any is measured."""
  found = {}
  for name in config['implementations']:
    found[name] = model_dir.load(os.path.join(run_dir, name))
    kind = model_dir.architecture(found[name].settings).name
    if kind != model_dir.TRANSFORMER.name:
      raise ValueError(
        f'runs: {run_dir}/{name} is a {kind}; the circuits are read from '
        'Transformers (--model transformer).'
      )
  return found


def measure(run_dir, log=print):
  """Writes `CIRCUITS_FILE` into `run_dir`, a completed trax-qkv-validate
  output directory, and returns what it holds: {'validation_pairs': n,
  'sentence': {'source': ..., 'tokens': ...}, name: {'circuits': ...,
  'initial_circuits': ..., 'importance': ..., 'sentence_attention': ...}}
  per model, as `circuits.model_circuits` (of the trained model, and of
  the same model freshly initialized from the run's seed),
  `circuits.head_importance` (on the run's validation split) and
  `self_attention_scores.sentence_attention` (the first test sentence's
  encoder self-attention, per layer (heads, L, L), to 3 decimals) give
  them.

  Only the sites the run varied (its `sites`) are read. Models that ran
  Trax's layer or a kernel are read as 'reference' (the same weights and
  math, and one layer tree to read).

  Raises:
    ValueError: the directory is not a completed run of Transformers
      (before anything is computed or written).
  """
  config = _run_config(run_dir)
  models = _checked_models(run_dir, config)
  data = _prepared_data(config)
  batches = data_lib.split_batches(
    data, 'validation', config['max_length'], config['batch_size']
  )
  result = {'validation_pairs': int(sum(b[2][:, 0].sum() for b in batches))}
  # One test sentence's encoder self-attention, to draw.
  vocab = data.vocab()
  sources, source_ids, target_ids = _test_sentences(config, data, vocab, 1)
  result['sentence'] = dict(
    source=sources[0],
    tokens=attention_maps.token_pieces(vocab, source_ids[0]),
  )
  signature = shapes.signature(batches[0][:2])
  for name, found in models.items():
    log(f'{name}: reading the circuits, masking each head ...')
    settings = found.settings
    measured = self_attention_scores.measured_attention(settings)
    attention = {site: measured[site] for site in config['sites']}
    n_heads = settings['n_heads']
    build = model_dir.model_fn(settings, measured)
    # The same model as initialized: what the measures are before any
    # training (a fresh draw from the run's seed; the run keeps no step 0).
    initial = build(mode='eval')
    initial.init(signature, rng=jax.random.PRNGKey(config['seed']))
    model = build(mode='eval')
    model.init_from_file(
      found.checkpoint, weights_only=True, input_signature=signature
    )
    result[name] = dict(
      circuits=circuits.model_circuits(model, attention, n_heads),
      initial_circuits=circuits.model_circuits(initial, attention, n_heads),
      importance=circuits.head_importance(model, attention, n_heads, batches),
      sentence_attention=[
        np.round(weights, 3).tolist()
        for weights in self_attention_scores.sentence_attention(
          build, found.checkpoint, source_ids[0], target_ids[0]
        )
      ],
    )
  files.write_json(os.path.join(run_dir, CIRCUITS_FILE), result)
  return result


INITIAL_SCORES_FILE = 'initial_scores.json'


def initial_scores(run_dir, source_dir=None, data_dir=None, log=print):
  """Writes `INITIAL_SCORES_FILE` into `run_dir`, a trax-qkv-validate
  output directory, and returns what it holds: per model, the
  self-attention score measures (`research.self_attention_scores`) of
  the model freshly initialized from the run's seed, on the sentences
  its summary.json measured the trained model on (the first
  `score_sentences` test sentences, teacher-forcing their references).

  Needs no checkpoint: the run's settings and data rebuild it.
  `source_dir` and `data_dir`, where given, are where the run's parallel
  text and prepared data are on this machine.

  Raises:
    ValueError: the directory holds no run, or its run measured no
      self-attention scores (before anything is computed or written).
  """
  import tempfile

  from trax_qkv.validation import run as run_lib

  config = _run_config(run_dir)
  transformer = config['model'] == model_dir.TRANSFORMER.name
  if not (config['score_sentences'] and transformer):
    raise ValueError(
      f'runs: {run_dir} measured no self-attention scores (a Transformer '
      'run with --score_sentences > 0 does).'
    )
  data = _prepared_data(config, source_dir, data_dir)
  vocab = data.vocab()
  sources, source_ids, target_ids = _test_sentences(
    config, data, vocab, config['score_sentences']
  )
  # The weights' shapes do not depend on the length: any batch inits.
  tokens = np.ones((1, 4), np.int32)
  signature = shapes.signature((tokens, tokens))
  settings_of = config_lib.from_dict(config)
  result = {'sentences': len(sources)}
  with tempfile.TemporaryDirectory() as scratch:
    for name in config['implementations']:
      log(f'{name}: the self-attention scores at initialization ...')
      settings = run_lib.model_settings(settings_of, vocab.vocab_size, name)
      build = model_dir.model_fn(
        settings, self_attention_scores.measured_attention(settings)
      )
      initial = build(mode='eval')
      initial.init(signature, rng=jax.random.PRNGKey(config['seed']))
      path = os.path.join(scratch, f'{name}.pkl.gz')
      initial.save_to_file(path)
      result[name] = self_attention_scores.self_attention_scores(
        build, path, source_ids, target_ids
      )
  files.write_json(os.path.join(run_dir, INITIAL_SCORES_FILE), result)
  return result
