"""CrEST: verified unit advantages and the verifier-bounded self-teacher token factor (arXiv 2608.13179)."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import credit_reference as ref
from credit_strategies import NONFINITE, REWARD_GRID, arrays, bools, grid_or_nonfinite, logp_grid
from jaxcredit import credit
from tests import shared_cases

SHAPES = ((1, 2, 16), (4, 3, 16), (8, 4, 40))  # (G, U, L)
# (lam, clip_eps, tau, rho): the published defaults, then wide and narrow corners; crest_advantages pairs each
# with one scale.
KNOBS = ((0.3, 0.28, 2.0, 0.5), (2.0, 0.9, 0.5, 1.0), (0.05, 0.0, 4.0, 0.0))
SCALE_OF = {KNOBS[0]: "group", KNOBS[1]: "none", KNOBS[2]: "group"}
EAGER_EXAMPLES = max(10, settings().max_examples // 5)
turn_adv_jit = jax.jit(credit.crest_turn_advantages, static_argnames=("scale", "eps"))


def _kw(knobs):
  return dict(zip(("lam", "clip_eps", "tau", "rho"), knobs))


@functools.lru_cache(maxsize=None)
def _weights(lam, clip_eps, tau, rho):
  return jax.jit(functools.partial(credit.crest_token_weights, lam=lam, clip_eps=clip_eps, tau=tau, rho=rho))


@functools.lru_cache(maxsize=None)
def _weights_shared_table():
  return jax.jit(jax.vmap(_weights(*KNOBS[0]), in_axes=(None, 0, 0, 0, 0)))


@functools.lru_cache(maxsize=None)
def _weights_nested():
  return jax.jit(jax.vmap(jax.vmap(_weights(*KNOBS[0]))))


@functools.lru_cache(maxsize=None)
def _advantages(scale, lam, clip_eps, tau, rho, batched=False):
  fn = functools.partial(credit.crest_advantages, scale=scale, lam=lam, clip_eps=clip_eps, tau=tau, rho=rho)
  return jax.jit(jax.vmap(fn) if batched else fn)


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
  return ids, action, arrays(draw, shape + (length,), _logp()), arrays(draw, shape + (length,), _logp())


@st.composite
def rollouts(draw):
  _, num_u, length = draw(st.sampled_from(SHAPES))
  turn_adv = arrays(draw, (num_u,), st.sampled_from((-1.5, -0.5, 0.0, 0.5, 1.0, 2.0)))
  return (turn_adv,) + draw(token_inputs(num_u=num_u, length=length))


@st.composite
def groups(draw, shapes=SHAPES):
  g, num_u, length = draw(st.sampled_from(shapes))
  rewards = arrays(draw, (g, num_u), grid_or_nonfinite(REWARD_GRID))
  tmask = bools(draw, (g, num_u), p_true=4)
  smask = bools(draw, (g,), p_true=5)
  ids, action, teacher, policy = draw(token_inputs(g=g, num_u=num_u, length=length))
  return rewards, tmask, ids, action, teacher, policy, smask


def _in_unit(ids, action, num_u):
  return action & (ids >= 0) & (ids < num_u)


def _live(turn_adv, ids, action, teacher, policy):
  """The tokens the teacher may modulate: unit tokens with A_u != 0 and both log-probs finite."""
  inside = _in_unit(ids, action, len(turn_adv))
  adv = np.where(inside, turn_adv[np.clip(ids, 0, len(turn_adv) - 1)], 0.0)
  return inside & (adv != 0) & np.isfinite(teacher) & np.isfinite(policy), adv


@given(groups(), st.sampled_from(["group", "none"]))
def test_turn_advantages_match_reference(group, scale):
  rewards, tmask, *_, smask = group
  got = np.asarray(turn_adv_jit(rewards, tmask, smask, scale=scale))
  np.testing.assert_allclose(got, ref.crest_turn(rewards, tmask, smask, scale), rtol=1e-5, atol=1e-5)
  assert np.all(got[~(tmask & smask[:, None] & np.isfinite(rewards))] == 0.0)


@given(rollouts(), st.sampled_from(KNOBS))
def test_token_weights_match_float64_reference(rollout, knobs):
  got = np.asarray(_weights(*knobs)(*rollout))
  np.testing.assert_allclose(got, ref.crest_weights(*rollout, *knobs), rtol=0, atol=1e-5)


@given(rollouts(), st.sampled_from(KNOBS))
def test_token_factor_properties(rollout, knobs):
  """Paper App. A: P1 sign(A_u · φ_i) = sign(A_u); P2 |φ_i − 1| <= lam · clip_eps; P3 φ_i >= 1. φ = 1 on unit tokens
  the teacher may not modulate, 0 off them."""
  lam, clip_eps, _, _ = knobs
  turn_adv, ids, action, teacher, policy = rollout
  phi = np.asarray(_weights(*knobs)(*rollout))
  inside = _in_unit(ids, action, len(turn_adv))
  live, adv = _live(*rollout)
  assert np.all(np.isfinite(phi))
  assert np.all(phi[~inside] == 0.0)
  assert np.all(np.sign(adv * phi)[inside] == np.sign(adv)[inside])  # P1
  assert np.all(np.abs(phi[inside] - 1.0) <= np.float32(lam) * np.float32(clip_eps) + 1e-6)  # P2
  assert np.all(phi[inside] >= 1.0)  # P3
  assert np.all(phi[inside & ~live] == 1.0)


@given(rollouts(), st.sampled_from(KNOBS))
def test_only_tokens_the_teacher_agrees_on_are_amplified(rollout, knobs):
  """The direction gate (Eq. 7): φ_i > 1 only where sign(A_u) · (teacher − policy) > 0; and there, with clip_eps > 0,
  lam > 0 and rho < 1, always."""
  lam, clip_eps, _, rho = knobs
  turn_adv, ids, action, teacher, policy = rollout
  phi = np.asarray(_weights(*knobs)(*rollout))
  live, adv = _live(*rollout)
  with np.errstate(invalid="ignore"):
    agrees = live & (np.sign(adv) * (teacher - policy) > 0)
  assert np.all(phi[~agrees & live] == 1.0)
  if lam > 0 and clip_eps > 0 and rho < 1:
    assert np.all(phi[agrees] > 1.0)


@given(rollouts(), st.sampled_from(KNOBS))
def test_teacher_equal_to_policy_gives_one(rollout, knobs):
  turn_adv, ids, action, teacher, _ = rollout
  phi = np.asarray(_weights(*knobs)(turn_adv, ids, action, teacher, teacher))
  assert np.all(phi[_in_unit(ids, action, len(turn_adv))] == 1.0)


@given(rollouts(), st.sampled_from(KNOBS))
def test_lam_zero_is_the_inter_turn_only_ablation(rollout, knobs):
  turn_adv, ids, action, *_ = rollout
  phi = np.asarray(_weights(0.0, *knobs[1:])(*rollout))
  assert np.all(phi[_in_unit(ids, action, len(turn_adv))] == 1.0)


@given(rollouts(), st.sampled_from((1, 8)), st.sampled_from(["nonfinite", "not_action", "zero_unit", "outside"]))
def test_surprisal_statistics_are_over_the_rollouts_action_tokens(rollout, extra, kind):
  """The z-score's mean and std are over the action tokens with a finite policy log-prob (the paper's "response
  tokens", Eq. 8): appending tokens with a NaN policy log-prob or non-action tokens leaves every other φ as it was;
  appended action tokens of a unit with A = 0 or of no unit are unmodulated themselves but count in the statistics
  (their surprisal is 3 nats here)."""
  turn_adv, ids, action, teacher, policy = rollout
  adv = np.append(turn_adv, 0.0).astype(np.float32)  # one more unit, with A = 0
  unit = {"zero_unit": len(turn_adv), "nonfinite": 0, "not_action": 0, "outside": -1}[kind]
  longer = (
    adv,
    np.append(ids, np.full(extra, unit, np.int32)),
    np.append(action, np.full(extra, kind != "not_action")),
    np.append(teacher, np.full(extra, -0.5, np.float32)),
    np.append(policy, np.full(extra, np.nan if kind == "nonfinite" else -3.0, np.float32)),
  )
  got = np.asarray(_weights(*KNOBS[0])(*longer))  # the published defaults, jitted: one compile per shape
  if kind in ("nonfinite", "not_action"):
    np.testing.assert_allclose(got[: len(ids)], ref.crest_weights(adv, ids, action, teacher, policy), atol=1e-5)
  np.testing.assert_allclose(got, ref.crest_weights(*longer), rtol=0, atol=1e-5)
  want_tail = {"outside": 0.0, "not_action": 0.0}.get(kind, 1.0)
  assert np.all(got[len(ids) :] == want_tail)


def test_surprisal_statistics_include_tokens_of_a_unit_with_zero_advantage():
  """Unit 1 (A = 0, unmodulated) holds two very surprising tokens: they raise the rollout's mean surprisal, so
  the endorsed token of unit 0 (surprisal 1 nat) sits below the mean and is amplified by less than lam·clip_eps."""
  ids = np.array([0, 0, 1, 1], np.int32)
  policy = np.array([-1.0, -1.0, -8.0, -8.0], np.float32)
  teacher = np.array([0.0, -1.0, -8.0, -8.0], np.float32)  # token 0 endorsed: Δ = 0.5, w = 1.28
  phi = np.asarray(credit.crest_token_weights([1.0, 0.0], ids, np.ones(4, bool), teacher, policy))
  z = (1.0 - 4.5) / (3.5 + 1e-6)
  m = 1 + 0.5 * (2 / (1 + np.exp(-z)) - 1)
  np.testing.assert_allclose(phi, [1 + 0.3 * m * 0.28, 1.0, 1.0, 1.0], rtol=1e-6)
  assert phi[0] < 1 + 0.3 * 0.28 - 0.01


def test_spec_example_amplifies_only_agreed_tokens_by_lam_clip_eps():
  """The repository's copy of the shared case "crest-amplify-only" (spec "CrEST" example): φ = 1 + 0.3 · 0.28
  on the two tokens the teacher endorses more than the policy, 1 elsewhere; float32-exact."""
  case = shared_cases.case("crest-amplify-only")
  args = {k: np.asarray(v) for k, v in case["args"].items()}
  for fn in (credit.crest_token_weights, jax.jit(credit.crest_token_weights)):
    got = np.asarray(fn(**args))
    np.testing.assert_array_equal(got, np.asarray(case["expect"], np.float32))
  np.testing.assert_allclose(ref.crest_weights(**args), case["expect"], rtol=0, atol=1e-12)


def test_without_the_direction_gate_the_teacher_also_shrinks_but_never_flips():
  """direction_gate=False (the ablation without Eq. 7): on the shared case, the tokens the teacher endorses less than
  the policy get φ = 1 + lam · (w − 1) < 1 with w = max(exp(sign(A) · Δ), 1 − clip_eps); the endorsed ones are
  amplified as with the gate; φ stays above 1 − lam · clip_eps > 0, so no token's sign flips."""
  case = shared_cases.case("crest-amplify-only")
  args = {k: np.asarray(v) for k, v in case["args"].items()}
  gated = np.asarray(credit.crest_token_weights(**args))
  free = np.asarray(credit.crest_token_weights(**args, direction_gate=False))
  lam, clip_eps = args.get("lam", 0.3), args.get("clip_eps", 0.28)
  amplified = gated > 1.0
  np.testing.assert_array_equal(free[amplified], gated[amplified])
  live = (args["action_mask"] & (args["turn_ids"] >= 0)) & ~amplified
  assert live.any() and (free[live] < 1.0).any(), free
  assert (free[args["action_mask"]] >= 1.0 - lam * clip_eps - 1e-6).all()
  with pytest.raises(ValueError, match="^crest_token_weights: knob `direction_gate`"):
    credit.crest_token_weights(**args, direction_gate="no")


@given(groups(), st.sampled_from(KNOBS))
def test_advantages_match_reference(group, knobs):
  scale = SCALE_OF[knobs]
  rewards, tmask, ids, action, teacher, policy, smask = group
  got = np.asarray(_advantages(scale, *knobs)(rewards, tmask, ids, action, teacher, policy, smask))
  want = ref.crest_adv(rewards, tmask, ids, action, teacher, policy, smask, scale, 1e-6, *knobs)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.all(np.isfinite(got))
  assert np.all(got[~action] == 0.0) and np.all(got[~smask] == 0.0)
  adv = np.asarray(turn_adv_jit(rewards, tmask, smask, scale=scale))
  unit_adv = np.take_along_axis(adv, np.clip(ids, 0, adv.shape[1] - 1), axis=1)
  assert np.all(np.sign(got) == np.where(_in_unit(ids, action, adv.shape[1]), np.sign(unit_adv), 0.0))


@settings(max_examples=EAGER_EXAMPLES)
@given(groups(shapes=SHAPES[1:2]))
def test_advantages_jit_vmap_and_eager_agree(group):
  """The eager call equals the jitted one and each row of the vmapped one. The property is about the three paths
  agreeing, not about the inputs (test_advantages_match_reference draws those): one shape (each new shape compiles
  every eager op and both programs again) and a fifth of the profile's examples (10 by default, 20 in CI)."""
  rewards, tmask, ids, action, teacher, policy, smask = group
  args = (rewards, tmask, ids, action, teacher, policy, smask)
  eager = np.asarray(credit.crest_advantages(*args, scale="group", **_kw(KNOBS[0])))
  np.testing.assert_allclose(np.asarray(_advantages("group", *KNOBS[0])(*args)), eager, rtol=0, atol=1e-6)
  stack = lambda x: np.stack([x, x[::-1]])
  got = np.asarray(_advantages("group", *KNOBS[0], batched=True)(*map(stack, args)))
  np.testing.assert_allclose(got[0], eager, rtol=0, atol=1e-6)
  np.testing.assert_allclose(got[1], ref.crest_adv(*[x[::-1] for x in args], "group", 1e-6, *KNOBS[0]), atol=1e-5)


@given(rollouts(), st.data())
def test_token_weights_batched_like_single_rollouts(rollout, data):
  """The custom batching of the per-unit look-ups (shared or per-row unit advantages, nested vmap) gives each row
  what the unbatched call gives."""
  turn_adv, ids, action, teacher, policy = rollout
  perm = data.draw(st.permutations(range(len(ids))))
  rows = [(ids, action, teacher, policy), tuple(x[list(perm)] for x in (ids, action, teacher, policy))]
  stacked = [np.stack(x) for x in zip(*rows)]
  fn = _weights(*KNOBS[0])
  shared = np.asarray(_weights_shared_table()(turn_adv, *stacked))
  nested = np.asarray(
    _weights_nested()(np.stack([np.stack([turn_adv] * 2)] * 3), *[np.stack([x] * 3) for x in stacked])
  )
  for r, row in enumerate(rows):
    single = np.asarray(fn(turn_adv, *row))
    np.testing.assert_allclose(shared[r], single, rtol=0, atol=1e-6)
    for p in range(3):
      np.testing.assert_allclose(nested[p, r], single, rtol=0, atol=1e-6)


def test_weights_stop_gradient():
  ids = np.array([0, 0, 1, 1], np.int32)
  grad = jax.jit(
    jax.grad(
      lambda p: (
        credit.crest_token_weights(np.array([1.0, -1.0]), ids, np.ones(4, bool), np.full(4, -1.0), p) @ np.arange(4.0)
      )
    )
  )
  assert np.all(np.asarray(grad(np.array([-2.0, -0.5, -2.0, -0.5]))) == 0.0)


L3 = np.zeros((2, 4))
BAD_SHAPES = [
  (lambda: credit.crest_turn_advantages(np.zeros((2, 3)), np.ones((2, 4), bool)), "`turn_mask` must have shape [G,U]"),
  (lambda: credit.crest_turn_advantages(np.zeros(3), np.ones(3, bool)), "`turn_rewards` must have rank 2"),
  (
    lambda: credit.crest_token_weights(np.zeros(2), np.zeros(4, np.int32), np.ones(4, bool), np.zeros(4), np.zeros(5)),
    "`policy_logp` must have shape [L]",
  ),
  (
    lambda: credit.crest_token_weights(np.zeros(2), np.zeros(4), np.ones(4, bool), np.zeros(4), np.zeros(4)),
    "`turn_ids` must be an integer",
  ),
  (
    lambda: credit.crest_advantages(
      np.zeros((2, 3)), np.ones((2, 3), bool), np.zeros((2, 4), np.int32), np.ones((2, 4), bool), L3, np.zeros((3, 4))
    ),
    "`policy_logp` must have shape [G,L]",
  ),
  (
    lambda: credit.crest_advantages(
      np.zeros((2, 3)),
      np.ones((2, 3), bool),
      np.zeros((2, 4), np.int32),
      np.ones((2, 4), bool),
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


TOKEN_KNOB_ERRORS = [
  ({"lam": -0.1}, "`lam` must be >= 0"),
  ({"lam": float("inf")}, "`lam` must be finite"),
  ({"clip_eps": -0.01}, "`clip_eps` must be >= 0"),
  ({"clip_eps": 1.0}, "`clip_eps` must be < 1"),
  ({"tau": 0.0}, "`tau` must be > 0"),
  ({"tau": float("nan")}, "`tau` must be finite"),
  ({"tau": float("inf")}, "`tau` must be finite"),
  ({"rho": -0.5}, "`rho` must be >= 0"),
  ({"rho": 1.5}, "`rho` must be <= 1"),
  ({"lam": "0.3"}, "`lam` must be a real scalar"),
]


@pytest.mark.parametrize("kwargs,message", TOKEN_KNOB_ERRORS + [({"eps": 0.0}, "`eps`"), ({"scale": "rms"}, "`scale`")])
def test_knob_errors_name_function_and_knob(kwargs, message):
  args = (np.zeros((2, 3)), np.ones((2, 3), bool), np.zeros((2, 4), np.int32), np.ones((2, 4), bool), L3, L3)
  with pytest.raises(ValueError, match=f"^crest_advantages: knob {message}"):
    credit.crest_advantages(*args, **kwargs)


@pytest.mark.parametrize("kwargs,message", TOKEN_KNOB_ERRORS)
def test_token_weight_knob_errors_name_function_and_knob(kwargs, message):
  args = (np.zeros(2), np.zeros(4, np.int32), np.ones(4, bool), np.zeros(4), np.zeros(4))
  with pytest.raises(ValueError, match=f"^crest_token_weights: knob {message}"):
    credit.crest_token_weights(*args, **kwargs)


@pytest.mark.parametrize("kwargs", [{"lam": 0.0}, {"clip_eps": 0.0}, {"rho": 0.0}, {"rho": 1.0}, {"clip_eps": 0.999}])
def test_knobs_at_the_edge_of_their_range_are_accepted(kwargs):
  args = (np.ones(1), np.zeros(3, np.int32), np.ones(3, bool), np.array([-0.1, -2.0, -1.0]), np.full(3, -1.0))
  phi = np.asarray(credit.crest_token_weights(*args, **kwargs))
  assert np.all(np.isfinite(phi)) and np.all(phi >= 1.0)
