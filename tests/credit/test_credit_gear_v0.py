"""GEAR v0, this library's earlier reading (credit.gear_v0_*, method gear_v0): segments and advantages against the loop
reference of its old formula, plus the segment invariants."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import credit_reference as ref
from credit_strategies import NONFINITE, TOKEN_LENGTHS, arrays, bools
from jaxcredit import credit

# (alpha, k_sigma, tau_low, entropy_floor, normalize)
KNOBS = ((1.0, 2.0, 0.1, 1.0, True), (0.5, 1.0, 0.3, 2.0, False), (2.0, 0.0, 0.1, 1.0, True))
SEQ_ADVS = (1.0, -0.75)


@functools.lru_cache(maxsize=None)
def _segments(k_sigma, tau_low, entropy_floor):
  return jax.jit(
    functools.partial(credit.gear_v0_segments, k_sigma=k_sigma, tau_low=tau_low, entropy_floor=entropy_floor)
  )


@functools.lru_cache(maxsize=None)
def _advantages(alpha, k_sigma, tau_low, entropy_floor, normalize, batched=False):
  fn = functools.partial(
    credit.gear_v0_advantages,
    alpha=alpha,
    k_sigma=k_sigma,
    tau_low=tau_low,
    entropy_floor=entropy_floor,
    normalize=normalize,
  )
  return jax.jit(jax.vmap(fn) if batched else fn)


@st.composite
def rollouts(draw, length=None):
  """Divergences on a 1/32 grid (heavy tail, some negative or non-finite) and entropies on a 1/4 grid."""
  length = length or draw(st.sampled_from(TOKEN_LENGTHS))
  low = st.integers(0, 8).map(lambda k: k / 32.0)
  high = st.integers(0, 128).map(lambda k: k / 32.0)
  div = st.one_of(low, low, low, high, st.sampled_from((-0.5,) + NONFINITE))
  ent = st.one_of(st.integers(0, 12).map(lambda k: k / 4.0), st.sampled_from(NONFINITE))
  return arrays(draw, (length,), div), arrays(draw, (length,), ent), bools(draw, (length,), p_true=5)


def _away_from_tau(div, action, k_sigma):
  """Rejects draws where an action token's divergence is within rounding of the spike threshold."""
  d, tau, _ = ref.gear_threshold(div, action, k_sigma)
  if tau is not None:
    gaps = [abs(d[i] - tau) for i in range(len(d)) if action[i]]
    assume(min(gaps) > 1e-4 * (1.0 + tau))
  return d, tau


@given(rollouts(), st.sampled_from(KNOBS))
def test_segments_match_reference(rollout, knobs):
  div, ent, action = rollout
  _, k_sigma, tau_low, entropy_floor, _ = knobs
  _away_from_tau(div, action, k_sigma)
  got = np.asarray(_segments(k_sigma, tau_low, entropy_floor)(div, ent, action))
  np.testing.assert_array_equal(got, ref.gear_segs(div, ent, action, k_sigma, tau_low, entropy_floor))


@given(rollouts(), st.sampled_from(KNOBS))
def test_segments_start_exactly_at_spikes(rollout, knobs):
  div, ent, action = rollout
  _, k_sigma, tau_low, entropy_floor, _ = knobs
  d, tau = _away_from_tau(div, action, k_sigma)
  seg = np.asarray(_segments(k_sigma, tau_low, entropy_floor)(div, ent, action))
  d = np.asarray(d)
  spread = tau is not None and np.ptp(d[action]) > 1e-6
  spikes = action & (d > tau) if spread else np.zeros_like(action)
  assert np.all(seg[spikes] == np.flatnonzero(spikes))  # every spike opens its own segment
  assert np.all(seg[~action] == -1)
  for i in np.flatnonzero(seg >= 0):
    start = seg[i]
    assert start <= i and spikes[start]  # opened by a spike, at or before the token
    assert np.all(seg[start : i + 1] == start) and np.all(action[start : i + 1])  # contiguous, never crosses


@given(rollouts(), st.sampled_from(KNOBS), st.sampled_from(SEQ_ADVS))
def test_advantages_match_reference(rollout, knobs, seq_adv):
  div, ent, action = rollout
  _away_from_tau(div, action, knobs[1])
  got = np.asarray(_advantages(*knobs)(seq_adv, div, ent, action))
  np.testing.assert_allclose(got, ref.gear_adv(seq_adv, div, ent, action, *knobs), rtol=1e-5, atol=1e-5)


@given(rollouts(), st.sampled_from(KNOBS))
def test_weight_invariants(rollout, knobs):
  div, ent, action = rollout
  alpha, k_sigma, tau_low, entropy_floor, normalize = knobs
  _away_from_tau(div, action, k_sigma)
  w = np.asarray(_advantages(*knobs)(1.0, div, ent, action))
  seg = np.asarray(_segments(k_sigma, tau_low, entropy_floor)(div, ent, action))
  assert np.all(np.isfinite(w)) and np.all(w[~action] == 0.0) and np.all(w[action] > 0.0)
  if normalize and action.any():
    np.testing.assert_allclose(w[action].mean(), 1.0, rtol=1e-5)
  if action.sum() < 2:
    assert np.all(w[action] == 1.0)
  for start in np.unique(seg[seg >= 0]):
    assert len(np.unique(w[seg == start])) == 1  # one weight per segment, bit for bit


@given(rollouts(), st.sampled_from(KNOBS), st.sampled_from(SEQ_ADVS))
def test_alpha_zero_or_no_divergence_is_grpo(rollout, knobs, seq_adv):
  div, ent, action = rollout
  want = np.where(action, np.float32(seq_adv), 0.0)
  no_alpha = _advantages(0.0, *knobs[1:])(seq_adv, div, ent, action)
  no_divergence = _advantages(*knobs)(seq_adv, np.zeros_like(div), ent, action)
  np.testing.assert_array_equal(no_alpha, want)
  np.testing.assert_array_equal(no_divergence, want)


@given(rollouts(length=40))
def test_advantages_vmapped(rollout):
  div, ent, action = rollout
  batch = [np.stack([x, x[::-1]]) for x in rollout]
  got = np.asarray(_advantages(*KNOBS[0], batched=True)(np.array([1.0, -0.75], np.float32), *batch))
  for row, (seq_adv, x) in enumerate(((1.0, rollout), (-0.75, [y[::-1] for y in rollout]))):
    _away_from_tau(x[0], x[2], KNOBS[0][1])
    np.testing.assert_allclose(got[row], ref.gear_adv(seq_adv, *x, *KNOBS[0]), rtol=1e-5, atol=1e-5)


def test_worked_example():
  d = np.array([0.0, 0.1, 5.0, 0.5, 0.05, 0.0, 0.0, 6.0, 0.2, 0.2, 0.0, 0.0], np.float32)
  action = np.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1], bool)
  seg = credit.gear_v0_segments(d, np.zeros(12, np.float32), action, k_sigma=1.0)
  np.testing.assert_array_equal(seg, [-1, -1, 2, 2, -1, -1, -1, 7, 7, -1, -1, -1])


def test_non_finite_seq_adv_gives_zero():
  got = credit.gear_v0_advantages(np.float32(np.nan), np.ones(4), np.ones(4), np.ones(4, bool))
  np.testing.assert_array_equal(got, np.zeros(4))


def test_stop_gradient():
  grad = jax.jit(
    jax.grad(lambda d: credit.gear_v0_advantages(1.0, d, np.ones(5), np.ones(5, bool), k_sigma=0.5) @ np.arange(5.0))
  )
  assert np.all(np.asarray(grad(np.array([0.1, 0.2, 3.0, 0.1, 0.0]))) == 0.0)


BAD_SHAPES = [
  (lambda: credit.gear_v0_segments(np.zeros(4), np.zeros(3), np.ones(4, bool)), "`entropy` must have shape [L]"),
  (
    lambda: credit.gear_v0_segments(np.zeros((1, 4)), np.zeros(4), np.ones(4, bool)),
    "`divergence` must have rank 1 with shape [L]",
  ),
  (
    lambda: credit.gear_v0_advantages(np.zeros(2), np.zeros(4), np.zeros(4), np.ones(4, bool)),
    "`seq_adv` must have rank 0",
  ),
  (
    lambda: credit.gear_v0_advantages(1.0, np.zeros(4), np.zeros(4), np.ones(5, bool)),
    "`action_mask` must have shape [L]",
  ),
]


@pytest.mark.parametrize("call,message", BAD_SHAPES)
def test_shape_errors_name_the_argument(call, message):
  with pytest.raises(ValueError) as info:
    call()
  assert message in str(info.value)


@pytest.mark.parametrize(
  "kwargs,knob",
  [
    ({"k_sigma": -0.1}, "k_sigma"),
    ({"alpha": -1.0}, "alpha"),
    ({"eps": 0.0}, "eps"),
    ({"tau_low": float("nan")}, "tau_low"),
    ({"entropy_floor": float("nan")}, "entropy_floor"),
    ({"normalize": 1}, "normalize"),
  ],
)
def test_knob_errors(kwargs, knob):
  with pytest.raises(ValueError, match=f"`{knob}`"):
    credit.gear_v0_advantages(1.0, np.zeros(4), np.zeros(4), np.ones(4, bool), **kwargs)


def test_segments_knob_errors():
  with pytest.raises(ValueError, match="`k_sigma`"):
    credit.gear_v0_segments(np.zeros(4), np.zeros(4), np.ones(4, bool), k_sigma=-1.0)
