"""Group statistics at extreme scales (issue 35, case 10): GRPO, Dr.GRPO, RLOO, GiGPO, TRACE, CrEST and GEAR
against float64 references, and their scale invariance A(c·R) = A(R) (c·A(R) for the centring-only baselines).

float32 squares overflow above about 1.8e19 and underflow below about 1e-19, so a std or an RMS taken of raw
values is wrong long before the values themselves are out of range; these tests draw rewards, surprisals and
divergences from 1e-30 to 1e30.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import credit_reference as ref
from jaxcredit import credit
from jaxcredit.credit import numerics

SCALES = ("group", "none")
GROUP_SIZES = (2, 3, 8)
BASE = (-2.0, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 3.0, 0.1, 1.7)  # rewards before the scale is applied
TINY_EPS = 1e-37  # an eps far below every std these tests produce, so the statistic alone decides


@functools.lru_cache(maxsize=None)
def _grpo(scale, eps):
  return jax.jit(functools.partial(credit.grpo_advantages, scale=scale, eps=eps))


@functools.lru_cache(maxsize=None)
def _gigpo(scale, eps):
  return jax.jit(functools.partial(credit.gigpo_advantages, gamma=0.5, omega=1.0, scale=scale, eps=eps))


_rloo = jax.jit(credit.rloo_advantages)


def _grpo64(rewards, mask, scale, eps, ddof=1):
  """(R − μ) / (σ + eps) (or R − μ) over the valid entries, in float64 from the float32 rewards."""
  r = np.asarray(rewards, np.float32).astype(np.float64)
  valid = np.asarray(mask, bool) & np.isfinite(r)
  out = np.zeros(r.shape, np.float64)
  if valid.sum() < 2 or np.all(r[valid] == r[valid][0]):
    return out
  dev = r[valid] - r[valid].mean()
  out[valid] = dev / (np.sqrt(np.sum(dev * dev) / (valid.sum() - ddof)) + eps) if scale == "group" else dev
  return out


def _rloo64(rewards, mask):
  r = np.asarray(rewards, np.float32).astype(np.float64)
  valid = np.asarray(mask, bool) & np.isfinite(r)
  n = valid.sum()
  out = np.zeros(r.shape, np.float64)
  if n < 2:
    return out
  out[valid] = r[valid] - (r[valid].sum() - r[valid]) / (n - 1)
  return out


def _close(got, want, rtol=1e-5):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert np.all(np.isfinite(got)), got
  np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(np.max(np.abs(want), initial=0.0), 1e-300))


# ------------------------------------------------------------------------------------------- the named case


def test_issue35_case10_huge_rewards_are_normalised_like_small_ones():
  """Issue 35 case 10: rewards [1e20, −1e20, 0] gave GRPO and GiGPO [0, 0, 0] (the variance overflowed)."""
  rewards = np.array([1e20, -1e20, 0.0], np.float32)
  np.testing.assert_allclose(_grpo("group", 1e-6)(rewards), [1.0, -1.0, 0.0], rtol=1e-6)
  np.testing.assert_allclose(_grpo("group", 1e-6)(rewards), _grpo("group", 1e-6)(np.float32([1, -1, 0])), rtol=1e-6)
  # One turn each, all in one anchor state: the step term is GRPO again, so A = 2 · GRPO.
  ids, turns = np.zeros((3, 1), np.int32), np.ones((3, 1), bool)
  np.testing.assert_allclose(_gigpo("group", 1e-6)(rewards, ids, turns)[:, 0], [2.0, -2.0, 0.0], rtol=1e-6)
  # Dr.GRPO and RLOO keep the reward's unit; their sums overflowed at 2e38 - (-2e38).
  big = np.array([2e38, -2e38, 0.0], np.float32)
  np.testing.assert_allclose(_grpo("group", 1e-6)(big), [1.0, -1.0, 0.0], rtol=1e-6)
  _close(_rloo(np.array([1e38, -1e38, 0.0], np.float32)), [1.5e38, -1.5e38, 0.0], rtol=1e-6)


# -------------------------------------------------------------------------------------------------- sweeps


@st.composite
def scaled_groups(draw):
  g = draw(st.sampled_from(GROUP_SIZES))
  base = np.asarray(draw(st.lists(st.sampled_from(BASE), min_size=g, max_size=g)), np.float64)
  mask = np.asarray(draw(st.lists(st.sampled_from([True] * 4 + [False]), min_size=g, max_size=g)), bool)
  exponent = draw(st.integers(-30, 30))
  mantissa = draw(st.sampled_from((1.0, 1.5, 3.7, 9.9)))
  return base, mask, mantissa * 10.0**exponent


@given(scaled_groups(), st.sampled_from(SCALES))
def test_grpo_rloo_gigpo_equal_a_float64_reference_at_every_scale(group, scale):
  base, mask, c = group
  rewards = (base * c).astype(np.float32)
  _close(_grpo(scale, 1e-6)(rewards, mask), _grpo64(rewards, mask, scale, 1e-6))
  _close(_rloo(rewards, mask), _rloo64(rewards, mask))
  # GiGPO with every turn in one state and one turn each: the step term is the episode term again.
  ids, turns = np.zeros((len(rewards), 1), np.int32), np.ones((len(rewards), 1), bool)
  _close(_gigpo(scale, 1e-6)(rewards, ids, turns, mask)[:, 0], 2.0 * _grpo64(rewards, mask, scale, 1e-6))


@given(scaled_groups(), st.sampled_from(SCALES))
def test_group_statistics_are_scale_invariant(group, scale):
  """A(c·R) = A(R) for GRPO and GiGPO (eps negligible), c·A(R) for Dr.GRPO and RLOO, c from 1e-30 to 1e31."""
  base, mask, c = group
  unit = base.astype(np.float32)
  rewards = (base * c).astype(np.float32)
  c32 = rewards.astype(np.float64) / np.where(unit == 0, 1.0, unit)  # c as float32 rounding left it, per entry
  factor = 1.0 if scale == "group" else c
  want = np.asarray(_grpo(scale, TINY_EPS)(unit, mask), np.float64) * factor
  _close(_grpo(scale, TINY_EPS)(rewards, mask), want, rtol=1e-5)
  _close(_rloo(rewards, mask), np.asarray(_rloo(unit, mask), np.float64) * c, rtol=1e-5)
  ids, turns = np.zeros((len(rewards), 1), np.int32), np.ones((len(rewards), 1), bool)
  want = np.asarray(_gigpo(scale, TINY_EPS)(unit, ids, turns, mask), np.float64) * factor
  _close(_gigpo(scale, TINY_EPS)(rewards, ids, turns, mask), want, rtol=1e-5)
  assert np.all(np.abs(c32[unit != 0] / c - 1.0) < 1e-6)  # the scaled rewards are c·R up to float32 rounding


@given(
  st.sampled_from(GROUP_SIZES),
  st.floats(allow_nan=False, allow_infinity=False, width=32),
  st.sampled_from(SCALES),
)
def test_equal_finite_rewards_of_any_size_give_zeros(g, value, scale):
  rewards = np.full(g, value, np.float32)
  assert np.all(np.asarray(_grpo(scale, 1e-6)(rewards)) == 0.0)
  assert np.all(np.asarray(_rloo(rewards)) == 0.0)
  ids, turns = np.tile(np.arange(2, dtype=np.int32), (g, 1)), np.ones((g, 2), bool)  # turn t in state t
  assert np.all(np.asarray(_gigpo(scale, 1e-6)(rewards, ids, turns)) == 0.0)


@given(
  st.lists(st.floats(-3.3999999521443642e38, 3.3999999521443642e38, width=32), min_size=2, max_size=8),
  st.sampled_from(SCALES),
)
def test_finite_rewards_never_give_nan(values, scale):
  """Any finite rewards (up to float32's largest) give finite GRPO advantages, equal to the float64 value."""
  rewards = np.asarray(values, np.float32)
  mask = np.ones(len(rewards), bool)
  if scale == "group":
    _close(_grpo(scale, 1e-6)(rewards, mask), _grpo64(rewards, mask, scale, 1e-6), rtol=1e-4)
  else:  # R − μ may exceed float32's range only when the rewards come near it; otherwise it is exact
    want = _grpo64(rewards, mask, scale, 1e-6)
    if np.max(np.abs(want)) < 3e38:
      _close(_grpo(scale, 1e-6)(rewards, mask), want, rtol=1e-4)


@functools.lru_cache(maxsize=None)
def _trace(std, dense_norm, alpha_turn):
  return jax.jit(
    functools.partial(credit.trace_advantages, std=std, dense_norm=dense_norm, alpha_turn=alpha_turn, eps=TINY_EPS)
  )


@given(st.integers(-30, 30), st.sampled_from((1.0, 2.5, 7.3)))
def test_trace_outcome_and_dense_rms_are_scale_invariant(exponent, mantissa):
  """TRACE's A_out (population and sample std) and its group_rms dense scaling at rewards 1e-30 to 1e31."""
  c = mantissa * 10.0**exponent
  unit = np.array([1.0, 0.0, 0.5, 1.0], np.float32)
  gold = np.array([[-5.0, -3.0, -3.0, -1.0, 0.0]] * 4, np.float32)
  bmask, turns = np.ones((4, 5), bool), np.ones((4, 4), bool)
  for std in ("population", "sample"):
    for dense_norm in ("none", "group_rms"):
      want = np.asarray(_trace(std, dense_norm, 0.2)(unit, gold, bmask, turns), np.float64)
      _close(_trace(std, dense_norm, 0.2)((unit * c).astype(np.float32), gold, bmask, turns), want, rtol=1e-5)
    out64 = _grpo64(unit * c, np.ones(4, bool), "group", TINY_EPS, 0 if std == "population" else 1)
    _close(_trace(std, "none", 0.0)((unit * c).astype(np.float32), gold, bmask, turns)[:, 0], out64)


def test_trace_group_rms_of_huge_dense_rewards():
  """The dense RMS squared each turn reward: a gold log-prob gap of 1e20 nats made it inf and the dense term 0."""
  rewards = np.array([1.0, 0.0], np.float32)
  gold = np.array([[-3e20, -1e20, 0.0], [-2.0, -1.0, 0.0]], np.float32)
  fn = functools.partial(credit.trace_advantages, value="raw_delta", dense_norm="group_rms", alpha_out=0.0)
  got = np.asarray(fn(rewards, gold, np.ones((2, 3), bool), np.ones((2, 2), bool)))
  assert np.all(np.isfinite(got)) and np.max(np.abs(got)) > 0.1, got


@given(st.integers(-25, 25), st.data())
def test_crest_surprisal_statistics_at_every_scale(exponent, data):
  """CrEST's surprisal z-score (population std) against the float64 reference, policy log-probs up to 1e25 nats."""
  n = 12
  base = np.asarray(data.draw(st.lists(st.sampled_from((-0.5, -1.0, -2.0, -4.0, -0.1)), min_size=n, max_size=n)))
  policy = (base * 10.0**exponent).astype(np.float32)
  # The teacher's log-prob a factor above or below the policy's, so the gap survives float32 at every scale.
  factor = np.asarray(data.draw(st.lists(st.sampled_from((0.5, 0.8, 1.5)), min_size=n, max_size=n)))
  teacher = (policy * factor).astype(np.float32)
  turn_adv = np.array([1.0, -1.0], np.float32)
  ids = np.array([0] * 6 + [1] * 6, np.int32)
  action = np.ones(n, bool)
  got = credit.crest_token_weights(turn_adv, ids, action, teacher, policy)
  want = ref.crest_weights(turn_adv, ids, action, teacher, policy)
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-6)


# No extension (tau_low = entropy_floor = inf): the segments are the spikes, decided by τ alone.
_gear_segs = jax.jit(
  functools.partial(credit.gear_v0_segments, k_sigma=2.0, tau_low=math.inf, entropy_floor=math.inf, eps=TINY_EPS)
)
_gear_adv = jax.jit(
  functools.partial(credit.gear_v0_advantages, k_sigma=2.0, tau_low=math.inf, entropy_floor=math.inf, eps=TINY_EPS)
)


@given(st.integers(-30, 30), st.sampled_from((1.0, 3.3)))
def test_gear_threshold_and_weights_are_scale_invariant(exponent, mantissa):
  """GEAR's τ = mean + k·std and its weights tanh(d / τ): the same spikes and weights at divergences 1e-30..1e31."""
  c = mantissa * 10.0**exponent
  div = np.array([0.1, 0.2, 0.1, 5.0, 0.3, 0.1, 0.2, 0.1, 0.15, 0.1], np.float32)
  ent = np.zeros(10, np.float32)
  action = np.ones(10, bool)
  scaled = (div * c).astype(np.float32)
  want_seg = np.asarray(_gear_segs(div, ent, action))
  assert want_seg.tolist() == [-1, -1, -1, 3, -1, -1, -1, -1, -1, -1]  # one spike, at token 3
  np.testing.assert_array_equal(_gear_segs(scaled, ent, action), want_seg)
  _close(_gear_adv(1.0, scaled, ent, action), np.asarray(_gear_adv(1.0, div, ent, action), np.float64), rtol=1e-5)


def test_crest_equal_surprisals_leave_the_entropy_gate_neutral():
  """Equal surprisals have z = 0 (m = 1); the rounded float32 mean made z = (s − mean) / 1e-6 far from 0."""
  n = 12
  policy = np.full(n, -5.9, np.float32)  # s = 5.9 gave φ = 1.0739 instead of 1.084
  teacher = np.full(n, -5.3, np.float32)  # 0.6 nats above the policy: w at its clip, the gate on where A > 0
  turn_adv = np.array([1.0, -1.0], np.float32)
  ids = np.array([0] * 6 + [1] * 6, np.int32)
  got = np.asarray(credit.crest_token_weights(turn_adv, ids, np.ones(n, bool), teacher, policy))
  want = ref.crest_weights(turn_adv, ids, np.ones(n, bool), teacher, policy)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_allclose(got[:6], 1.0 + 0.3 * 0.28, rtol=1e-6)  # λ = lam · m with m = 1, w at its clip


# -------------------------------------------------------------------- credit.numerics (issue 35, case 9's kind)


def _expm1_minus_x64(x):
  x = np.asarray(x, np.float64)
  series = x * x * (1 / 2 + x * (1 / 6 + x * (1 / 24 + x * (1 / 120 + x / 720))))
  return np.where(np.abs(x) < 1e-2, series, np.expm1(x) - x)


def _x_minus_log1p64(y):
  y = np.asarray(y, np.float64)
  series = y * y * (1 / 2 - y * (1 / 3 - y * (1 / 4 - y * (1 / 5 - y / 6))))
  return np.where(np.abs(y) < 1e-2, series, y - np.log1p(y))


@given(st.lists(st.floats(-80.0, 80.0, width=32), min_size=1, max_size=64))
def test_expm1_minus_x_is_accurate_everywhere(values):
  x = np.asarray(values, np.float32)
  got = np.asarray(numerics.expm1_minus_x(x), np.float64)
  np.testing.assert_allclose(got, _expm1_minus_x64(x), rtol=2e-6, atol=2e-38)  # below float32's normal range: 0


@given(st.lists(st.floats(-0.9990000128746033, 50.0, width=32), min_size=1, max_size=64))
def test_x_minus_log1p_is_accurate_everywhere(values):
  y = np.asarray(values, np.float32)
  got = np.asarray(numerics.x_minus_log1p(y), np.float64)
  np.testing.assert_allclose(got, _x_minus_log1p64(y), rtol=2e-6, atol=2e-38)  # below float32's normal range: 0


def test_x_minus_log1p_keeps_results_whose_intermediate_square_is_subnormal():
  """y = 2.07e-19: y − log1p(y) = y²/2 = 2.15e-38 is a normal float32, but (y / 2)² is not; computed as 2·s² the
  result was flushed to 0 (a case hypothesis found)."""
  y = np.float32([2.071667511037493e-19, -3e-19, 1.6e-19])
  np.testing.assert_allclose(np.asarray(numerics.x_minus_log1p(y), np.float64), _x_minus_log1p64(y), rtol=2e-6)


def test_the_direct_forms_were_rounding_noise_near_zero():
  """Why the helpers exist: at 1e-4 the direct float32 forms are off by 100% or more, the helpers by < 1e-6."""
  x = np.float32([1e-4, -1e-4, 3e-3])
  direct = np.asarray(jnp.exp(x) - 1.0 - x, np.float64)
  assert np.max(np.abs(direct / _expm1_minus_x64(x) - 1.0)) > 0.5
  np.testing.assert_allclose(np.asarray(numerics.expm1_minus_x(x), np.float64), _expm1_minus_x64(x), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(numerics.x_minus_log1p(x), np.float64), _x_minus_log1p64(x), rtol=1e-6)
