"""ToolOPD token weights, HSD token advantages and the OPD baseline against the loop reference."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import credit_reference as ref
from credit_strategies import NONFINITE, TOKEN_LENGTHS, arrays, bools, logp_grid
from jaxcredit import credit

TOOLOPD_KNOBS = ((2.0, True), (0.5, False), (1.0, True))  # (max_credit, normalize)
CLIPS = (1.0, 0.25)
opd_jit = jax.jit(credit.opd_token_advantages)


@functools.lru_cache(maxsize=None)
def _toolopd(max_credit, normalize):
  return jax.jit(functools.partial(credit.toolopd_token_weights, max_credit=max_credit, normalize=normalize))


@functools.lru_cache(maxsize=None)
def _hsd(clip):
  return jax.jit(functools.partial(credit.hsd_token_advantages, clip=clip))


@st.composite
def token_pairs(draw):
  """Two log-prob arrays on a 1/16 grid (so a difference is exactly 0 or at least 1/16 from 0) and a mask."""
  length = draw(st.sampled_from(TOKEN_LENGTHS))
  logp = st.one_of(*([logp_grid()] * 7), st.sampled_from(NONFINITE))
  return arrays(draw, (length,), logp), arrays(draw, (length,), logp), bools(draw, (length,), p_true=4)


def _delta(a, b):
  with np.errstate(invalid="ignore"):
    return a - b


@given(token_pairs(), st.booleans(), st.sampled_from(TOOLOPD_KNOBS))
def test_toolopd_matches_reference(pair, success, knobs):
  skill, base, action = pair
  got = np.asarray(_toolopd(*knobs)(skill, base, success, action))
  np.testing.assert_allclose(got, ref.toolopd(skill, base, success, action, *knobs), rtol=1e-5, atol=1e-5)
  assert np.all(np.isfinite(got)) and np.all(got >= 0.0) and np.all(got[~action] == 0.0)
  if knobs[1] and got.any():
    np.testing.assert_allclose(got[action].mean(), 1.0, rtol=1e-5)


@given(token_pairs(), st.sampled_from(TOOLOPD_KNOBS))
def test_toolopd_outcome_reversal(pair, knobs):
  """Flipping `success` with the trajectory fixed moves weight from the tokens with δ > 0 to those with δ < 0."""
  skill, base, action = pair
  delta = _delta(skill, base)
  w_success = np.asarray(_toolopd(*knobs)(skill, base, True, action))
  w_failure = np.asarray(_toolopd(*knobs)(skill, base, False, action))
  ok = action & np.isfinite(delta)
  assert np.all(w_success[~(ok & (delta > 0))] == 0.0) and np.all(w_success[ok & (delta > 0)] > 0.0)
  assert np.all(w_failure[~(ok & (delta < 0))] == 0.0) and np.all(w_failure[ok & (delta < 0)] > 0.0)
  if not knobs[1]:
    max_credit = knobs[0]
    np.testing.assert_array_equal(w_success - w_failure, np.where(ok, np.clip(delta, -max_credit, max_credit), 0))


def test_toolopd_traced_success_and_vmap():
  skill = np.array([[-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0]], np.float32)
  base = np.array([[-2.0, -2.0, -1.0], [-2.0, -2.0, -1.0]], np.float32)
  action = np.ones((2, 3), bool)
  got = jax.jit(jax.vmap(credit.toolopd_token_weights))(skill, base, np.array([True, False]), action)
  np.testing.assert_allclose(got, [[3.0, 0.0, 0.0], [0.0, 0.0, 3.0]])


@given(token_pairs(), st.sampled_from(CLIPS))
def test_hsd_tokens_match_reference(pair, clip):
  teacher, policy, action = pair
  got = np.asarray(_hsd(clip)(teacher, policy, action))
  np.testing.assert_allclose(got, ref.hsd_tokens(teacher, policy, action, clip), rtol=1e-5, atol=1e-5)
  assert np.all(np.abs(got) <= clip) and np.all(got[~action] == 0.0) and np.all(np.isfinite(got))


@given(token_pairs())
def test_opd_tokens_match_reference(pair):
  teacher, policy, action = pair
  got = np.asarray(opd_jit(teacher, policy, action))
  np.testing.assert_array_equal(got, ref.opd_tokens(teacher, policy, action))
  assert np.all(got[~action] == 0.0) and np.all(np.isfinite(got))


def test_dense_terms_stop_gradient():
  t = np.array([-1.0, -0.5, -3.0])
  a = np.ones(3, bool)
  for fn in (
    credit.opd_token_advantages,
    credit.hsd_token_advantages,
    lambda s, b, m: credit.toolopd_token_weights(s, b, True, m, normalize=False),
  ):
    grads = jax.jit(jax.grad(lambda x, y: fn(x, y, a) @ np.arange(3.0), argnums=(0, 1)))(t, np.full(3, -1.5))
    assert all(np.all(np.asarray(g) == 0.0) for g in grads)


BAD_SHAPES = [
  (
    lambda: credit.toolopd_token_weights(np.zeros(4), np.zeros(3), True, np.ones(4, bool)),
    "`logp_base` must have shape [L]",
  ),
  (
    lambda: credit.toolopd_token_weights(np.zeros(4), np.zeros(4), np.array([True]), np.ones(4, bool)),
    "`success` must have rank 0",
  ),
  (
    lambda: credit.toolopd_token_weights(np.zeros(4), np.zeros(4), 0.7, np.ones(4, bool)),
    "`success` must be a bool scalar",
  ),
  (
    lambda: credit.hsd_token_advantages(np.zeros(4), np.zeros(4), np.ones(5, bool)),
    "`action_mask` must have shape [L]",
  ),
  (
    lambda: credit.opd_token_advantages(np.zeros((2, 4)), np.zeros(4), np.ones(4, bool)),
    "`teacher_logp` must have rank 1 with shape [L]",
  ),
]


@pytest.mark.parametrize("call,message", BAD_SHAPES)
def test_shape_errors_name_the_argument(call, message):
  with pytest.raises(ValueError) as info:
    call()
  assert message in str(info.value)


@pytest.mark.parametrize(
  "call,knob",
  [
    (
      lambda: credit.toolopd_token_weights(np.zeros(2), np.zeros(2), True, np.ones(2, bool), max_credit=0.0),
      "max_credit",
    ),
    (
      lambda: credit.toolopd_token_weights(np.zeros(2), np.zeros(2), True, np.ones(2, bool), normalize="yes"),
      "normalize",
    ),
    (lambda: credit.hsd_token_advantages(np.zeros(2), np.zeros(2), np.ones(2, bool), clip=0.0), "clip"),
    (lambda: credit.hsd_token_advantages(np.zeros(2), np.zeros(2), np.ones(2, bool), clip=-1.0), "clip"),
  ],
)
def test_knob_errors(call, knob):
  with pytest.raises(ValueError, match=f"`{knob}`"):
    call()
