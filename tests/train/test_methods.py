"""METHODS: each method's advantage function on a small trajectory, with its pass outputs filled by hand."""

import dataclasses

import numpy as np
import pytest

from jaxcredit import credit
from jaxcredit.train.config import base_config
from jaxcredit.train.tables.methods import METHODS, gigpo_state_ids
from jaxcredit.train.tables.pass_outputs import (
  DivergenceOutput,
  GoldAnswerOutput,
  PeerStatesOutput,
  PeerTeacherOutput,
  SiblingSummaryOutput,
  SkillOutput,
  TeacherOutput,
)
from jaxcredit.trajectory import RolloutBuilder, VocabKLInput, pack

B, L = 4, 16


def _traj(rewards=(1.0, 0.0, 0.0, 0.0), group_ids=(0, 0, 0, 0)):
  rollouts = []
  for g in range(len(rewards)):
    b = RolloutBuilder.from_prompt([1, 2, 3])
    b.append_action([10 + g, 11], [-0.5, -0.5])  # turn 0: tool call
    b.append_context([4, 5])
    b.mark_boundary()
    b.append_action([12, 13, 14], [-0.1] * 3)  # turn 1: answer
    rollouts.append(b)
  return pack(rollouts, list(rewards), list(group_ids), max_turns=3, pad_id=0, length_bucket=L)


def _knobs(method, **kw):
  k = dict(base_config().credit[method])
  k.update(kw)
  return k


def _teacher(traj, logp=None, entropy=None, valid=None, **extra):
  """A teacher pass's output: TeacherOutput, or the subclass whose fields `extra` holds."""
  b = traj.batch_size
  fields = {
    "logp_BxL": np.where(traj.action_mask_BxL, traj.behavior_logp_BxL if logp is None else logp, 0.0),
    "entropy_BxL": np.where(traj.action_mask_BxL, 0.5 if entropy is None else entropy, 0.0),
    "context_cut_tokens_B": np.zeros(b, np.int32),
    "valid_B": np.ones(b, bool) if valid is None else np.asarray(valid),
    "reasons": [""] * b,
  }
  if "divergence_BxL" in extra:
    extra.setdefault("student_entropy_BxL", np.zeros(traj.tokens_BxL.shape, np.float32))
    return DivergenceOutput(**fields, **extra)
  if "hidden_BxLxD" in extra:
    return PeerStatesOutput(**fields, **extra)
  if "peer_B" in extra:
    return PeerTeacherOutput(**fields, **extra)
  return TeacherOutput(**fields, **extra)


def _gold(traj, gold):
  b = traj.batch_size
  return GoldAnswerOutput(
    gold_logp_BxT1=gold, boundary_mask_BxT1=traj.boundary_mask_BxT1.copy(), valid_B=np.ones(b, bool), reasons=[""] * b
  )


GRPO = np.asarray([1.5, -0.5, -0.5, -0.5])


def _assert_seq(adv, traj, expect):
  for b in range(traj.batch_size):
    np.testing.assert_allclose(adv[b][traj.action_mask_BxL[b]], expect[b], atol=1e-5)
    assert np.all(adv[b][~traj.action_mask_BxL[b]] == 0.0)


def test_grpo_broadcasts_group_advantage_on_action_tokens_only():
  traj = _traj()
  _assert_seq(METHODS["grpo"].advantages(traj, _knobs("grpo")).adv_BxL, traj, GRPO)
  _assert_seq(METHODS["drgrpo"].advantages(traj, _knobs("drgrpo")).adv_BxL, traj, [0.75, -0.25, -0.25, -0.25])
  _assert_seq(METHODS["rloo"].advantages(traj, _knobs("rloo")).adv_BxL, traj, [1, -1 / 3, -1 / 3, -1 / 3])


def test_group_ids_are_honoured_whatever_the_batch_order():
  """Two groups interleaved (0, 1, 0, 1) give each rollout the advantage of its own group."""
  traj = _traj(rewards=(1.0, 0.0, 0.0, 3.0), group_ids=(0, 1, 0, 1))
  adv = METHODS["drgrpo"].advantages(traj, _knobs("drgrpo")).adv_BxL
  _assert_seq(adv, traj, [0.5, -1.5, -0.5, 1.5])


def test_unequal_groups_are_refused():
  traj = _traj(group_ids=(0, 0, 0, 1))
  with pytest.raises(ValueError, match="groups have different sizes"):
    METHODS["grpo"].advantages(traj, _knobs("grpo"))


def test_trace_adds_the_turn_credit_of_the_papers_defaults():
  """alpha_out·A_out + 0.2·(δ + 2·0.8·A_out) on the tool-call turn (one transition: the window is δ_0 and reaches
  the end), A_out alone on the answer turn; A_out with the population std (arXiv 2607.13988)."""
  traj = _traj()
  gold = np.tile(np.asarray([[-5.0, -3.0, 0.0, 0.0]], np.float32), (4, 1))
  gold[1, 1] = -5.0  # rollout 1's tool call did not help: δ = 0
  traj.passes["gold_answer"] = _gold(traj, gold)
  out = METHODS["trace"].advantages(traj, _knobs("trace"))
  a_out = (np.asarray([1.0, 0.0, 0.0, 0.0]) - 0.25) / (np.sqrt(0.25 * 0.75) + 1e-6)
  delta = np.log(5.1 / 3.1)
  r0 = np.asarray([delta, 0.0, delta, delta]) + 2.0 * 0.8 * a_out
  np.testing.assert_allclose(out.turn_adv_BxT[:, 0], a_out + 0.2 * r0, atol=1e-5)
  np.testing.assert_allclose(out.turn_adv_BxT[:, 1], a_out, atol=1e-5)
  np.testing.assert_allclose(out.details["turn_reward_BxT"][:, 0], r0, atol=1e-5)
  np.testing.assert_allclose(out.details["state_value_BxT1"][0, :2], [0.0, delta], atol=1e-6)
  np.testing.assert_allclose(out.adv_BxL[0][traj.turn_ids_BxL[0] == 0], out.turn_adv_BxT[0, 0], atol=1e-6)
  assert out.metrics["gold_boundaries"] == 8
  assert out.metrics["td_reward_abs_mean"] == pytest.approx(3 * delta / 8, abs=1e-6)


def test_crest_with_teacher_equal_to_policy_is_grpo_and_amplifies_only_agreed_tokens():
  traj = _traj()
  traj.passes["teacher_privileged"] = _teacher(traj)
  out = METHODS["crest"].advantages(traj, _knobs("crest"))
  _assert_seq(out.adv_BxL, traj, GRPO)  # U = 1 and teacher == policy: φ = 1
  assert out.metrics["crest_direction_gate_frac"] == 0.0
  # A teacher that endorses the even positions 1 nat more than the policy. Rollout 0 (A > 0): the gate opens on its
  # action tokens 4 and 8 (Δ = 0.5, w = min(e^0.5, 1.28) = 1.28); in the negative rollouts it stays closed.
  logp = np.where(np.arange(L)[None, :] % 2 == 0, traj.behavior_logp_BxL + 1.0, traj.behavior_logp_BxL)
  traj.passes["teacher_privileged"] = _teacher(traj, logp=logp, valid=[True, True, False, True])
  out = METHODS["crest"].advantages(traj, _knobs("crest"))
  # Rollout 0's surprisals [0.5, 0.5, 0.1, 0.1, 0.1]: token 4 is above their mean (λ = lam), token 8 below.
  s = np.asarray([0.5, 0.5, 0.1, 0.1, 0.1])
  m8 = 1 + 0.5 * (2 / (1 + np.exp(-(0.1 - s.mean()) / (s.std() + 1e-6))) - 1)
  phi0 = np.ones(L)
  phi0[4], phi0[8] = 1 + 0.3 * 0.28, 1 + 0.3 * m8 * 0.28
  np.testing.assert_allclose(out.adv_BxL[0], np.where(traj.action_mask_BxL[0], 1.5 * phi0, 0.0), atol=1e-5)
  for b in (1, 2, 3):  # disagreeing teacher (1, 3) and invalid pass (2): unmodulated
    np.testing.assert_allclose(out.adv_BxL[b][traj.action_mask_BxL[b]], -0.5, atol=1e-6)
  assert out.metrics["crest_direction_gate_frac"] == pytest.approx(2 / 15)  # of the valid rollouts' action tokens
  gate = out.details["direction_gate_BxL"]
  assert gate.dtype == bool and np.flatnonzero(gate[0]).tolist() == [4, 8] and not gate[1:].any()
  np.testing.assert_allclose(
    out.details["token_weight_BxL"][0][traj.action_mask_BxL[0]], phi0[traj.action_mask_BxL[0]], atol=1e-6
  )
  assert np.isnan(out.details["token_weight_BxL"][2]).all()
  assert "teacher_entropy_BxL" not in out.details


def test_toolopd_weights_only_valid_rollouts_and_keeps_grpo_advantage():
  traj = _traj()
  base = traj.behavior_logp_BxL
  skill = np.where(traj.action_mask_BxL, base + 0.5, 0.0)
  traj.passes["hindsight_skill"] = SkillOutput(
    skills=["s"] * 4,
    skill_tokens_B=np.full(4, 3),
    valid_B=np.ones(4, bool),
    success_B=np.asarray([True, False, False, False]),
    reasons=[""] * 4,
  )
  traj.passes["teacher_plain"] = _teacher(traj, logp=base)
  traj.passes["teacher_skill"] = _teacher(traj, logp=skill, valid=[True, True, False, True])
  out = METHODS["toolopd"].advantages(traj, _knobs("toolopd"))
  _assert_seq(out.adv_BxL, traj, GRPO)
  w = out.loss_inputs["distill"].distill_weight_BxL
  assert np.all(w[0][traj.action_mask_BxL[0]] > 0)  # success, the skill raised every token: all credited
  assert np.all(w[1] == 0) and np.all(w[2] == 0)  # failure with raised tokens: no credit; invalid: none
  np.testing.assert_array_equal(out.loss_inputs["distill"].distill_target_BxL, skill)
  assert out.metrics["toolopd_credited_frac"] == pytest.approx(1 / 3)


def test_hsd_grpo_adds_clipped_peer_teacher_ratio():
  """The earlier reading (`hsd_grpo`): GRPO plus dense_coef times the clipped sampled-token log-ratio."""
  traj = _traj()
  logp = np.where(traj.action_mask_BxL, traj.behavior_logp_BxL + 3.0, 0.0)
  traj.passes["teacher_peer"] = _teacher(
    traj, logp=logp, valid=[True, True, True, False], peer_B=np.asarray([-1, 0, 0, 0])
  )
  k = _knobs("hsd_grpo", dense_coef=0.5, clip=1.0)
  out = METHODS["hsd_grpo"].advantages(traj, k)
  _assert_seq(out.adv_BxL, traj, GRPO + np.asarray([0.5, 0.5, 0.5, 0.0]))  # clip(3) = 1; invalid: 0
  assert out.metrics["hsd_peers_found_frac"] == pytest.approx(0.75)
  assert METHODS["hsd_grpo"].variant_of == "hsd" and METHODS["hsd_grpo"].loss_terms == ()


def test_hsd_has_no_reward_term_and_distils_every_valid_rollout():
  """HSD as its paper trains: zero advantages whatever the rewards, the full-vocabulary KL on the action tokens of
  every rollout whose pass is valid (peer or gold-answer fallback), the teacher's hidden states passed through."""
  traj = _traj()
  hidden = np.random.default_rng(0).normal(size=(B, L, 5)).astype(np.float32)
  logp = np.where(traj.action_mask_BxL, traj.behavior_logp_BxL + 0.25, 0.0)
  traj.passes["teacher_peer_states"] = _teacher(
    traj, logp=logp, valid=[True, True, True, False], peer_B=np.asarray([-1, 0, 0, 0]), hidden_BxLxD=hidden
  )
  out = METHODS["hsd"].advantages(traj, _knobs("hsd"))
  assert not out.adv_BxL.any()
  arrays = out.input_arrays({"vocab_kl": VocabKLInput})
  np.testing.assert_array_equal(arrays["teacher_hidden"], hidden)
  want = traj.action_mask_BxL & np.asarray([True, True, True, False])[:, None] & traj.sample_mask_B[:, None]
  np.testing.assert_array_equal(arrays["vocab_kl_weight"], want.astype(np.float32))
  assert out.metrics["hsd_peers_found_frac"] == pytest.approx(0.75)
  gap = out.details["teacher_gap_BxL"]
  np.testing.assert_allclose(gap[want], 0.25, rtol=1e-6)  # the paper's diagnostic credit, for the viewer
  assert np.isnan(gap[~want]).all()
  assert METHODS["hsd"].loss_terms == ("vocab_kl", "reference_kl") and METHODS["hsd"].knobs["beta"] == 0.001


@pytest.mark.parametrize("name", ["gear", "gear_v0"])
def test_gear_with_zero_divergence_is_grpo(name):
  traj = _traj()
  traj.passes["teacher_divergence"] = _teacher(
    traj, divergence_BxL=np.zeros((B, L), np.float32), student_entropy_BxL=np.zeros((B, L), np.float32)
  )
  out = METHODS[name].advantages(traj, _knobs(name))
  _assert_seq(out.adv_BxL, traj, GRPO)
  assert out.metrics["gear_spikes_per_rollout"] == 0.0


def test_gear_weights_a_spike_by_the_sign_of_the_advantage():
  """The paper's reading (credit.gear_advantages): rollout 0 succeeded (A = 1.5), the others failed (A = -0.5).
  Each rollout's first action token diverges (d̂ = 1), the rest barely (d̂ = 0.002 < lambda_KL = 0.1). The spike's
  weight is 1 − 0.2 on the success and 1 + 0.2 on the failures; with an even entropy the segment runs over the turn."""
  traj = _traj()
  div = np.where(traj.action_mask_BxL, 0.01, 0.0).astype(np.float32)
  first = np.flatnonzero(traj.action_mask_BxL[0])[0]
  div[:, first] = 5.0
  ent = np.where(traj.action_mask_BxL, 1.0, 0.0).astype(np.float32)
  traj.passes["teacher_divergence"] = _teacher(traj, divergence_BxL=div, student_entropy_BxL=ent)
  out = METHODS["gear"].advantages(traj, _knobs("gear"))
  a = [out.adv_BxL[b][traj.action_mask_BxL[b]] for b in range(B)]
  np.testing.assert_allclose(a[0][:2], [1.5 * 0.8, 1.5 * 0.8], rtol=1e-5)  # the spike's turn: its segment
  np.testing.assert_allclose(a[1][:2], [-0.5 * 1.2, -0.5 * 1.2], rtol=1e-5)
  np.testing.assert_allclose(a[0][2:], 1.5 * (1 - 0.2 * 0.002), rtol=1e-5)  # the answer turn: own d̂
  assert out.metrics["gear_spikes_per_rollout"] == 1.0 and out.metrics["gear_segment_tokens_per_rollout"] == 2.0
  np.testing.assert_allclose(out.details["token_weight_BxL"][0][first], 0.8, rtol=1e-5)
  # The policy grows unsure right after the spike (entropy 2.0 > 1.5 · 1.0): the segment is the spike alone.
  ent[:, first + 1] = 2.0
  traj.passes["teacher_divergence"] = dataclasses.replace(traj.passes["teacher_divergence"], student_entropy_BxL=ent)
  out = METHODS["gear"].advantages(traj, _knobs("gear"))
  assert out.metrics["gear_segment_tokens_per_rollout"] == 1.0


def test_gear_v0_redistributes_toward_a_spike():
  traj = _traj()
  div = np.where(traj.action_mask_BxL, 0.01, 0.0).astype(np.float32)
  first = np.flatnonzero(traj.action_mask_BxL[0])[0]
  div[:, first] = 5.0
  low = np.zeros((B, L), np.float32)
  traj.passes["teacher_divergence"] = _teacher(traj, entropy=5.0, divergence_BxL=div, student_entropy_BxL=low)
  out = METHODS["gear_v0"].advantages(traj, _knobs("gear_v0", k_sigma=1.0))
  a0 = out.adv_BxL[0][traj.action_mask_BxL[0]]
  assert a0[0] > a0[1:].max() and a0.mean() == pytest.approx(1.5, abs=1e-5)
  assert out.metrics["gear_spikes_per_rollout"] == 1.0
  assert out.metrics["gear_segment_tokens_per_rollout"] == 1.0  # the policy is sure: the segment is the spike
  # An unsure policy (its entropy above the floor) extends the segment over the turn; the teacher's entropy
  # (5.0 above) never enters.
  traj.passes["teacher_divergence"] = dataclasses.replace(
    traj.passes["teacher_divergence"], student_entropy_BxL=np.where(traj.action_mask_BxL, 2.0, 0.0)
  )
  out = METHODS["gear_v0"].advantages(traj, _knobs("gear_v0", k_sigma=1.0))
  assert out.metrics["gear_segment_tokens_per_rollout"] == 2.0


def _sgcd_traj():
  """Group 0 mixed (rewards 1, 0), group 1 without a success (0, 0): only group 0 has a summary. The teacher departs
  from the student on rollout 0's first action token only (2 nats) and agrees with rollout 1 everywhere."""
  traj = _traj(rewards=(1.0, 0.0, 0.0, 0.0), group_ids=(0, 0, 1, 1))
  mixed = np.asarray([True, True, False, False])
  traj.passes["sibling_summary"] = SiblingSummaryOutput(
    summaries=["step 1 decided it", "step 1 decided it", "", ""],
    summary_tokens_B=np.asarray([5, 5, 0, 0], np.int32),
    siblings_Bx2=np.asarray([[0, 1], [0, 1], [-1, -1], [-1, -1]], np.int32),
    mixed_B=mixed,
    success_B=np.asarray([True, False, False, False]),
    valid_B=mixed,
    reasons=["", "", "not_mixed", "not_mixed"],
  )
  div = np.zeros((B, L), np.float32)
  div[0, np.flatnonzero(traj.action_mask_BxL[0])[0]] = 2.0
  traj.passes["teacher_sibling"] = _teacher(traj, entropy=0.0, valid=mixed, divergence_BxL=div)
  return traj


def test_sgcd_amplifies_grpo_and_skips_groups_without_both_outcomes():
  """The paper's weight (credit.sgcd_token_weights): rollout 0 has f = (2, 0, 0, 0, 0), so s = f / max f =
  (1, 0, 0, 0, 0) and W = clip(1 + s, 1, 2) = (2, 1, 1, 1, 1): the spike doubled, nothing shrunk. Rollout 1 (no
  divergence) and the unmixed group (no summary) keep W = 1: GRPO."""
  traj = _sgcd_traj()
  a0 = float(credit.grpo_advantages(np.asarray([1.0, 0.0]))[0])
  out = METHODS["sgcd"].advantages(traj, _knobs("sgcd"))
  _assert_seq(out.adv_BxL, traj, [[2 * a0] + [a0] * 4, -a0, 0.0, 0.0])
  np.testing.assert_array_equal(out.keep_B, [True, True, False, False])
  assert out.metrics["sgcd_groups_skipped"] == 1 and out.metrics["sgcd_mixed_groups"] == 1
  assert out.metrics["sgcd_weight_at_max_frac"] == pytest.approx(1.0 / 10)  # rollout 0's doubled token
  assert out.metrics["sgcd_weight_at_min_frac"] == pytest.approx(9.0 / 10)  # W = 1: the rest, never below
  assert out.metrics["sgcd_weight_mean"] == pytest.approx(1.1)
  w = out.details["credit_weight_BxL"]
  np.testing.assert_allclose(w[0][traj.action_mask_BxL[0]], [2.0, 1.0, 1.0, 1.0, 1.0])
  assert np.isnan(w[2]).all()


def test_sgcd_v0_reweights_grpo_within_bounds_and_skips_groups_without_both_outcomes():
  """This library's earlier reading (credit.sgcd_v0_token_weights): rollout 0: f = (2, 0, 0, 0, 0), f̄ = 0.4, so
  w = clip(1 + (f/f̄ − 1), 0.5, 2) = (2, 0.5, 0.5, 0.5, 0.5); rollout 1 (no divergence) and the unmixed group (no
  summary) keep w = 1: GRPO."""
  traj = _sgcd_traj()
  a0 = float(credit.grpo_advantages(np.asarray([1.0, 0.0]))[0])
  out = METHODS["sgcd_v0"].advantages(traj, _knobs("sgcd_v0", alpha=1.0))
  _assert_seq(out.adv_BxL, traj, [[2 * a0] + [0.5 * a0] * 4, -a0, 0.0, 0.0])
  np.testing.assert_array_equal(out.keep_B, [True, True, False, False])
  assert out.metrics["sgcd_groups_skipped"] == 1 and out.metrics["sgcd_mixed_groups"] == 1
  assert out.metrics["sgcd_weight_clipped_frac"] == pytest.approx(1.0 / 2)  # rollout 0's 5 tokens of the 10 scored
  assert out.metrics["sgcd_weight_at_min_frac"] == pytest.approx(4.0 / 10)  # its four halved tokens
  assert out.metrics["sgcd_weight_at_max_frac"] == pytest.approx(1.0 / 10)  # its doubled one
  assert out.metrics["sgcd_summary_tokens"] == 5.0
  w = out.details["credit_weight_BxL"]
  np.testing.assert_allclose(w[0][traj.action_mask_BxL[0]], [2.0, 0.5, 0.5, 0.5, 0.5])
  assert np.isnan(w[2]).all() and np.isnan(w[0][~traj.action_mask_BxL[0]]).all()
  # "keep": the unmixed group stays in the update, as GRPO (its advantages are 0: equal rewards).
  out = METHODS["sgcd_v0"].advantages(traj, _knobs("sgcd_v0", alpha=1.0, mixed_groups="keep"))
  assert out.keep_B is None and out.metrics["sgcd_groups_skipped"] == 0
  _assert_seq(out.adv_BxL, traj, [[2 * a0] + [0.5 * a0] * 4, -a0, 0.0, 0.0])


@pytest.mark.parametrize(
  "name,key,value,message",
  [
    ("sgcd", "mixed_groups", "drop", "config.credit.sgcd.mixed_groups = 'drop': must be one of ('skip', 'keep')"),
    ("sgcd", "c", 0.5, "config.credit.sgcd.c = 0.5: must be >= 1.0"),
    ("sgcd", "gamma", -1.0, "config.credit.sgcd.gamma = -1.0: must be >= 0.0"),
    ("sgcd", "salience", "mean", "config.credit.sgcd.salience = 'mean': must be one of ('max', 'excess')"),
    ("sgcd_v0", "w_min", 0.0, "config.credit.sgcd_v0.w_min = 0.0: must be > 0.0"),
    ("sgcd_v0", "w_max", 0.5, "config.credit.sgcd_v0.w_max = 0.5: must be >= 1.0"),
    (
      "sgcd",
      "summary_max_tokens",
      288,
      "config.credit.sgcd.summary_max_tokens = 288: must be in [1, sampling.max_len = 288)",
    ),
    (
      "sgcd_v0",
      "summary_template",
      "Task: {question}",
      "config.credit.sgcd_v0.summary_template = 'Task: {question}': may use only",
    ),
  ],
)
def test_sgcd_knobs_are_refused_by_config_key(name, key, value, message):
  from jaxcredit.train.config import validate

  c = base_config()
  c.credit.method = name
  c.credit[name][key] = value
  with pytest.raises(ValueError) as info:
    validate(c)
  assert str(info.value).startswith(message)


def test_opd_is_teacher_minus_policy_and_zero_on_invalid():
  traj = _traj()
  logp = np.where(traj.action_mask_BxL, traj.behavior_logp_BxL - 0.25, 0.0)
  traj.passes["teacher_plain"] = _teacher(traj, logp=logp, valid=[True, False, True, True])
  out = METHODS["opd"].advantages(traj, _knobs("opd"))
  _assert_seq(out.adv_BxL, traj, [-0.25, 0.0, -0.25, -0.25])
  assert out.metrics["teacher_policy_gap"] == pytest.approx(-0.25, abs=1e-6)


def test_gigpo_state_ids_and_omega_zero_is_grpo():
  traj = _traj()
  ids = gigpo_state_ids(traj, "observation")
  assert np.all(ids[:, 0] == ids[0, 0])  # turn 0: the shared prompt
  assert np.all(ids[:, 1] == ids[0, 1]) and ids[0, 1] != ids[0, 0]  # same observation [4, 5] after turn 0
  assert np.all(ids[:, 2] == -1)
  hist = gigpo_state_ids(traj, "history")
  assert len(set(hist[:, 1].tolist())) == 4  # histories differ by each rollout's first action
  out = METHODS["gigpo"].advantages(traj, _knobs("gigpo", omega=0.0))
  _assert_seq(out.adv_BxL, traj, GRPO)
  out = METHODS["gigpo"].advantages(traj, _knobs("gigpo"))
  expect = credit.gigpo_advantages(traj.rewards_B, ids, traj.turn_mask_BxT, traj.sample_mask_B, gamma=0.95, omega=1.0)
  np.testing.assert_allclose(out.turn_adv_BxT, expect, atol=1e-6)


def test_every_method_row_is_complete():
  for name, m in METHODS.items():
    assert callable(m.advantages) and m.summary, name
    assert isinstance(m.knobs, dict) and all(isinstance(p, str) for p in m.passes), name


@pytest.mark.parametrize("name", ["gigpo", "trace", "crest"])
def test_every_step_of_a_turn_level_method_carries_its_own_advantage(name):
  """A public report (SkyRL PR #1507): in step-wise training most step samples silently got advantage 0. Here a group
  with an outcome contrast gives every action token of every turn of every rollout a nonzero advantage, per turn,
  with each method's own passes filled (TRACE: a gold answer whose log-prob changes at the boundary; CrEST: a teacher
  equal to the policy, so only its unit advantages act, units = turns with their own verdicts)."""
  traj = _traj(rewards=(1.0, 0.0, 1.0, 0.0))
  if name == "trace":
    gold = np.tile(np.asarray([[-5.0, -3.0, 0.0, 0.0]], np.float32), (4, 1))
    traj.passes["gold_answer"] = _gold(traj, gold)
  if name == "crest":
    traj.passes["teacher_privileged"] = _teacher(traj)
  out = METHODS[name].advantages(traj, _knobs(name))
  act = traj.action_mask_BxL & traj.sample_mask_B[:, None]
  assert act.sum() == 4 * 5
  assert np.all(out.adv_BxL[act] != 0.0), out.adv_BxL
  for b in range(4):  # each turn's tokens share their turn's value (turn-level credit)
    for t in (0, 1):
      values = out.adv_BxL[b][traj.turn_ids_BxL[b] == t]
      assert np.all(values == values[0])


def test_the_steps_credit_diagnostics():
  """contrast_group_frac, nonzero_adv_token_frac and dense_adv_share (issue 51's why-numbers) on two groups of two:
  one tied (both fail), one with a success and a failure."""
  from jaxcredit.train.loop.rl_step import credit_diagnostics

  traj = _traj(rewards=(0.0, 0.0, 1.0, 0.0), group_ids=(0, 0, 1, 1))
  success = np.asarray([False, False, True, False])
  grpo = METHODS["grpo"].advantages(traj, _knobs("grpo")).adv_BxL
  d = credit_diagnostics(traj, grpo, success)
  assert d == {
    "contrast_group_frac": 0.5,
    "outcome_contrast_group_frac": 0.5,
    "nonzero_adv_token_frac": 0.5,
    "dense_adv_share": 0.0,
  }
  act = traj.action_mask_BxL
  dense = np.where(act, 0.25, 0.0)  # a dense term of 0.25 on every action token, the tied group's included
  d = credit_diagnostics(traj, grpo + dense, success)
  assert d["nonzero_adv_token_frac"] == 1.0
  # |A_grpo| = 0.5 / (the sample std 1/√2) = 1/√2 on the 10 tokens of group 1, 0 on group 0; the dense 0.25 on all 20.
  assert d["dense_adv_share"] == pytest.approx(0.25 * 20 / (10 / np.sqrt(2) + 0.25 * 20), rel=1e-5)
  # A shaped reward (the chain's progress): every group's rewards differ, but only group 1 holds a success
  shaped = _traj(rewards=(0.25, 0.5, 1.0, 0.75), group_ids=(0, 0, 1, 1))
  d = credit_diagnostics(shaped, METHODS["grpo"].advantages(shaped, _knobs("grpo")).adv_BxL, success)
  assert d["contrast_group_frac"] == 1.0 and d["outcome_contrast_group_frac"] == 0.5
  with pytest.raises(ValueError, match="success_B"):
    credit_diagnostics(traj, grpo, success[:3])


def test_a_method_reusing_a_pass_gets_its_knobs_and_a_node_without_one_is_refused_naming_the_pass(monkeypatch):
  """Pass knobs live on the pass row: a new method that runs the peer pass has `fallback` and `success_threshold` in
  its config node without declaring them, its values are checked by the pass's choices, and a node that lacks one
  (a row registered after the config was built, its node written by hand) is refused by `validate`, naming the knob
  and the pass, instead of a KeyError at the first RL step."""
  from jaxcredit.train.config import validate
  from jaxcredit.train.tables.methods import Method, MethodOutput
  from jaxcredit.train.tables.passes import PASSES

  def peer_gap(traj, knobs):
    return MethodOutput(np.zeros(traj.tokens_BxL.shape, np.float32))

  monkeypatch.setitem(
    METHODS, "peer_gap", Method(peer_gap, {"margin": 0.1}, ("teacher_peer",), summary="a method reusing a pass")
  )
  c = base_config()
  c.credit.method = "peer_gap"
  assert dict(c.credit.peer_gap) == {"success_threshold": 0.5, "fallback": "gold", "margin": 0.1}
  assert PASSES["teacher_peer"].knobs == {"success_threshold": 0.5, "fallback": "gold"}
  validate(c)
  c.credit.peer_gap.fallback = "nothing"
  with pytest.raises(
    ValueError, match=r"config.credit.peer_gap.fallback = 'nothing': must be one of \('gold', 'skip'\)"
  ):
    validate(c)
  c.credit.peer_gap.fallback = "gold"
  c.credit.peer_gap.success_threshold = float("nan")
  with pytest.raises(ValueError, match="config.credit.peer_gap.success_threshold = nan"):
    validate(c)
  import ml_collections

  c.credit.peer_gap = ml_collections.ConfigDict({"margin": 0.1, "success_threshold": 0.5})  # written by hand
  with pytest.raises(
    ValueError,
    match=r"config.credit.peer_gap.fallback is missing: it is a knob of its pass "
    r"'teacher_peer' \(default 'gold'\)",
  ):
    validate(c)
  # A method's own row may set its default for a pass's knob (CrEST's per-unit context is the pass's default).
  monkeypatch.setitem(METHODS, "peer_skip", Method(peer_gap, {"fallback": "skip"}, ("teacher_peer",), summary="x"))
  assert base_config().credit.peer_skip.fallback == "skip"


@pytest.mark.parametrize(
  "method,key,value,message",
  [
    ("toolopd", "distill_coef", -0.1, "config.credit.toolopd.distill_coef = -0.1: the 'distill' loss term's weight"),
    ("hsd_grpo", "dense_coef", -0.5, "config.credit.hsd_grpo.dense_coef = -0.5: must be a finite number >= 0"),
    ("hsd_grpo", "dense_coef", float("inf"), "config.credit.hsd_grpo.dense_coef = inf: must be a finite number"),
  ],
)
def test_a_weight_knob_is_checked_by_its_own_row_not_by_name_in_the_config_module(method, key, value, message):
  """ToolOPD's distill_coef as its loss term's weight (the check every declared term's knob gets), hsd_grpo's
  dense_coef by hsd_grpo's own row: config.py names neither."""
  from jaxcredit.train.config import validate

  c = base_config()
  c.credit.method = method
  c.credit[method][key] = value
  with pytest.raises(ValueError) as info:
    validate(c)
  assert str(info.value).startswith(message)
