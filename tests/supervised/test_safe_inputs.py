"""Inputs users did not make: planted pickles, damaged files, bad settings.

Each case runs the real command in-process and checks for one `error: ...`
line, exit status 2, that a planted payload never ran (its marker file does
not exist), and that nothing in the directory changed.
"""

import dataclasses
import gzip
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import threading
import time

from helpers import CONFIGS
from helpers import TINY_MODEL
from helpers import RunsCode
from helpers import assert_loads_as_pickle
from helpers import command
from helpers import shared_data_dir
from helpers import tiny_train_bindings
from helpers import tiny_validate_flags
from helpers import tiny_validation_config
import numpy as np
import pytest
import trax
from trax import layers as tl
from trax.supervised import training as trax_training

from trax_qkv import checkpoint_files
from trax_qkv import files
from trax_qkv.supervised import checkpointing
from trax_qkv.supervised import locking
from trax_qkv.supervised import model_dir
from trax_qkv.validation import config as config_lib
from trax_qkv.validation import run as validation


def _tiny_config(base, **changes):
  return tiny_validation_config(
    shared_data_dir(base), 6, 3,
    implementations=('reference',), beam_sentences=0, heatmap_sentences=0,
    **changes,
  )  # fmt: skip


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  """A finished 6-step validate run: out/reference is a model directory."""
  base = tmp_path_factory.mktemp('safe_inputs')
  validation.run_validation(
    _tiny_config(base), str(base / 'out'), log=lambda line: None
  )
  return base


def _copy_model(run, tmp_path):
  """A copy of the run's model directory, to damage."""
  copy = tmp_path / 'model'
  shutil.copytree(run / 'out' / 'reference', copy)
  return copy


def _snapshot(directory):
  return {
    path: path.read_bytes()
    for path in sorted(directory.rglob('*'))
    if path.is_file() and path.name != locking.LOCK_FILE
  }


def _plant(checkpoint, marker):
  """Adds an entry to a checkpoint's metadata that runs code when
  unpickled (checking first that it does, with plain pickle)."""
  payload = RunsCode(marker)
  pickle.loads(pickle.dumps(payload))
  assert marker.exists(), 'the payload should run under plain pickle'
  marker.unlink()
  with gzip.open(checkpoint) as f:
    meta = checkpoint_files.unpickle(f)
  meta['planted'] = payload
  with gzip.open(checkpoint, 'wb') as f:
    pickle.dump(meta, f)


def _refused(capsys, argv_main, snapshot_dir, match):
  before = _snapshot(snapshot_dir)
  main, argv = argv_main
  try:
    status = main(argv)
  except SystemExit as e:  # trax-qkv-train exits through argparse
    status = e.code
  assert status == 2
  err = capsys.readouterr().err
  assert err.startswith('error: ') and err.count('\n') == 1, err
  assert match in err, err
  assert _snapshot(snapshot_dir) == before
  return err


def _validate_argv(run, out, steps=6):
  # The tiny run, without beams or heat maps.
  return tiny_validate_flags(
    shared_data_dir(run), out, steps, 3,
    '--implementations', 'reference',
    '--beam_sentences', '0', '--heatmap_sentences', '0',
  )  # fmt: skip


def _train_argv(run, out, steps=4, eval_frequency=2):
  return [
    '--config_file',
    os.path.join(CONFIGS, 'reference.gin'),
    '--output_dir',
    str(out),
  ] + sum(
    (
      ['--config', b]
      for b in tiny_train_bindings(
        str(shared_data_dir(run)), steps, eval_frequency
      )
    ),
    [],
  )


# ------------------------------------------------- checkpoints that run code


@pytest.mark.slow
def test_a_planted_checkpoint_is_refused_by_every_command(
  run, tmp_path, capsys
):
  marker = tmp_path / 'marker'
  model = _copy_model(run, tmp_path)
  _plant(model / 'model.pkl.gz', marker)
  unsafe = 'refers to posix.system, which no Trax checkpoint holds'
  translate = command('translate').main
  attention_map = command('attention_map').main
  for argv_main in (
    (translate, ['--model_dir', str(model), 'one']),
    (
      attention_map,
      [
        '--model_dir',
        str(model),
        '--source',
        'one',
        '--output',
        str(tmp_path / 'map.png'),
      ],
    ),
    (
      attention_map,
      [
        '--model_dir',
        str(model),
        '--source',
        'one',
        '--target',
        'eins',
        '--output',
        str(tmp_path / 'map.png'),
      ],
    ),
  ):
    _refused(capsys, argv_main, tmp_path, unsafe)
  # Trax's own loader, as a user of the layers would call it.
  with pytest.raises(checkpoint_files.UnsafeCheckpointError, match=unsafe):
    tl.Serial().init_from_file(str(model / 'model.pkl.gz'))
  # Resuming: validate (a copy of the whole run) and train.
  out = tmp_path / 'validate'
  shutil.copytree(run / 'out', out)
  _plant(out / 'reference' / 'model.pkl.gz', marker)
  _refused(
    capsys, (command('validate').main, _validate_argv(run, out, 9)), out, unsafe
  )
  train_dir = tmp_path / 'train'
  shutil.copytree(model, train_dir)
  _refused(
    capsys,
    (command('train').main, _train_argv(run, train_dir)),
    train_dir,
    unsafe,
  )
  assert not marker.exists()


@pytest.mark.slow
def test_planted_data_counters_are_refused_before_a_fresh_run(
  run, tmp_path, capsys
):
  marker = tmp_path / 'marker'
  out = tmp_path / 'fresh'
  out.mkdir()
  with open(out / 'data_counters0.pkl', 'wb') as f:
    pickle.dump({'trax_qkv_train': RunsCode(marker)}, f)
  _refused(
    capsys,
    (command('train').main, _train_argv(run, out)),
    out,
    'data_counters0.pkl refers to posix.system',
  )
  assert sorted(os.listdir(out)) == ['.trax_qkv.lock', 'data_counters0.pkl']
  assert not marker.exists()


@pytest.mark.slow
def test_a_slot_file_holding_objects_is_refused(run, tmp_path, capsys):
  out = tmp_path / 'validate'
  shutil.copytree(run / 'out', out)
  with gzip.open(out / 'reference' / 'model.opt_slots0.npy.gz', 'wb') as f:
    np.save(
      f,
      np.array([RunsCode(tmp_path / 'marker')], dtype=object),
      allow_pickle=True,
    )
  _refused(
    capsys,
    (command('validate').main, _validate_argv(run, out, 9)),
    out,
    'model.opt_slots0.npy.gz is damaged or truncated after 0',
  )
  assert not (tmp_path / 'marker').exists()


# ---------------------------------------- what Trax writes still loads exactly


def test_checkpoints_of_this_package_load_bit_for_bit(run):
  """ResumableLoop's (a validate run); Trax's own writers are in
  test_trax_checkpoints.py."""
  assert_loads_as_pickle(run / 'out' / 'reference')


# --------------------------------------------------- damaged model directories


def _damage(model, name, content):
  path = model / name
  if callable(content):
    content = content(path.read_bytes())
  path.write_bytes(content)


@pytest.mark.slow
@pytest.mark.parametrize(
  'name,content,match',
  [
    (
      'model.pkl.gz',
      lambda b: b[: len(b) // 2],
      'model.pkl.gz is damaged or truncated',
    ),
    (
      'model.weights.npy.gz',
      lambda b: b[: len(b) // 2],
      'model.weights.npy.gz is damaged or truncated',
    ),
    ('model.json', b'not json', 'model.json is not valid JSON'),
    ('model.json', b'[]', 'model.json holds a list; expected a JSON object'),
    (
      'model.json',
      lambda b: json.dumps(
        {k: v for k, v in json.loads(b).items() if k != 'd_ff'}
      ).encode(),
      'model.json: d_ff must be a positive int; got nothing',
    ),
    (
      'model.json',
      lambda b: json.dumps(dict(json.loads(b), n_heads='2')).encode(),
      "model.json: n_heads must be a positive int; got '2'",
    ),
    (
      'model.json',
      lambda b: json.dumps(
        dict(json.loads(b), attention={'cross_attention': 'nope'})
      ).encode(),
      "got 'nope'",
    ),
    (
      'model.json',
      lambda b: json.dumps(
        dict(json.loads(b), attention={'decoder': 'reference'})
      ).encode(),
      "model.json: site must be one of ('self_attention'",
    ),
    (
      'model.json',
      lambda b: json.dumps(dict(json.loads(b), model='gru')).encode(),
      "model.json: model must be one of ('transformer', 'lstm_seq2seq_attn'"
      "); got 'gru'",
    ),
    (
      'model.json',
      lambda b: json.dumps(
        dict(json.loads(b), model='lstm_seq2seq_attn')
      ).encode(),
      'model.json: lstm_seq2seq_attn builds attention only in '
      "('cross_attention',); got 'self_attention'",
    ),
    (
      'model.json',
      lambda b: json.dumps(dict(json.loads(b), attention='reference')).encode(),
      'model.json: attention must map sites to the attention the model was '
      "trained with; got 'reference'",
    ),
    (
      'vocab.subwords',
      bytes(range(256)) * 4,
      'vocab.subwords is not a subword vocabulary',
    ),
    ('vocab.subwords', b'', 'vocab.subwords is not a subword vocabulary'),
    (
      'vocab.subwords',
      lambda b: b'\n'.join(b.split(b'\n')[:20]) + b'\n',
      'vocab.subwords has 20 subwords, but model.json says the model was '
      'trained with vocab_size',
    ),
  ],
)
def test_a_damaged_model_directory_is_one_line(
  run, tmp_path, capsys, name, content, match
):
  model = _copy_model(run, tmp_path)
  _damage(model, name, content)
  for argv_main in (
    (command('translate').main, ['--model_dir', str(model), 'one']),
    (
      command('attention_map').main,
      [
        '--model_dir',
        str(model),
        '--source',
        'one',
        '--target',
        'eins',
        '--output',
        str(tmp_path / 'map.png'),
      ],
    ),
  ):
    _refused(capsys, argv_main, tmp_path, match)


@pytest.mark.slow
def test_a_truncated_slot_file_is_not_resumed_from(run, tmp_path, capsys):
  out = tmp_path / 'validate'
  shutil.copytree(run / 'out', out)
  _damage(
    out / 'reference', 'model.opt_slots0.npy.gz', lambda b: b[: len(b) // 2]
  )
  _refused(
    capsys,
    (command('validate').main, _validate_argv(run, out, 9)),
    out,
    'model.opt_slots0.npy.gz is damaged or truncated',
  )


def test_slots_of_another_optimizer_are_refused(tmp_path):
  def loop(optimizer):
    def batches():
      while True:
        yield (
          np.ones((2, 3), np.float32),
          np.ones((2, 1), np.float32),
          np.ones((2, 1), np.float32),
        )

    return checkpointing.ResumableLoop(
      tl.Serial(tl.Dense(1)),
      [trax_training.TrainTask(batches(), tl.L2Loss(), optimizer)],
      output_dir=str(tmp_path),
      random_seed=0,
    )

  first = loop(trax.optimizers.Adam(0.01))
  first.progress_log = None
  first.run(1)
  with pytest.raises(
    checkpointing.CheckpointMismatchError,
    match='it holds 4 optimizer slot arrays, the model has 2',
  ):
    loop(trax.optimizers.Momentum(0.01))


# ------------------------------------------------------------ bad input


@pytest.mark.slow
def test_translate_refuses_what_the_model_cannot_take(
  run, tmp_path, capsys, monkeypatch
):
  model = str(run / 'out' / 'reference')
  translate = command('translate').main
  snapshot = run / 'out'
  _refused(
    capsys,
    (translate, ['--model_dir', model, 'one', 'two ' * 200, 'three']),
    snapshot,
    'sentence 2 (',
  )
  _refused(
    capsys,
    (translate, ['--model_dir', model, '--max_length', '2000000', 'one']),
    snapshot,
    'max_length must be an int from 1 to 63',
  )
  _refused(
    capsys,
    (translate, ['--model_dir', model, '--beam', '2', '--alpha', 'nan', 'one']),
    snapshot,
    'alpha must be a finite number >= 0; got nan',
  )
  _refused(
    capsys,
    (
      command('attention_map').main,
      [
        '--model_dir',
        model,
        '--source',
        'two ' * 200,
        '--output',
        str(tmp_path / 'm.png'),
      ],
    ),
    snapshot,
    'longer than the model takes',
  )

  class BinaryStdin:
    buffer = io.BytesIO(b'one\n\xff\xfe\x00binary\n')

    def isatty(self):
      return False

  monkeypatch.setattr('sys.stdin', BinaryStdin())
  _refused(
    capsys,
    (translate, ['--model_dir', model]),
    snapshot,
    'standard input line 2 is not UTF-8 text',
  )


@pytest.mark.slow
def test_attention_map_output_must_be_a_file(run, tmp_path, capsys):
  model = str(run / 'out' / 'reference')
  main = command('attention_map').main
  (tmp_path / 'afile').write_text('x')
  _refused(
    capsys,
    (
      main,
      ['--model_dir', model, '--source', 'one', '--output', str(tmp_path)],
    ),
    tmp_path,
    'is a directory; give a file name',
  )
  _refused(
    capsys,
    (
      main,
      [
        '--model_dir',
        model,
        '--source',
        'one',
        '--output',
        str(tmp_path / 'afile' / 'x.png'),
      ],
    ),
    tmp_path,
    'afile is a file, not a directory',
  )
  # A name without a suffix is written as given, not as NAME.png.
  assert (
    main(
      [
        '--model_dir',
        model,
        '--source',
        'one',
        '--target',
        'eins',
        '--output',
        str(tmp_path / 'map'),
      ]
    )
    == 0
  )
  assert (tmp_path / 'map').read_bytes()[:4] == b'\x89PNG'
  capsys.readouterr()


@pytest.mark.parametrize(
  'argv,match',
  [
    (['--lr_factors', 'constant * bogus'], 'lr_factors must be factor names'),
    (['--keys', '../../x', 'de'], 'keys must be two different'),
    (['--keys', 'en', 'en'], 'keys must be two different'),
    (['--learning_rate', 'nan'], 'learning_rate must be a finite number'),
  ],
)
def test_validate_refuses_bad_settings_before_writing(
  tmp_path, capsys, argv, match
):
  out = tmp_path / 'out'
  assert command('validate').main(argv + ['--output_dir', str(out)]) == 2
  err = capsys.readouterr().err
  assert err.startswith('error: ') and match in err and err.count('\n') == 1
  assert not out.exists()


def test_validate_dangling_output_dir_link(tmp_path, capsys):
  link = tmp_path / 'link'
  link.symlink_to(tmp_path / 'nowhere')
  assert command('validate').main(['--output_dir', str(link)]) == 2
  assert 'is a symbolic link to' in capsys.readouterr().err
  assert not (tmp_path / 'nowhere').exists()


@pytest.mark.parametrize(
  'argv,match',
  [
    (
      ['--config', "train.steps = 'abc'"],
      "train.steps must be a positive int; got 'abc'",
    ),
    (['--config', 'train.steps = ('], 'gin could not use the configuration'),
  ],
)
def test_train_refuses_bad_bindings_before_writing(
  tmp_path, capsys, argv, match
):
  out = tmp_path / 'out'
  _refused(
    capsys,
    (
      command('train').main,
      [
        '--config_file',
        os.path.join(CONFIGS, 'reference.gin'),
        '--output_dir',
        str(out),
      ]
      + argv,
    ),
    tmp_path,
    match,
  )
  assert not out.exists()


def test_a_config_importing_a_missing_module(tmp_path, capsys):
  config = tmp_path / 'bad.gin'
  config.write_text('import no_such_module_here\n')
  _refused(
    capsys,
    (
      command('train').main,
      ['--config_file', str(config), '--output_dir', str(tmp_path / 'out')],
    ),
    tmp_path,
    "No module named 'no_such_module_here'",
  )


@pytest.mark.slow
def test_train_saves_its_last_step(run, tmp_path):
  out = tmp_path / 'out'
  command('train').main(_train_argv(run, out, steps=7, eval_frequency=3))
  assert checkpointing.checkpoint_step(str(out)) == 7
  loaded = model_dir.load(out)
  assert loaded.settings['d_model'] == TINY_MODEL['d_model']


# ------------------------------------------------------------------ files


def test_the_lock_file_is_never_followed_through_a_link(tmp_path):
  victim = tmp_path / 'victim'
  victim.write_text('precious\n')
  out = tmp_path / 'out'
  out.mkdir()
  (out / locking.LOCK_FILE).symlink_to(victim)
  with pytest.raises(files.LockFileError, match='is a symbolic link'):
    with locking.hold_output_dir(str(out)):
      pass
  assert victim.read_text() == 'precious\n'
  os.remove(out / locking.LOCK_FILE)
  os.mkdir(out / locking.LOCK_FILE)
  with pytest.raises(files.LockFileError, match='is not a regular file'):
    with locking.hold_output_dir(str(out)):
      pass


def test_a_failed_write_leaves_the_old_file(tmp_path):
  path = tmp_path / 'summary.json'
  files.write_json(path, {'a': 1})
  with pytest.raises(TypeError):
    files.write_json(path, {'a': object()})
  assert json.loads(path.read_text()) == {'a': 1}
  assert os.listdir(tmp_path) == ['summary.json']


# ------------------------------------------ a model directory of release 0.2.0

RELEASE_0_2_0 = os.path.join(
  os.path.dirname(os.path.dirname(__file__)), 'fixtures', 'release_0.2.0'
)


def test_a_model_directory_of_release_0_2_0_loads_bit_for_bit(tmp_path):
  model = tmp_path / 'model'
  shutil.copytree(RELEASE_0_2_0, model)
  assert_loads_as_pickle(model)
  checkpointing.check_checkpoint_files(str(model))


@pytest.mark.slow
@pytest.mark.parametrize(
  'n_beams,decodes', [(1, 'decodes_greedy.txt'), (2, 'decodes_beam2.txt')]
)
def test_a_model_directory_of_release_0_2_0_translates_as_it_did(
  n_beams, decodes, capsys
):
  sources = (
    open(os.path.join(RELEASE_0_2_0, 'sources.txt'), encoding='utf-8')
    .read()
    .splitlines()
  )
  assert (
    command('translate').main(
      [
        '--model_dir',
        RELEASE_0_2_0,
        '--beam',
        str(n_beams),
        '--batch_size',
        '100',
        '--max_length',
        '16',
      ]
      + sources
    )
    == 0
  )
  expected = (
    open(os.path.join(RELEASE_0_2_0, decodes), encoding='utf-8')
    .read()
    .splitlines()
  )
  assert capsys.readouterr().out.splitlines() == expected
  # 0.2.0's --implementation flag still works, with a notice.
  argv = ['--model_dir', RELEASE_0_2_0, '--beam', str(n_beams)]
  argv += ['--batch_size', '100', '--max_length', '16']
  assert (
    command('translate').main(argv + ['--implementation', 'trax'] + sources)
    == 0
  )
  out, err = capsys.readouterr()
  assert out.splitlines() == expected
  assert '--implementation is deprecated' in err
  assert '--attention cross_attention=trax' in err


@pytest.mark.slow
def test_data_preparation_waits_for_the_data_dir_lock(tmp_path):
  """A second run sharing data_dir prepares nothing while another holds
  it (a real second process), and proceeds once it is free."""
  from trax_qkv import data as data_lib

  package_root = os.path.dirname(os.path.dirname(checkpoint_files.__file__))
  holder = subprocess.Popen(
    [
      sys.executable,
      '-c',
      textwrap.dedent(f"""
          import sys, time
          sys.path.insert(0, {package_root!r})
          from trax_qkv import files
          with files.locked({str(tmp_path)!r}, {data_lib.DATA_LOCK_FILE!r}):
            print('held', flush=True)
            time.sleep(600)
          """),
    ],
    stdout=subprocess.PIPE,
    text=True,
  )
  done = []
  try:
    assert holder.stdout.readline().strip() == 'held'
    worker = threading.Thread(
      target=lambda: done.append(
        data_lib.prepare_translation_data(
          'trax_qkv_numbers/tiny', data_dir=str(tmp_path), vocab_size=200
        )
      )
    )
    worker.start()
    # Wait until the worker is blocked in the lock (not merely slow).
    lock_code = files.locked.__wrapped__.__code__
    deadline = time.time() + 120
    while True:
      frame = sys._current_frames().get(worker.ident)
      if frame is not None and frame.f_code is lock_code:
        break
      assert worker.is_alive() and time.time() < deadline
      time.sleep(0.01)
    assert not done  # and, while the holder holds it, cannot pass it
    assert not os.path.exists(tmp_path / 'trax_qkv_vocabs')
  finally:
    holder.kill()
    holder.wait()
  worker.join(300)
  assert done and os.path.exists(tmp_path / 'trax_qkv_vocabs')


def test_a_damaged_run_config_is_named(tmp_path):
  (tmp_path / config_lib.RUN_CONFIG).write_text('[1, 2]')
  with pytest.raises(
    ValueError,
    match=r'validation_config.json holds a list;'
    r' expected a JSON object of trax-qkv-validate settings.'
    r' Choose a new --output_dir.',
  ):
    config_lib.check_same_run(config_lib.ValidationConfig(), str(tmp_path))


def test_a_setting_an_older_run_did_not_record_is_its_default(tmp_path):
  """A run directory from an earlier release lacks later settings: reading
  it (trax-qkv-circuits) and resuming it take them as their defaults."""
  config = config_lib.ValidationConfig()
  config_lib.write_run_config(config, str(tmp_path))
  path = tmp_path / config_lib.RUN_CONFIG
  recorded = json.loads(path.read_text())
  del recorded['score_sentences'], recorded['d_model']
  path.write_text(json.dumps(recorded))
  read = config_lib.read_run_config(str(tmp_path))
  assert read['d_model'] == config.d_model
  assert read['score_sentences'] == config.score_sentences
  assert read['keys'] == list(config.keys)  # JSON values, as recorded
  config_lib.check_same_run(config, str(tmp_path))  # the same run
  with pytest.raises(ValueError, match=r'd_model 128 -> 64'):
    config_lib.check_same_run(
      dataclasses.replace(config, d_model=64), str(tmp_path)
    )
  assert config_lib.read_run_config(str(tmp_path / 'none')) is None
