"""scripts/train.py: trains from configs/, resumes, rejects bad input early."""

import os
import re

import gin
from helpers import CONFIGS
from helpers import command
from helpers import shared_data_dir
from helpers import tiny_train_bindings as _tiny_bindings
import pytest
from trax.supervised import training as trax_training

from trax_qkv.supervised import model_dir
from trax_qkv.supervised import training
from trax_qkv.supervised import translation

train_script = command('train')


@pytest.mark.parametrize(
  'config,implementation',
  [
    ('trax.gin', 'trax'),
    ('reference.gin', 'reference'),
    ('multi30k.gin', 'reference'),
    ('transformer_base.gin', None),
  ],
)
def test_every_config_parses(config, implementation):
  assert sorted(f for f in os.listdir(CONFIGS) if f.endswith('.gin')) == [
    'multi30k.gin',
    'reference.gin',
    'transformer_base.gin',
    'trax.gin',
  ]
  gin.clear_config()
  training.parse_configs([os.path.join(CONFIGS, config)])
  if implementation:
    assert (
      gin.query_parameter('trax_qkv.EncoderDecoderAttention.implementation')
      == implementation
    )
  assert gin.query_parameter('train.steps') > 0


@pytest.mark.slow
@pytest.mark.parametrize('config', ['trax.gin', 'reference.gin'])
def test_trains_and_resumes(tmp_path, config):
  out = tmp_path / 'run'
  tfds_dir = shared_data_dir(tmp_path)
  config_file = os.path.join(CONFIGS, config)
  assert (
    train_script.main(
      ['--config_file', config_file, '--output_dir', str(out)]
      + sum((['--config', b] for b in _tiny_bindings(tfds_dir, 5)), [])
    )
    == 0
  )
  assert (out / 'model.pkl.gz').exists()
  assert (
    trax_training.unpickle_from_file(str(out / 'model.pkl.gz'), gzip=True)[
      'step'
    ]
    == 5
  )
  # Same command with more steps: continues from step 5, not from scratch.
  loop = training.train_from_configs(
    [config_file], _tiny_bindings(tfds_dir, 8), str(out)
  )
  assert loop.step == 8
  history = loop.history.get('train', 'metrics/WeightedCategoryCrossEntropy')
  # As in a fresh 8-step run: metrics at steps 1 and 5 (the step-5
  # checkpoint is written after its eval), none repeated.
  assert [step for step, _ in history] == [1, 5]
  # The run is a model directory: translate and attention maps read it.
  loaded = model_dir.load(out)
  assert loaded.settings['d_model'] == 32 and loaded.settings['max_len'] == 64
  assert loaded.settings['attention'] == {
    'self_attention': 'trax',
    'causal_attention': 'trax',
    'cross_attention': 'trax' if config == 'trax.gin' else 'reference',
  }
  (greedy,) = translation.translate(out, ['twenty-one'], max_length=8)
  assert isinstance(greedy, str)


@pytest.mark.slow
def test_checkpoint_of_another_model_size(tmp_path, capsys):
  out = tmp_path / 'run'

  def argv(d_model):
    bindings = _tiny_bindings(shared_data_dir(tmp_path), 2, d_model=d_model)
    return [
      '--config_file',
      os.path.join(CONFIGS, 'reference.gin'),
      '--output_dir',
      str(out),
    ] + sum((['--config', b] for b in bindings), [])

  assert train_script.main(argv(32)) == 0
  before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
  err = _cli_error(capsys, argv(64))
  assert 'does not fit the model' in err
  assert re.search(r'has shape \(\d+, 32\), the model expects \(\d+, 64\)', err)
  assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == (
    before
  )


def test_output_dir_not_writable(tmp_path, capsys):
  if os.geteuid() == 0:
    pytest.skip('running as root, which may write into any directory')
  locked = tmp_path / 'locked'
  locked.mkdir(mode=0o500)
  err = _cli_error(
    capsys,
    [
      '--config_file',
      os.path.join(CONFIGS, 'reference.gin'),
      '--output_dir',
      str(locked / 'run'),
    ],
  )
  assert 'is not writable' in err
  assert not (locked / 'run').exists()


def _cli_error(capsys, argv):
  assert train_script.main(argv) == 2
  return capsys.readouterr().err


def test_missing_config_file(tmp_path, capsys):
  err = _cli_error(
    capsys,
    [
      '--config_file',
      str(tmp_path / 'nope.gin'),
      '--output_dir',
      str(tmp_path / 'out'),
    ],
  )
  assert 'config file' in err and 'nope.gin does not exist' in err
  assert not (tmp_path / 'out').exists()


def test_gin_syntax_error(tmp_path, capsys):
  bad = tmp_path / 'bad.gin'
  bad.write_text('train.steps = = 3\n')
  err = _cli_error(
    capsys, ['--config_file', str(bad), '--output_dir', str(tmp_path / 'out')]
  )
  assert 'gin could not use the configuration' in err and 'bad.gin' in err
  assert not (tmp_path / 'out').exists()


def test_unknown_binding(tmp_path, capsys):
  err = _cli_error(
    capsys,
    [
      '--config_file',
      os.path.join(CONFIGS, 'reference.gin'),
      '--config',
      'NoSuchThing.x = 1',
      '--output_dir',
      str(tmp_path / 'out'),
    ],
  )
  assert 'NoSuchThing' in err
  assert not (tmp_path / 'out').exists()


def test_output_dir_is_a_file(tmp_path, capsys):
  target = tmp_path / 'file'
  target.write_text('x')
  err = _cli_error(
    capsys,
    [
      '--config_file',
      os.path.join(CONFIGS, 'reference.gin'),
      '--output_dir',
      str(target),
    ],
  )
  assert 'is a file; expected a directory' in err
