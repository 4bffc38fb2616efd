"""The main job: Transformers with different attention, side by side.

One model per implementation ('trax', 'reference', 'auto', ...), each
running it in the chosen sites (`config.sites`) and Trax's layers elsewhere,
each trained from the same seed on the same list of batches with
`trax.supervised.training.Loop` (resumable, exactly); then each decodes the
test split in predict mode and is scored with sacreBLEU (and exact match).
The report shows whether they agree: with 'reference' the per-step training
losses are those of the built-in ('trax'), bit for bit.
"""

import collections
import dataclasses
import itertools
import os
import time

import jax
import numpy as np
import trax
from trax import layers as tl
from trax.fastmath import numpy as jnp
from trax.supervised import lr_schedules
from trax.supervised import training

from trax_qkv import data as data_lib
from trax_qkv import files
from trax_qkv.models import registry
from trax_qkv.research import head_measures
from trax_qkv.research import self_attention_scores as self_attention_scores_lib
from trax_qkv.supervised import attention_maps
from trax_qkv.supervised import checkpointing
from trax_qkv.supervised import decoding
from trax_qkv.supervised import distributed
from trax_qkv.supervised import locking
from trax_qkv.supervised import model_dir
from trax_qkv.supervised import scoring
from trax_qkv.supervised import training as training_lib
from trax_qkv.validation import config as config_lib
from trax_qkv.validation import environment
from trax_qkv.validation import report

STEP_LOSS = 'metrics/step_loss'  # history entry: every step's training loss
# History entry: wall seconds since the previous step ended (evals and
# checkpoints in between included), so a resumed run's training time adds up.
STEP_SECONDS = 'metrics/step_seconds'


class RecordingLoop(checkpointing.ResumableLoop):
  """A resumable training.Loop that keeps every step's training loss.

  The losses and step times live in the Loop's history, so checkpoints
  carry them and a resumed run reports the whole curve and training time.
  """

  _last_step_end = None

  def run(self, n_steps=1):
    self._last_step_end = time.time()
    super().run(n_steps)

  def _run_one_step(self, task_index, task_changed):
    loss, stats = super()._run_one_step(task_index, task_changed)
    # One loss per device with data parallelism; their mean, as Trax's.
    self.history.append('train', STEP_LOSS, self.step, float(jnp.mean(loss)))
    now = time.time()
    self.history.append(
      'train', STEP_SECONDS, self.step, now - self._last_step_end
    )
    self._last_step_end = now
    return loss, stats

  @property
  def train_seconds(self):
    """Wall time of all steps so far, over every (resumed) run; None when
    the history lacks some steps' times (a checkpoint from before 0.2.0)."""
    seconds = [s for _, s in self.history.get('train', STEP_SECONDS)]
    return sum(seconds) if len(seconds) >= self.step else None

  @property
  def median_step_seconds(self):
    """The median wall time of a step over every (resumed) run: what is
    paid once (compiling, warming the data pipeline) and the evals and
    checkpoints between steps do not move it; None without step times."""
    seconds = [s for _, s in self.history.get('train', STEP_SECONDS)]
    return float(np.median(seconds)) if seconds else None

  @property
  def step_losses(self):
    return [loss for _, loss in self.history.get('train', STEP_LOSS)]


def model_settings(config, vocab_size, implementation):
  """model.json's settings of the model that runs `implementation` in
  `config.sites` and Trax's layers elsewhere (the settings `config.model`
  does not take are left out)."""
  return model_dir.model_settings(
    vocab_size,
    {site: implementation for site in config.sites},
    model=config.model,
    d_model=config.d_model,
    d_ff=config.d_ff,
    n_encoder_layers=config.n_layers,
    n_decoder_layers=config.n_layers,
    n_heads=config.n_heads,
    max_len=max(2 * config.max_length, 64),
    dropout=config.dropout,
  )


def train_one(
  config, model_fn, train_batches, eval_batches, output_dir, log=print
):
  """Trains from `config.seed`, or resumes; returns (loop, seconds of
  training over every run that made the checkpoint).

  Step s trains on `train_batches[s % len]` (entry 0 is TrainTask's shape
  sample); a resumed run picks up at its checkpoint's step.
  """
  # With rsqrt_decay, multifactor divides by sqrt(max(step, warmup)); scale
  # the constant so that `learning_rate` is the peak rate either way.
  peak = config.learning_rate * (
    np.sqrt(config.warmup_steps) if 'rsqrt_decay' in config.lr_factors else 1.0
  )
  schedule = lr_schedules.multifactor(
    constant=peak, factors=config.lr_factors, warmup_steps=config.warmup_steps
  )
  # Every process of a run reads the step once the chief has completed the
  # checkpoint.
  distributed.chief_only(checkpointing.finish_interrupted_save, output_dir)
  done = checkpointing.checkpoint_step(output_dir)
  task = training.TrainTask(
    itertools.islice(itertools.cycle(train_batches), done + 1, None),
    tl.WeightedCategoryCrossEntropy(
      label_smoothing=config.label_smoothing or None
    ),
    trax.optimizers.Adam(config.learning_rate),
    lr_schedule=schedule,
    sample_batch=train_batches[0],
  )
  eval_task = training.EvalTask(
    itertools.cycle(eval_batches),
    [tl.WeightedCategoryCrossEntropy(), tl.WeightedCategoryAccuracy()],
    n_eval_batches=len(eval_batches),
  )
  loop = RecordingLoop(
    model_fn(mode='train'),
    task,
    eval_model=model_fn(mode='eval'),
    eval_tasks=[eval_task],
    output_dir=output_dir,
    random_seed=config.seed,
    eval_at=lambda step: step % config.eval_every == 0 or step == 1,
    checkpoint_at=lambda step: (
      step % config.eval_every == 0 or step == config.steps
    ),
  )
  loop.progress_log = log
  start = time.time()
  loop.run(config.steps - loop.step)
  total = loop.train_seconds
  log(
    f'trained steps {done + 1}-{config.steps} in {time.time() - start:.1f}'
    ' s ('
    + (
      f'{total:.1f} s in all'
      if total is not None
      else 'earlier runs did not record step times'
    )
    + f'), final loss {loop.step_losses[-1]:.4f}'
  )
  return loop, loop.train_seconds


# What every model of a run trains on and is tested with.
Corpus = collections.namedtuple(
  'Corpus',
  'data vocab train_batches eval_batches sources references '
  'source_ids source_length decode_length',
)


def prepare_corpus(config, data, log=print):
  """The batches and test sentences shared by every model of the run."""
  vocab = data.vocab()
  log(
    f'vocabulary: {vocab.vocab_size} subwords ({config.vocab_size} requested)'
  )
  if vocab.vocab_size > 1.1 * config.vocab_size:
    log(
      f'note: the subword builder cannot make a vocabulary smaller than '
      f'the characters of the training text need; --vocab_size '
      f'{config.vocab_size} became {vocab.vocab_size} subwords.'
    )
  inputs = data_lib.TranslationInputs(
    data,
    max_length=config.max_length,
    batch_size=config.batch_size,
    seed=config.seed,
  )
  training_lib.reset_data_counters()
  train_batches = list(itertools.islice(inputs.train_stream(1), config.steps))
  if config.eval_batches:
    eval_batches = list(
      itertools.islice(inputs.eval_stream(1), config.eval_batches)
    )
  else:
    eval_batches = data_lib.split_batches(
      data, 'validation', config.max_length, config.batch_size
    )
  test = data_lib.load_split(data.name, 'test', data.keys, data.data_dir)
  if config.max_test_sentences:
    test = test[: config.max_test_sentences]
  sources = [s for s, _ in test]
  references = [t for _, t in test]
  source_ids = data_lib.encode_with_eos(vocab, sources)
  return Corpus(
    data,
    vocab,
    train_batches,
    eval_batches,
    sources,
    references,
    source_ids,
    max(len(s) for s in source_ids),
    max(len(vocab.encode(t)) for t in references) + 8,
  )


def decode_test(
  config, model_fn, checkpoint, corpus, n_sentences, n_beams, log=print
):
  """(hypotheses, seconds) of the first `n_sentences` test sentences."""
  batch = decoding.batch_rows(n_sentences, config.decode_batch_size)
  how = 'greedy' if n_beams == 1 else f'beam search, {n_beams} beams'
  log(f'decoding {n_sentences} test sentences ({how}, {batch} at a time) ...')
  start = time.time()
  ids = decoding.decode(
    model_fn,
    checkpoint,
    corpus.source_ids[:n_sentences],
    n_beams=n_beams,
    batch_size=config.decode_batch_size,
    max_length=corpus.decode_length,
    source_length=corpus.source_length,
    description='greedy decoding' if n_beams == 1 else 'beam search',
    log=log,
  )
  return [corpus.vocab.decode(h) for h in ids], time.time() - start


def beam_search_scores(config, model_fn, checkpoint, corpus, log=print):
  """Beam search on the first `config.beam_sentences` test sentences.

  None means every test sentence. Returns {} when there are none, else
  the beams' sacreBLEU / exact-match scores, 'sentences', 'seconds' and
  the 'hypotheses' themselves.
  """
  n = (
    len(corpus.source_ids)
    if config.beam_sentences is None
    else min(config.beam_sentences, len(corpus.source_ids))
  )
  if n == 0:
    return {}
  hypotheses, seconds = decode_test(
    config, model_fn, checkpoint, corpus, n, config.n_beams, log
  )
  return dict(
    scoring.scores(hypotheses, corpus.references[:n], config.bleu_tokenize),
    sentences=n,
    seconds=seconds,
    hypotheses=hypotheses,
  )


def _eval_metric(loop, name):
  history = loop.history.get('eval', f'metrics/{name}')
  return float(history[-1][1]) if history else None


def _eval_curve(loop, name):
  """[[step, value]] of every evaluation so far, over every (resumed) run:
  the checkpoint's history carries the earlier ones."""
  return [
    [int(step), float(value)]
    for step, value in loop.history.get('eval', f'metrics/{name}')
  ]


def _write_lines(path, lines):
  files.write_text(path, ''.join(line + '\n' for line in lines))


def run_validation(config, output_dir, log=print):
  """Trains, decodes and scores every implementation; writes the report.

  Everything is checked before anything is written.

  Args:
    config: a `ValidationConfig`.
    output_dir: where the run directories, decodes and report go; an
      earlier run there with the same settings is resumed.
    log: called with each progress line.

  Returns:
    The summary dict also written to `summary.json`; its per-model
    entries, run directories and decode files are named by implementation
    ('trax', 'reference', ...). As one process of several: None on all
    but the chief, which alone decodes, scores and writes.
  """
  config.check()
  output_dir = training_lib.check_output_dir(output_dir)
  # Refused before data is prepared or the directory is touched; checked
  # again once it is held, where no other run can change it.
  config_lib.check_same_run(config, output_dir)
  log(f'preparing data {config.source_dir or config.dataset} ...')

  def prepare_data():
    return data_lib.prepare_translation_data(
      config.dataset,
      config.keys,
      config.source_dir,
      config.data_dir,
      config.vocab_size,
    )

  # Across processes the chief prepares the data; the others then read it.
  data = distributed.chief_first(prepare_data)
  with locking.hold_output_dir(output_dir):
    config_lib.check_same_run(config, output_dir)
    for name in config.implementations:
      checkpointing.check_checkpoint_files(os.path.join(output_dir, name))
    if distributed.is_chief():
      config_lib.write_run_config(config, output_dir)
    corpus = prepare_corpus(config, data, log)
    # Attention maps of the bit-identical layers, else of the first model.
    mapped = (
      'reference'
      if 'reference' in config.implementations
      else config.implementations[0]
    )
    results, histories, decodes = {}, {}, {}
    for name in config.implementations:
      results[name], histories[name], decodes[name] = run_one(
        config, name, corpus, output_dir, name == mapped, log
      )
    if not distributed.is_chief():
      return None
    return write_summary(
      config, corpus, results, histories, decodes, output_dir
    )


def run_one(config, name, corpus, output_dir, draw_maps, log=print):
  """Trains, decodes and scores the model of implementation `name`; writes
  its decodes (and attention maps if `draw_maps`). Returns (its results,
  its per-step training losses, its greedy hypotheses). As one process of
  several, all train it; the chief alone writes, decodes and scores, and
  the others return (None, None, None)."""
  settings = model_settings(config, corpus.vocab.vocab_size, name)
  log(
    f'== {name}: '
    + ', '.join(
      f'{site} {implementation!r}'
      for site, implementation in settings[model_dir.ATTENTION].items()
    )
  )
  model_fn = model_dir.model_fn(settings)
  run_dir = os.path.join(output_dir, name)
  if distributed.is_chief():
    model_dir.save(
      run_dir,
      settings,
      os.path.join(corpus.data.vocab_dir, corpus.data.vocab_file),
    )
  loop, seconds = train_one(
    config, model_fn, corpus.train_batches, corpus.eval_batches, run_dir, log
  )
  if not distributed.is_chief():
    return None, None, None
  checkpoint = os.path.join(run_dir, model_dir.CHECKPOINT)
  hypotheses, decode_seconds = decode_test(
    config, model_fn, checkpoint, corpus, len(corpus.source_ids), 1, log
  )
  beam = beam_search_scores(config, model_fn, checkpoint, corpus, log)
  # One viz-mode model for the head measures and the maps.
  reader = attention_maps.CrossAttentionReader(
    model_fn, checkpoint, settings['max_len']
  )
  results = dict(
    scoring.scores(hypotheses, corpus.references, config.bleu_tokenize),
    **{f'beam_{k}': v for k, v in beam.items() if k != 'hypotheses'},
    final_loss=loop.step_losses[-1],
    eval_loss=_eval_metric(loop, 'WeightedCategoryCrossEntropy'),
    eval_accuracy=_eval_metric(loop, 'WeightedCategoryAccuracy'),
    eval_loss_curve=_eval_curve(loop, 'WeightedCategoryCrossEntropy'),
    train_seconds=seconds,
    step_ms=(
      None
      if loop.median_step_seconds is None
      else 1000 * loop.median_step_seconds
    ),
    decode_seconds=decode_seconds,
    attention=settings[model_dir.ATTENTION],
    parameters=int(
      sum(np.size(w) for w in jax.tree_util.tree_leaves(loop.model.weights))
    ),
    cross_attention_heads=cross_attention_heads(reader, corpus, log),
    self_attention_scores=self_attention_scores(
      settings, checkpoint, corpus, config.score_sentences, log
    ),
  )
  log(
    f'{name}: '
    + ', '.join(
      f'{k} {v:.4g}' for k, v in results.items() if isinstance(v, float)
    )
  )
  _write_lines(os.path.join(output_dir, f'decodes_{name}.txt'), hypotheses)
  _write_lines(
    os.path.join(output_dir, f'decodes_beam_{name}.txt'),
    beam.get('hypotheses', []),
  )
  if draw_maps:
    draw_attention_maps(config, name, reader, corpus, hypotheses, output_dir)
  return results, loop.step_losses, hypotheses


HEAD_SENTENCES = 200  # test sentences whose cross-attention is measured
HEAD_BATCH = 50  # of them at a time


def _targets(corpus, translations, n):
  """The first `n` of `translations` as ids to teacher-force, EOS last."""
  return data_lib.encode_with_eos(corpus.vocab, translations[:n])


def cross_attention_heads(reader, corpus, log=print):
  """`head_measures.model_measures` of the cross-attention layers (read by
  `reader`, an `attention_maps.CrossAttentionReader`) over the first
  `HEAD_SENTENCES` test sentences, teacher-forcing their reference
  translations (every model measured on the same targets), with the
  number of sentences."""
  n = min(HEAD_SENTENCES, len(corpus.source_ids))
  log(f'measuring the cross-attention heads on {n} test sentences ...')
  return dict(
    head_measures.model_measures(
      reader, corpus.source_ids[:n], _targets(corpus, corpus.references, n),
      HEAD_BATCH,
    ),
    sentences=n,
  )  # fmt: skip


def self_attention_scores(settings, checkpoint, corpus, sentences, log=print):
  """`research.self_attention_scores` (a position's weight on itself,
  the scores' asymmetry) of a Transformer's encoder and decoder over the
  first `sentences` test sentences, teacher-forcing their reference
  translations, with the number of sentences; None where `sentences` is
  0 or the model has no self-attention. (JAX runs eagerly there: seconds
  per sentence batch, so it is asked for, not a default.)"""
  if not sentences or (
    registry.SELF_ATTENTION not in settings[model_dir.ATTENTION]
  ):
    return None
  n = min(sentences, len(corpus.source_ids))
  log(f'measuring the self-attention scores on {n} test sentences ...')
  measured = model_dir.model_fn(
    settings, self_attention_scores_lib.measured_attention(settings)
  )
  return dict(
    self_attention_scores_lib.self_attention_scores(
      measured, checkpoint, corpus.source_ids[:n],
      _targets(corpus, corpus.references, n),
    ),
    sentences=n,
  )  # fmt: skip


def draw_attention_maps(config, name, reader, corpus, hypotheses, output_dir):
  """cross_attention_{i}.png of the first `config.heatmap_sentences` test
  sentences, teacher-forcing the model's own greedy translations."""
  n = min(config.heatmap_sentences, len(corpus.source_ids))
  if not n:
    return
  # Read as the head measures' first batch: the same shape, no new program.
  m = max(n, min(HEAD_BATCH, HEAD_SENTENCES, len(corpus.source_ids)))
  targets = _targets(corpus, hypotheses, m)
  weights = reader(corpus.source_ids[:m], targets)
  for i in range(n):
    report.plot_heatmaps(
      [w[i] for w in weights],
      attention_maps.token_pieces(corpus.vocab, corpus.source_ids[i]),
      attention_maps.token_pieces(corpus.vocab, targets[i]),
      os.path.join(output_dir, f'cross_attention_{i}.png'),
      f'{name}: "{corpus.sources[i]}" -> "{hypotheses[i]}"',
    )


def write_summary(config, corpus, results, histories, decodes, output_dir):
  """Writes summary.json, report.md and loss_curves.png; returns the
  summary, with the stack and CPU it ran on. The first two models are
  compared: largest per-step loss difference and share of identical
  greedy decodes."""
  names = list(histories)
  summary = dict(
    dataset=corpus.data.name,
    keys=list(corpus.data.keys),
    vocab_size=corpus.vocab.vocab_size,
    steps=config.steps,
    seed=config.seed,
    test_sentences=len(corpus.references),
    config=dataclasses.asdict(config),
    environment=environment.describe(),
    **results,
  )
  if len(names) >= 2:
    a, b = names[:2]
    summary['max_loss_diff'] = float(
      np.max(np.abs(np.asarray(histories[a]) - np.asarray(histories[b])))
    )
    summary['identical_decodes'] = float(
      np.mean([x == y for x, y in zip(decodes[a], decodes[b])])
    )
  report.plot_loss_curves(
    histories, os.path.join(output_dir, 'loss_curves.png')
  )
  files.write_json(
    os.path.join(output_dir, 'summary.json'), summary, default=str
  )
  files.write_text(
    os.path.join(output_dir, 'report.md'), report.render_report(summary, names)
  )
  return summary
