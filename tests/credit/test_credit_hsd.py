"""hsd_select_peers, checked by its properties over many keys."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import credit_reference as ref
from credit_strategies import GROUP_SIZES, REWARD_GRID, arrays, bools, grid_or_nonfinite
from jaxcredit import credit

NUM_KEYS = 256
THRESHOLDS = (0.5, 0.0)


@functools.lru_cache(maxsize=None)
def _select_many(threshold):
  """[num_keys, G] peers: one draw per key split from `key`, the group fixed."""
  select = jax.vmap(functools.partial(credit.hsd_select_peers, success_threshold=threshold), in_axes=(None, None, 0))
  return jax.jit(
    lambda rewards, mask, key, num_keys=NUM_KEYS: select(rewards, mask, jax.random.split(key, num_keys)),
    static_argnames="num_keys",
  )


@st.composite
def groups(draw):
  g = draw(st.sampled_from(GROUP_SIZES))
  rewards = arrays(draw, (g,), grid_or_nonfinite(REWARD_GRID))
  return rewards, bools(draw, (g,), p_true=4), draw(st.integers(0, 2**31 - 1))


@given(groups(), st.sampled_from(THRESHOLDS))
def test_peer_properties(group, threshold):
  rewards, mask, seed = group
  peers = np.asarray(_select_many(threshold)(rewards, mask, jax.random.key(seed)))
  assert peers.dtype == np.int32
  eligible = ref.hsd_eligible(rewards, mask, threshold)
  for g, allowed in enumerate(eligible):
    chosen = set(peers[:, g].tolist())
    if not allowed:
      assert chosen == {-1}  # -1 exactly when no successful valid peer exists (or g is invalid)
    else:
      assert g not in chosen  # never itself
      assert chosen == allowed  # only eligible peers, and every one of them over 256 keys


def test_choice_is_uniform():
  rewards = np.array([1.0, 1.0, 0.0, 1.0, 1.0, 1.0], np.float32)
  peers = np.asarray(_select_many(0.5)(rewards, np.ones(6, bool), jax.random.key(7), num_keys=6000))[:, 2]
  counts = np.bincount(peers, minlength=6)
  assert counts[2] == 0
  # 5 eligible peers, 6000 draws: each count is 1200 +- 31 (1 sigma); 5 sigma bounds
  assert np.all(np.abs(counts[[0, 1, 3, 4, 5]] - 1200) < 160), counts


def test_threshold_is_strict_and_default_mask():
  peers = credit.hsd_select_peers(np.array([0.5, 0.5, 1.0], np.float32), None, jax.random.key(0))
  np.testing.assert_array_equal(peers, [2, 2, -1])


def test_raw_uint32_key_and_batched_groups():
  rewards_PxG = np.array([[1.0, 0.0], [0.0, 0.0]], np.float32)
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  peers = jax.jit(jax.vmap(credit.hsd_select_peers))(rewards_PxG, np.ones((2, 2), bool), keys)
  np.testing.assert_array_equal(peers, [[-1, 0], [-1, -1]])


@pytest.mark.parametrize(
  "call,message",
  [
    (lambda: credit.hsd_select_peers(np.zeros((2, 2)), None, jax.random.key(0)), "`rewards` must have rank 1"),
    (
      lambda: credit.hsd_select_peers(np.zeros(3), np.ones(2, bool), jax.random.key(0)),
      "`sample_mask` must have shape [G]",
    ),
    (
      lambda: credit.hsd_select_peers(np.zeros(3), None, jax.random.key(0), success_threshold=float("nan")),
      "`success_threshold`",
    ),
  ],
)
def test_errors(call, message):
  with pytest.raises(ValueError) as info:
    call()
  assert message in str(info.value)
