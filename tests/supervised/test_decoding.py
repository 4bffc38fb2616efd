"""The compiled search against release 0.3's per-token Python loop."""

import functools
import io
import os
import sys

from helpers import TINY_TRANSFORMER
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import trax
from trax import shapes

import trax_qkv
from trax_qkv.benchmarks import python_loop_decoding
from trax_qkv.data import EOS_ID
from trax_qkv.kernels import dispatch
from trax_qkv.models import registry
from trax_qkv.supervised import decoding
from trax_qkv.supervised import search
from trax_qkv.supervised import translation

VOCAB = 40  # small enough that random weights often choose EOS
# Wider than the tiny model, so that its random weights (EOS favoured, see
# `checkpoint`) end hypotheses at every length, not all at once; max_len
# 64: room for the default decode length, 2 x the source + 10.
CONFIG = dict(TINY_TRANSFORMER, d_model=32, d_ff=64, max_len=64, dropout=0.0)
RELEASE_0_2_0 = os.path.join(
  os.path.dirname(os.path.dirname(__file__)), 'fixtures', 'release_0.2.0'
)


def test_top_k_by_blocks_is_lax_top_k():
  rs = np.random.RandomState(0)
  for n in (33380, 4 * 8192, 700):
    for trial in range(6):
      x = rs.randn(5, n).astype(np.float32)
      if trial % 2:
        x = np.round(x, 1)  # many equal values: the order of ties counts
      if trial % 3 == 0:
        x[:, rs.randint(0, n, 100)] = -np.inf
      if trial == 5:  # fewer finite values than k: -inf ones, in order
        x[:, 3:] = -np.inf
        x[:, rs.randint(0, n, 2)] = 1.0
      for k in (2, 8):
        expected = jax.lax.top_k(x, k)
        got = jax.jit(search.top_k, static_argnums=1)(x, k)
        assert np.array_equal(expected[0], got[0])
        assert np.array_equal(expected[1], got[1])


def test_argmax_by_blocks_is_jnp_argmax():
  rs = np.random.RandomState(1)
  argmax = jax.jit(search.argmax)
  for n in (8345, 8192, 700, 40):
    for trial in range(8):
      x = rs.randn(6, n).astype(np.float32)
      if trial % 2:
        x = np.round(x, 1)  # many equal values: the first one counts
      if trial == 2:
        x[:, rs.randint(0, n, 50)] = -np.inf
      if trial == 3:
        x[:] = -np.inf
      if trial == 4:  # NaN counts as the largest, +inf after it or not
        x[np.arange(6), rs.randint(0, n, 6)] = np.nan
        x[:, rs.randint(0, n, 2)] = np.inf
      if trial == 5:  # the short last block overlaps the one before
        x[:, [n - 1, n - 130 if n > 130 else 0]] = 10.0
      if trial == 6:
        x[:, n - 1] = 10.0
      if trial == 7:
        x = np.ones_like(x)
      assert np.array_equal(jnp.argmax(x, axis=1), argmax(x)), (n, trial)


def test_one_step_of_beam_search_moves_eos_to_finished():
  """Candidates of 2 beams x 4 tokens, EOS is token 1: beam 0 + EOS
  finishes; the two best others go on; beam 1 + EOS ranks after them."""
  candidates = np.log(
    np.array([0.30, 0.25, 0.05, 0.02, 0.20, 0.10, 0.06, 0.02])
  )
  finished = []
  scores, parents, tokens = python_loop_decoding._select_beams(
    candidates, 2, 4, step=0, alpha=0.0, finished=finished
  )
  assert finished == [(candidates[1], candidates[1], 0)]
  assert parents.tolist() == [0, 1] and tokens.tolist() == [0, 0]
  np.testing.assert_allclose(scores, candidates[[0, 4]])
  (new_scores, new_parents, new_tokens), (values, _, finishes) = search._select(
    jnp.asarray(candidates[None], jnp.float32), 4, 2, EOS_ID
  )
  assert new_parents.tolist() == [[0, 1]] and new_tokens.tolist() == [[0, 0]]
  np.testing.assert_allclose(new_scores[0], candidates[[0, 4]], rtol=1e-6)
  np.testing.assert_allclose(
    values[finishes], candidates[[1]], rtol=1e-6
  )  # beam 1 + EOS (0.10) came after two that go on: not finished


def test_bucket_lengths_and_batch_rows():
  buckets = sorted({decoding.bucket_length(n) for n in range(1, 200)})
  assert buckets == [8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]
  assert decoding.bucket_length(13, limit=14) == 14
  assert decoding.bucket_length(20, limit=16) == 20  # never shorter
  assert [decoding.batch_rows(n, 32) for n in (100, 96, 65, 33, 31, 1)] == [
    25, 32, 22, 17, 31, 1
  ]  # fmt: skip
  assert decoding.n_batches(100, 32) == 4  # 25 each


def _model_fn(attention, mode):
  if attention == registry.BUILTIN:
    return trax.models.Transformer(VOCAB, mode=mode, **CONFIG)
  with trax_qkv.use_attention(**dict.fromkeys(registry.SITES, attention)):
    return trax.models.Transformer(VOCAB, mode=mode, **CONFIG)


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
  """Random weights of the small model, saved as Trax saves them; the
  output layer's bias favours EOS, so that hypotheses end at all lengths."""
  model = _model_fn(registry.BUILTIN, 'eval')
  src = np.ones((1, 4), np.int32)
  model.init(shapes.signature((src, src)), rng=jax.random.PRNGKey(3))
  leaves, tree = jax.tree_util.tree_flatten(model.weights)
  last = max(i for i, x in enumerate(leaves) if np.shape(x) == (VOCAB,))
  leaves[last] = np.asarray(leaves[last]).copy()
  leaves[last][EOS_ID] += 2.0
  model.weights = jax.tree_util.tree_unflatten(tree, leaves)
  path = str(tmp_path_factory.mktemp('decoding') / 'model.pkl.gz')
  model.save_to_file(path)
  return path, model


def _sources(n, seed=0):
  """`n` sources of 1 to 19 tokens with EOS, in no order of length."""
  rs = np.random.RandomState(seed)
  return [
    rs.randint(2, VOCAB, rs.randint(0, 19)).tolist() + [EOS_ID]
    for _ in range(n)
  ]


@pytest.mark.slow
@pytest.mark.stack
@pytest.mark.parametrize(
  'n_beams,alpha', [(1, 0.6), (1, 0.0), (2, 0.6), (4, 0.6), (3, 0.0)]
)
def test_decodes_equal_the_python_loop(checkpoint, n_beams, alpha, monkeypatch):
  """Every hypothesis (and beam search's log-probability) as the previous
  implementation's, which padded every batch to the longest source and
  took sources in input order: the compiled search sorts them into
  length buckets (here one per batch). Ragged last batches on both
  sides. With 'reference' attention; Trax's own layers decode as it does
  (test_trax_and_reference_decode_alike)."""
  monkeypatch.setattr(decoding, 'MIN_BATCHES_PER_BUCKET', 1)
  path, _ = checkpoint
  model_fn = functools.partial(_model_fn, 'reference')
  sources = _sources(13)
  longest, max_length, batch = max(map(len, sources)), 12, 5
  old = decoding.predict_model(
    model_fn, path, batch * n_beams, longest, max_length
  )
  decoder = decoding.Decoder(model_fn, path, n_beams, alpha)
  if n_beams == 1:  # greedy; with alpha 0, the loop's beam search of 1
    expected = (
      python_loop_decoding.greedy_decode(
        old, sources, batch, longest, max_length
      )
      if alpha
      else python_loop_decoding.beam_decode(
        old, sources, batch, longest, 1, max_length, alpha=0.0
      )
    )
    got = decoder.decode(sources, batch, max_length, longest)
  else:
    expected = python_loop_decoding.beam_decode(
      old, sources, batch, longest, n_beams, max_length, alpha, True
    )
    got = decoder.decode(
      sources, batch, max_length, longest, with_log_probs=True
    )
    np.testing.assert_allclose(
      [log_prob for _, log_prob in got],
      [log_prob for _, log_prob in expected],
      rtol=1e-5,
    )
    expected, got = [e for e, _ in expected], [g for g, _ in got]
  assert got == expected
  # Not vacuous: some hypotheses end at EOS, some run to max_length.
  lengths = {len(h) for h in got}
  assert max(lengths) == max_length and min(lengths) < max_length


@pytest.mark.slow
@pytest.mark.stack
@pytest.mark.parametrize('n_beams', [1, 3])
def test_trax_and_reference_decode_alike(checkpoint, n_beams):
  path, _ = checkpoint
  sources = _sources(9, seed=4)
  decoded = [
    decoding.Decoder(
      functools.partial(_model_fn, attention), path, n_beams
    ).decode(sources, 4, 10)
    for attention in (registry.BUILTIN, 'reference')
  ]
  assert decoded[0] == decoded[1]  # 'auto': the test below


@pytest.mark.slow
@pytest.mark.parametrize('n_beams', [1, 3])
def test_auto_through_a_fast_kernel_decodes_as_the_builtin(
  checkpoint, n_beams, monkeypatch
):
  """At this size 'auto' runs the reference math; with the reference's
  size limit at 0 it runs 'fused' in the encoder and cross-attention, and
  decodes the built-in's hypotheses (beam scores to float32 rounding)."""
  path, _ = checkpoint
  sources = _sources(9, seed=4)

  def decoded(attention):
    decoder = decoding.Decoder(
      functools.partial(_model_fn, attention), path, n_beams
    )
    return decoder.decode(sources, 4, 10, with_log_probs=n_beams > 1)

  builtin = decoded(registry.BUILTIN)
  chosen, choose = [], dispatch.choose
  monkeypatch.setattr(dispatch, 'REFERENCE_MAX_LOGITS', 0)
  monkeypatch.setattr(
    dispatch, 'choose', lambda call: chosen.append(choose(call)) or chosen[-1]
  )
  auto = decoded('auto')
  assert 'fused' in chosen
  if n_beams == 1:
    assert auto == builtin
  else:
    assert [ids for ids, _ in auto] == [ids for ids, _ in builtin]
    np.testing.assert_allclose(
      [p for _, p in auto], [p for _, p in builtin], rtol=1e-5, atol=1e-5
    )


@pytest.mark.slow
def test_beam_log_probs_are_the_models(checkpoint):
  """Teacher-force each hypothesis (+ EOS if it ended) in eval mode: the
  sum of its log-softmax is the search's score. Beams whose K/V caches
  were not re-ordered with them would break this."""
  path, eval_model = checkpoint
  sources = _sources(6, seed=1)
  decoder = decoding.Decoder(
    functools.partial(_model_fn, 'reference'), path, 3, 0.6
  )
  got = decoder.decode(sources, 4, 10, with_log_probs=True)
  for source, (hypothesis, log_prob) in zip(sources, got):
    assert EOS_ID not in hypothesis
    target = np.array(
      [hypothesis + ([EOS_ID] if len(hypothesis) < 10 else [])], np.int32
    )
    logits = eval_model((np.array([source], np.int32), target))[0]
    log_softmax = jax.nn.log_softmax(logits[0], axis=-1)
    expected = jnp.sum(log_softmax[np.arange(target.shape[1]), target[0]])
    np.testing.assert_allclose(log_prob, float(expected), rtol=0, atol=1e-4)


@pytest.mark.parametrize('n_beams', [1, 3])
def test_a_row_is_decoded_alike_whatever_its_neighbours(checkpoint, n_beams):
  """What docs/serving.md promises: within one program shape, another
  row's sentence, or another row, changes nothing of a sentence's
  translation (beam search: nor its score), bit for bit."""
  path, _ = checkpoint
  decoder = decoding.Decoder(
    functools.partial(_model_fn, 'reference'), path, n_beams
  )
  sentence, *others = _sources(15, seed=5)
  width = max(len(s) for s in [sentence, *others])

  def decoded_at(row, neighbours):
    rows = neighbours[:row] + [sentence] + neighbours[row:]
    batch = decoding.pad_rows(rows, width)
    return decoder.decode_batch(batch, len(rows), 10, n_beams > 1)[row]

  first = decoded_at(0, others[:7])
  assert decoded_at(5, others[7:][::-1]) == first
  assert decoded_at(7, others[3:10]) == first


def test_batches_are_padded_to_few_lengths(monkeypatch):
  lengths = [3, 30, 9, 5, 17, 2, 11, 8, 25, 4, 6]
  plan = decoding.plan_batches(lengths, 2)
  assert [lengths[i] for b, _ in plan for i in b] == sorted(lengths)[::-1]
  assert {length for _, length in plan} == {32}  # 6 batches: one program
  monkeypatch.setattr(decoding, 'MIN_BATCHES_PER_BUCKET', 3)
  plan = decoding.plan_batches(lengths, 2, limit=28)
  # 30 is padded to itself (the limit is shorter); then 17, 9 and 6 start
  # buckets 24, 12 and 8, as 3 batches or more remain; the last 2 share 8.
  assert [length for _, length in plan] == [30, 24, 12, 8, 8, 8]


@pytest.mark.slow
@pytest.mark.stack
def test_one_program_per_batch_shape(checkpoint, monkeypatch):
  """A program is compiled once for each (sentences, bucket, max_length)
  and then reused: decoding the same sources again compiles nothing."""
  monkeypatch.setattr(decoding, 'MIN_BATCHES_PER_BUCKET', 2)
  path, _ = checkpoint
  decoder = decoding.Decoder(
    functools.partial(_model_fn, 'reference'), path, n_beams=2
  )
  sources = _sources(40, seed=2)
  plan = decoding.plan_batches([len(s) for s in sources], 8)
  n_shapes = len({length for _, length in plan})
  assert 2 <= n_shapes < len(plan)  # more than one bucket, fewer than batches
  first = decoder.decode(sources, 8, 6)
  assert decoder.compilations == n_shapes
  assert decoder.decode(sources, 8, 6) == first
  assert decoder.decode(sources[::-1], 8, 6) == first[::-1]
  assert decoder.compilations == n_shapes
  decoder.decode(sources[:3], 8, 6)  # 3 sentences: one batch of 3 rows
  assert decoder.compilations == n_shapes + 1
  decoder.decode(sources[:3], 8, 7)  # another max_length: another program
  assert decoder.compilations == n_shapes + 2


def _release_sources():
  with open(os.path.join(RELEASE_0_2_0, 'sources.txt'), encoding='utf-8') as f:
    return f.read().splitlines()


def _release_decodes(name):
  with open(os.path.join(RELEASE_0_2_0, name), encoding='utf-8') as f:
    return f.read().splitlines()


@pytest.mark.slow
def test_translation_streams_in_order():
  """Lines are pulled a chunk at a time, and each chunk's translations
  come out, in input order, before the next chunk is read."""
  sources = _release_sources()
  expected = _release_decodes('decodes_beam2.txt')
  pulled = []

  def lines():
    for line in sources:
      pulled.append(line)
      yield line

  out = translation.translate_lines(
    RELEASE_0_2_0, lines(), chunk_size=3, n_beams=2, max_length=16
  )
  assert len(pulled) == 3  # the first chunk, read to check there is one
  got = []
  for translated in out:
    got.append(translated)
    assert len(pulled) == min(len(sources), 3 * (1 + (len(got) - 1) // 3))
  assert got == expected


@pytest.mark.slow
def test_translate_command_streams_stdin(monkeypatch, capsys):
  from trax_qkv.cli import translate

  sources = _release_sources()
  data = ('\r\n'.join(sources[:4]) + '\n\n' + '\n'.join(sources[4:])).encode()
  monkeypatch.setattr(sys, 'stdin', io.TextIOWrapper(io.BytesIO(data)))
  argv = ['--model_dir', RELEASE_0_2_0, '--max_length', '16']
  assert translate.main(argv + ['--chunk_size', '2', '--batch_size', '3']) == 0
  expected = _release_decodes('decodes_greedy.txt')
  assert (
    capsys.readouterr().out.splitlines() == expected[:4] + [''] + (expected[4:])
  )
  assert translate.CHUNK_SIZE == translation.CHUNK_SIZE
