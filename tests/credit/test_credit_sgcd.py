"""SGCD as its summaries describe it (credit.sgcd_token_weights, spec v2.1): the amplify-only weight
W = clip(1 + gamma · s, 1, c) against a float64 loop reference, its properties (W in [1, c], the advantage's sign
kept and never shrunk, no teacher signal -> GRPO, mask respected, scale of the divergence irrelevant) and the worked
example of docs/credit.md computed by hand."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import credit_reference as ref
from credit_strategies import NONFINITE, TOKEN_LENGTHS, arrays, bools
from jaxcredit import credit

# (gamma, c, entropy_coef, salience): the paper's defaults, a capped gentle one, a strong one, the other salience.
KNOBS = ((1.0, 2.0, 1.0, "max"), (0.5, 1.25, 0.0, "max"), (4.0, 3.0, 2.0, "max"), (1.0, 2.0, 1.0, "excess"))


def _named(knobs):
  return dict(zip(("gamma", "c", "entropy_coef", "salience"), knobs))


@functools.lru_cache(maxsize=None)
def _weights(knobs):
  return jax.jit(functools.partial(credit.sgcd_token_weights, **_named(knobs)))


def _grid(top):
  return st.integers(0, 16 * top).map(lambda k: k / 16.0)


@st.composite
def rollouts(draw, length=None):
  """(divergence, teacher entropy, action mask) of one rollout, with zeros, a negative rounding residue and NaN/inf."""
  length = draw(st.sampled_from(TOKEN_LENGTHS)) if length is None else length
  div = st.one_of(*([_grid(4)] * 5), st.just(0.0), st.just(-1.0 / 1024), st.sampled_from(NONFINITE))
  ent = st.one_of(*([_grid(4)] * 7), st.sampled_from(NONFINITE))
  return arrays(draw, (length,), div), arrays(draw, (length,), ent), bools(draw, (length,), p_true=4)


@given(rollouts(), st.sampled_from(KNOBS))
def test_sgcd_matches_reference(r, knobs):
  div, ent, action = r
  got = np.asarray(_weights(knobs)(div, ent, action))
  np.testing.assert_allclose(got, ref.sgcd_v21_weights(div, ent, action, **_named(knobs)), rtol=1e-5, atol=1e-6)


@given(rollouts(), st.sampled_from(KNOBS), st.data())
def test_sgcd_weights_lie_in_one_to_c_and_only_amplify(r, knobs, data):
  """W in [1, c]: A · W has A's sign and |A · W| >= |A| (never shrunk, never flipped), at most c · |A|."""
  div, ent, action = r
  c = knobs[1]
  w = np.asarray(_weights(knobs)(div, ent, action))
  assert w.dtype == np.float32 and np.all(np.isfinite(w))
  assert np.all(w >= 1.0) and np.all(w <= np.float32(c))
  adv = arrays(data.draw, div.shape, st.sampled_from((-1.5, -0.25, 0.0, 0.5, 2.0))) * action
  np.testing.assert_array_equal(np.sign(adv * w), np.sign(adv))
  assert np.all(np.abs(adv * w) >= np.abs(adv)) and np.all(np.abs(adv * w) <= np.float32(c) * np.abs(adv) * (1 + 1e-6))


@given(rollouts(), st.sampled_from(KNOBS))
def test_sgcd_without_teacher_signal_is_exactly_grpo(r, knobs):
  """d = 0 on every token, an invalid teacher pass (NaN everywhere), no action token, or gamma = 0: W = 1 exactly."""
  div, ent, action = r
  fn = _weights(knobs)
  for d, e, m in (
    (np.zeros_like(div), ent, action),
    (np.full_like(div, np.nan), ent, action),
    (div, ent, np.zeros_like(action)),
  ):
    np.testing.assert_array_equal(np.asarray(fn(d, e, m)), np.ones(div.shape, np.float32))
  w = np.asarray(_weights((0.0,) + knobs[1:])(div, ent, action))
  np.testing.assert_array_equal(w, np.ones_like(w))


@given(rollouts(), st.sampled_from(KNOBS), st.data())
def test_sgcd_respects_the_action_mask(r, knobs, data):
  """Off the mask W = 1, and what the features hold there never changes a weight on the mask."""
  div, ent, action = r
  fn = _weights(knobs)
  w = np.asarray(fn(div, ent, action))
  assert np.all(w[~action] == 1.0)
  other_div = arrays(data.draw, div.shape, st.one_of(_grid(8), st.sampled_from(NONFINITE)))
  other_ent = arrays(data.draw, div.shape, _grid(8))
  w2 = np.asarray(fn(np.where(action, div, other_div), np.where(action, ent, other_ent), action))
  np.testing.assert_array_equal(w2, w)


def test_sgcd_the_spike_gets_the_cap_with_max_salience():
  """salience="max": the token with the largest damped divergence has s = 1, so W = min(1 + gamma, c) there."""
  div = np.asarray([0.1, 2.0, 0.3, 0.0], np.float32)
  ent = np.zeros(4, np.float32)
  w = np.asarray(credit.sgcd_token_weights(div, ent, np.ones(4, bool)))
  assert w[1] == 2.0 and np.all(w[[0, 2]] < 2.0) and w[3] == 1.0


def test_sgcd_scale_of_the_divergence_does_not_matter():
  """Without the entropy term only d / max(d) counts: d · 2^j gives the same weights, bit for bit."""
  div = np.asarray([0.0, 0.5, 3.0, 1.5, 0.25, 7.0], np.float32)
  ent = np.ones(6, np.float32)
  action = np.asarray([True, True, True, True, False, True])
  for salience in ("max", "excess"):
    fn = _weights((1.0, 2.0, 0.0, salience))
    base = np.asarray(fn(div, ent, action))
    for j in (-100, -20, 20, 124):
      np.testing.assert_array_equal(np.asarray(fn(np.ldexp(div, j).astype(np.float32), ent, action)), base)


def test_sgcd_worked_example_by_hand():
  """docs/methods/sgcd.md, worked example. Six tokens, 0 and 4 off the action mask; A = -0.5 on the actions.

  live tokens 1, 2, 3, 5 (entropy_coef = 1):  f = 0/1, 0.5/1, 3/(1+1), 1.5/(1+1) = 0, 1/2, 3/2, 3/4
  salience "max":    s = f / (3/2) = 0, 1/3, 1, 1/2         W = 1 + s = 1, 4/3, 2, 3/2
  salience "excess": f / f̄ (f̄ = 11/16) = 0, 8/11, 24/11, 12/11;  s = clip(· − 1, 0, 1) = 0, 0, 1, 1/11
                     W = 1, 1, 2, 12/11
  gamma = 0.5, c = 1.25, "max": W = 1 + s/2 = 1, 7/6, 3/2 -> 1.25, 5/4
  """
  div = np.asarray([9.0, 0.0, 0.5, 3.0, 7.0, 1.5], np.float32)
  ent = np.asarray([0.0, 0.0, 0.0, 1.0, 0.0, 1.0], np.float32)
  action = np.asarray([False, True, True, True, False, True])
  adv = np.where(action, -0.5, 0.0).astype(np.float32)
  w = np.asarray(credit.sgcd_token_weights(div, ent, action))  # the paper's gamma = 1, c = 2
  np.testing.assert_allclose(w, [1.0, 1.0, 4 / 3, 2.0, 1.0, 3 / 2], rtol=1e-6)
  np.testing.assert_allclose(adv * w, [0.0, -0.5, -2 / 3, -1.0, 0.0, -0.75], rtol=1e-6)
  w = np.asarray(credit.sgcd_token_weights(div, ent, action, salience="excess"))
  np.testing.assert_allclose(w, [1.0, 1.0, 1.0, 2.0, 1.0, 12 / 11], rtol=1e-6)
  w = np.asarray(credit.sgcd_token_weights(div, ent, action, gamma=0.5, c=1.25))
  np.testing.assert_allclose(w, [1.0, 1.0, 7 / 6, 1.25, 1.0, 1.25], rtol=1e-6)


def test_sgcd_weights_stop_gradient():
  d = np.asarray([0.2, 1.0, 0.1], np.float32)
  h = np.asarray([0.5, 0.0, 2.0], np.float32)
  a = np.ones(3, bool)
  grads = jax.grad(lambda x, y: credit.sgcd_token_weights(x, y, a) @ np.arange(3.0), argnums=(0, 1))(d, h)
  assert all(np.all(np.asarray(g) == 0.0) for g in grads)


@pytest.mark.parametrize(
  "call,message",
  [
    (lambda: credit.sgcd_token_weights(np.zeros(4), np.zeros(3), np.ones(4, bool)), "`teacher_entropy` must have"),
    (lambda: credit.sgcd_token_weights(np.zeros((2, 4)), np.zeros(4), np.ones(4, bool)), "`divergence` must have"),
    (lambda: credit.sgcd_token_weights(np.zeros(4), np.zeros(4), np.ones(5, bool)), "`action_mask` must have"),
  ],
)
def test_sgcd_shape_errors_name_the_argument(call, message):
  with pytest.raises(ValueError, match=message):
    call()


@pytest.mark.parametrize(
  "knobs,knob",
  [
    ({"gamma": -0.1}, "gamma"),
    ({"c": 0.5}, "c"),
    ({"c": float("inf")}, "c"),
    ({"entropy_coef": -1.0}, "entropy_coef"),
    ({"salience": "mean"}, "salience"),
  ],
)
def test_sgcd_knob_errors(knobs, knob):
  with pytest.raises(ValueError, match=f"sgcd_token_weights: knob `{knob}`"):
    credit.sgcd_token_weights(np.zeros(2), np.zeros(2), np.ones(2, bool), **knobs)
