"""grpo_advantages, rloo_advantages, turn_to_token against the loop reference, plus the spec's invariants."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import credit_reference as ref
from credit_strategies import GROUP_SIZES, NONFINITE, REWARD_GRID, arrays, bools, grid_or_nonfinite
from jaxcredit import credit

grpo_jit = jax.jit(credit.grpo_advantages, static_argnames=("scale", "eps"))
rloo_jit = jax.jit(credit.rloo_advantages)
turn_to_token_jit = jax.jit(credit.turn_to_token)
SCALES = ("group", "none")
BATCH = 3  # groups per vmapped batch


@functools.lru_cache(maxsize=None)
def _grpo_batched(scale):
  return jax.jit(jax.vmap(functools.partial(credit.grpo_advantages, scale=scale)))


@st.composite
def groups(draw, nonfinite=True, batch=None):
  g = draw(st.sampled_from(GROUP_SIZES))
  shape = (g,) if batch is None else (batch, g)
  elements = grid_or_nonfinite(REWARD_GRID) if nonfinite else st.sampled_from(REWARD_GRID)
  return arrays(draw, shape, elements), bools(draw, shape, p_true=4)


def _assert_masked_zero(adv, rewards, mask):
  invalid = ~(mask & np.isfinite(rewards))
  assert np.all(np.isfinite(adv))
  assert np.all(adv[invalid] == 0.0)


@given(groups(), st.sampled_from(SCALES))
def test_grpo_matches_reference(group, scale):
  rewards, mask = group
  got = np.asarray(grpo_jit(rewards, mask, scale=scale))
  np.testing.assert_allclose(got, ref.grpo(rewards, mask, scale), rtol=1e-5, atol=1e-5)
  _assert_masked_zero(got, rewards, mask)


@given(groups(batch=BATCH), st.sampled_from(SCALES))
def test_grpo_vmapped_matches_reference(group, scale):
  rewards_PxG, mask_PxG = group
  got = np.asarray(_grpo_batched(scale)(rewards_PxG, mask_PxG))
  want = np.stack([ref.grpo(r, m, scale) for r, m in zip(rewards_PxG, mask_PxG)])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@given(groups(nonfinite=False))
def test_grpo_default_mask_is_all_valid(group):
  rewards, _ = group
  np.testing.assert_array_equal(grpo_jit(rewards), grpo_jit(rewards, np.ones_like(rewards, bool)))


@given(st.sampled_from(GROUP_SIZES), st.floats(-(2.0**100), 2.0**100, width=32), st.data(), st.sampled_from(SCALES))
def test_equal_rewards_give_exactly_zero(g, value, data, scale):
  rewards = np.full(g, value, np.float32)
  mask = bools(data.draw, (g,))
  rewards[bools(data.draw, (g,), p_true=1)] = np.nan  # invalid entries must not break the tie
  assert np.all(np.asarray(grpo_jit(rewards, mask, scale=scale)) == 0.0)
  assert np.all(np.asarray(rloo_jit(rewards, mask)) == 0.0)


@given(groups(), st.data(), st.sampled_from(SCALES))
def test_invalid_entries_change_nothing(group, data, scale):
  """Whatever an invalid sample holds (any value, NaN, inf), the valid samples' advantages are unchanged."""
  rewards, mask = group
  other = rewards.copy()
  other[~mask] = arrays(data.draw, (int((~mask).sum()),), grid_or_nonfinite(REWARD_GRID, 2))
  nonfinite = mask & ~np.isfinite(rewards)
  other[nonfinite] = arrays(data.draw, (int(nonfinite.sum()),), st.sampled_from(NONFINITE))
  np.testing.assert_array_equal(grpo_jit(rewards, mask, scale=scale), grpo_jit(other, mask, scale=scale))
  np.testing.assert_array_equal(rloo_jit(rewards, mask), rloo_jit(other, mask))


@given(groups(nonfinite=False), st.sampled_from(SCALES))
def test_grpo_centres_and_scales(group, scale):
  """Valid advantages sum to 0; under scale='group' their ddof=1 std is 1 (up to eps) when rewards differ."""
  rewards, mask = group
  adv = np.asarray(grpo_jit(rewards, mask, scale=scale), np.float64)
  valid = mask
  np.testing.assert_allclose(adv[valid].sum(), 0.0, atol=1e-5)
  if scale == "group" and valid.sum() >= 2 and np.ptp(rewards[valid]) > 0:
    np.testing.assert_allclose(adv[valid].std(ddof=1), 1.0, rtol=1e-4)


@given(groups())
def test_rloo_matches_reference(group):
  rewards, mask = group
  got = np.asarray(rloo_jit(rewards, mask))
  np.testing.assert_allclose(got, ref.rloo(rewards, mask), rtol=1e-5, atol=1e-5)
  _assert_masked_zero(got, rewards, mask)


@given(groups(nonfinite=False))
def test_rloo_is_scaled_dr_grpo(group):
  """A_rloo = n / (n - 1) * A_drgrpo: the leave-one-out baseline only rescales the centred reward."""
  rewards, mask = group
  n = mask.sum()
  if n >= 2:
    np.testing.assert_allclose(
      rloo_jit(rewards, mask), n / (n - 1) * np.asarray(grpo_jit(rewards, mask, scale="none")), atol=1e-5
    )


@st.composite
def turn_inputs(draw):
  num_turns, length = draw(st.sampled_from([(1, 16), (4, 16), (4, 40)]))
  values = arrays(draw, (num_turns,), grid_or_nonfinite(REWARD_GRID))
  ids = np.asarray(draw(st.lists(st.integers(-2, num_turns + 1), min_size=length, max_size=length)), np.int32)
  return values, ids, bools(draw, (length,), p_true=3)


@given(turn_inputs())
def test_turn_to_token_matches_reference(inputs):
  values, ids, action = inputs
  got = np.asarray(turn_to_token_jit(values, ids, action))
  np.testing.assert_array_equal(got, ref.turn_to_token(values, ids, action))
  assert np.all(got[~action] == 0.0)


def test_turn_to_token_batched():
  values_PxGxT = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
  ids_PxGxL = np.tile(np.array([-1, 0, 1, 1, 3, 9], np.int32), (2, 3, 1))
  action_PxGxL = ids_PxGxL >= 0
  got = jax.jit(jax.vmap(jax.vmap(credit.turn_to_token)))(values_PxGxT, ids_PxGxL, action_PxGxL)
  for p in range(2):
    for g in range(3):
      np.testing.assert_array_equal(
        got[p, g], ref.turn_to_token(values_PxGxT[p, g], ids_PxGxL[p, g], action_PxGxL[p, g])
      )


BAD_SHAPES = [
  (lambda: credit.grpo_advantages(np.zeros((2, 3))), "`rewards` must have rank 1 with shape [G]"),
  (lambda: credit.grpo_advantages(np.zeros(3), np.ones(4, bool)), "`sample_mask` must have shape [G]"),
  (lambda: credit.rloo_advantages(np.zeros(3), np.ones((3, 1), bool)), "`sample_mask` must have rank 1"),
  (
    lambda: credit.turn_to_token(np.zeros(3), np.zeros(5, np.int32), np.ones(4, bool)),
    "`action_mask` must have shape [L]",
  ),
  (lambda: credit.turn_to_token(np.zeros(3), np.zeros(5), np.ones(5, bool)), "`turn_ids` must be an integer"),
]


@pytest.mark.parametrize("call,message", BAD_SHAPES)
def test_shape_errors_name_the_argument(call, message):
  with pytest.raises(ValueError) as info:
    call()
  assert message in str(info.value)


def test_shape_errors_raise_at_trace_time():
  with pytest.raises(ValueError, match=r"`sample_mask` must have shape \[G\]"):
    jax.jit(credit.grpo_advantages)(np.zeros(3), np.ones(4, bool))


@pytest.mark.parametrize(
  "kwargs,knob",
  [
    ({"eps": 0.0}, "eps"),
    ({"eps": -1.0}, "eps"),
    ({"eps": float("nan")}, "eps"),
    ({"scale": "std"}, "scale"),
    ({"scale": None}, "scale"),
  ],
)
def test_grpo_knob_errors(kwargs, knob):
  with pytest.raises(ValueError, match=f"`{knob}`"):
    credit.grpo_advantages(np.zeros(3), **kwargs)


def test_traced_knob_is_refused_by_name():
  with pytest.raises(ValueError, match="`eps` must be a static"):
    jax.jit(lambda r, e: credit.grpo_advantages(r, eps=e))(np.zeros(3), 1e-6)


def test_empty_group_is_refused_by_name():
  import jax.numpy as jnp
  import pytest as _pytest
  from jaxcredit import credit as _credit

  with _pytest.raises(ValueError, match="empty group axis"):
    _credit.grpo_advantages(jnp.zeros((0,)))
  with _pytest.raises(ValueError, match="empty group axis"):
    _credit.rloo_advantages(jnp.zeros((0,)))


def test_a_knob_out_of_range_is_a_knob_error_naming_the_knob_its_rule_and_value():
  """`credit.KnobError` carries the knob's name, rule and value (a caller says them in its own terms: the trainer
  as `config.credit.<method>.<knob> = <value>: <rule>`); it is a ValueError with the function's message."""
  from jaxcredit import credit

  with pytest.raises(credit.KnobError) as info:
    credit.grpo_advantages(np.asarray([1.0, 0.0], np.float32), eps=-1.0)
  e = info.value
  assert isinstance(e, ValueError) and (e.fn, e.knob, e.rule, e.value) == (
    "grpo_advantages",
    "eps",
    "must be > 0.0",
    -1.0,
  )
  assert str(e) == "grpo_advantages: knob `eps` must be > 0.0, got -1.0."
  with pytest.raises(credit.KnobError, match=r"knob `gamma` must be in \[0, 1\], got 1.5") as info:
    credit.gigpo_advantages(
      np.zeros(2, np.float32), np.zeros((2, 1), np.int32), np.ones((2, 1), bool), np.ones(2, bool), gamma=1.5
    )
  assert info.value.knob == "gamma"
