"""TRACE (arXiv 2607.13988) against the loop reference: state values, one-step TD, K-step turn credit with the
terminal fill, the mixed advantage; telescoping, redundant calls, K = 0, raw-delta values with v1's other knobs as v1, jit/vmap."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import credit_reference as ref
from credit_strategies import NONFINITE, REWARD_GRID, arrays, bools, grid_or_nonfinite, logp_grid
from jaxcredit import credit

TURN_COUNTS = (1, 4, 7)
GROUP_SHAPES = ((1, 3), (4, 5), (8, 2))  # (G, T)
VALUE_KNOBS = ((0.1, "log_ratio"), (0.001, "log_ratio"), (0.1, "raw_delta"))  # (gap_eps, value)
TURN_KNOBS = ((3, 0.8, 2.0), (0, 0.8, 2.0), (1, 1.0, 0.0), (5, 0.5, 1.0))  # (td_horizon, td_gamma, terminal_scale)
# (alpha_out, alpha_turn, value, td_horizon, std, dense_norm): a few fixed combinations keep compilations few.
ADV_KNOBS = (
  (1.0, 0.2, "log_ratio", 3, "population", "none"),
  (1.0, 1.0, "raw_delta", 1, "sample", "group_rms"),
  (0.5, 0.0, "log_ratio", 0, "population", "none"),
  (1.0, 0.5, "log_ratio", 2, "sample", "group_rms"),
)


@functools.lru_cache(maxsize=None)
def _jit(fn, **knobs):
  return jax.jit(functools.partial(fn, **knobs))


def _adv_knobs(alpha_out, alpha_turn, value, td_horizon, std, dense_norm):
  return dict(
    alpha_out=alpha_out, alpha_turn=alpha_turn, value=value, td_horizon=td_horizon, std=std, dense_norm=dense_norm
  )


def _ref_adv(group, alpha_out, alpha_turn, value, td_horizon, std, dense_norm):
  rewards, gold, bmask, tmask, smask = group
  return ref.trace_adv(
    rewards, gold, bmask, tmask, smask, alpha_out, alpha_turn, value=value, k=td_horizon, std=std, dense_norm=dense_norm
  )


def _gold(draw, shape):
  """Gold-answer mean log-probs on an exact grid, repeated values (redundant calls) included, sometimes NaN."""
  return arrays(draw, shape, st.one_of(logp_grid(), logp_grid(), logp_grid(), st.sampled_from(NONFINITE)))


@st.composite
def rollouts(draw):
  num_turns = draw(st.sampled_from(TURN_COUNTS))
  return _gold(draw, (num_turns + 1,)), bools(draw, (num_turns + 1,), p_true=4)


@given(rollouts(), st.sampled_from(VALUE_KNOBS))
def test_state_values_and_td_rewards_match_reference(rollout, knobs):
  gold, mask = rollout
  gap_eps, value = knobs
  v = np.asarray(_jit(credit.trace_state_values, gap_eps=gap_eps, value=value)(gold, mask))
  d = np.asarray(_jit(credit.trace_td_rewards, gap_eps=gap_eps, value=value)(gold, mask))
  np.testing.assert_allclose(v, ref.trace_values(gold, mask, gap_eps, value), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(d, ref.trace_td(gold, mask, gap_eps, value), rtol=1e-5, atol=1e-5)
  assert np.all(np.isfinite(v)) and np.all(np.isfinite(d))
  assert v[0] == 0.0


@given(rollouts(), st.sampled_from(VALUE_KNOBS))
def test_td_rewards_telescope_to_the_last_state_value(rollout, knobs):
  gold, mask = rollout
  valid = mask & np.isfinite(gold)
  v = np.asarray(_jit(credit.trace_state_values, gap_eps=knobs[0], value=knobs[1])(gold, mask), np.float64)
  d = np.asarray(_jit(credit.trace_td_rewards, gap_eps=knobs[0], value=knobs[1])(gold, mask), np.float64)
  if not valid[0]:
    assert np.all(d == 0.0) and np.all(v == 0.0)
  else:
    np.testing.assert_allclose(d.sum(), v[np.flatnonzero(valid)[-1]], atol=1e-4)
  assert np.all(d[~valid[1:]] == 0.0)  # δ_t is non-zero only where the next boundary exists


@given(rollouts(), st.data())
def test_redundant_call_gets_zero_and_changes_nothing_else(rollout, data):
  """Insert after boundary b a boundary with the value of the latest valid one: its turn gets exactly 0, and
  every other turn keeps exactly its δ."""
  gold, mask = rollout
  valid = mask & np.isfinite(gold)
  assume(valid[0])
  b = data.draw(st.integers(0, len(gold) - 1))
  latest = np.flatnonzero(valid[: b + 1])[-1]
  gold2 = np.insert(gold, b + 1, gold[latest])
  mask2 = np.insert(mask, b + 1, True)
  td = _jit(credit.trace_td_rewards)
  r, r2 = np.asarray(td(gold, mask)), np.asarray(td(gold2, mask2))
  assert r2[b] == 0.0
  np.testing.assert_array_equal(np.delete(r2, b), r)


@given(rollouts(), st.sampled_from(TURN_KNOBS), st.sampled_from(REWARD_GRID + NONFINITE))
def test_turn_rewards_match_reference(rollout, knobs, outcome_adv):
  gold, mask = rollout
  k, gamma, scale = knobs
  fn = _jit(credit.trace_turn_rewards, td_horizon=k, td_gamma=gamma, terminal_scale=scale)
  got = np.asarray(fn(gold, mask, np.float32(outcome_adv)))
  want = ref.trace_turn(gold, mask, outcome_adv, k=k, gamma=gamma, scale=scale)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.all(np.isfinite(got))
  n = ref.trace_transitions(gold, mask)
  assert np.all(got[n:] == 0.0)  # the final answer and everything after the last transition: outcome term only


@given(rollouts(), st.sampled_from(REWARD_GRID))
def test_horizon_zero_keeps_only_the_terminal_fill(rollout, outcome_adv):
  """K = 0 (the paper's ablation): no look-ahead; only the last transition's turn gets λ·γ·A_out."""
  gold, mask = rollout
  got = np.asarray(_jit(credit.trace_turn_rewards, td_horizon=0)(gold, mask, np.float32(outcome_adv)))
  n = ref.trace_transitions(gold, mask)
  want = np.zeros_like(got)
  if n:
    want[n - 1] = np.float32(2.0 * 0.8 * outcome_adv)
  np.testing.assert_allclose(got, want, atol=1e-6)


@st.composite
def groups(draw):
  g, num_turns = draw(st.sampled_from(GROUP_SHAPES))
  rewards = arrays(draw, (g,), grid_or_nonfinite(REWARD_GRID))
  gold = _gold(draw, (g, num_turns + 1))
  bmask = bools(draw, (g, num_turns + 1), p_true=5)
  tmask = bools(draw, (g, num_turns), p_true=5)
  smask = bools(draw, (g,), p_true=5)
  return rewards, gold, bmask, tmask, smask


@given(groups(), st.sampled_from(ADV_KNOBS))
def test_trace_advantages_match_reference(group, knobs):
  rewards, gold, bmask, tmask, smask = group
  got = np.asarray(_jit(credit.trace_advantages, **_adv_knobs(*knobs))(rewards, gold, bmask, tmask, smask))
  np.testing.assert_allclose(got, _ref_adv(group, *knobs), rtol=1e-5, atol=1e-5)
  assert np.all(np.isfinite(got))
  valid = smask & np.isfinite(rewards)
  assert np.all(got[~(valid[:, None] & tmask)] == 0.0)


@given(groups(), st.sampled_from(["population", "sample"]))
def test_alpha_turn_zero_is_the_outcome_advantage(group, std):
  rewards, gold, bmask, tmask, smask = group
  got = np.asarray(_jit(credit.trace_advantages, alpha_turn=0.0, std=std)(rewards, gold, bmask, tmask, smask))
  want = ref.trace_outcome(rewards, smask, std)[:, None] * tmask
  np.testing.assert_allclose(got, want, atol=1e-5)


@given(groups())
def test_raw_delta_one_step_without_fill_is_v1(group):
  """value="raw_delta", K = 1, no fill, ddof 1, group RMS: this library's v1 TRACE (the paper's raw-delta ablation changes only the value)."""
  rewards, gold, bmask, tmask, smask = group
  v1 = dict(value="raw_delta", td_horizon=1, terminal_scale=0.0, std="sample", dense_norm="group_rms")
  got = np.asarray(_jit(credit.trace_advantages, alpha_turn=1.0, **v1)(rewards, gold, bmask, tmask, smask))
  np.testing.assert_allclose(got, ref.trace_adv_v1(rewards, gold, bmask, tmask, smask), rtol=1e-5, atol=1e-5)


_trace_advantages_batched = jax.jit(jax.vmap(credit.trace_advantages))  # one program per shape for every example


@given(groups())
def test_trace_advantages_vmapped_under_jit(group):
  rewards, gold, bmask, tmask, smask = group
  batched = _trace_advantages_batched
  stack = lambda x: np.stack([x, x[::-1]])
  got = np.asarray(batched(stack(rewards), stack(gold), stack(bmask), stack(tmask), stack(smask)))
  flipped = tuple(x[::-1] for x in group)
  np.testing.assert_allclose(got[0], _ref_adv(group, *ADV_KNOBS[0]), atol=1e-5)
  np.testing.assert_allclose(got[1], _ref_adv(flipped, *ADV_KNOBS[0]), atol=1e-5)


def test_the_same_raw_gain_is_worth_more_near_the_answer():
  """The appendix's point: a gain of 3.55 nats in ℓ̄ from -5.12 is worth 1.18; from -10.66 only 0.41
  (raw_delta values both at 3.55)."""
  near = credit.trace_state_values([-5.1187, -1.5712], [True, True], gap_eps=0.001)
  far = credit.trace_state_values([-10.6570, -7.1061], [True, True], gap_eps=0.001)
  np.testing.assert_allclose([near[1], far[1]], [1.1806, 0.4052], atol=1e-3)
  raw = credit.trace_state_values([-10.6570, -7.1061], [True, True], value="raw_delta")
  np.testing.assert_allclose(raw[1], 3.5509, atol=1e-4)


def test_the_issues_three_turn_rollout_gets_the_papers_advantages():
  """Issue 32's side-by-side: mean gold log-probs -4, -3, -1.5, -0.8 (three tool turns), A_out = 1: the paper's
  advantages 1 + 0.2 r are [1.30, 1.38, 1.44] (v1 gave [1.90, 2.34, 1.63])."""
  r = credit.trace_turn_rewards(np.array([-4.0, -3.0, -1.5, -0.8]), np.ones(4, bool), 1.0)
  np.testing.assert_allclose(1.0 + 0.2 * np.asarray(r), [1.3013, 1.3806, 1.4351], atol=1e-4)


def test_a_positive_mean_log_prob_is_read_as_zero():
  """Rounding can push a near-certain answer's mean log-prob above 0: d_t = gap_eps, never a negative gap."""
  v = credit.trace_state_values([-1.0, 0.003], [True, True])
  np.testing.assert_allclose(v, [0.0, np.log(1.1 / 0.1)], rtol=1e-6)


def test_dense_terms_apply_in_a_group_with_one_valid_sample():
  """A_out is 0 (one valid sample) so the fill is 0 too, but the look-ahead of δ still applies."""
  got = credit.trace_advantages(
    np.array([1.0, np.nan], np.float32),
    np.array([[-4, -2, -1], [-4, -2, -1]], np.float32),
    np.ones((2, 3), bool),
    np.ones((2, 2), bool),
  )
  d0, d1 = np.log(4.1 / 2.1), np.log(2.1 / 1.1)
  want0 = 0.2 * (d0 + 0.8 * d1) / 1.8
  np.testing.assert_allclose(got, [[want0, 0.2 * d1], [0.0, 0.0]], rtol=1e-5)


BAD_SHAPES = [
  (
    lambda: credit.trace_td_rewards(np.zeros((2, 3)), np.ones((2, 3), bool)),
    "`gold_logp` must have rank 1 with shape [T+1]",
  ),
  (lambda: credit.trace_td_rewards(np.zeros(4), np.ones(3, bool)), "`boundary_mask` must have shape [T+1]"),
  (lambda: credit.trace_state_values(np.zeros(4), np.ones(5, bool)), "`boundary_mask` must have shape [T+1]"),
  (
    lambda: credit.trace_turn_rewards(np.zeros(4), np.ones(4, bool), np.ones(2)),
    "`outcome_adv` must have rank 0",
  ),
  (
    lambda: credit.trace_advantages(np.zeros(2), np.zeros((2, 5)), np.ones((2, 4), bool), np.ones((2, 4), bool)),
    "`boundary_mask` must have shape [G,T+1]",
  ),
  (
    lambda: credit.trace_advantages(np.zeros(2), np.zeros((2, 5)), np.ones((2, 5), bool), np.ones((2, 5), bool)),
    "`turn_mask` must have shape [G,T]",
  ),
  (
    lambda: credit.trace_advantages(np.zeros(3), np.zeros((2, 5)), np.ones((2, 5), bool), np.ones((2, 4), bool)),
    "`gold_logp` must have shape [G,T+1]",
  ),
  (
    lambda: credit.trace_advantages(
      np.zeros(2), np.zeros((2, 5)), np.ones((2, 5), bool), np.ones((2, 4), bool), np.ones(3, bool)
    ),
    "`sample_mask` must have shape [G]",
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
    ({"alpha_turn": -1.0}, "alpha_turn"),
    ({"alpha_out": float("inf")}, "alpha_out"),
    ({"gap_eps": 0.0}, "gap_eps"),
    ({"value": "delta"}, "value"),
    ({"td_horizon": 1.5}, "td_horizon"),
    ({"td_horizon": True}, "td_horizon"),
    ({"td_horizon": -1}, "td_horizon"),
    ({"td_gamma": 1.5}, "td_gamma"),
    ({"terminal_scale": -2.0}, "terminal_scale"),
    ({"std": "ddof1"}, "std"),
    ({"dense_norm": "std"}, "dense_norm"),
    ({"eps": 0.0}, "eps"),
  ],
)
def test_knob_errors(kwargs, knob):
  with pytest.raises(ValueError, match=f"`{knob}`"):
    credit.trace_advantages(np.zeros(2), np.zeros((2, 5)), np.ones((2, 5), bool), np.ones((2, 4), bool), **kwargs)
