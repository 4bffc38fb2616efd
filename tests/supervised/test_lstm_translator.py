"""The attention-LSTM translator (trax.models.LSTMSeq2SeqAttn) through the
main job and every command that reads a model directory."""

import json

from helpers import Server
from helpers import command
from helpers import shared_data_dir
from helpers import tiny_validation_config
import numpy as np
import pytest

from trax_qkv import data as data_lib
from trax_qkv.supervised import attention_maps
from trax_qkv.supervised import model_dir
from trax_qkv.validation import config as config_lib
from trax_qkv.validation import run as validation


def _same_cross_attention_maps(maps, n_heads):
  """{implementation: weights} of attention-map's JSON outputs, checked
  equal, and of one layer, every head, each target token over the source
  tokens (of other lengths)."""
  a, b = maps.values()
  assert np.array_equal(a['weights'], b['weights'])
  lengths = len(a['target_tokens']), len(a['source_tokens'])
  assert lengths[0] != lengths[1]
  assert np.shape(a['weights']) == (1, n_heads, *lengths)
  return {name: written['weights'] for name, written in maps.items()}


@pytest.mark.slow
def test_validate_translate_attention_map_and_serve(tmp_path, capsys):
  config = tiny_validation_config(
    shared_data_dir(tmp_path),
    20,
    20,
    model='lstm_seq2seq_attn',
    heatmap_sentences=1,
  )
  out = tmp_path / 'out'
  summary = validation.run_validation(config, str(out), log=lambda _: None)
  capsys.readouterr()  # what Trax's Loop printed
  # The built-in and trax_qkv from one seed on the same batches.
  assert summary['max_loss_diff'] == 0.0
  assert summary['identical_decodes'] == 1.0
  for decodes in ('decodes_{}.txt', 'decodes_beam_{}.txt'):
    trax, ours = (
      (out / decodes.format(n)).read_text() for n in config.implementations
    )
    assert trax == ours
  reference = out / 'reference'
  loaded = model_dir.load(reference)
  assert loaded.settings['model'] == 'lstm_seq2seq_attn'
  assert loaded.settings['attention'] == {'cross_attention': 'reference'}
  assert 'LSTMSeq2SeqAttn' in (out / 'report.md').read_text()

  # trax-qkv-translate gives the run's greedy decodes (the server below,
  # its beam-search ones).
  pairs = data_lib.load_split(
    summary['dataset'], 'test', tuple(summary['keys']), config.data_dir
  )[: config.max_test_sentences]
  sources = [s for s, _ in pairs]
  max_length = max(len(loaded.vocab.encode(t)) for _, t in pairs) + 8
  argv = ['--model_dir', str(reference), '--max_length', str(max_length)]
  argv += ['--batch_size', str(config.decode_batch_size)]
  assert command('translate').main(argv + sources) == 0
  assert capsys.readouterr().out == (out / 'decodes_reference.txt').read_text()

  # trax-qkv-attention-map: its one attention layer, every head, as Trax's
  # own layer computes it on the same checkpoint.
  source, target = pairs[0]
  maps = {}
  for attention in ('reference', 'trax'):
    path = tmp_path / f'{attention}.json'
    assert command('attention_map').main([
      '--model_dir', str(reference), '--source', source, '--target', target,
      '--attention', f'cross_attention={attention}',
      '--format', 'json', '--output', str(path),
    ]) == 0  # fmt: skip
    maps[attention] = json.loads(path.read_text())
  maps = _same_cross_attention_maps(maps, config.n_heads)
  want = attention_maps.cross_attention_weights(
    model_dir.model_fn(loaded.settings, {'cross_attention': 'trax'}),
    loaded.checkpoint,
    data_lib.encode_with_eos(loaded.vocab, [source]),
    [loaded.vocab.encode(target) + [data_lib.EOS_ID]],
  )
  assert np.array_equal(np.asarray(maps['trax'][0], np.float32), want[0][0])

  # trax-qkv-serve answers as the command does.
  server = Server(str(reference), '--max_wait_ms', '10')
  try:
    status, answer = server.post(
      '/translate',
      {'sentences': sources[:3], 'beam': 3, 'max_length': max_length},
    )
    assert status == 200
    expected = (out / 'decodes_beam_reference.txt').read_text().splitlines()
    assert answer['translations'] == expected[:3]
    status, answer = server.post(
      '/attention', {'sentence': source, 'format': 'json'}
    )
    assert status == 200 and len(answer['weights']) == 1
  finally:
    server.stop()


def test_lstm_model_has_only_cross_attention():
  with pytest.raises(
    ValueError, match=r"sites must name one or more of \('cross_attention',\)"
  ):
    config_lib.ValidationConfig(
      model='lstm_seq2seq_attn', sites=('self_attention',)
    ).check()
  with pytest.raises(ValueError, match='model must be one of'):
    config_lib.ValidationConfig(model='gru').check()
