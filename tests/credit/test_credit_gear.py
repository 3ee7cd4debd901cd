"""GEAR as its captions and summaries describe it (credit.gear_segments / gear_advantages, spec v2.1): against a
float32 loop reference, the properties the spec names (a success's high-divergence tokens weighted below 1, a
failure's above 1; segments opened by d̂ > lambda_KL and ended by the entropy rule; no divergence -> GRPO) and the
worked example of docs/credit.md computed by hand."""

import functools
import math

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import credit_reference as ref
from credit_strategies import NONFINITE, TOKEN_LENGTHS, arrays, bools
from jaxcredit import credit

# (alpha, lambda_kl, lambda_h): Table 2's defaults, an onset at any divergence with segments that never end on
# entropy, and a strict one.
KNOBS = ((0.2, 0.1, 1.5), (0.5, 0.0, math.inf), (0.9, 0.5, 1.0))


def _named(knobs):
  return dict(zip(("alpha", "lambda_kl", "lambda_h"), knobs))


@functools.lru_cache(maxsize=None)
def _adv(knobs):
  return jax.jit(functools.partial(credit.gear_advantages, **_named(knobs)))


@functools.lru_cache(maxsize=None)
def _segs(knobs):
  return jax.jit(functools.partial(credit.gear_segments, **dict(list(_named(knobs).items())[1:])))


def _grid(top):
  return st.integers(0, 16 * top).map(lambda k: k / 16.0)


@st.composite
def rollouts(draw, length=None):
  length = draw(st.sampled_from(TOKEN_LENGTHS)) if length is None else length
  div = st.one_of(*([_grid(4)] * 6), st.just(-1.0 / 1024), st.sampled_from(NONFINITE))
  ent = st.one_of(*([_grid(3)] * 7), st.sampled_from(NONFINITE))
  return arrays(draw, (length,), div), arrays(draw, (length,), ent), bools(draw, (length,), p_true=5)


ADVANTAGES = st.sampled_from((-2.0, -0.5, 0.0, 0.75, 1.5))


@given(rollouts(), st.sampled_from(KNOBS), ADVANTAGES)
def test_gear_matches_reference(r, knobs, seq_adv):
  div, ent, action = r
  k = _named(knobs)
  np.testing.assert_array_equal(
    np.asarray(_segs(knobs)(div, ent, action)),
    ref.gear_v21_segs(div, ent, action, k["lambda_kl"], k["lambda_h"]),
  )
  got = np.asarray(_adv(knobs)(np.float32(seq_adv), div, ent, action))
  np.testing.assert_allclose(got, ref.gear_v21_adv(seq_adv, div, ent, action, **k), rtol=1e-6, atol=1e-7)


@given(rollouts(), st.sampled_from(KNOBS), ADVANTAGES)
def test_gear_is_sign_aware(r, knobs, seq_adv):
  """A success (A > 0): every weight in (1 − alpha, 1], below 1 where the token's credit is positive; a failure
  (A < 0): in [1, 1 + alpha]. The advantage keeps its sign; A = 0 stays 0."""
  div, ent, action = r
  alpha = knobs[0]
  adv = np.asarray(_adv(knobs)(np.float32(seq_adv), div, ent, action), np.float64)
  assert np.all(adv[~action] == 0.0)
  if seq_adv == 0.0:
    assert np.all(adv == 0.0)
    return
  w = adv[action] / seq_adv
  if seq_adv > 0:
    assert np.all(w <= 1.0 + 1e-7) and np.all(w >= 1.0 - alpha - 1e-6)
  else:
    assert np.all(w >= 1.0 - 1e-7) and np.all(w <= 1.0 + alpha + 1e-6)
  np.testing.assert_array_equal(np.sign(adv[action]), np.sign(seq_adv))


def test_gear_weights_a_success_spike_below_one_and_a_failure_spike_above_one():
  div = np.asarray([0.05, 3.0, 0.05, 0.05], np.float32)
  ent = np.ones(4, np.float32)
  action = np.ones(4, bool)
  up = np.asarray(credit.gear_advantages(1.0, div, ent, action))
  down = np.asarray(credit.gear_advantages(-1.0, div, ent, action))
  assert up[1] < 1.0 and down[1] < -1.0  # the spike: less credit on a success, more blame on a failure
  np.testing.assert_allclose(up[1], 0.8, rtol=1e-6)  # 1 − 0.2 · d̂, d̂ = 1 at the rollout's largest divergence
  np.testing.assert_allclose(down[1], -1.2, rtol=1e-6)


@given(rollouts(), st.sampled_from(KNOBS))
def test_gear_segments_follow_the_onset_and_entropy_rules(r, knobs):
  """Every segment starts at an onset (d̂ > lambda_kl); each later token of it has finite entropy <= lambda_h · the
  onset's; the action token right after a segment either opens a new one or breaks the entropy bound (an onset
  with non-finite entropy extends over nothing)."""
  div, ent, action = r
  _, lambda_kl, lambda_h = knobs
  seg = np.asarray(_segs(knobs)(div, ent, action))
  d_hat = np.asarray(ref.gear_v21_normalised(div, action), np.float32)
  onset = action & (d_hat > np.float32(lambda_kl))
  for i, s in enumerate(seg):
    if s < 0:
      assert not onset[i]
      continue
    assert action[i] and onset[s] and s <= i and np.all(seg[s : i + 1] == s)
    if i > s and not math.isinf(lambda_h):
      assert np.isfinite(ent[i]) and ent[i] <= np.float32(np.float32(lambda_h) * ent[s])
    nxt = i + 1
    if nxt < len(seg) and seg[nxt] != s and action[nxt] and not onset[nxt]:
      bound = np.inf if math.isinf(lambda_h) else np.float32(np.float32(lambda_h) * ent[s])  # NaN: nothing extends
      assert not (np.isfinite(ent[nxt]) and ent[nxt] <= bound)


@given(rollouts(), st.sampled_from(KNOBS), ADVANTAGES)
def test_gear_without_divergence_is_exactly_grpo(r, knobs, seq_adv):
  div, ent, action = r
  want = np.where(action, np.float32(seq_adv), np.float32(0.0))
  for d in (np.zeros_like(div), np.full_like(div, np.nan), np.full_like(div, 1e-7)):
    np.testing.assert_array_equal(np.asarray(_adv(knobs)(np.float32(seq_adv), d, ent, action)), want)
    assert np.all(np.asarray(_segs(knobs)(d, ent, action)) == -1)


def test_gear_worked_example_by_hand():
  """docs/methods/gear.md, worked example: eight tokens, token 5 off the action mask (a tool observation).

  d = 0.1, 0.3, 4.0, 0.2, 0.3, (9.0 off), 0.8, 0.1;  max over actions 4.0:  d̂ = .025, .075, 1, .05, .075, 0, .2, .025
  onsets (d̂ > 0.1): tokens 2 and 6.  H = 1.0, 1.0, 0.8, 1.0, 1.5, 0, 2.0, 0.5
  token 2 opens (H₀ = 0.8, bound 1.2): token 3 (H 1.0) stays, token 4 (H 1.5) ends it; token 5 is no action;
  token 6 opens (H₀ = 2.0, bound 3.0): token 7 (H 0.5) stays.   seg_start = -1, -1, 2, 2, -1, -1, 6, 6
  credit c = .025, .075, 1, 1, .075, -, .2, .2
  A = +1 (alpha 0.2): W = 1 − 0.2 c = .995, .985, .8, .8, .985, -, .96, .96
  A = −0.5:           A (1 + 0.2 c) = −.5025, −.5075, −.6, −.6, −.5075, 0, −.52, −.52
  lambda_h = inf: the segment at 2 runs to the observation: seg_start = -1, -1, 2, 2, 2, -1, 6, 6
  """
  div = np.asarray([0.1, 0.3, 4.0, 0.2, 0.3, 9.0, 0.8, 0.1], np.float32)
  ent = np.asarray([1.0, 1.0, 0.8, 1.0, 1.5, 0.0, 2.0, 0.5], np.float32)
  action = np.asarray([True, True, True, True, True, False, True, True])
  np.testing.assert_array_equal(credit.gear_segments(div, ent, action), [-1, -1, 2, 2, -1, -1, 6, 6])
  np.testing.assert_allclose(
    credit.gear_advantages(1.0, div, ent, action), [0.995, 0.985, 0.8, 0.8, 0.985, 0.0, 0.96, 0.96], rtol=1e-6
  )
  np.testing.assert_allclose(
    credit.gear_advantages(-0.5, div, ent, action),
    [-0.5025, -0.5075, -0.6, -0.6, -0.5075, 0.0, -0.52, -0.52],
    rtol=1e-6,
  )
  np.testing.assert_array_equal(credit.gear_segments(div, ent, action, lambda_h=math.inf), [-1, -1, 2, 2, 2, -1, 6, 6])


# Jitted once, so each token length compiles once across the examples (a jit made inside the test compiled anew for
# every example: 70 s of the default suite).
_VMAPPED_ADV = jax.jit(jax.vmap(credit.gear_advantages))
_VMAPPED_SEGS = jax.jit(jax.vmap(credit.gear_segments))


@given(st.sampled_from(TOKEN_LENGTHS).flatmap(lambda n: st.lists(rollouts(n), min_size=3, max_size=3)))
def test_gear_vmap_agrees_with_one_call_per_rollout(rs):
  div, ent, action = (np.stack([r[k] for r in rs]) for k in range(3))
  seq = np.asarray([1.0, -0.5, 0.25], np.float32)
  batched = np.asarray(_VMAPPED_ADV(seq, div, ent, action))
  segs = np.asarray(_VMAPPED_SEGS(div, ent, action))
  for b in range(3):
    np.testing.assert_array_equal(batched[b], np.asarray(_adv(KNOBS[0])(seq[b], div[b], ent[b], action[b])))
    np.testing.assert_array_equal(segs[b], np.asarray(_segs(KNOBS[0])(div[b], ent[b], action[b])))


def test_gear_advantages_stop_gradient():
  d = np.asarray([0.2, 1.0, 0.1], np.float32)
  h = np.asarray([0.5, 0.4, 2.0], np.float32)
  grads = jax.grad(lambda x, y: credit.gear_advantages(1.0, x, y, np.ones(3, bool)).sum(), argnums=(0, 1))(d, h)
  assert all(np.all(np.asarray(g) == 0.0) for g in grads)


@pytest.mark.parametrize(
  "knobs,knob",
  [
    ({"alpha": 1.0}, "alpha"),
    ({"alpha": -0.1}, "alpha"),
    ({"lambda_kl": 1.0}, "lambda_kl"),
    ({"lambda_kl": -0.1}, "lambda_kl"),
    ({"lambda_h": 0.5}, "lambda_h"),
    ({"min_divergence": 0.0}, "min_divergence"),
  ],
)
def test_gear_knob_errors(knobs, knob):
  with pytest.raises(ValueError, match=f"gear_advantages: knob `{knob}`"):
    credit.gear_advantages(1.0, np.zeros(2), np.zeros(2), np.ones(2, bool), **knobs)


def test_gear_shape_errors_name_the_argument():
  with pytest.raises(ValueError, match="`entropy` must have"):
    credit.gear_segments(np.zeros(4), np.zeros(3), np.ones(4, bool))
  with pytest.raises(ValueError, match="`seq_adv` must have"):
    credit.gear_advantages(np.zeros(2), np.zeros(4), np.zeros(4), np.ones(4, bool))


def test_an_onset_exactly_at_the_threshold_is_not_one():
  """Found by the property test: d = 0.375 against a max of 3.75 is d̂ = 0.1 = lambda_KL exactly, no onset (d̂ must
  exceed it); the division d / max had read as one ulp above it and opened a segment."""
  div = np.zeros(12, np.float32)
  div[4], div[9] = 0.375, 3.75
  seg = np.asarray(credit.gear_segments(div, np.zeros(12, np.float32), np.ones(12, bool)))
  assert seg[4] == -1 and seg[9] == 9
  np.testing.assert_array_equal(seg, ref.gear_v21_segs(div, np.zeros(12), np.ones(12, bool)))
