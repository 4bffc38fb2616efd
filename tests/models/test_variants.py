"""The projection variants (`trax_qkv.layers.variants`, registered by
`trax_qkv.models.variants`): real models that train and decode, never
chosen unless named; and the head measures they are compared by."""

import os

from helpers import ROOT
from helpers import TINY_TRANSFORMER
from helpers import walk_layers
import jax
import numpy as np
import pytest
import trax
from trax import shapes

import trax_qkv
from trax_qkv import kernels
from trax_qkv.models import registry
from trax_qkv.models import variants
from trax_qkv.research import head_measures

VOCAB = 20
RNG = jax.random.PRNGKey(0)


def _transformer(name, mode):
  with trax_qkv.use_attention(**dict.fromkeys(registry.SITES, name)):
    return trax.models.Transformer(
      VOCAB, mode=mode, dropout=0.0, **TINY_TRANSFORMER
    )


def _of_kind(model, kind):
  return [layer for layer in walk_layers(model) if type(layer).__name__ == kind]


def _size(weights):
  return sum(np.size(x) for x in jax.tree_util.tree_leaves(weights))


def _batch():
  rs = np.random.RandomState(0)
  src = rs.randint(1, VOCAB, size=(2, 6)).astype(np.int32)
  tgt = rs.randint(1, VOCAB, size=(2, 5)).astype(np.int32)
  src[1, -2:] = 0
  return src, tgt


@pytest.mark.parametrize('name', sorted(variants.VARIANTS))
def test_variant_in_every_site_trains_and_decodes_as_it_evaluates(
  name, tmp_path
):
  src, tgt = _batch()
  model = _transformer(name, 'eval')
  heads = {layer._n_heads for layer in _of_kind(model, 'PureAttention')}
  assert heads == ({1} if name == 'one_head' else {4})
  projections, _ = variants.VARIANTS[name]
  # Every site: the encoder's self-, the decoder's causal and cross-attention.
  sites = (
    TINY_TRANSFORMER['n_encoder_layers']
    + 2 * (TINY_TRANSFORMER['n_decoder_layers'])
  )
  assert len(_of_kind(model, 'InputProjections')) == (
    0 if projections is None else sites
  )
  signature = shapes.signature((src, tgt, tgt))
  w, s = model.init(signature, rng=RNG)
  # Per site, what the record takes away from the three d x d Dense (and
  # adds: a temperature per head), counted by hand.
  d, h = TINY_TRANSFORMER['d_model'], TINY_TRANSFORMER['n_heads']
  dense = d * d + d
  changed = {
    'no_projection': -3 * dense,
    'no_projection_temperature': -3 * dense + h,
    'shared_projection': -2 * dense,
    'raw_values': -dense,
    'raw_queries_keys': -2 * dense,
    'shared_query_key': -dense,
    'multi_query': -2 * (dense - (d * d // h + d // h)),
    'one_head': 0,
  }
  full = _transformer('reference', 'eval').init(signature, rng=RNG)[0]
  assert _size(w) == _size(full) + changed[name] * sites

  def loss(weights):
    logits = model.pure_fn((src, tgt, tgt), weights, s, RNG)[0][0]
    return (
      -jax.numpy.sum(jax.nn.one_hot(tgt, VOCAB) * jax.nn.log_softmax(logits))
      / tgt.size
    )

  before, grads = jax.value_and_grad(loss)(w)
  assert all(np.isfinite(g).all() for g in jax.tree_util.tree_leaves(grads))
  w = jax.tree_util.tree_map(lambda a, g: a - 0.05 * g, w, grads)
  assert loss(w) < before  # one step of gradient descent: it trains

  # Decoding: predict mode, a token at a time, from the same weights,
  # gives what eval mode gives for the whole target (the causal cache).
  model.weights, model.state = w, s
  path = str(tmp_path / 'weights.pkl.gz')
  model.save_to_file(path)
  logits = model((src, tgt, tgt))[0]
  predict = _transformer(name, 'predict')
  predict.init_from_file(
    path, weights_only=True, input_signature=shapes.signature((src, tgt[:, :1]))
  )
  # The decoder's input is the target shifted right: 0 first.
  shifted = np.pad(tgt, ((0, 0), (1, 0)))[:, :-1]
  for i in range(tgt.shape[1]):
    step = predict((src, shifted[:, i : i + 1]))[0]
    np.testing.assert_allclose(step[:, 0], logits[:, i], atol=1e-5)


def test_costs_count_what_the_layer_holds():
  d, h = 64, 8
  x = np.zeros((1, 3, d), np.float32)
  for name in ('reference', *variants.VARIANTS):
    with trax_qkv.use_attention(self_attention=name):
      layer = registry.EncoderSelfAttention(d, n_heads=h, mode='eval')
    w, _ = layer.init(shapes.signature((x, np.ones((1, 1, 1, 3), bool))))
    assert variants.costs(name, d, h)[0] == _size(w), name
  # docs/why_three_dense.md holds the table of its seeded runs' model.
  with open(os.path.join(ROOT, 'docs', 'why_three_dense.md')) as f:
    assert variants.cost_table(128, 4) in f.read()


def test_variants_are_chosen_only_by_name():
  for site in registry.SITES:
    names = registry.attention_implementations(site)
    for name in variants.VARIANTS:
      assert name in names and name not in kernels.names()
    auto = registry.resolve_attention(site, 'auto')
    assert auto.func is registry.SITES[site].ours
  # Neither the default nor 'auto' drops a projection or a head.
  src, tgt = _batch()
  sizes = set()
  for name in ('trax', 'auto'):
    model = _transformer(name, 'eval')
    assert not _of_kind(model, 'InputProjections')
    assert {layer._n_heads for layer in _of_kind(model, 'PureAttention')} == {4}
    w, _ = model.init(shapes.signature((src, tgt, tgt)), rng=RNG)
    sizes.add(sum(np.size(x) for x in jax.tree_util.tree_leaves(w)))
  assert len(sizes) == 1


def test_bad_projections_are_named():
  from trax_qkv.layers import variants as layers

  with pytest.raises(TypeError, match='projections must be a Projections'):
    layers.AttentionQKV('none', 16, n_heads=4)
  with pytest.raises(ValueError, match='k must be one of'):
    layers.Projections(k='both')
  with pytest.raises(
    ValueError, match="q must be one of \\('dense', 'none'\\)"
  ):
    layers.Projections(q='head')
  with pytest.raises(ValueError, match='temperature'):
    layers.Projections(temperature=True)
  with pytest.raises(ValueError, match='n_heads'):
    layers.AttentionQKV(layers.Projections(), 16, n_heads=3)


def _rows(*rows):
  return np.asarray(rows, np.float64)


def test_head_measures_on_hand_made_distributions():
  uniform = _rows([0.25] * 4, [0.25] * 4)
  one_hot = _rows([1, 0, 0, 0], [0, 0, 1, 0])
  other = _rows([0, 1, 0, 0], [0, 0, 0, 1])
  measure = head_measures.layer_measures
  # Identical heads: 0 divergence. One-hot rows: 0 entropy, peak 1.
  same = measure(np.stack([one_hot, one_hot])[None], [4], [2])
  assert same == dict(divergence=0.0, agreement=1.0, entropy=0.0, peak=1.0)
  # Disjoint one-hot heads: 1 bit apart, never the same argmax.
  apart = measure(np.stack([one_hot, other])[None], [4], [2])
  assert apart['divergence'] == pytest.approx(1.0)
  assert apart['agreement'] == 0.0
  # Uniform over 4: 2 bits; against one-hot: JSD = H(m) - (2 + 0) / 2.
  spread = measure(np.stack([uniform, one_hot])[None], [4], [2])
  m = np.array([0.625, 0.125, 0.125, 0.125])
  assert spread['divergence'] == pytest.approx(-np.sum(m * np.log2(m)) - 1.0)
  assert spread['entropy'] == pytest.approx(1.0)  # (2 + 0) / 2
  assert spread['peak'] == pytest.approx((0.25 + 1) / 2)
  # A uniform row's argmax is its first position: one row of two agrees.
  assert spread['agreement'] == 0.5
  # One head: no pairs, no divergence, no agreement.
  alone = measure(one_hot[None, None], [4], [2])
  assert alone['divergence'] is None and alone['agreement'] is None


def test_head_measures_leave_out_padding():
  # Sentence 2 has 2 real source positions and 1 real target position; its
  # padded rows and columns (nonsense here, half of each real row's weight
  # among them) must not count: counted, every measure would change.
  w = np.zeros((2, 2, 2, 4))
  w[0, :, :, 0] = 1.0
  w[1, :, 0, :] = [[0.5, 0.0, 0.5, 0.0], [0.0, 0.5, 0.0, 0.5]]
  w[1, :, 1, :] = 0.25
  got = head_measures.layer_measures(w, [4, 2], [2, 1])
  # Rows: 2 + 2 (sentence 1, identical heads) and 1 + 1 (disjoint heads).
  assert got['entropy'] == 0.0 and got['peak'] == 1.0
  assert got['divergence'] == pytest.approx((0 + 0 + 1) / 3)
  with pytest.raises(ValueError, match='source_lengths'):
    head_measures.layer_measures(w, [4, 5], [2, 1])


def test_model_measures_average_every_real_row_whatever_the_batches():
  """Batches of different sizes and lengths weigh each real row once: the
  result does not depend on how the sentences were batched."""
  rs = np.random.RandomState(1)
  lengths = [(3, 2), (5, 4), (2, 5), (4, 1), (6, 3)]
  maps = [rs.dirichlet(np.ones(s), size=(2, 3, t)) for s, t in lengths]

  def reader(src, tgt):  # one layer, (batch, heads, Lq, Lk), padded
    w = np.full((len(src), 3, max(map(len, tgt)), max(map(len, src))), 0.5)
    for i, (s, t) in enumerate(zip(src, tgt, strict=True)):
      w[i, :, : len(t), : len(s)] = maps[s[0]][0]
    return [w]

  src = [[i] * s for i, (s, _) in enumerate(lengths)]
  tgt = [[i] * t for i, (_, t) in enumerate(lengths)]
  one_by_one = head_measures.model_measures(reader, src, tgt, batch_size=1)
  for batch_size in (2, 5):
    got = head_measures.model_measures(reader, src, tgt, batch_size)
    for key, values in got.items():
      assert values == pytest.approx(one_by_one[key], rel=1e-12), key
  # And each row counted once: the entropy is the mean over all rows.
  rows = [row for m in maps for row in m[0].reshape(-1, m.shape[-1])]
  entropy = np.mean([-np.sum(row * np.log2(row)) for row in rows])
  assert one_by_one['entropy'] == [pytest.approx(entropy, rel=1e-12)]


def test_score_measures_on_hand_made_queries_and_keys():
  rs = np.random.RandomState(2)
  x = rs.normal(size=(2, 3, 5, 4))
  # q = k: a symmetric score, and (equal norms) the diagonal is each row's
  # largest, so a position weighs itself most.
  unit = x / np.linalg.norm(x, axis=-1, keepdims=True) * 3.0
  same = head_measures.score_measures(unit, unit, [5, 5], causal=False)
  assert same['asymmetry'] == 0.0
  assert same['diagonal'] > 1 / 5
  assert same['agreement'] == 1.0  # every head's largest is the diagonal
  assert same['agreement_off_self'] is None  # and no row is off it
  # Two heads that read the next position, one the position after it:
  # off the diagonal they agree in 1 pair of 3.
  eye = np.eye(5)
  ahead = [np.roll(eye, shift, axis=1) * 10 for shift in (1, 1, 2)]
  q, k = np.stack(ahead)[None], np.stack([eye] * 3)[None]
  reading = head_measures.score_measures(q, k, [5], causal=False)
  assert reading['agreement_off_self'] == pytest.approx(1 / 3)
  assert reading['agreement'] == pytest.approx(1 / 3)
  # An antisymmetric score (k = q rotated by 90 degrees in each plane).
  rotated = np.stack(
    [-unit[..., 1], unit[..., 0], -unit[..., 3], unit[..., 2]], -1
  )
  skew = head_measures.score_measures(unit, rotated, [5, 5], causal=False)
  assert skew['asymmetry'] == pytest.approx(2.0)
  assert skew['diagonal'] < same['diagonal']  # s_ii = 0: no longer the max
  # Padding leaves the measures alone; causal rows see themselves only at 0.
  padded = np.concatenate([unit, rs.normal(size=(2, 3, 2, 4)) * 9], axis=2)
  assert head_measures.score_measures(padded, padded, [5, 5], False) == same
  zeros = np.zeros((1, 1, 3, 4))
  causal = head_measures.score_measures(zeros, zeros, [3], causal=True)
  assert causal['diagonal'] == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
  assert causal['entropy'] == pytest.approx((0 + 1 + np.log2(3)) / 3)
  assert causal['agreement'] is None  # one head
  with pytest.raises(ValueError, match='length per sentence'):
    head_measures.score_measures(unit, unit, [5], causal=False)


@pytest.mark.slow
def test_self_attention_scores_of_a_model_as_the_mathematics_says(tmp_path):
  """Unprojected queries and keys give symmetric scores in the encoder
  and the decoder; Trax's projections do not."""
  from trax_qkv.research import self_attention_scores

  src, tgt = _batch()
  lengths = ([6, 4], [5, 5])
  measured = {}
  for name in ('reference', 'no_projection'):

    def model_fn(mode, name=name):
      # As the seeded runs measure: cross-attention left Trax's.
      with trax_qkv.use_attention(self_attention=name, causal_attention=name):
        return trax.models.Transformer(
          VOCAB, mode=mode, dropout=0.0, **TINY_TRANSFORMER
        )

    model = model_fn('eval')
    model.init(shapes.signature((src, tgt)), rng=RNG)
    path = str(tmp_path / f'{name}.pkl.gz')
    model.save_to_file(path)
    measured[name] = self_attention_scores.self_attention_scores(
      model_fn, path,
      [list(s[:n]) for s, n in zip(src, lengths[0], strict=True)],
      [list(t[:n]) for t, n in zip(tgt, lengths[1], strict=True)],
    )  # fmt: skip
  layers = TINY_TRANSFORMER['n_encoder_layers']
  for part in ('encoder', 'decoder'):
    assert len(measured['reference'][part]['asymmetry']) == layers
    assert min(measured['reference'][part]['asymmetry']) > 0.05
    assert max(measured['no_projection'][part]['asymmetry']) < 1e-6
    for diagonal in measured['no_projection'][part]['diagonal']:
      assert 0 < diagonal < 1
