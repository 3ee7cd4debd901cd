"""trace_td_rewards and trace_advantages against the loop reference, plus telescoping and redundant calls."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import credit_reference as ref
from credit_strategies import NONFINITE, REWARD_GRID, arrays, bools, grid_or_nonfinite, logp_grid
from jaxcredit import credit

td_jit = jax.jit(credit.trace_td_rewards)
grpo_jit = jax.jit(credit.grpo_advantages, static_argnames=("scale", "eps"))
TURN_COUNTS = (1, 4, 7)
GROUP_SHAPES = ((1, 3), (4, 5), (8, 2))  # (G, T)
# (beta, scale, dense_norm): a few fixed combinations keep the number of compilations small.
KNOBS = ((1.0, "group", "group_rms"), (0.5, "none", "none"), (0.0, "group", "group_rms"), (2.0, "group", "none"))


@functools.lru_cache(maxsize=None)
def _trace_adv(beta, scale, dense_norm):
  return jax.jit(functools.partial(credit.trace_advantages, beta=beta, scale=scale, dense_norm=dense_norm))


@functools.lru_cache(maxsize=None)
def _trace_adv_batched(beta, scale, dense_norm):
  return jax.jit(jax.vmap(functools.partial(credit.trace_advantages, beta=beta, scale=scale, dense_norm=dense_norm)))


def _gold(draw, shape):
  """Gold-answer log-probs on an exact grid, repeated values (redundant calls) included, sometimes NaN."""
  return arrays(draw, shape, st.one_of(logp_grid(), logp_grid(), logp_grid(), st.sampled_from(NONFINITE)))


@st.composite
def rollouts(draw):
  num_turns = draw(st.sampled_from(TURN_COUNTS))
  return _gold(draw, (num_turns + 1,)), bools(draw, (num_turns + 1,), p_true=4)


@given(rollouts())
def test_td_rewards_match_reference(rollout):
  gold, mask = rollout
  got = np.asarray(td_jit(gold, mask))
  np.testing.assert_allclose(got, ref.trace_td(gold, mask), rtol=1e-5, atol=1e-5)
  assert np.all(np.isfinite(got))


@given(rollouts())
def test_td_rewards_telescope(rollout):
  gold, mask = rollout
  valid = mask & np.isfinite(gold)
  r = np.asarray(td_jit(gold, mask), np.float64)
  if not valid[0]:
    assert np.all(r == 0.0)
  else:
    last = np.flatnonzero(valid)[-1]
    np.testing.assert_allclose(r.sum(), float(gold[last]) - float(gold[0]), atol=1e-4)
  # r_t is non-zero only where the next boundary exists
  assert np.all(r[~valid[1:]] == 0.0)


@given(rollouts(), st.data())
def test_redundant_call_gets_zero_and_changes_nothing_else(rollout, data):
  """Insert after boundary b a boundary with the value of the latest valid one: its turn gets exactly 0, and
  every other turn keeps exactly its reward."""
  gold, mask = rollout
  valid = mask & np.isfinite(gold)
  assume(valid[0])
  b = data.draw(st.integers(0, len(gold) - 1))
  latest = np.flatnonzero(valid[: b + 1])[-1]
  gold2 = np.insert(gold, b + 1, gold[latest])
  mask2 = np.insert(mask, b + 1, True)
  r = np.asarray(td_jit(gold, mask))
  r2 = np.asarray(td_jit(gold2, mask2))
  assert r2[b] == 0.0
  np.testing.assert_array_equal(np.delete(r2, b), r)


@st.composite
def groups(draw):
  g, num_turns = draw(st.sampled_from(GROUP_SHAPES))
  rewards = arrays(draw, (g,), grid_or_nonfinite(REWARD_GRID))
  gold = _gold(draw, (g, num_turns + 1))
  bmask = bools(draw, (g, num_turns + 1), p_true=5)
  tmask = bools(draw, (g, num_turns), p_true=5)
  smask = bools(draw, (g,), p_true=5)
  return rewards, gold, bmask, tmask, smask


@given(groups(), st.sampled_from(KNOBS))
def test_trace_advantages_match_reference(group, knobs):
  rewards, gold, bmask, tmask, smask = group
  beta, scale, dense_norm = knobs
  got = np.asarray(_trace_adv(*knobs)(rewards, gold, bmask, tmask, smask))
  want = ref.trace_adv(rewards, gold, bmask, tmask, smask, beta, scale, dense_norm)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.all(np.isfinite(got))
  valid = smask & np.isfinite(rewards)
  assert np.all(got[~(valid[:, None] & tmask)] == 0.0)


@given(groups(), st.sampled_from(["group", "none"]))
def test_beta_zero_is_grpo(group, scale):
  rewards, gold, bmask, tmask, smask = group
  got = np.asarray(_trace_adv(0.0, scale, "group_rms")(rewards, gold, bmask, tmask, smask))
  want = np.asarray(grpo_jit(rewards, smask, scale=scale))[:, None] * tmask
  np.testing.assert_array_equal(got, want)


@given(groups())
def test_trace_advantages_vmapped(group):
  rewards, gold, bmask, tmask, smask = group
  knobs = KNOBS[0]
  batched = _trace_adv_batched(*knobs)
  stack = lambda x: np.stack([x, x[::-1]])
  got = np.asarray(batched(stack(rewards), stack(gold), stack(bmask), stack(tmask), stack(smask)))
  np.testing.assert_allclose(got[0], ref.trace_adv(rewards, gold, bmask, tmask, smask, *knobs), atol=1e-5)
  np.testing.assert_allclose(
    got[1], ref.trace_adv(rewards[::-1], gold[::-1], bmask[::-1], tmask[::-1], smask[::-1], *knobs), atol=1e-5
  )


def test_redundant_call_keeps_the_outcome_advantage_under_rms():
  rewards = np.array([1.0, 0.0], np.float32)
  gold = np.array([[-5, -3, -3, -1, 0], [-5, -6, -6, -6, -6]], np.float32)
  ones = lambda *s: np.ones(s, bool)
  got = np.asarray(_trace_adv(1.0, "group", "group_rms")(rewards, gold, ones(2, 5), ones(2, 4), ones(2)))
  a_out = np.asarray(grpo_jit(rewards))
  assert got[0, 1] == a_out[0] and got[1, 1] == a_out[1] and got[1, 3] == a_out[1]


def test_no_dense_turn_gives_grpo():
  rewards = np.array([1.0, 0.0, 2.0], np.float32)
  gold = np.zeros((3, 4), np.float32)
  bmask = np.zeros((3, 4), bool)
  tmask = np.ones((3, 3), bool)
  got = np.asarray(_trace_adv(1.0, "group", "group_rms")(rewards, gold, bmask, tmask, np.ones(3, bool)))
  np.testing.assert_array_equal(got, np.asarray(grpo_jit(rewards))[:, None] * tmask)


def test_dense_terms_apply_in_a_group_with_one_valid_sample():
  got = _trace_adv(1.0, "group", "none")(
    np.array([1.0, np.nan], np.float32),
    np.array([[-4, -2, -1], [-4, -2, -1]], np.float32),
    np.ones((2, 3), bool),
    np.ones((2, 2), bool),
  )
  np.testing.assert_allclose(got, [[2.0, 1.0], [0.0, 0.0]])


BAD_SHAPES = [
  (
    lambda: credit.trace_td_rewards(np.zeros((2, 3)), np.ones((2, 3), bool)),
    "`gold_logp` must have rank 1 with shape [T+1]",
  ),
  (lambda: credit.trace_td_rewards(np.zeros(4), np.ones(3, bool)), "`boundary_mask` must have shape [T+1]"),
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
    ({"beta": -1.0}, "beta"),
    ({"beta": float("inf")}, "beta"),
    ({"eps": 0.0}, "eps"),
    ({"scale": "batch"}, "scale"),
    ({"dense_norm": "std"}, "dense_norm"),
  ],
)
def test_knob_errors(kwargs, knob):
  with pytest.raises(ValueError, match=f"`{knob}`"):
    credit.trace_advantages(np.zeros(2), np.zeros((2, 5)), np.ones((2, 5), bool), np.ones((2, 4), bool), **kwargs)
