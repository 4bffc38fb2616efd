"""A trained translation model's directory, usable on its own.

Besides Trax's checkpoint (`model.pkl.gz` and its weight files) a run
saves what a later command needs to rebuild the model: the Transformer's
settings (`model.json`) and a copy of its subword vocabulary
(`vocab.subwords`). `trax-qkv-translate` and `trax-qkv-attention-map` read
these directories.
"""

import collections
import functools
import json
import os
import shutil

from trax_qkv.data import pipeline
from trax_qkv.models import registry

SETTINGS_FILE = 'model.json'
VOCAB_FILE = 'vocab.subwords'
CHECKPOINT = 'model.pkl.gz'
# trax.models.Transformer's arguments that shape its weights or its math.
TRANSFORMER_SETTINGS = ('d_model', 'd_ff', 'n_encoder_layers',
                        'n_decoder_layers', 'n_heads', 'max_len', 'dropout')


class ModelDirError(ValueError):
  """A directory that does not hold a usable trained model."""


def transformer_fn(settings, cross_attention=None):
  """model_fn(mode=...) of the Transformer that `settings` describe, with
  `cross_attention` (default: the one it was trained with) and the self-
  and causal attention it was trained with (Trax's, in directories written
  before these were recorded)."""
  self_sites = {site: settings.get(site, registry.BUILTIN)
                for site in ('self_attention', 'causal_attention')}
  build = functools.partial(
      registry.CrossAttentionTransformer, settings['vocab_size'],
      cross_attention=cross_attention or settings['cross_attention'],
      **{k: settings[k] for k in TRANSFORMER_SETTINGS})

  def model_fn(mode='train'):
    with registry.use_attention(**self_sites):
      return build(mode=mode)
  return model_fn


def save(run_dir, settings, vocab_path):
  """Writes `settings` (vocab_size, cross_attention and every key of
  TRANSFORMER_SETTINGS) and a copy of the vocabulary into `run_dir`."""
  missing = [k for k in TRANSFORMER_SETTINGS + ('vocab_size',
                                                'cross_attention')
             if k not in settings]
  if missing:
    raise ValueError(f'model settings lack {missing}.')
  os.makedirs(run_dir, exist_ok=True)
  for name, write in (
      (VOCAB_FILE, lambda tmp: shutil.copyfile(vocab_path, tmp)),
      (SETTINGS_FILE, lambda tmp: _write_json(tmp, settings))):
    tmp = os.path.join(run_dir, name + '.tmp')
    write(tmp)
    os.replace(tmp, os.path.join(run_dir, name))


def _write_json(path, value):
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(value, f, indent=2)


ModelDir = collections.namedtuple('ModelDir', 'path settings vocab checkpoint')


def load(model_dir):
  """The model in `model_dir`; ModelDirError says what is missing."""
  path = os.path.abspath(os.path.expanduser(model_dir))
  if not os.path.isdir(path):
    raise ModelDirError(f'model_dir {path} is not a directory; expected the '
                        'directory of a trained model (e.g. '
                        'runs/validate/reference).')
  checkpoint = os.path.join(path, CHECKPOINT)
  if not os.path.exists(checkpoint):
    inside = sorted(d for d in os.listdir(path)
                    if os.path.exists(os.path.join(path, d, CHECKPOINT)))
    where = (f'; it holds the models {inside}: pass one of them, e.g. '
             f'--model_dir {os.path.join(model_dir, inside[0])}'
             if inside else '')
    raise ModelDirError(f'model_dir {path} has no checkpoint ({CHECKPOINT})'
                        f'{where}.')
  for name in (SETTINGS_FILE, VOCAB_FILE):
    if not os.path.exists(os.path.join(path, name)):
      raise ModelDirError(
          f'model_dir {path} has a checkpoint but no {name}: it was not '
          'written by trax-qkv-validate (which saves the model settings and '
          'vocabulary with each model); rerun that command to add them.')
  with open(os.path.join(path, SETTINGS_FILE), encoding='utf-8') as f:
    settings = json.load(f)
  return ModelDir(path, settings,
                  pipeline.load_vocab(path, VOCAB_FILE), checkpoint)
