"""A trained translation model's directory, usable on its own.

Besides Trax's checkpoint (`model.pkl.gz` and its weight files) a run
saves what a later command needs to rebuild the model: the Transformer's
settings (`model.json`) and a copy of its subword vocabulary
(`vocab.subwords`). `trax-qkv-translate` and `trax-qkv-attention-map` read
these directories.
"""

import collections
import dataclasses
import os
import shutil

import trax.layers
import trax.models

from trax_qkv import files
from trax_qkv.data import pipeline
from trax_qkv.models import registry

SETTINGS_FILE = 'model.json'
VOCAB_FILE = 'vocab.subwords'
CHECKPOINT = 'model.pkl.gz'
ATTENTION = 'attention'  # model.json's {site: implementation}
MODEL = 'model'  # model.json's architecture; absent (before 0.5.0): Transformer


@dataclasses.dataclass(frozen=True)
class Architecture:
  """A translation model of trax.models that a directory can hold.

  Attributes:
    name: model.json's `model`, `trax-qkv-validate --model`.
    settings: model.json's settings of it besides vocab_size and attention:
      what shapes its weights or its math, and `max_len`, the most target
      positions a translation may take.
    sites: the attention sites it builds (`registry.SITES`).
    build: (settings, mode) -> the Trax model, every argument explicit so
      that no gin binding changes the model a directory describes.
  """

  name: str
  settings: tuple
  sites: tuple
  build: object


def _transformer(settings, mode):
  return trax.models.Transformer(
    settings['vocab_size'],
    output_vocab_size=None,
    dropout_shared_axes=None,
    ff_activation=trax.layers.Relu,
    mode=mode,
    **{k: settings[k] for k in ARCHITECTURES['transformer'].settings},
  )


def _lstm_seq2seq_attn(settings, mode):
  return trax.models.LSTMSeq2SeqAttn(
    settings['vocab_size'],
    settings['vocab_size'],
    d_model=settings['d_model'],
    n_encoder_layers=settings['n_encoder_layers'],
    n_decoder_layers=settings['n_decoder_layers'],
    n_attention_heads=settings['n_heads'],
    attention_dropout=settings['dropout'],
    mode=mode,
  )


ARCHITECTURES = {
  arch.name: arch
  for arch in (
    Architecture(
      'transformer',
      (
        'd_model',
        'd_ff',
        'n_encoder_layers',
        'n_decoder_layers',
        'n_heads',
        'max_len',
        'dropout',
      ),
      tuple(registry.SITES),
      _transformer,
    ),
    # LSTM encoder and decoder joined by one AttentionQKV; dropout is the
    # attention's, max_len only bounds decoding (no positional encoding).
    Architecture(
      'lstm_seq2seq_attn',
      (
        'd_model',
        'n_encoder_layers',
        'n_decoder_layers',
        'n_heads',
        'max_len',
        'dropout',
      ),
      (registry.CROSS_ATTENTION,),
      _lstm_seq2seq_attn,
    ),
  )
}
TRANSFORMER = ARCHITECTURES['transformer']


class ModelDirError(ValueError):
  """A directory that does not hold a usable trained model."""


def architecture(settings):
  """The `Architecture` of model.json's `settings`."""
  return ARCHITECTURES[settings.get(MODEL, TRANSFORMER.name)]


def model_fn(settings, attention=None):
  """model_fn(mode=...) of the model that `settings` describe.

  Args:
    settings: model.json's settings (`load` or `model_settings`).
    attention: {site: implementation} to build with instead of what the
      model was trained with (its checkpoint fits every implementation).
  """
  chosen = dict(settings[ATTENTION], **(attention or {}))
  build = architecture(settings).build
  return registry.with_attention(
    lambda mode='train': build(settings, mode), **chosen
  )


def model_settings(vocab_size, attention, model=TRANSFORMER.name, **arguments):
  """The settings model.json holds.

  Args:
    vocab_size: subwords of the vocabulary (input and output).
    attention: {site: implementation name}; sites of the model not named
      run Trax's own layer.
    model: a name of ARCHITECTURES.
    **arguments: every setting of the architecture.
  """
  if model not in ARCHITECTURES:
    raise ValueError(
      f'model must be one of {tuple(ARCHITECTURES)}; got {model!r}.'
    )
  arch = ARCHITECTURES[model]
  missing = [k for k in arch.settings if k not in arguments]
  if missing:
    raise ValueError(f'model settings lack {missing}.')
  _check_sites(arch, attention)
  return dict(
    model=model,
    vocab_size=vocab_size,
    **{k: arguments[k] for k in arch.settings},
    attention={
      site: attention.get(site, registry.BUILTIN) for site in arch.sites
    },
  )


def _check_sites(arch, attention):
  for site in attention:
    registry.check_site(site)
    if site not in arch.sites:
      raise ValueError(
        f'{arch.name} builds attention only in {arch.sites}; got {site!r}.'
      )


def save(run_dir, settings, vocab_path):
  """Writes `settings` (`model_settings`) and a copy of the vocabulary into
  `run_dir`."""
  os.makedirs(run_dir, exist_ok=True)
  with files.atomic_path(os.path.join(run_dir, VOCAB_FILE)) as tmp:
    shutil.copyfile(vocab_path, tmp)
  files.write_json(os.path.join(run_dir, SETTINGS_FILE), settings)


ModelDir = collections.namedtuple('ModelDir', 'path settings vocab checkpoint')


def _read_settings(path):
  """model.json, checked: a dict with every setting, each of its type."""
  file = os.path.join(path, SETTINGS_FILE)
  try:
    settings = files.read_json_object(file, 'model settings')
  except ValueError as e:
    raise ModelDirError(str(e)) from None
  model = settings.setdefault(MODEL, TRANSFORMER.name)
  if model not in ARCHITECTURES:
    raise ModelDirError(
      f'{file}: {MODEL} must be one of {tuple(ARCHITECTURES)}; got {model!r}.'
    )
  for name in architecture(settings).settings + ('vocab_size',):
    value = settings.get(name)
    if name == 'dropout':
      ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and 0.0 <= value < 1.0
      )
      expected = 'a number in [0, 1)'
    else:
      ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
      expected = 'a positive int'
    if not ok:
      raise ModelDirError(
        f'{file}: {name} must be {expected}; got '
        + (
          'nothing (the key is missing)'
          if name not in settings
          else repr(value)
        )
        + '.'
      )
  if settings['d_model'] % settings['n_heads']:
    raise ModelDirError(
      f'{file}: d_model ({settings["d_model"]}) must be '
      f'divisible by n_heads ({settings["n_heads"]}).'
    )
  settings[ATTENTION] = _read_attention(file, settings)
  return settings


def _read_attention(file, settings):
  """model.json's {site: implementation}, checked. Directories of 0.2.0
  name the sites at the top level; sites a directory does not name (it was
  written before they existed) ran Trax's layer."""
  if ATTENTION in settings:
    attention = settings[ATTENTION]
    if not isinstance(attention, dict) or not attention:
      raise ModelDirError(
        f'{file}: {ATTENTION} must map sites to the '
        f'attention the model was trained with; got '
        f'{attention!r}.'
      )
  else:
    attention = {
      site: settings.pop(site) for site in registry.SITES if site in settings
    }
    if not attention:
      raise ModelDirError(
        f'{file}: {ATTENTION} must name the attention '
        'the model was trained with; it is missing.'
      )
  arch = architecture(settings)
  try:
    registry.check_attention(attention)
    _check_sites(arch, attention)
  except (TypeError, ValueError) as e:
    raise ModelDirError(f'{file}: {e}') from None
  return {site: attention.get(site, registry.BUILTIN) for site in arch.sites}


def _read_vocab(path, settings):
  """The vocabulary, checked against model.json's vocab_size."""
  file = os.path.join(path, VOCAB_FILE)
  try:
    vocab = pipeline.load_vocab(path, VOCAB_FILE)
    size = vocab.vocab_size
  except (UnicodeDecodeError, ValueError) as e:
    raise ModelDirError(
      f'{file} is not a subword vocabulary (one quoted '
      f'subword per line, UTF-8): {e}'
    ) from None
  if size != settings['vocab_size']:
    raise ModelDirError(
      f'{file} has {size} subwords, but {SETTINGS_FILE} says the model '
      f'was trained with vocab_size {settings["vocab_size"]}: they are '
      'not from the same run.'
    )
  return vocab


def load(model_dir):
  """The model in `model_dir`, its settings and vocabulary checked.

  Raises:
    ModelDirError (a ValueError): what is missing or wrong, naming the
      file. The checkpoint itself is read later, by `checkpoint_files`.
  """
  path = os.path.abspath(os.path.expanduser(model_dir))
  if not os.path.isdir(path):
    raise ModelDirError(
      f'model_dir {path} is not a directory; expected the '
      'directory of a trained model (e.g. '
      'runs/validate/reference).'
    )
  checkpoint = os.path.join(path, CHECKPOINT)
  if not os.path.exists(checkpoint):
    inside = sorted(
      d
      for d in os.listdir(path)
      if os.path.exists(os.path.join(path, d, CHECKPOINT))
    )
    where = (
      f'; it holds the models {inside}: pass one of them, e.g. '
      f'--model_dir {os.path.join(model_dir, inside[0])}'
      if inside
      else ''
    )
    raise ModelDirError(
      f'model_dir {path} has no checkpoint ({CHECKPOINT}){where}.'
    )
  for name in (SETTINGS_FILE, VOCAB_FILE):
    if not os.path.exists(os.path.join(path, name)):
      raise ModelDirError(
        f'model_dir {path} has a checkpoint but no {name}: it was not '
        'written by trax-qkv-validate (which saves the model settings and '
        'vocabulary with each model); rerun that command to add them.'
      )
  settings = _read_settings(path)
  return ModelDir(path, settings, _read_vocab(path, settings), checkpoint)
