"""The main job: train built-in and plugin cross-attention side by side.

Both Transformers are trained from the same seed on the same list of batches
with `trax.supervised.training.Loop`; then each decodes the test split in
predict mode and is scored with sacreBLEU (and exact match). The report shows
whether the two agree: with the reference plugin the per-step training losses
are identical, not merely close.
"""

import dataclasses
import functools
import itertools
import json
import os
import time

import numpy as np
import trax
from trax import layers as tl
from trax import shapes
from trax.supervised import lr_schedules
from trax.supervised import training

from trax_qkv import checkpointing
from trax_qkv import data as data_lib
from trax_qkv import evaluation
from trax_qkv import transformer
from trax_qkv.training import check_output_dir

NAMES = {'trax': 'builtin', 'trax_qkv': 'plugin'}  # report labels
STEP_LOSS = 'metrics/step_loss'  # history entry: every step's training loss
RUN_CONFIG = 'validation_config.json'  # the settings of the run in output_dir
MAY_CHANGE_ON_RESUME = ('steps', 'implementations', 'data_dir',
                        'max_test_sentences', 'decode_batch_size',
                        'beam_sentences', 'n_beams', 'heatmap_sentences')


@dataclasses.dataclass
class ValidationConfig:
  """What to train and how; the defaults are the embedded numbers run."""
  dataset: str = 'trax_qkv_numbers'
  source_dir: str = None
  keys: tuple = ('en', 'de')
  data_dir: str = None
  vocab_size: int = 512
  d_model: int = 128
  d_ff: int = 256
  n_layers: int = 2
  n_heads: int = 4
  dropout: float = 0.1
  max_length: int = 32
  batch_size: int = 64
  steps: int = 1500
  learning_rate: float = 0.002
  warmup_steps: int = 100
  lr_factors: str = 'constant * linear_warmup'
  label_smoothing: float = 0.0
  eval_every: int = 250
  seed: int = 0
  implementations: tuple = ('trax', 'trax_qkv')
  max_test_sentences: int = None
  decode_batch_size: int = 100
  beam_sentences: int = None  # None: every test sentence
  n_beams: int = 4
  heatmap_sentences: int = 3

  def check(self):
    for name in ('vocab_size', 'd_model', 'd_ff', 'n_layers', 'n_heads',
                 'max_length', 'batch_size', 'steps', 'eval_every',
                 'decode_batch_size', 'n_beams'):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be a positive int; got {value!r}.')
    for name in ('beam_sentences', 'heatmap_sentences'):
      value = getattr(self, name)
      if value is None and name == 'beam_sentences':
        continue
      if not isinstance(value, int) or value < 0:
        raise ValueError(f'{name} must be an int >= 0; got {value!r}.')
    if self.d_model % self.n_heads:
      raise ValueError(f'd_model ({self.d_model}) must be divisible by '
                       f'n_heads ({self.n_heads}).')
    for name in ('dropout', 'label_smoothing'):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f'{name} must be in [0, 1); got '
                         f'{getattr(self, name)}.')
    if not self.implementations:
      raise ValueError('implementations must name at least one of '
                       f'{transformer.cross_attention_implementations()}.')
    for name in self.implementations:
      transformer.resolve_cross_attention(name)


class RecordingLoop(checkpointing.ResumableLoop):
  """A resumable training.Loop that keeps every step's training loss.

  The losses live in the Loop's history, so checkpoints carry them and a
  resumed run reports the whole curve.
  """

  def _run_one_step(self, task_index, task_changed):
    loss, stats = super()._run_one_step(task_index, task_changed)
    self.history.append('train', STEP_LOSS, self.step, float(loss))
    return loss, stats

  @property
  def step_losses(self):
    return [loss for _, loss in self.history.get('train', STEP_LOSS)]


def check_same_run(config, output_dir):
  """Raises ValueError if `output_dir` holds a run with other settings.

  A rerun resumes the checkpoints there, which is only the same run if
  everything that shapes training is the same; more `steps` (train longer)
  and what is decoded may change.
  """
  path = os.path.join(output_dir, RUN_CONFIG)
  if not os.path.exists(path):
    return
  with open(path) as f:
    earlier = json.load(f)
  current = json.loads(json.dumps(dataclasses.asdict(config)))  # lists
  changed = [f'{k} {earlier.get(k)!r} -> {v!r}' for k, v in current.items()
             if k not in MAY_CHANGE_ON_RESUME and earlier.get(k) != v]
  if changed:
    raise ValueError(
        f'output_dir {output_dir} holds a run with other settings '
        f'({"; ".join(changed)}); rerun with the same settings to resume it, '
        'or choose a new --output_dir.')


def _label(implementation):
  return NAMES.get(implementation, implementation)


def model_factory(config, vocab_size, implementation):
  return functools.partial(
      transformer.CrossAttentionTransformer, vocab_size,
      d_model=config.d_model, d_ff=config.d_ff,
      n_encoder_layers=config.n_layers, n_decoder_layers=config.n_layers,
      n_heads=config.n_heads, max_len=max(2 * config.max_length, 64),
      dropout=config.dropout, cross_attention=implementation)


def train_one(config, model_fn, train_batches, eval_batches, output_dir,
              log=print):
  """Trains from `config.seed`, or resumes; returns (loop, seconds).

  Step s trains on `train_batches[s % len]` (entry 0 is TrainTask's shape
  sample); a resumed run picks up at its checkpoint's step.
  """
  # With rsqrt_decay, multifactor divides by sqrt(max(step, warmup)); scale
  # the constant so that `learning_rate` is the peak rate either way.
  peak = config.learning_rate * (
      np.sqrt(config.warmup_steps) if 'rsqrt_decay' in config.lr_factors
      else 1.0)
  schedule = lr_schedules.multifactor(
      constant=peak, factors=config.lr_factors,
      warmup_steps=config.warmup_steps)
  checkpointing.finish_interrupted_save(output_dir)
  done = checkpointing.checkpoint_step(output_dir)
  task = training.TrainTask(itertools.islice(itertools.cycle(train_batches),
                                             done + 1, None),
                            tl.WeightedCategoryCrossEntropy(
                                label_smoothing=config.label_smoothing or None),
                            trax.optimizers.Adam(config.learning_rate),
                            lr_schedule=schedule,
                            sample_batch=train_batches[0])
  eval_task = training.EvalTask(
      itertools.cycle(eval_batches),
      [tl.WeightedCategoryCrossEntropy(), tl.WeightedCategoryAccuracy()],
      n_eval_batches=len(eval_batches))
  loop = RecordingLoop(
      model_fn(mode='train'), task, eval_model=model_fn(mode='eval'),
      eval_tasks=[eval_task], output_dir=output_dir,
      random_seed=config.seed,
      eval_at=lambda step: step % config.eval_every == 0 or step == 1,
      checkpoint_at=lambda step: (step % config.eval_every == 0
                                  or step == config.steps))
  start = time.time()
  loop.run(config.steps - loop.step)
  seconds = time.time() - start
  log(f'trained steps {done + 1}-{config.steps} in {seconds:.1f} s, final '
      f'loss {loop.step_losses[-1]:.4f}')
  return loop, seconds


def beam_search_scores(config, model_fn, checkpoint, vocab, source_ids,
                       references, source_length, decode_length, log=print):
  """Beam search on the first `config.beam_sentences` test sentences.

  None means every test sentence. Returns {} when there are none, else
  the beams' sacreBLEU / exact-match scores, 'sentences', 'seconds' and
  the 'hypotheses' themselves.
  """
  n = len(source_ids) if config.beam_sentences is None else min(
      config.beam_sentences, len(source_ids))
  if n == 0:
    return {}
  batch = max(1, min(config.decode_batch_size // config.n_beams, n))
  log(f'beam search ({config.n_beams} beams) on {n} sentences, {batch} at '
      'a time ...')
  start = time.time()
  ids = evaluation.beam_decode(
      evaluation.predict_model(model_fn, checkpoint, batch * config.n_beams,
                               source_length, decode_length),
      source_ids[:n], batch, source_length, config.n_beams, decode_length)
  hypotheses = [vocab.decode(h) for h in ids]
  return dict(evaluation.scores(hypotheses, references[:n]), sentences=n,
              seconds=time.time() - start, hypotheses=hypotheses)


def _eval_metric(loop, name):
  history = loop.history.get('eval', f'metrics/{name}')
  return float(history[-1][1]) if history else None


def cross_attention_weights(model_fn, weights_file, source_ids, target_ids,
                            n_decoder_layers):
  """Per-layer (batch, heads, Lq, Lk) cross-attention weights from 'viz'.

  Teacher-forces `target_ids` (e.g. the model's own decodes) and reads the
  'viz' state of each decoder layer's PureAttention. Encoder self-attention
  also contains a PureAttention and comes first in the layer tree; decoder
  causal attention does not, so the last `n_decoder_layers` are the
  cross-attention ones.
  """
  model = model_fn(mode='viz')
  src = evaluation.pad_rows(source_ids, max(len(s) for s in source_ids))
  tgt = evaluation.pad_rows(target_ids, max(len(t) for t in target_ids))
  model.init_from_file(weights_file, weights_only=True,
                       input_signature=shapes.signature((src, tgt)))
  model((src, tgt))
  found = []

  def walk(layer):
    if type(layer).__name__ == 'PureAttention':
      found.append(np.asarray(layer.state))
    for sub in layer.sublayers:
      walk(sub)

  walk(model)
  return found[-n_decoder_layers:]


def plot_loss_curves(histories, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(7, 4))
  for (label, losses), style in zip(histories.items(), ('-', '--', ':', '-.')):
    ax.plot(np.arange(1, len(losses) + 1), losses, style, label=label,
            linewidth=1)
  ax.set_xlabel('step')
  ax.set_ylabel('training loss (cross-entropy)')
  ax.set_yscale('log')
  ax.legend()
  ax.set_title('Training loss, same seed and batches')
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_heatmaps(weights, source_tokens, target_tokens, path, title):
  """One row per layer, one column per head, for one sentence."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  n_layers, n_heads = len(weights), weights[0].shape[0]
  fig, axes = plt.subplots(n_layers, n_heads, squeeze=False,
                           figsize=(2.6 * n_heads + 1, 2.4 * n_layers + 1))
  for li, layer_weights in enumerate(weights):
    for h in range(n_heads):
      ax = axes[li][h]
      ax.imshow(layer_weights[h][:len(target_tokens), :len(source_tokens)],
                cmap='viridis', vmin=0, aspect='auto')
      ax.set_title(f'layer {li + 1} head {h + 1}', fontsize=8)
      ax.set_xticks(range(len(source_tokens)))
      ax.set_xticklabels(source_tokens, rotation=90, fontsize=6)
      ax.set_yticks(range(len(target_tokens)))
      ax.set_yticklabels(target_tokens, fontsize=6)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _pieces(vocab, ids):
  return [vocab.decode([i]) if i != data_lib.EOS_ID else '<eos>' for i in ids]


def run_validation(config, output_dir, log=print):
  """Trains, decodes and scores every implementation; writes the report.

  Returns the summary dict also written to `summary.json`.
  """
  config.check()
  output_dir = check_output_dir(output_dir)
  check_same_run(config, output_dir)
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, RUN_CONFIG), 'w') as f:
    json.dump(dataclasses.asdict(config), f, indent=2)
  log(f'preparing data {config.source_dir or config.dataset} ...')
  data = data_lib.translation_data(config.dataset, config.keys,
                                   config.source_dir, config.data_dir,
                                   config.vocab_size)
  vocab = data.vocab()
  inputs = data_lib.TranslationInputs(data, max_length=config.max_length,
                                      batch_size=config.batch_size,
                                      seed=config.seed)
  checkpointing.reset_data_counters()
  train_batches = list(itertools.islice(inputs.train_stream(1), config.steps))
  eval_batches = list(itertools.islice(inputs.eval_stream(1), 4))
  test = data_lib.load_split(data.name, 'test', data.keys, data.data_dir)
  if config.max_test_sentences:
    test = test[:config.max_test_sentences]
  sources = [s for s, _ in test]
  references = [t for _, t in test]
  source_ids = evaluation.encode_sources(vocab, sources)
  source_length = max(len(s) for s in source_ids)
  decode_length = max(len(vocab.encode(t)) for t in references) + 8

  results, histories, decodes = {}, {}, {}
  for implementation in config.implementations:
    label = _label(implementation)
    log(f'== {label}: cross-attention {implementation!r}')
    model_fn = model_factory(config, vocab.vocab_size, implementation)
    run_dir = os.path.join(output_dir, label)
    loop, seconds = train_one(config, model_fn, train_batches, eval_batches,
                              run_dir, log)
    histories[label] = loop.step_losses
    checkpoint = os.path.join(run_dir, 'model.pkl.gz')
    batch = min(config.decode_batch_size, len(source_ids))
    log(f'decoding {len(source_ids)} test sentences (greedy, batches of '
        f'{batch}) ...')
    start = time.time()
    ids = evaluation.greedy_decode(
        evaluation.predict_model(model_fn, checkpoint, batch, source_length,
                                 decode_length),
        source_ids, batch, source_length, decode_length)
    decode_seconds = time.time() - start
    hypotheses = [vocab.decode(h) for h in ids]
    decodes[label] = hypotheses
    beam = beam_search_scores(config, model_fn, checkpoint, vocab, source_ids,
                              references, source_length, decode_length, log)
    results[label] = dict(
        evaluation.scores(hypotheses, references),
        **{f'beam_{k}': v for k, v in beam.items() if k != 'hypotheses'},
        final_loss=loop.step_losses[-1],
        eval_loss=_eval_metric(loop, 'WeightedCategoryCrossEntropy'),
        eval_accuracy=_eval_metric(loop, 'WeightedCategoryAccuracy'),
        train_seconds=seconds, decode_seconds=decode_seconds)
    log(f'{label}: ' + ', '.join(
        f'{k} {v:.4g}' for k, v in results[label].items()
        if isinstance(v, float)))
    with open(os.path.join(output_dir, f'decodes_{label}.txt'), 'w',
              encoding='utf-8') as f:
      f.writelines(h + '\n' for h in hypotheses)
    with open(os.path.join(output_dir, f'decodes_beam_{label}.txt'), 'w',
              encoding='utf-8') as f:
      f.writelines(h + '\n' for h in beam.get('hypotheses', []))

    if implementation == 'trax_qkv' or (
        'trax_qkv' not in config.implementations
        and implementation == config.implementations[0]):
      n = min(config.heatmap_sentences, len(source_ids))
      targets = [vocab.encode(h) + [data_lib.EOS_ID] for h in hypotheses[:n]]
      layers = cross_attention_weights(model_fn, checkpoint, source_ids[:n],
                                       targets, config.n_layers)
      for i in range(n):
        plot_heatmaps([w[i] for w in layers], _pieces(vocab, source_ids[i]),
                      _pieces(vocab, targets[i]),
                      os.path.join(output_dir, f'cross_attention_{i}.png'),
                      f'{label}: "{sources[i]}" -> "{hypotheses[i]}"')

  labels = list(histories)
  summary = dict(
      dataset=data.name, keys=list(data.keys), steps=config.steps,
      seed=config.seed, test_sentences=len(references),
      config=dataclasses.asdict(config), **results)
  if len(labels) >= 2:
    a, b = labels[:2]
    summary['max_loss_diff'] = float(np.max(np.abs(
        np.asarray(histories[a]) - np.asarray(histories[b]))))
    summary['identical_decodes'] = float(np.mean(
        [x == y for x, y in zip(decodes[a], decodes[b])]))
  plot_loss_curves(histories, os.path.join(output_dir, 'loss_curves.png'))
  with open(os.path.join(output_dir, 'summary.json'), 'w') as f:
    json.dump(summary, f, indent=2, default=str)
  with open(os.path.join(output_dir, 'report.md'), 'w') as f:
    f.write(render_report(summary, labels))
  return summary


def render_report(summary, labels):
  rows = [('BLEU (sacreBLEU, cased)', 'bleu', '{:.2f}'),
          ('BLEU (lowercased)', 'bleu_lowercase', '{:.2f}'),
          ('chrF (sacreBLEU)', 'chrf', '{:.2f}'),
          ('exact match, greedy', 'exact_match', '{:.2%}'),
          ('BLEU lowercased, beam search (first N sentences)',
           'beam_bleu_lowercase', '{:.2f}'),
          ('exact match, beam search (first N sentences)',
           'beam_exact_match', '{:.2%}'),
          ('beam search: N sentences', 'beam_sentences', '{}'),
          ('final training loss', 'final_loss', '{:.6f}'),
          ('eval loss', 'eval_loss', '{:.4f}'),
          ('eval token accuracy', 'eval_accuracy', '{:.4f}'),
          ('training time (s)', 'train_seconds', '{:.1f}'),
          ('greedy decoding time (s)', 'decode_seconds', '{:.1f}'),
          ('beam search time (s)', 'beam_seconds', '{:.1f}')]
  c = summary['config']
  lines = [
      '# trax_qkv validation: built-in vs plugin cross-attention', '',
      f"Data set `{summary['dataset']}` ({' -> '.join(summary['keys'])}), "
      f"{summary['test_sentences']} test sentences. Transformer "
      f"{c['n_layers']}+{c['n_layers']} layers, d_model {c['d_model']}, "
      f"d_ff {c['d_ff']}, {c['n_heads']} heads, dropout {c['dropout']}; "
      f"{summary['steps']} steps of batch {c['batch_size']}, Adam "
      f"{c['learning_rate']} with {c['warmup_steps']} warm-up steps, seed "
      f"{summary['seed']}. Both models see the same batches in the same "
      'order and start from the same weights.', '',
      '| metric | ' + ' | '.join(labels) + ' |',
      '|---|' + '---|' * len(labels)]
  for title, key, fmt in rows:
    cells = [fmt.format(summary[l][key]) if summary[l].get(key) is not None
             else 'n/a' for l in labels]
    lines.append(f'| {title} | ' + ' | '.join(cells) + ' |')
  if 'max_loss_diff' in summary:
    lines += ['', f"Max |difference| between the per-step training losses: "
              f"**{summary['max_loss_diff']:.3g}**; test sentences decoded "
              f"identically: **{summary['identical_decodes']:.2%}**."]
  lines += ['', '![loss curves](loss_curves.png)', '',
            'Cross-attention per head (`cross_attention_*.png`): each head '
            'has its own query/key projection and so its own alignment.', '']
  return '\n'.join(lines)
