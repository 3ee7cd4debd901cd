"""SGCD v0, this library's earlier reading (credit.sgcd_v0_token_weights, method sgcd_v0), against the loop
reference of its old formula, its properties (bounded, sign of the advantage kept, no teacher signal -> GRPO, mask
respected, jit and vmap agree) and a worked example whose numbers are computed by hand."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import credit_reference as ref
from credit_strategies import NONFINITE, TOKEN_LENGTHS, arrays, bools
from jaxcredit import credit

# (alpha, entropy_coef, w_min, w_max): the defaults, a gentle reading without entropy, and a strong one.
KNOBS = ((1.0, 1.0, 0.5, 2.0), (0.5, 0.0, 0.8, 1.25), (3.0, 2.0, 0.1, 10.0))


@functools.lru_cache(maxsize=None)
def _weights(alpha, entropy_coef, w_min, w_max):
  return jax.jit(
    functools.partial(credit.sgcd_v0_token_weights, alpha=alpha, entropy_coef=entropy_coef, w_min=w_min, w_max=w_max)
  )


def _grid(top):
  return st.integers(0, 16 * top).map(lambda k: k / 16.0)


@st.composite
def rollouts(draw, length=None):
  """(divergence, teacher entropy, action mask) of one rollout: divergences on a 1/16 grid with zeros, a negative
  rounding residue and NaN/inf mixed in; entropies on a 1/16 grid in [0, 4], sometimes not finite."""
  length = draw(st.sampled_from(TOKEN_LENGTHS)) if length is None else length
  div = st.one_of(*([_grid(4)] * 5), st.just(0.0), st.just(-1.0 / 1024), st.sampled_from(NONFINITE))
  ent = st.one_of(*([_grid(4)] * 7), st.sampled_from(NONFINITE))
  return arrays(draw, (length,), div), arrays(draw, (length,), ent), bools(draw, (length,), p_true=4)


@given(rollouts(), st.sampled_from(KNOBS))
def test_sgcd_matches_reference(r, knobs):
  div, ent, action = r
  got = np.asarray(_weights(*knobs)(div, ent, action))
  np.testing.assert_allclose(got, ref.sgcd_weights(div, ent, action, *knobs), rtol=1e-5, atol=1e-6)


@given(rollouts(), st.sampled_from(KNOBS), st.data())
def test_sgcd_weights_are_bounded_and_keep_the_advantage_sign(r, knobs, data):
  div, ent, action = r
  _, _, w_min, w_max = knobs
  w = np.asarray(_weights(*knobs)(div, ent, action))
  assert w.dtype == np.float32 and np.all(np.isfinite(w))
  assert np.all(w >= np.float32(w_min)) and np.all(w <= np.float32(w_max))
  adv = arrays(data.draw, div.shape, st.sampled_from((-1.5, -0.25, 0.0, 0.5, 2.0))) * action
  np.testing.assert_array_equal(np.sign(adv * w), np.sign(adv))


@given(rollouts(), st.sampled_from(KNOBS))
def test_sgcd_without_teacher_signal_is_exactly_grpo(r, knobs):
  """d = 0 on every token, a teacher pass that is invalid (NaN everywhere), no action token or alpha = 0: w = 1,
  so w · A is GRPO's A bit for bit."""
  div, ent, action = r
  adv = np.where(action, np.float32(-0.866), np.float32(0.0))
  fn = _weights(*knobs)
  for d, e, m in (
    (np.zeros_like(div), ent, action),
    (np.full_like(div, np.nan), ent, action),
    (div, ent, np.zeros_like(action)),
  ):
    w = np.asarray(fn(d, e, m))
    np.testing.assert_array_equal(w, np.ones_like(w))
    np.testing.assert_array_equal(adv * w, adv)
  w = np.asarray(_weights(0.0, *knobs[1:])(div, ent, action))
  np.testing.assert_array_equal(w, np.ones_like(w))


@given(rollouts(), st.sampled_from(KNOBS), st.data())
def test_sgcd_respects_the_action_mask(r, knobs, data):
  """Off the mask w = 1, and what the features hold there never changes a weight on the mask."""
  div, ent, action = r
  fn = _weights(*knobs)
  w = np.asarray(fn(div, ent, action))
  assert np.all(w[~action] == 1.0)
  other_div = arrays(data.draw, div.shape, st.one_of(_grid(8), st.sampled_from(NONFINITE)))
  other_ent = arrays(data.draw, div.shape, _grid(8))
  w2 = np.asarray(fn(np.where(action, div, other_div), np.where(action, ent, other_ent), action))
  np.testing.assert_array_equal(w2, w)


@given(st.sampled_from(TOKEN_LENGTHS).flatmap(lambda n: st.lists(rollouts(n), min_size=3, max_size=3)))
def test_sgcd_jit_and_vmap_agree_with_one_call_per_rollout(rs):
  """The vmapped batch equals one jitted call per rollout (the defaults; eager calls in the worked example)."""
  knobs = KNOBS[0]
  div, ent, action = (np.stack([r[k] for r in rs]) for k in range(3))
  batched = np.asarray(_batched(knobs)(div, ent, action))
  for b in range(len(rs)):
    np.testing.assert_allclose(batched[b], np.asarray(_weights(*knobs)(div[b], ent[b], action[b])), rtol=1e-6, atol=0)


def _named(knobs):
  return dict(zip(("alpha", "entropy_coef", "w_min", "w_max"), knobs))


@functools.lru_cache(maxsize=None)
def _batched(knobs):
  return jax.jit(jax.vmap(functools.partial(credit.sgcd_v0_token_weights, **_named(knobs))))


@given(rollouts())
def test_sgcd_reassigns_without_inflating_when_the_clip_does_not_bind(r):
  """alpha = 0.5 keeps 1 + alpha · (f/f̄ − 1) >= 0.5 = w_min, and w_max = 1e6 never binds: the weights of the live
  tokens then have mean 1 (the rollout's credit is moved, not added)."""
  div, ent, action = r
  w = np.asarray(_weights(0.5, 1.0, 0.5, 1e6)(div, ent, action))
  live = action & np.isfinite(div) & np.isfinite(ent)
  if live.any() and np.any(np.maximum(div[live], 0.0) > 0):
    np.testing.assert_allclose(w[live].mean(), 1.0, rtol=1e-5)


def test_sgcd_scale_of_the_divergence_does_not_matter():
  """Without the entropy term only d / mean(d) counts: d · 2^j gives the same weights, bit for bit, from divergences
  near 2^-100 to near overflow (XLA on CPU flushes subnormals to 0: those read as no signal)."""
  div = np.asarray([0.0, 0.5, 3.0, 1.5, 0.25, 7.0], np.float32)
  ent = np.ones(6, np.float32)
  action = np.asarray([True, True, True, True, False, True])
  fn = _weights(1.0, 0.0, 0.5, 2.0)
  base = np.asarray(fn(div, ent, action))
  for j in (-100, -20, 20, 124):
    np.testing.assert_array_equal(np.asarray(fn(np.ldexp(div, j).astype(np.float32), ent, action)), base)


def test_sgcd_worked_example_by_hand():
  """Six tokens, 0 and 4 off the action mask; the GRPO advantage of this failed rollout is -0.5 on its tokens.

  live tokens 1, 2, 3, 5 (entropy_coef = 1):
    f = 0/1, 0.5/1, 3/(1+1), 1.5/(1+1) = 0, 1/2, 3/2, 3/4;   f̄ = (0 + 1/2 + 3/2 + 3/4) / 4 = 11/16
    f / f̄ = 0, 8/11, 24/11, 12/11
  alpha = 1:   w = clip(f / f̄, 0.5, 2) = 0.5, 8/11, 2, 12/11
  alpha = 0.5: w = 1 + (f / f̄ − 1) / 2 = 1/2, 19/22, 35/22, 23/22   (no clip; mean 1)
  """
  div = np.asarray([9.0, 0.0, 0.5, 3.0, 7.0, 1.5], np.float32)
  ent = np.asarray([0.0, 0.0, 0.0, 1.0, 0.0, 1.0], np.float32)
  action = np.asarray([False, True, True, True, False, True])
  adv = np.where(action, -0.5, 0.0).astype(np.float32)
  w = np.asarray(credit.sgcd_v0_token_weights(div, ent, action, alpha=1.0))
  np.testing.assert_allclose(w, [1.0, 0.5, 8 / 11, 2.0, 1.0, 12 / 11], rtol=1e-6)
  np.testing.assert_allclose(adv * w, [0.0, -0.25, -4 / 11, -1.0, 0.0, -6 / 11], rtol=1e-6)
  w = np.asarray(credit.sgcd_v0_token_weights(div, ent, action))  # the defaults: alpha 0.5, entropy_coef 1, [0.5, 2]
  np.testing.assert_allclose(w, [1.0, 1 / 2, 19 / 22, 35 / 22, 1.0, 23 / 22], rtol=1e-6)


def test_sgcd_weights_stop_gradient():
  d = np.asarray([0.2, 1.0, 0.1], np.float32)
  h = np.asarray([0.5, 0.0, 2.0], np.float32)
  a = np.ones(3, bool)
  grads = jax.grad(lambda x, y: credit.sgcd_v0_token_weights(x, y, a) @ np.arange(3.0), argnums=(0, 1))(d, h)
  assert all(np.all(np.asarray(g) == 0.0) for g in grads)


@pytest.mark.parametrize(
  "call,message",
  [
    (lambda: credit.sgcd_v0_token_weights(np.zeros(4), np.zeros(3), np.ones(4, bool)), "`teacher_entropy` must have"),
    (lambda: credit.sgcd_v0_token_weights(np.zeros((2, 4)), np.zeros(4), np.ones(4, bool)), "`divergence` must have"),
    (lambda: credit.sgcd_v0_token_weights(np.zeros(4), np.zeros(4), np.ones(5, bool)), "`action_mask` must have"),
  ],
)
def test_sgcd_shape_errors_name_the_argument(call, message):
  with pytest.raises(ValueError, match=message):
    call()


@pytest.mark.parametrize(
  "knobs,knob",
  [
    ({"alpha": -0.1}, "alpha"),
    ({"entropy_coef": -1.0}, "entropy_coef"),
    ({"w_min": 0.0}, "w_min"),
    ({"w_min": 1.5}, "w_min"),
    ({"w_max": 0.9}, "w_max"),
    ({"w_max": float("inf")}, "w_max"),
  ],
)
def test_sgcd_knob_errors(knobs, knob):
  with pytest.raises(ValueError, match=f"sgcd_v0_token_weights: knob `{knob}`"):
    credit.sgcd_v0_token_weights(np.zeros(2), np.zeros(2), np.ones(2, bool), **knobs)
