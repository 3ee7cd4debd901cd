"""gigpo_advantages against the loop reference, the spec's example, and its reductions to GRPO."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import credit_reference as ref
from credit_strategies import REWARD_GRID, arrays, bools, grid_or_nonfinite
from jaxcredit import credit

grpo_jit = jax.jit(credit.grpo_advantages, static_argnames=("scale", "eps"))
GROUP_SHAPES = ((1, 3), (4, 5), (8, 2), (3, 6))  # (G, T)
# Ids: -1 (none), small ids, and large int32 hashes; drawn per turn, so they repeat across rollouts and turns.
STATE_IDS = (-1, 0, 1, 2, 7, 123456789, 2**31 - 1)
# (gamma, omega, scale): a few fixed combinations keep the number of compilations small.
KNOBS = ((0.95, 1.0, "group"), (0.5, 0.5, "none"), (1.0, 2.0, "group"), (0.0, 1.0, "group"))


@functools.lru_cache(maxsize=None)
def _gigpo(gamma, omega, scale):
  return jax.jit(functools.partial(credit.gigpo_advantages, gamma=gamma, omega=omega, scale=scale))


@functools.lru_cache(maxsize=None)
def _gigpo_batched(gamma, omega, scale):
  return jax.jit(jax.vmap(functools.partial(credit.gigpo_advantages, gamma=gamma, omega=omega, scale=scale)))


@st.composite
def groups(draw, shapes=GROUP_SHAPES):
  g, num_turns = draw(st.sampled_from(shapes))
  rewards = arrays(draw, (g,), grid_or_nonfinite(REWARD_GRID))
  ids = np.asarray(
    draw(st.lists(st.sampled_from(STATE_IDS), min_size=g * num_turns, max_size=g * num_turns)), np.int32
  ).reshape(g, num_turns)
  if draw(st.booleans()):  # state_key="observation": turn 0's state is the prompt, shared by the whole group
    ids[:, 0] = draw(st.sampled_from(STATE_IDS[1:]))
  if draw(st.booleans()):  # the usual layout: the real turns are a prefix of n_g turns
    n_G = np.asarray(draw(st.lists(st.integers(0, num_turns), min_size=g, max_size=g)))
    tmask = np.arange(num_turns)[None, :] < n_G[:, None]
  else:
    tmask = bools(draw, (g, num_turns), p_true=4)
  smask = bools(draw, (g,), p_true=5)
  return rewards, ids, tmask, smask


def _real(rewards, tmask, smask):
  return tmask & (smask & np.isfinite(rewards))[:, None]


def test_spec_example():
  """Spec v1.2: G=2, both in state 0 at t=0, rewards [1, 0], n = [1, 2], gamma = 0.5."""
  rewards = np.array([1.0, 0.0], np.float32)
  ids = np.array([[0, -1], [0, 1]], np.int32)
  tmask = np.array([[True, False], [True, True]])
  a_episode = np.array([0.7071, -0.7071])  # GRPO of [1, 0]
  a_step = np.array([[0.7071, 0.0], [-0.7071, 0.0]])  # R_0 = [1, 0]: mean 0.5, std 0.7071; (1, 1) is alone
  for call in (credit.gigpo_advantages, jax.jit(credit.gigpo_advantages, static_argnames=("gamma", "omega"))):
    got = np.asarray(call(rewards, ids, tmask, gamma=0.5))
    np.testing.assert_allclose(got, a_episode[:, None] * tmask + a_step, rtol=0, atol=1e-4)
    assert got[0, 1] == 0.0
    step = got - np.asarray(call(rewards, ids, tmask, gamma=0.5, omega=0.0))
    np.testing.assert_allclose(step, a_step, rtol=0, atol=1e-4)


def test_state_revisited_across_turns_and_rollouts():
  """State 7 is taken at t=0 and t=2 by rollout 0 and at t=0, 1 by rollout 1: one step group of 4 turns."""
  rewards = np.array([2.0, 0.0], np.float32)
  ids = np.array([[7, 3, 7], [7, 7, 7]], np.int32)
  tmask = np.array([[True, True, True], [True, True, False]])
  got = np.asarray(credit.gigpo_advantages(rewards, ids, tmask, gamma=0.5, scale="none"))
  # R_t = [0.5, 1, 2] and [0, 0]; group 7 = {0.5, 2, 0, 0}, mean 0.625; state 3 is alone; A_E = [1, -1]
  np.testing.assert_array_equal(got, [[0.875, 1.0, 2.375], [-1.625, -1.625, 0.0]])


@given(groups(), st.sampled_from(KNOBS))
def test_matches_reference(group, knobs):
  rewards, ids, tmask, smask = group
  got = np.asarray(_gigpo(*knobs)(rewards, ids, tmask, smask))
  want = ref.gigpo_advantages_ref(rewards, ids, tmask, smask, *knobs)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.all(np.isfinite(got))
  assert np.all(got[~_real(rewards, tmask, smask)] == 0.0)


@given(groups(), st.sampled_from(["group", "none"]), st.sampled_from([0.0, 0.95]))
def test_omega_zero_is_grpo_broadcast(group, scale, gamma):
  rewards, ids, tmask, smask = group
  got = np.asarray(_gigpo(gamma, 0.0, scale)(rewards, ids, tmask, smask))
  want = np.where(tmask, np.asarray(grpo_jit(rewards, smask, scale=scale))[:, None], 0.0)
  np.testing.assert_array_equal(got, want)


@given(groups(), st.sampled_from(KNOBS[:2]))
def test_gamma_one_with_one_shared_state_per_turn(group, knobs):
  """All rollouts share the state of turn t: each turn's step group is GRPO over the rollouts that reached it."""
  rewards, _, tmask, smask = group
  _, omega, scale = knobs
  ids = np.broadcast_to(1000 + 17 * np.arange(tmask.shape[1], dtype=np.int32), tmask.shape)
  got = np.asarray(_gigpo(1.0, omega, scale)(rewards, ids, tmask, smask))
  a_episode = np.asarray(grpo_jit(rewards, smask, scale=scale))
  a_step = np.stack(
    [np.asarray(grpo_jit(rewards, smask & tmask[:, t], scale=scale)) for t in range(tmask.shape[1])], axis=1
  )
  want = np.where(_real(rewards, tmask, smask), a_episode[:, None] + omega * a_step, 0.0)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  if np.all(tmask):
    np.testing.assert_allclose(got, (1.0 + omega) * a_episode[:, None] * np.ones_like(tmask), rtol=1e-5, atol=1e-5)


@given(groups(shapes=((4, 5),)), groups(shapes=((4, 5),)))
def test_jit_and_vmap_equal_eager(first, second):
  knobs = KNOBS[0]
  stacked = [np.stack([a, b]) for a, b in zip(first, second)]
  got = np.asarray(_gigpo_batched(*knobs)(*stacked))
  for p, group in enumerate((first, second)):
    eager = np.asarray(credit.gigpo_advantages(*group, gamma=knobs[0], omega=knobs[1], scale=knobs[2]))
    np.testing.assert_allclose(got[p], eager, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(_gigpo(*knobs)(*group)), eager, rtol=1e-6, atol=1e-6)
    assert np.all(got[p][~_real(*group[:1], *group[2:])] == 0.0)


@given(groups(), st.data())
def test_ids_are_labels_only(group, data):
  """Renaming the states (any injective map of the ids >= 0 onto other int32 values) changes nothing."""
  rewards, ids, tmask, smask = group
  used = sorted({int(k) for k in ids.ravel() if k >= 0})
  new = data.draw(st.lists(st.integers(0, 2**31 - 1), min_size=len(used), max_size=len(used), unique=True))
  rename = dict(zip(used, new))
  ids2 = np.vectorize(lambda k: rename.get(int(k), -1), otypes=[np.int32])(ids)
  call = _gigpo(*KNOBS[0])
  np.testing.assert_array_equal(call(rewards, ids2, tmask, smask), call(rewards, ids, tmask, smask))


def test_masked_entries_are_exactly_zero():
  rewards = np.array([1.0, np.nan, 3.0, np.inf, 0.0], np.float32)
  ids = np.zeros((5, 3), np.int32)
  tmask = np.array([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0], [0, 0, 0]], bool)
  smask = np.array([True, True, False, True, True])
  got = np.asarray(credit.gigpo_advantages(rewards, ids, tmask, smask))
  real = _real(rewards, tmask, smask)
  assert real.sum() == 2 and np.all(got[~real] == 0.0) and not np.any(np.signbit(got[~real]))
  # rollout 4 has no real turn but still counts in the episode term; rollout 0's turns (R_t 0.95, 1) share state 0
  np.testing.assert_allclose(got[real], [0.7071 - 0.7071, 0.7071 + 0.7071], atol=1e-4)


def test_no_turns():
  got = credit.gigpo_advantages(np.ones(3), np.zeros((3, 0), np.int32), np.ones((3, 0), bool))
  assert got.shape == (3, 0) and got.dtype == np.float32


BAD_SHAPES = [
  (
    lambda: credit.gigpo_advantages(np.zeros((2, 1)), np.zeros((2, 3), np.int32), np.ones((2, 3), bool)),
    "`rewards` must have rank 1 with shape [G]",
  ),
  (
    lambda: credit.gigpo_advantages(np.zeros(2), np.zeros((3, 3), np.int32), np.ones((2, 3), bool)),
    "`state_ids` must have shape [G,T]",
  ),
  (
    lambda: credit.gigpo_advantages(np.zeros(2), np.zeros(3, np.int32), np.ones((2, 3), bool)),
    "`state_ids` must have rank 2 with shape [G,T]",
  ),
  (
    lambda: credit.gigpo_advantages(np.zeros(2), np.zeros((2, 3), np.int32), np.ones((2, 4), bool)),
    "`turn_mask` must have shape [G,T]",
  ),
  (
    lambda: credit.gigpo_advantages(np.zeros(2), np.zeros((2, 3), np.int32), np.ones((2, 3), bool), np.ones(3, bool)),
    "`sample_mask` must have shape [G]",
  ),
  (
    lambda: credit.gigpo_advantages(np.zeros(2), np.zeros((2, 3), np.float32), np.ones((2, 3), bool)),
    "`state_ids` must be an integer (int32) array",
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
    ({"gamma": -0.1}, "gamma"),
    ({"gamma": 1.5}, "gamma"),
    ({"gamma": float("nan")}, "gamma"),
    ({"omega": -1.0}, "omega"),
    ({"omega": float("inf")}, "omega"),
    ({"eps": 0.0}, "eps"),
    ({"scale": "batch"}, "scale"),
    ({"gamma": "0.9"}, "gamma"),
  ],
)
def test_knob_errors(kwargs, knob):
  with pytest.raises(ValueError, match=f"`{knob}`"):
    credit.gigpo_advantages(np.zeros(2), np.zeros((2, 3), np.int32), np.ones((2, 3), bool), **kwargs)


def test_traced_knob_is_refused_by_name():
  call = jax.jit(
    lambda omega: credit.gigpo_advantages(np.zeros(2), np.zeros((2, 3), np.int32), np.ones((2, 3), bool), omega=omega)
  )
  with pytest.raises(ValueError, match="`omega`"):
    call(1.0)
