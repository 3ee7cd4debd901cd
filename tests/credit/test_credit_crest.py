"""CrEST: verified unit advantages and entropy-gated self-teacher token weights."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import credit_reference as ref
from credit_strategies import NONFINITE, REWARD_GRID, arrays, bools, grid_or_nonfinite, logp_grid
from jaxcredit import credit

SHAPES = ((1, 2, 16), (4, 3, 16), (8, 4, 40))  # (G, U, L)
# (tau, temperature, max_log_ratio); crest_advantages pairs each with one scale.
KNOBS = ((1.0, 0.25, 2.0), (0.5, 1.0, 0.5), (2.0, 0.1, 5.0))
SCALE_OF = {KNOBS[0]: "group", KNOBS[1]: "none", KNOBS[2]: "group"}
turn_adv_jit = jax.jit(credit.crest_turn_advantages, static_argnames=("scale", "eps"))


@functools.lru_cache(maxsize=None)
def _weights(tau, temperature, max_log_ratio):
  return jax.jit(
    functools.partial(credit.crest_token_weights, tau=tau, temperature=temperature, max_log_ratio=max_log_ratio)
  )


@functools.lru_cache(maxsize=None)
def _weights_shared_table():
  return jax.jit(jax.vmap(_weights(*KNOBS[0]), in_axes=(None, 0, 0, 0, 0, 0)))


@functools.lru_cache(maxsize=None)
def _weights_nested():
  return jax.jit(jax.vmap(jax.vmap(_weights(*KNOBS[0]))))


@functools.lru_cache(maxsize=None)
def _advantages(scale, tau, temperature, max_log_ratio, batched=False):
  fn = functools.partial(
    credit.crest_advantages, scale=scale, tau=tau, temperature=temperature, max_log_ratio=max_log_ratio
  )
  return jax.jit(jax.vmap(fn) if batched else fn)


def _entropy():
  return st.one_of(
    st.integers(0, 32).map(lambda k: k / 8.0), st.integers(0, 32).map(lambda k: k / 8.0), st.sampled_from(NONFINITE)
  )


def _logp():
  return st.one_of(*([logp_grid()] * 7), st.sampled_from(NONFINITE))


@st.composite
def token_inputs(draw, g=None, num_u=None, length=None):
  shape = () if g is None else (g,)
  ids = np.asarray(
    draw(
      st.lists(
        st.integers(-1, num_u), min_size=int(np.prod(shape + (length,))), max_size=int(np.prod(shape + (length,)))
      )
    ),
    np.int32,
  ).reshape(shape + (length,))
  action = bools(draw, shape + (length,), p_true=4)
  return (
    ids,
    action,
    arrays(draw, shape + (length,), _logp()),
    arrays(draw, shape + (length,), _logp()),
    arrays(draw, shape + (length,), _entropy()),
  )


@st.composite
def rollouts(draw):
  _, num_u, length = draw(st.sampled_from(SHAPES))
  turn_adv = arrays(draw, (num_u,), st.sampled_from((-1.5, -0.5, 0.0, 0.5, 1.0, 2.0)))
  return (turn_adv,) + draw(token_inputs(num_u=num_u, length=length))


@st.composite
def groups(draw):
  g, num_u, length = draw(st.sampled_from(SHAPES))
  rewards = arrays(draw, (g, num_u), grid_or_nonfinite(REWARD_GRID))
  tmask = bools(draw, (g, num_u), p_true=4)
  smask = bools(draw, (g,), p_true=5)
  ids, action, teacher, policy, entropy = draw(token_inputs(g=g, num_u=num_u, length=length))
  return rewards, tmask, ids, action, teacher, policy, entropy, smask


def _in_unit(ids, action, num_u):
  return action & (ids >= 0) & (ids < num_u)


@given(groups(), st.sampled_from(["group", "none"]))
def test_turn_advantages_match_reference(group, scale):
  rewards, tmask, *_, smask = group
  got = np.asarray(turn_adv_jit(rewards, tmask, smask, scale=scale))
  np.testing.assert_allclose(got, ref.crest_turn(rewards, tmask, smask, scale), rtol=1e-5, atol=1e-5)
  assert np.all(got[~(tmask & smask[:, None] & np.isfinite(rewards))] == 0.0)


@given(rollouts(), st.sampled_from(KNOBS))
def test_token_weights_match_reference(rollout, knobs):
  got = np.asarray(_weights(*knobs)(*rollout))
  np.testing.assert_allclose(got, ref.crest_weights(*rollout, *knobs), rtol=1e-5, atol=1e-5)


@given(rollouts(), st.sampled_from(KNOBS))
def test_token_weight_invariants(rollout, knobs):
  turn_adv, ids, action, teacher, policy, entropy = rollout
  w = np.asarray(_weights(*knobs)(*rollout))
  inside = _in_unit(ids, action, len(turn_adv))
  assert np.all(np.isfinite(w))
  assert np.all(w[~inside] == 0.0)
  assert np.all(w[inside] > 0.0)  # so sign(A_u * w_i) == sign(A_u)
  for u in np.unique(ids[inside]):
    np.testing.assert_allclose(w[inside & (ids == u)].mean(), 1.0, rtol=1e-5)


@given(rollouts(), st.sampled_from(KNOBS))
def test_teacher_equal_to_policy_gives_unit_weights(rollout, knobs):
  turn_adv, ids, action, teacher, _, entropy = rollout
  w = np.asarray(_weights(*knobs)(turn_adv, ids, action, teacher, teacher, entropy))
  inside = _in_unit(ids, action, len(turn_adv))
  assert np.all(w[inside] == 1.0)


@given(rollouts())
def test_closed_gate_gives_unit_weights(rollout):
  turn_adv, ids, action, *_ = rollout
  w = np.asarray(_weights(float("-inf"), 0.25, 2.0)(*rollout))
  assert np.all(w[_in_unit(ids, action, len(turn_adv))] == 1.0)


@given(rollouts())
def test_modulation_direction(rollout):
  """Within a unit, an endorsed token (gap > 0) outweighs a disowned one (gap < 0) iff the unit is positive."""
  turn_adv, ids, action, teacher, policy, entropy = rollout
  entropy = np.zeros_like(entropy)  # open gate everywhere
  w = np.asarray(_weights(1.0, 0.25, 2.0)(turn_adv, ids, action, teacher, policy, entropy))
  with np.errstate(invalid="ignore"):
    gap = teacher - policy
  for u in range(len(turn_adv)):
    unit = _in_unit(ids, action, len(turn_adv)) & (ids == u) & np.isfinite(gap)
    up, down = unit & (gap > 0), unit & (gap < 0)
    if up.any() and down.any() and turn_adv[u] != 0:
      assert (w[up].min() > w[down].max()) == (turn_adv[u] > 0)


@given(groups(), st.sampled_from(KNOBS))
def test_advantages_match_reference(group, knobs):
  scale = SCALE_OF[knobs]
  rewards, tmask, ids, action, teacher, policy, entropy, smask = group
  got = np.asarray(_advantages(scale, *knobs)(rewards, tmask, ids, action, teacher, policy, entropy, smask))
  want = ref.crest_adv(rewards, tmask, ids, action, teacher, policy, entropy, smask, scale, 1e-6, *knobs)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.all(np.isfinite(got))
  assert np.all(got[~action] == 0.0) and np.all(got[~smask] == 0.0)
  adv = np.asarray(turn_adv_jit(rewards, tmask, smask, scale=scale))
  unit_adv = np.take_along_axis(adv, np.clip(ids, 0, adv.shape[1] - 1), axis=1)
  assert np.all(np.sign(got) == np.where(_in_unit(ids, action, adv.shape[1]), np.sign(unit_adv), 0.0))


@given(groups())
def test_advantages_vmapped(group):
  rewards, tmask, ids, action, teacher, policy, entropy, smask = group
  stack = lambda x: np.stack([x, x[::-1]])
  args = (rewards, tmask, ids, action, teacher, policy, entropy, smask)
  got = np.asarray(_advantages("group", *KNOBS[0], batched=True)(*map(stack, args)))
  np.testing.assert_allclose(got[0], ref.crest_adv(*args, "group", 1e-6, *KNOBS[0]), atol=1e-5)
  np.testing.assert_allclose(got[1], ref.crest_adv(*[x[::-1] for x in args], "group", 1e-6, *KNOBS[0]), atol=1e-5)


def test_weights_stop_gradient():
  ids = np.array([0, 0, 1, 1], np.int32)
  grad = jax.jit(
    jax.grad(
      lambda p: (
        credit.crest_token_weights(np.array([1.0, -1.0]), ids, np.ones(4, bool), np.full(4, -1.0), p, np.zeros(4))
        @ np.arange(4.0)
      )
    )
  )
  assert np.all(np.asarray(grad(np.array([-2.0, -0.5, -2.0, -0.5]))) == 0.0)


L3 = np.zeros((2, 4))
BAD_SHAPES = [
  (lambda: credit.crest_turn_advantages(np.zeros((2, 3)), np.ones((2, 4), bool)), "`turn_mask` must have shape [G,U]"),
  (lambda: credit.crest_turn_advantages(np.zeros(3), np.ones(3, bool)), "`turn_rewards` must have rank 2"),
  (
    lambda: credit.crest_token_weights(
      np.zeros(2), np.zeros(4, np.int32), np.ones(4, bool), np.zeros(4), np.zeros(5), np.zeros(4)
    ),
    "`policy_logp` must have shape [L]",
  ),
  (
    lambda: credit.crest_token_weights(
      np.zeros(2), np.zeros(4), np.ones(4, bool), np.zeros(4), np.zeros(4), np.zeros(4)
    ),
    "`turn_ids` must be an integer",
  ),
  (
    lambda: credit.crest_advantages(
      np.zeros((2, 3)),
      np.ones((2, 3), bool),
      np.zeros((2, 4), np.int32),
      np.ones((2, 4), bool),
      L3,
      L3,
      np.zeros((3, 4)),
    ),
    "`teacher_entropy` must have shape [G,L]",
  ),
  (
    lambda: credit.crest_advantages(
      np.zeros((2, 3)),
      np.ones((2, 3), bool),
      np.zeros((2, 4), np.int32),
      np.ones((2, 4), bool),
      L3,
      L3,
      L3,
      np.ones(3, bool),
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
    ({"temperature": 0.0}, "temperature"),
    ({"temperature": -1.0}, "temperature"),
    ({"max_log_ratio": -0.1}, "max_log_ratio"),
    ({"max_log_ratio": float("inf")}, "max_log_ratio"),
    ({"tau": float("nan")}, "tau"),
    ({"eps": 0.0}, "eps"),
    ({"scale": "rms"}, "scale"),
  ],
)
def test_knob_errors(kwargs, knob):
  args = (np.zeros((2, 3)), np.ones((2, 3), bool), np.zeros((2, 4), np.int32), np.ones((2, 4), bool), L3, L3, L3)
  with pytest.raises(ValueError, match=f"`{knob}`"):
    credit.crest_advantages(*args, **kwargs)


@given(rollouts(), st.data())
def test_token_weights_batched_like_single_rollouts(rollout, data):
  """The custom batching of the per-unit look-ups and sums (shared or per-row unit advantages, nested vmap)
  gives each row what the unbatched call gives."""
  turn_adv, ids, action, teacher, policy, entropy = rollout
  perm = data.draw(st.permutations(range(len(ids))))
  rows = [
    (ids, action, teacher, policy, entropy),
    tuple(x[list(perm)] for x in (ids, action, teacher, policy, entropy)),
  ]
  stacked = [np.stack(x) for x in zip(*rows)]
  fn = _weights(*KNOBS[0])
  shared = np.asarray(_weights_shared_table()(turn_adv, *stacked))
  nested = np.asarray(
    _weights_nested()(np.stack([np.stack([turn_adv] * 2)] * 3), *[np.stack([x] * 3) for x in stacked])
  )
  for r, row in enumerate(rows):
    single = np.asarray(fn(turn_adv, *row))
    np.testing.assert_array_equal(shared[r], single)
    for p in range(3):
      np.testing.assert_array_equal(nested[p, r], single)
