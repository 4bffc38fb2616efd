"""What the main job trains and how: every setting, its default and its help
written once; the command line (`trax-qkv-validate`) is made from it.

The defaults are the embedded numbers run.
"""

import dataclasses
import json
import math
import os

from trax.supervised import lr_schedules

from trax_qkv import data as data_lib
from trax_qkv import files
from trax_qkv import kernels
from trax_qkv.models import registry
from trax_qkv.supervised import model_dir
from trax_qkv.supervised import scoring

RUN_CONFIG = 'validation_config.json'  # the settings of the run in output_dir
# Settings a rerun on the same output_dir may change: the run is the same.
MAY_CHANGE_ON_RESUME = (
  'steps',
  'implementations',
  'data_dir',
  'max_test_sentences',
  'decode_batch_size',
  'beam_sentences',
  'n_beams',
  'heatmap_sentences',
  'bleu_tokenize',
  'score_sentences',
)


def _field(default, help, **flag):
  """A setting: `help` and argparse options (`type`, `nargs`, `metavar`)."""
  return dataclasses.field(default=default, metadata=dict(help=help, flag=flag))


@dataclasses.dataclass
class ValidationConfig:
  """What to train and how; the defaults are the embedded numbers run."""

  dataset: str = _field(
    'trax_qkv_numbers',
    "TFDS data set name (default: the embedded 'trax_qkv_numbers'; "
    "'trax_qkv_numbers/tiny' is a 200-number version)",
  )
  source_dir: str = _field(
    None,
    'directory of {split}.{lang} parallel text; overrides --dataset',
    type=str,
  )
  keys: tuple = _field(
    ('en', 'de'),
    'source and target language / feature names',
    nargs=2,
    metavar=('SRC', 'TGT'),
  )
  data_dir: str = _field(
    None,
    'TFDS data and vocabulary cache (default ~/tensorflow_datasets)',
    type=str,
  )
  model: str = _field(
    'transformer',
    "the trax.models model trained: 'transformer' (trax.models.Transformer"
    ") or 'lstm_seq2seq_attn' (trax.models.LSTMSeq2SeqAttn: LSTM encoder "
    'and decoder joined by one AttentionQKV, --d_ff unused)',
  )
  vocab_size: int = _field(512, 'subword vocabulary size (target)')
  d_model: int = _field(128, 'model width')
  d_ff: int = _field(256, 'feed-forward width')
  n_layers: int = _field(2, 'encoder layers and decoder layers (each)')
  n_heads: int = _field(4, 'attention heads')
  dropout: float = _field(0.1, 'dropout rate')
  max_length: int = _field(
    32, 'longest source/target kept for training, in subwords'
  )
  batch_size: int = _field(64, 'training batch size')
  steps: int = _field(1500, 'training steps')
  learning_rate: float = _field(0.002, 'peak Adam learning rate')
  warmup_steps: int = _field(100, 'linear warm-up steps')
  lr_factors: str = _field(
    'constant * linear_warmup',
    "trax multifactor schedule, e.g. 'constant * linear_warmup * "
    "rsqrt_decay'; --learning_rate is its peak",
  )
  label_smoothing: float = _field(0.0, 'label smoothing of the training loss')
  eval_every: int = _field(250, 'eval (and checkpoint) every N steps')
  eval_batches: int = _field(
    4,
    'batches of the validation split per eval; 0: the whole split, each '
    'sentence once',
  )
  seed: int = _field(0, 'random seed (weights, dropout, data order)')
  implementations: tuple = _field(
    ('trax', 'reference'),
    "attention implementations to train, one model each: 'trax' (Trax's "
    f"layers), a kernel or 'auto' ({', '.join(kernels.names())})",
    nargs='+',
    metavar='NAME',
  )
  sites: tuple = _field(
    (registry.CROSS_ATTENTION,),
    'attention sites where each implementation runs; the others run '
    "Trax's own layers: "
    + ', '.join(
      f'{site.name} ({site.role})' for site in registry.SITES.values()
    ),
    nargs='+',
    metavar='SITE',
  )
  max_test_sentences: int = _field(
    None, 'decode only the first N test sentences', type=int
  )
  decode_batch_size: int = _field(100, 'sentences per decoding batch')
  beam_sentences: int = _field(
    None,
    'decode only the first N test sentences with beam search too '
    '(default: all of them; 0: none)',
    type=int,
  )
  n_beams: int = _field(4, 'beam size')
  heatmap_sentences: int = _field(
    3, 'test sentences whose cross-attention maps are drawn'
  )
  score_sentences: int = _field(
    0,
    "test sentences on which the self-attention scores (a position's "
    "weight on itself, the scores' asymmetry) are measured; 0: none",
  )
  bleu_tokenize: str = _field(
    '13a',
    "sacreBLEU's tokenizer for BLEU: 13a, intl, char, zh or "
    "ja-mecab (needs pip install 'sacrebleu[ja]')",
  )

  def check(self):
    """Raises ValueError naming the first setting that cannot be used."""
    self._check_numbers()
    self._check_schedule()
    self.keys = data_lib.check_keys(self.keys)
    self._check_counts()
    scoring.check_bleu_tokenize(self.bleu_tokenize)
    self._check_sites_and_implementations()

  def _check_numbers(self):
    for name in (
      'vocab_size',
      'd_model',
      'd_ff',
      'n_layers',
      'n_heads',
      'max_length',
      'batch_size',
      'steps',
      'eval_every',
      'decode_batch_size',
      'n_beams',
      'warmup_steps',
    ):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be a positive int; got {value!r}.')
    if not (
      isinstance(self.learning_rate, (int, float))
      and math.isfinite(self.learning_rate)
      and self.learning_rate > 0
    ):
      raise ValueError(
        'learning_rate must be a finite number > 0; got '
        f'{self.learning_rate!r}.'
      )
    if self.d_model % self.n_heads:
      raise ValueError(
        f'd_model ({self.d_model}) must be divisible by '
        f'n_heads ({self.n_heads}).'
      )
    for name in ('dropout', 'label_smoothing'):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(
          f'{name} must be in [0, 1); got {getattr(self, name)}.'
        )

  def _check_schedule(self):
    try:  # Trax's schedule names its unknown factors only when called
      lr_schedules.multifactor(
        factors=self.lr_factors, warmup_steps=self.warmup_steps
      )(1)
    except (ValueError, AttributeError) as e:
      raise ValueError(
        f'lr_factors must be factor names joined by "*" that Trax\'s '
        f"multifactor schedule knows, e.g. 'constant * linear_warmup * "
        f"rsqrt_decay'; got {self.lr_factors!r} ({e})."
      ) from None

  def _check_counts(self):
    for name in (
      'beam_sentences',
      'heatmap_sentences',
      'eval_batches',
      'score_sentences',
    ):
      value = getattr(self, name)
      if value is None and name == 'beam_sentences':
        continue
      if not isinstance(value, int) or value < 0:
        raise ValueError(f'{name} must be an int >= 0; got {value!r}.')

  def _check_sites_and_implementations(self):
    if self.model not in model_dir.ARCHITECTURES:
      raise ValueError(
        f'model must be one of {tuple(model_dir.ARCHITECTURES)}; got '
        f'{self.model!r}.'
      )
    sites = model_dir.ARCHITECTURES[self.model].sites
    if not self.sites or any(site not in sites for site in self.sites):
      raise ValueError(
        f'sites must name one or more of {sites} (the sites of model '
        f'{self.model!r}); got {self.sites!r}.'
      )
    if len(set(self.sites)) != len(self.sites):
      raise ValueError(f'sites must be different; got {self.sites!r}.')
    if not self.implementations:
      raise ValueError(
        'implementations must name at least one of '
        f'{registry.attention_implementations(self.sites[0])}.'
      )
    for name in self.implementations:
      for site in self.sites:
        registry.resolve_attention(site, name)
    names = [registry.canonical_name(n) for n in self.implementations]
    if len(set(names)) != len(names):
      raise ValueError(f'implementations must be different; got {names}.')
    self.implementations = tuple(names)
    self.sites = tuple(self.sites)


def add_flags(parser, config_class=ValidationConfig):
  """One argparse flag per field of `config_class`, from its metadata."""
  for field in dataclasses.fields(config_class):
    options = dict(field.metadata['flag'])
    if 'type' not in options and 'nargs' not in options:
      options['type'] = type(field.default)
    default = field.default
    shown = ' '.join(default) if isinstance(default, tuple) else default
    parser.add_argument(
      f'--{field.name}',
      default=list(default) if isinstance(default, tuple) else default,
      help=f'{field.metadata["help"]} (default: {shown})',
      **options,
    )


def from_dict(values, config_class=ValidationConfig):
  """The config of `values`' entries for its fields (lists become
  tuples): parsed flags, or `read_run_config`'s recorded settings."""
  return config_class(
    **{
      f.name: tuple(values[f.name])
      if isinstance(values[f.name], list)
      else values[f.name]
      for f in dataclasses.fields(config_class)
    }
  )


def from_flags(args, config_class=ValidationConfig):
  """The config made of parsed flags (lists become tuples)."""
  return from_dict(vars(args), config_class)


def read_run_config(output_dir, config_class=ValidationConfig):
  """The settings recorded in `output_dir` as plain JSON values (lists, not
  tuples), or None if it holds no run. A setting the run did not record
  (added in a later release) is its default.

  Raises:
    ValueError: the recorded settings are not a JSON object.
  """
  path = os.path.join(output_dir, RUN_CONFIG)
  if not os.path.exists(path):
    return None
  recorded = files.read_json_object(path, 'trax-qkv-validate settings')
  defaults = dataclasses.asdict(config_class())
  return json.loads(json.dumps(dict(defaults, **recorded)))


def check_same_run(config, output_dir):
  """Raises ValueError if `output_dir` holds a run with other settings.

  A rerun resumes the checkpoints there, which is only the same run if
  everything that shapes training is the same; more `steps` (train longer)
  and what is decoded may change.
  """
  try:
    earlier = read_run_config(output_dir, type(config))
  except ValueError as e:
    raise ValueError(f'{e} Choose a new --output_dir.') from None
  if earlier is None:
    return
  current = json.loads(json.dumps(dataclasses.asdict(config)))  # lists
  changed = [
    f'{k} {earlier[k]!r} -> {v!r}'
    for k, v in current.items()
    if k not in MAY_CHANGE_ON_RESUME and earlier[k] != v
  ]
  if changed:
    raise ValueError(
      f'output_dir {output_dir} holds a run with other settings '
      f'({"; ".join(changed)}); rerun with the same settings to resume it, '
      'or choose a new --output_dir.'
    )


def write_run_config(config, output_dir):
  files.write_json(
    os.path.join(output_dir, RUN_CONFIG), dataclasses.asdict(config)
  )
