"""After training: translate, attention maps; and the faults around runs
(a busy output directory, an unknown data set, a vocabulary too small)."""

import errno
import io
import json
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap

from helpers import ROOT
from helpers import command
from helpers import shared_data_dir
from helpers import tiny_validation_config
import numpy as np
import pytest

from trax_qkv import data as data_lib
from trax_qkv.research import head_measures
from trax_qkv.supervised import attention_maps
from trax_qkv.supervised import locking
from trax_qkv.supervised import model_dir
from trax_qkv.supervised import scoring
from trax_qkv.supervised import translation
from trax_qkv.validation import config as config_lib
from trax_qkv.validation import run as validation


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
  """A tiny trax-qkv-validate run of the reference model."""
  base = tmp_path_factory.mktemp('tiny_run')
  config = tiny_validation_config(
    shared_data_dir(base), 60, 30,
    implementations=('reference',),
    heatmap_sentences=1,
  )  # fmt: skip
  log = []
  summary = validation.run_validation(config, str(base / 'out'), log=log.append)
  return config, base / 'out', summary, log


def _data(config):
  return data_lib.translation_data(
    config.dataset,
    config.keys,
    data_dir=config.data_dir,
    vocab_size=config.vocab_size,
  )


def _test_pairs(config):
  """The run's test sentences (every one decoded greedily and with beams)."""
  data = _data(config)
  pairs = data_lib.load_split(data.name, 'test', data.keys, data.data_dir)
  return pairs[: config.max_test_sentences], data.vocab()


@pytest.mark.slow
def test_the_report_gives_the_vocabulary_requested_and_made(tiny_run):
  config, out, summary, log = tiny_run
  made = f'{summary["vocab_size"]} subwords ({config.vocab_size} requested)'
  assert f'vocabulary: {made}' in log
  assert made in (out / 'report.md').read_text()


def test_a_vocabulary_smaller_than_possible_is_reported(tmp_path):
  config = tiny_validation_config(shared_data_dir(tmp_path), 1, 1, vocab_size=1)
  log = []
  corpus = validation.prepare_corpus(config, _data(config), log.append)
  assert corpus.vocab.vocab_size > 10 * config.vocab_size
  assert f'--vocab_size 1 became {corpus.vocab.vocab_size} subwords' in log[-1]


@pytest.mark.slow
@pytest.mark.parametrize('n_beams', [1, 3])
def test_translate_gives_the_validate_decodes(tiny_run, n_beams, capsys):
  """Same sentences, same model: the command's output lines are the
  validation run's decodes, greedy and beam."""
  config, out, _, _ = tiny_run
  pairs, vocab = _test_pairs(config)
  sources = [s for s, _ in pairs]
  # The validation decoded at most (longest reference + 8) tokens.
  max_length = max(len(vocab.encode(t)) for _, t in pairs) + 8
  name = (
    'decodes_reference.txt' if n_beams == 1 else ('decodes_beam_reference.txt')
  )
  expected = (out / name).read_text(encoding='utf-8').splitlines()
  argv = ['--model_dir', str(out / 'reference'), '--beam', str(n_beams)]
  argv += ['--batch_size', str(config.decode_batch_size)]
  argv += ['--max_length', str(max_length)]
  assert command('translate').main(argv + sources) == 0
  assert capsys.readouterr().out.splitlines() == expected
  # Any implementation decodes the same checkpoint: Trax's layers in the
  # command's --attention flags, another kernel through the function.
  attention = ['--attention', 'cross_attention=trax']
  assert command('translate').main(argv + attention + sources) == 0
  assert capsys.readouterr().out.splitlines() == expected
  assert (
    translation.translate(
      str(out / 'reference'),
      sources,
      n_beams=n_beams,
      attention={'cross_attention': 'auto', 'causal_attention': 'reference'},
      batch_size=config.decode_batch_size,
      max_length=max_length,
    )
    == expected
  )


def _line_within(stream, seconds):
  """The next line of `stream` (a pipe), or None if none comes in time."""
  ready, _, _ = select.select([stream], [], [], seconds)
  return stream.readline().decode('utf-8').rstrip('\n') if ready else None


@pytest.mark.slow
def test_translates_line_by_line_on_a_terminal(tiny_run):
  """Driven through a pseudo-terminal: each line typed is answered before
  the next is typed, from one load of the model; a line too long for the
  model is one error line and the session goes on; Ctrl-D ends it."""
  config, out, _, _ = tiny_run
  pairs, _ = _test_pairs(config)
  sources = [s for s, _ in pairs[:3]]
  model = str(out / 'reference')
  translator = translation.Translator(model, batch_size=1)
  expected = [translator.translate([s])[0] for s in sources]
  terminal, keyboard = pty.openpty()
  session = subprocess.Popen(
    [sys.executable, '-m', '_trax_qkv_cli', 'translate', '--model_dir', model],
    cwd=ROOT,
    stdin=keyboard,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
  )
  os.close(keyboard)
  got = []
  try:
    for i, source in enumerate(sources):
      if i == 1:
        os.write(terminal, ('one ' * 200 + '\n').encode())
      os.write(terminal, (source + '\n').encode())
      got.append(_line_within(session.stdout, 300))
    os.write(terminal, b'\x04')  # Ctrl-D at the start of a line: end
    assert session.wait(timeout=60) == 0
  finally:
    session.kill()
    os.close(terminal)
  assert got == expected
  errors = session.stderr.read().decode('utf-8')
  assert errors.count('error: ') == 1 and 'longer than the model' in errors


@pytest.mark.slow
def test_a_second_identical_command_compiles_no_search_program(
  tiny_run, tmp_path
):
  """JAX's compile log of two identical commands: the first compiles the
  search program and keeps it in --compilation_cache, the second reads
  it from there."""
  _, out, _, _ = tiny_run
  argv = [sys.executable, '-m', '_trax_qkv_cli', 'translate']
  argv += ['--model_dir', str(out / 'reference')]
  argv += ['--compilation_cache', str(tmp_path / 'xla')]
  env = dict(
    os.environ,
    JAX_LOGGING_LEVEL='DEBUG',  # its compile log, hits and misses included
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
  )
  first, second = (
    subprocess.run(
      argv + ['twenty-one', 'nine hundred'],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      check=True,
    )
    for _ in range(2)
  )
  miss = "PERSISTENT COMPILATION CACHE MISS for 'jit__search'"
  hit = "Persistent compilation cache hit for 'jit__search'"
  assert first.stderr.count(miss) >= 1
  assert second.stderr.count(miss) == 0 and second.stderr.count(hit) >= 1
  assert first.stdout == second.stdout and len(first.stdout.splitlines()) == 2


@pytest.mark.slow
def test_translate_errors(tiny_run, tmp_path, capsys):
  config, out, _, _ = tiny_run
  translate = command('translate').main
  assert translate(['--model_dir', str(out), 'one']) == 2
  assert (
    'has no checkpoint (model.pkl.gz); it holds the models '
    "['reference']: pass one of them" in capsys.readouterr().err
  )
  assert translate(['--model_dir', str(tmp_path), 'one']) == 2
  assert 'has no checkpoint (model.pkl.gz).' in capsys.readouterr().err
  with pytest.raises(ValueError, match='no sentences to translate'):
    translation.translate(str(out / 'reference'), [])
  # A checkpoint that does not fit the saved settings.
  bad = tmp_path / 'bad'
  os.makedirs(bad)
  for name in os.listdir(out / 'reference'):
    if os.path.isfile(out / 'reference' / name):
      (bad / name).write_bytes((out / 'reference' / name).read_bytes())
  settings = json.loads((bad / model_dir.SETTINGS_FILE).read_text())
  settings['d_ff'] *= 2
  (bad / model_dir.SETTINGS_FILE).write_text(json.dumps(settings))
  assert translate(['--model_dir', str(bad), 'one']) == 2
  assert 'does not fit the model: weight #' in capsys.readouterr().err
  assert (
    translate(
      [
        '--model_dir',
        str(out / 'reference'),
        '--attention',
        'cross_attention=nope',
        'one',
      ]
    )
    == 2
  )
  assert "got 'nope'" in capsys.readouterr().err
  assert (
    translate(
      [
        '--model_dir',
        str(out / 'reference'),
        '--attention',
        'decoder=auto',
        'one',
      ]
    )
    == 2
  )
  assert "site must be one of ('self_attention'" in capsys.readouterr().err
  with pytest.raises(SystemExit):  # argparse: not SITE=NAME
    translate(
      ['--model_dir', str(out / 'reference'), '--attention', 'auto', 'one']
    )
  assert 'must be SITE=NAME' in capsys.readouterr().err


def test_a_full_disk_is_one_error_line(tiny_run, tmp_path, monkeypatch, capfd):
  """Through the console entry point, as a user runs the commands."""
  from matplotlib.figure import Figure

  import _trax_qkv_cli

  _, out, _, _ = tiny_run
  model = str(out / 'reference')

  class FullDisk(io.StringIO):
    def write(self, text):
      raise OSError(errno.ENOSPC, 'No space left on device')

  with monkeypatch.context() as patch:
    patch.setattr(sys, 'stdout', FullDisk())
    assert _trax_qkv_cli.run('translate', ['--model_dir', model, 'one']) == 1
  err = capfd.readouterr().err.strip().splitlines()
  # Progress lines, then the one error line: nothing else.
  *progress, error = err
  assert error == 'error: No space left on device: standard output'
  assert all(line.startswith('translating: ') for line in progress)

  def no_space(*args, **kwargs):  # a write to a full disk names no file
    raise OSError(errno.ENOSPC, 'No space left on device')

  monkeypatch.setattr(Figure, 'savefig', no_space)
  png = tmp_path / 'maps' / 'map.png'
  argv = ['--model_dir', model, '--source', 'one', '--output', str(png)]
  assert _trax_qkv_cli.run('attention_map', argv) == 1
  err = capfd.readouterr().err.strip().splitlines()
  assert err == [f'error: No space left on device: {png}']
  assert os.listdir(png.parent) == []  # no half-written file, no temporary


@pytest.mark.slow
def test_attention_map_holds_the_viz_mode_weights(tiny_run, tmp_path):
  config, out, _, _ = tiny_run
  ((source, target),) = _test_pairs(config)[0][:1]
  path = tmp_path / 'map.json'
  main = command('attention_map').main
  assert (
    main(
      [
        '--model_dir',
        str(out / 'reference'),
        '--source',
        source,
        '--target',
        target,
        '--format',
        'json',
        '--output',
        str(path),
      ]
    )
    == 0
  )
  written = json.loads(path.read_text(encoding='utf-8'))
  # The model in viz mode, run here: its cross-attention layers' state.
  loaded = model_dir.load(out / 'reference')
  source_ids = data_lib.encode_with_eos(loaded.vocab, [source])
  target_ids = [loaded.vocab.encode(target) + [data_lib.EOS_ID]]
  expected = attention_maps.cross_attention_weights(
    model_dir.model_fn(loaded.settings),
    loaded.checkpoint,
    source_ids,
    target_ids,
  )
  assert len(written['weights']) == config.n_layers
  # Cross-attention, by its shape: each target token over the source
  # tokens (of other lengths here), not the encoder's self-attention.
  lengths = (len(target_ids[0]), len(source_ids[0]))
  assert lengths[0] != lengths[1]
  for got, want in zip(written['weights'], expected, strict=True):
    assert np.shape(got)[1:] == lengths
    assert np.array_equal(np.asarray(got, np.float32), want[0])
  assert written['head_measures'] == head_measures.measures(
    expected, [len(source_ids[0])], [len(target_ids[0])]
  )
  # Trax's own cross-attention on the same checkpoint: the same weights.
  builtin = tmp_path / 'builtin.json'
  argv = ['--model_dir', str(out / 'reference'), '--source', source]
  argv += ['--target', target, '--format', 'json', '--output', str(builtin)]
  assert main(argv + ['--attention', 'cross_attention=trax']) == 0
  for got, want in zip(json.loads(builtin.read_text())['weights'], expected):
    assert np.array_equal(np.asarray(got, np.float32), want[0])
  assert written['source_tokens'][-1] == '<eos>'
  assert len(written['target_tokens']) == len(target_ids[0])
  png = tmp_path / 'map.png'
  assert (
    main(
      [
        '--model_dir',
        str(out / 'reference'),
        '--source',
        source,
        '--output',
        str(png),
      ]
    )
    == 0
  )  # target: the greedy decode
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


@pytest.mark.slow
def test_a_second_run_on_a_held_output_dir_is_refused(tmp_path):
  """A real second process holds the directory; once it is killed the
  lock is free again (the kernel drops it)."""
  locking_py = os.path.join(ROOT, 'trax_qkv', 'supervised', 'locking.py')
  holder = textwrap.dedent(f"""
      import importlib.util, sys, time
      spec = importlib.util.spec_from_file_location('locking', {locking_py!r})
      locking = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(locking)
      with locking.hold_output_dir({str(tmp_path)!r}):
        print('held', flush=True)
        time.sleep(600)
      """)
  process = subprocess.Popen(
    [sys.executable, '-c', holder], stdout=subprocess.PIPE, text=True
  )
  try:
    assert process.stdout.readline().strip() == 'held'
    with pytest.raises(
      locking.OutputDirBusyError,
      match=rf'output_dir {tmp_path} is in use by a running '
      rf'job \(pid {process.pid} on .*-c\)',
    ):
      with locking.hold_output_dir(str(tmp_path)):
        pass
    with pytest.raises(locking.OutputDirBusyError):
      validation.run_validation(
        config_lib.ValidationConfig(
          dataset='trax_qkv_numbers/tiny',
          data_dir=shared_data_dir(tmp_path),
          vocab_size=200,
        ),
        str(tmp_path),
      )
    assert not (tmp_path / config_lib.RUN_CONFIG).exists()
  finally:
    process.send_signal(signal.SIGKILL)
    process.wait()
  with locking.hold_output_dir(str(tmp_path)):
    pass  # free again after the holder was killed


def test_unknown_dataset_is_one_line_and_writes_nothing(tmp_path, capsys):
  out = tmp_path / 'out'
  assert (
    command('validate').main(
      ['--dataset', 'no_such_dataset', '--output_dir', str(out)]
    )
    == 2
  )
  err = capsys.readouterr().err
  assert err.count('\n') == 1, err
  assert err.startswith(
    "error: dataset 'no_such_dataset' is not a "
    'tensorflow-datasets data set (did you mean '
  )
  assert not out.exists()


def test_bleu_tokenize_choices():
  with pytest.raises(
    ValueError,
    match=r'bleu_tokenize must be one of '
    r"\('13a', 'intl', 'char', 'zh', 'ja-mecab'\)",
  ):
    config_lib.ValidationConfig(bleu_tokenize='space').check()
  scores = scoring.scores(['犬が走る'], ['犬が走る'], 'char')
  assert scores['bleu'] == pytest.approx(100.0)
  assert 'tok:char' in scores['bleu_signature']
