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


def test_hsd_worked_example_by_hand():
  """docs/methods/hsd.md, worked example. Four tokens of one rollout, token 0 off the action mask; a vocabulary of
  three; logits = log-probabilities (T = 1).

  token 1: q = (1/2, 1/4, 1/4), p = (1/4, 1/2, 1/4):  KL = 1/2 ln 2 + 1/4 ln 1/2 + 0 = ln 2 / 4
  token 2: q = p = (1/3, 1/3, 1/3) (the context changes nothing):  KL = 0
  token 3: q = (1/2, 1/4, 1/4), p = (1/2, 1/8, 3/8):  KL = 0 + 1/4 ln 2 + 1/4 ln 2/3 = ln(4/3) / 4
  the rollout's objective (1/|o|) Σ_t KL_t = (ln 2 + ln 4/3) / 12 = ln(8/3) / 12
  d KL_1 / d z_student = p - q = (-1/4, 1/4, 0); the diagnostic credit of token 1 sampled as v = 0: ln q - ln p = ln 2
  """
  q = np.log(np.asarray([[1, 1, 1], [2, 1, 1], [1, 1, 1], [2, 1, 1]], np.float64) / [[3], [4], [3], [4]])
  p = np.log(np.asarray([[1, 1, 1], [1, 2, 1], [1, 1, 1], [4, 1, 3]], np.float64) / [[3], [4], [3], [8]])
  action = np.asarray([False, True, True, True])
  kl = np.asarray(credit.hsd_token_kl(q.astype(np.float32), p.astype(np.float32), action))
  np.testing.assert_allclose(kl, [0.0, np.log(2) / 4, 0.0, np.log(4 / 3) / 4], rtol=1e-5, atol=1e-7)
  assert float(kl[action].mean()) == pytest.approx(np.log(8 / 3) / 12, rel=1e-5)
  grad = jax.grad(lambda s: credit.hsd_token_kl(q.astype(np.float32), s, action)[1])(p.astype(np.float32))
  np.testing.assert_allclose(np.asarray(grad)[1], [-0.25, 0.25, 0.0], atol=1e-6)
  credit_1 = credit.hsd_token_advantages(q[:, 0], p[:, 0], action, clip=float("inf"))[1]
  assert float(credit_1) == pytest.approx(np.log(2), rel=1e-6)
