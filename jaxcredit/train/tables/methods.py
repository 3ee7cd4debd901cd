"""`METHODS`: every credit method the trainer can run, as one table.

    method = METHODS[config.credit.method]
    traj.passes[name] = PASSES[name](...) for name in method.passes     # jaxcredit.train.tables.passes
    out = method.advantages(traj, config.credit[config.credit.method])  # -> MethodOutput
    loss = PPO-clip(out.adv_BxL) + Σ the method's loss terms             # jaxcredit.train.loop.step

A method is a `Method` record: the passes it needs (it reads their outputs as their declared classes,
`pass_outputs.read_output`; `config.validate` runs it on stand-ins of them), a function from (trajectory with pass
outputs, its knobs) to
token advantages, the knobs' defaults (they become `config.credit.<name>.*`, with the credit functions' own
argument names) and the extra loss terms it adds. Adding a method is one function and one row; the trainer never
names a method.

Group functions of `jaxcredit.credit` are applied per group (`jaxcredit.trajectory.group_index`, so the batch
need not be group-major), per-rollout functions over the whole batch; both jitted with the knobs static.

Shape letters: B rollouts, P groups, G rollouts per group, L tokens, T turns, U verified units.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any, Callable, Mapping

import jax
import numpy as np

from jaxcredit import credit
from jaxcredit.train.tables.pass_outputs import (
  DivergenceOutput,
  GoldAnswerOutput,
  PeerStatesOutput,
  PeerTeacherOutput,
  SiblingSummaryOutput,
  SkillOutput,
  TeacherOutput,
  read_output,
)
from jaxcredit.trajectory import DistillInput, LossInput, Trajectory, VocabKLInput, group_index


@dataclasses.dataclass
class MethodOutput:
  """What a method's advantage function returns (numpy, host side).

  Attributes:
    adv_BxL: float32 token advantages, 0 off action tokens and on invalid rollouts.
    turn_adv_BxT: float32 per-turn advantages where the method has them (for metrics), else None.
    metrics: scalars for metrics.jsonl (method-specific: gate-open fraction, spikes per rollout, ...).
    details: per-rollout intermediate values for the credit viewer and the rollout samples (`jaxcredit viz`),
      numpy arrays with leading axis B named by their shape suffix (`*_BxL` per token, `*_BxT` per turn, `*_BxT1`
      per boundary state): TRACE's state values and TD rewards, CrEST's direction gate and token factors, GEAR's
      segments, ToolOPD's distillation weights, ... Never read by the loss.
    keep_B: bool, the rollouts the update trains on, or None: all of them. A method that filters groups (SGCD's
      dynamic sampling drops groups without both outcomes) sets False on the rollouts it drops; the trainer takes
      them out of the loss and its token counts, as it does rollouts without action tokens.
    loss_inputs: {loss term: its typed input} for each loss term the method declares (`Method.loss_terms`) that
      reads arrays of the method (`LossTerm.input`, a `jaxcredit.trajectory.LossInput`: ToolOPD's `DistillInput`,
      HSD's `VocabKLInput`); their fields join the update batch (packed with the rest, read at the scored slots).
  """

  adv_BxL: np.ndarray
  turn_adv_BxT: np.ndarray | None = None
  metrics: dict = dataclasses.field(default_factory=dict)
  details: dict = dataclasses.field(default_factory=dict)
  keep_B: np.ndarray | None = None
  loss_inputs: Mapping[str, LossInput] = dataclasses.field(default_factory=dict)

  def input_arrays(self, inputs: Mapping[str, type[LossInput]]) -> dict[str, np.ndarray]:
    """The update-batch arrays of the method's declared loss-term inputs (`UpdateBatch.inputs_NxK`), by batch key
    (`LossInput.batch_keys`).

    Args:
      inputs: {loss term: its input class} for the method's declared terms that read one (`step.term_inputs`).

    Raises:
      ValueError: a declared term whose input is missing or of another class, an input for a term the method does
        not declare, or an input field of a shape other than the advantages' [B, L] (naming term, class, field).
    """
    out: dict[str, np.ndarray] = {}
    for term, cls in inputs.items():
      given = self.loss_inputs.get(term)
      if not isinstance(given, cls):
        raise ValueError(
          f"loss term {term!r} reads a {cls.__name__} (fields {list(cls.keys())}), and MethodOutput.loss_inputs"
          f"[{term!r}] is {'missing' if given is None else type(given).__name__}"
        )
      out.update(given.batch_arrays(np.shape(self.adv_BxL), term=term))
    undeclared = sorted(set(self.loss_inputs) - set(inputs))
    if undeclared:
      raise ValueError(
        f"MethodOutput.loss_inputs holds {undeclared}: loss terms the method does not declare (Method.loss_terms) "
        "or that read no input of the method"
      )
    return out


@dataclasses.dataclass(frozen=True)
class Method:
  """One row of `METHODS`.

  Attributes:
    advantages: (trajectory with `passes` filled, knobs mapping) -> `MethodOutput`.
    knobs: the method's own knobs with their defaults; its config node `config.credit.<name>` holds these and the
      knobs of its passes (`Pass.knobs`; `method_checks.method_knobs`). A key here that a pass declares too sets
      this method's default for it.
    passes: names in `jaxcredit.train.tables.passes.PASSES` to run before `advantages`, in order; `advantages` reads their
      outputs as their rows' classes (`pass_outputs.read_output(traj, name, TeacherOutput)`), and `config.validate`
      runs it on stand-ins of exactly those (`method_checks.check_knobs`).
    loss_terms: extra loss terms in `jaxcredit.train.loop.step.LOSS_TERMS` ("distill"); the PPO-clip term is always
      there and the KL term when `config.loss.kl_coef > 0`.
    teacher: the default `config.teacher.source` of its teacher passes ("policy", "reference", "" when it needs a
      checkpoint that the config must name), or None when it runs no teacher pass (then `teacher.source` must be
      empty: a teacher it would never use is refused rather than loaded).
    min_group_size: the smallest `config.rollout.group_size` it can use (2 for a group baseline).
    summary: one line for `docs` and errors.
    validate: (knobs, config) -> None, the row's own checks of the knobs its credit functions do not read (its
      filter's; its passes check theirs, `Pass.validate`), run by `config.validate` before `check_knobs`; raises
      ValueError naming `config.credit.<name>.<knob>`. None: the credit functions' checks are all.
    variant_of: "" for a method of its own; the name of the row whose earlier or alternative reading this row keeps
      (`gear_v0` of `gear`, `hsd_grpo` of `hsd`): it differs in its credit function, its knobs or (hsd_grpo) the
      pass outputs and loss terms it needs.
  """

  advantages: Callable[[Trajectory, Mapping[str, Any]], MethodOutput]
  knobs: dict
  passes: tuple[str, ...] = ()
  loss_terms: tuple[str, ...] = ()
  teacher: str | None = "policy"
  min_group_size: int = 2
  summary: str = ""
  validate: Callable[[Mapping[str, Any], Any], None] | None = None
  variant_of: str = ""

  def __post_init__(self):
    object.__setattr__(self, "passes", tuple(self.passes))
    object.__setattr__(self, "loss_terms", tuple(self.loss_terms))


# ---------------------------------------------------------------------------------------------------------------
# Batching helpers.


@functools.lru_cache(maxsize=None)
def _jit_vmap(fn: Callable, knobs: tuple) -> Callable:
  return jax.jit(jax.vmap(functools.partial(fn, **dict(knobs))))


def per_group(fn: Callable, knobs: Mapping[str, Any], traj: Trajectory, *arrays_B) -> np.ndarray:
  """fn(*[G, ...] arrays, **knobs) applied to every group, results scattered back to batch order: [B, ...]."""
  idx_PxG = group_index(traj.group_ids_B)
  out = np.asarray(_jit_vmap(fn, tuple(sorted(knobs.items())))(*[np.asarray(a)[idx_PxG] for a in arrays_B]))
  res = np.zeros((traj.batch_size,) + out.shape[2:], out.dtype)
  res[idx_PxG.ravel()] = out.reshape((-1,) + out.shape[2:])
  return res


def per_rollout(fn: Callable, knobs: Mapping[str, Any], *arrays_B) -> np.ndarray:
  """fn(*[...] arrays of one rollout, **knobs) vmapped over the batch: [B, ...]."""
  return np.asarray(_jit_vmap(fn, tuple(sorted(knobs.items())))(*[np.asarray(a) for a in arrays_B]))


def _pick(knobs: Mapping[str, Any], *names: str) -> dict:
  return {n: knobs[n] for n in names}


def _on_actions(seq_B: np.ndarray, traj: Trajectory) -> np.ndarray:
  return (seq_B[:, None] * traj.action_mask_BxL).astype(np.float32)


def _turns(values_BxT: np.ndarray, traj: Trajectory) -> np.ndarray:
  return per_rollout(credit.turn_to_token, {}, values_BxT, traj.turn_ids_BxL, traj.action_mask_BxL)


def _outcome(traj: Trajectory, scale: str, eps: float) -> np.ndarray:
  return per_group(credit.grpo_advantages, {"scale": scale, "eps": eps}, traj, traj.rewards_B, traj.sample_mask_B)


def outcome_advantages(traj: Trajectory) -> np.ndarray:
  """[B] GRPO's group-normalised outcome advantage of each rollout (`credit.grpo_advantages`, the defaults): the
  reference the step's diagnostics measure a method's dense share against."""
  return _outcome(traj, _OUTCOME["scale"], _OUTCOME["eps"])


def _action_mean(x_BxL: np.ndarray, mask_BxL: np.ndarray) -> float:
  return float(x_BxL[mask_BxL].mean()) if mask_BxL.any() else 0.0


def pass_valid(traj: Trajectory, output) -> np.ndarray:
  """valid_B of a pass's output, and-ed with the sample mask."""
  return np.asarray(output.valid_B, bool) & traj.sample_mask_B


def _teacher_gap(traj: Trajectory, teacher: TeacherOutput) -> float | None:
  """Mean teacher - policy log-prob of the sampled tokens over the pass's valid rollouts (nats); None (not logged)
  when the pass dropped every rollout."""
  m = traj.action_mask_BxL & pass_valid(traj, teacher)[:, None]
  return _action_mean(teacher.logp_BxL - traj.behavior_logp_BxL, m) if m.any() else None


# ---------------------------------------------------------------------------------------------------------------
# Outcome baselines.


def grpo(traj: Trajectory, k: Mapping[str, Any]) -> MethodOutput:
  """GRPO: the group-normalised outcome on every action token (credit.grpo_advantages)."""
  seq = _outcome(traj, k["scale"], k["eps"])
  return MethodOutput(_on_actions(seq, traj), seq[:, None] * traj.turn_mask_BxT)


def drgrpo(traj: Trajectory, k: Mapping[str, Any]) -> MethodOutput:
  """Dr.GRPO: the outcome minus the group mean, no std normalisation (credit.grpo_advantages, scale="none")."""
  seq = _outcome(traj, "none", k["eps"])
  return MethodOutput(_on_actions(seq, traj), seq[:, None] * traj.turn_mask_BxT)


def rloo(traj: Trajectory, k: Mapping[str, Any]) -> MethodOutput:
  """RLOO: leave-one-out baseline (credit.rloo_advantages)."""
  seq = per_group(credit.rloo_advantages, {}, traj, traj.rewards_B, traj.sample_mask_B)
  return MethodOutput(_on_actions(seq, traj), seq[:, None] * traj.turn_mask_BxT)


def _hash32(ids: np.ndarray) -> int:
  return (
    int.from_bytes(hashlib.blake2b(np.ascontiguousarray(ids, np.int32).tobytes(), digest_size=4).digest(), "little")
    & 0x7FFFFFFF
  )


def gigpo_state_ids(traj: Trajectory, state_key: str) -> np.ndarray:
  """state_ids_BxT int32 for GiGPO: a 31-bit hash of the tokens that define the state turn t is taken in.

  "observation": the context tokens right before turn t (turn 0: the prompt, shared by the group; turn t >= 1:
  the tool observation and scaffolding since turn t-1's last action token). "history": every token before turn t.
  -1 where turn t does not exist. Hashes are of token ids, so equal text tokenized alike gives equal ids.

  Raises:
    ValueError: for an unknown `state_key`.
  """
  if state_key not in ("observation", "history"):
    raise ValueError(f"config.credit.gigpo.state_key must be 'observation' or 'history', got {state_key!r}")
  b, t = traj.turn_mask_BxT.shape
  out = np.full((b, t), -1, np.int32)
  for i in range(b):
    ids = traj.turn_ids_BxL[i]
    prev_end = 0
    for turn in range(t):
      if not traj.turn_mask_BxT[i, turn]:
        continue
      pos = np.flatnonzero(ids == turn)
      if pos.size == 0:
        continue
      start = int(pos[0])
      lo = 0 if (state_key == "history" or turn == 0) else prev_end
      out[i, turn] = _hash32(traj.tokens_BxL[i, lo:start])
      prev_end = int(pos[-1]) + 1
  return out


def gigpo(traj: Trajectory, k: Mapping[str, Any]) -> MethodOutput:
  """GiGPO: episode advantage plus a step advantage among turns taken in the same state (credit.gigpo_advantages)."""
  state_ids = gigpo_state_ids(traj, k["state_key"])
  turn = per_group(
    credit.gigpo_advantages,
    _pick(k, "gamma", "omega", "scale", "eps"),
    traj,
    traj.rewards_B,
    state_ids,
    traj.turn_mask_BxT,
    traj.sample_mask_B,
  )
  real = state_ids[traj.turn_mask_BxT]
  return MethodOutput(
    _turns(turn, traj),
    turn,
    metrics={"gigpo_states_per_rollout": float(len(set(real.tolist()))) / max(traj.batch_size, 1)},
    details={"state_id_BxT": np.where(traj.turn_mask_BxT, state_ids % 100003, -1)},  # short ids to tell states apart
  )


# ---------------------------------------------------------------------------------------------------------------
# Dense methods.


_TRACE_VALUE = ("gap_eps", "value")
_TRACE_TURN = _TRACE_VALUE + ("td_horizon", "td_gamma", "terminal_scale")


def trace(traj: Trajectory, k: Mapping[str, Any]) -> MethodOutput:
  """TRACE (arXiv 2607.13988): the outcome advantage plus alpha_turn times the K-step TD turn credit of the frozen
  reference's log-ratio state values of the gold answer, with a terminal fill (credit.trace_advantages)."""
  gold = read_output(traj, "gold_answer", GoldAnswerOutput)
  gold_T1, bmask_T1 = gold.gold_logp_BxT1, gold.boundary_mask_BxT1
  turn = per_group(
    credit.trace_advantages,
    _pick(k, "alpha_out", "alpha_turn", "std", "dense_norm", "eps", *_TRACE_TURN),
    traj,
    traj.rewards_B,
    gold_T1,
    bmask_T1,
    traj.turn_mask_BxT,
    traj.sample_mask_B,
  )
  # The turn credit r before mixing, for the viewer, with the same A_out: alpha_turn = 0 leaves A_out on every turn.
  all_turns = np.ones(traj.turn_mask_BxT.shape, bool)
  out_knobs = dict(_pick(k, "std", "eps"), alpha_turn=0.0)
  a_out = per_group(
    credit.trace_advantages, out_knobs, traj, traj.rewards_B, gold_T1, bmask_T1, all_turns, traj.sample_mask_B
  )
  a_out = a_out[:, 0] if a_out.shape[1] else np.zeros(traj.batch_size, np.float32)
  td = per_rollout(credit.trace_td_rewards, _pick(k, *_TRACE_VALUE), gold_T1, bmask_T1)
  turn_reward = per_rollout(credit.trace_turn_rewards, _pick(k, *_TRACE_TURN), gold_T1, bmask_T1, a_out)
  value = per_rollout(credit.trace_state_values, _pick(k, *_TRACE_VALUE), gold_T1, bmask_T1)
  ok = np.asarray(bmask_T1, bool) & np.isfinite(np.asarray(gold_T1, np.float64))
  tm = traj.turn_mask_BxT
  return MethodOutput(
    _turns(turn, traj),
    turn,
    metrics={
      "td_reward_abs_mean": float(np.abs(td[tm]).mean()) if tm.any() else 0.0,
      "turn_reward_abs_mean": float(np.abs(turn_reward[tm]).mean()) if tm.any() else 0.0,
      "gold_boundaries": int(np.asarray(bmask_T1).sum()),
    },
    details={
      "state_value_BxT1": np.where(ok & ok[:, :1], value, np.nan),
      "td_reward_BxT": np.where(tm, td, np.nan),
      "turn_reward_BxT": np.where(tm, turn_reward, np.nan),
    },
  )


def _teacher_or_nan(traj: Trajectory, output, x_BxL: np.ndarray) -> np.ndarray:
  """A pass's per-token array with NaN on the pass's invalid rollouts (the credit functions then skip them, never
  read 0)."""
  return np.where(pass_valid(traj, output)[:, None], x_BxL, np.nan).astype(np.float32)


def crest(traj: Trajectory, k: Mapping[str, Any]) -> MethodOutput:
  """CrEST: per-unit verified advantages times the fixed teacher's bounded token factor (the teacher only amplifies
  tokens it agrees on, by at most lam · clip_eps; credit.crest_token_weights). The teacher is the `teacher_privileged`
  pass: by default the frozen reference, each unit shown the ground truth of the units before it."""
  unit_adv = per_group(
    credit.crest_turn_advantages,
    _pick(k, "scale", "eps"),
    traj,
    traj.unit_rewards_BxU,
    traj.unit_mask_BxU,
    traj.sample_mask_B,
  )
  teacher = read_output(traj, "teacher_privileged", TeacherOutput)
  teacher_logp = _teacher_or_nan(traj, teacher, teacher.logp_BxL)
  policy_logp = np.asarray(traj.behavior_logp_BxL, np.float32)
  w = per_rollout(
    credit.crest_token_weights,
    _pick(k, "lam", "clip_eps", "tau", "rho", "direction_gate"),
    unit_adv,
    traj.unit_ids_BxL,
    traj.action_mask_BxL,
    teacher_logp,
    policy_logp,
  )
  unit_tok = per_rollout(credit.turn_to_token, {}, unit_adv, traj.unit_ids_BxL, traj.action_mask_BxL)
  adv = unit_tok * w
  act = traj.action_mask_BxL & pass_valid(traj, teacher)[:, None]
  # The direction gate of Eq. 7 as crest_token_weights computes it: sign(A_u) · Δ_i > 0 on finite log-probs.
  finite = np.isfinite(teacher_logp) & np.isfinite(policy_logp)
  with np.errstate(invalid="ignore"):
    signed = np.sign(unit_tok) * ((teacher_logp - policy_logp) / np.float32(k["tau"]))
  gate = act & finite & ((signed > 0) if k["direction_gate"] else True)
  return MethodOutput(
    adv.astype(np.float32),
    metrics={
      "teacher_policy_gap": _teacher_gap(traj, teacher),
      "crest_direction_gate_frac": _action_mean(gate.astype(np.float32), act),
      "crest_weight_std": float(w[act].std()) if act.any() else 0.0,
    },
    details={
      "direction_gate_BxL": gate,
      "token_weight_BxL": np.where(act, w, np.nan),
    },
  )


def toolopd(traj: Trajectory, k: Mapping[str, Any]) -> MethodOutput:
  """ToolOPD: GRPO plus a distillation term toward the skilled teacher, weighted by outcome-aware hindsight credit."""
  seq = _outcome(traj, k["scale"], k["eps"])
  skilled = read_output(traj, "teacher_skill", TeacherOutput)
  plain = read_output(traj, "teacher_plain", TeacherOutput)
  skills = read_output(traj, "hindsight_skill", SkillOutput)
  valid = pass_valid(traj, skilled) & pass_valid(traj, plain)
  skill, base, success = skilled.logp_BxL, plain.logp_BxL, skills.success_B
  w = per_rollout(
    credit.toolopd_token_weights, _pick(k, "max_credit", "normalize"), skill, base, success, traj.action_mask_BxL
  )
  w = np.where(valid[:, None], w, 0.0).astype(np.float32)
  act = traj.action_mask_BxL & valid[:, None]
  return MethodOutput(
    _on_actions(seq, traj),
    seq[:, None] * traj.turn_mask_BxT,
    loss_inputs={"distill": DistillInput(w, np.asarray(skill, np.float32))},
    metrics={
      "teacher_policy_gap": _teacher_gap(traj, skilled),
      "toolopd_credited_frac": _action_mean((w > 0).astype(np.float32), act),
      "toolopd_skill_tokens": float(np.mean(skills.skill_tokens_B)),
    },
    details={
      "distill_weight_BxL": np.where(act, w, np.nan),
      "skill_logp_gain_BxL": np.where(act, skill - base, np.nan),
    },
  )


def hsd(traj: Trajectory, k: Mapping[str, Any]) -> MethodOutput:
  """HSD as its paper trains (arXiv 2606.15576, from its summaries; docs/methods/hsd.md): no outcome advantage (the
  verifier only picks the peers); the loss is the full-vocabulary KL(teacher || student) to the peer-conditioned
  self-teacher at every action token of a rollout whose pass is valid (loss term "vocab_kl", reading the pass's
  hidden states), plus beta KL to the reference ("reference_kl"). The paper's diagnostic credit, the teacher's minus
  the policy's log-prob of the sampled token, is shown in the viewer."""
  teacher = read_output(traj, "teacher_peer_states", PeerStatesOutput)
  valid = pass_valid(traj, teacher)
  act = traj.action_mask_BxL & valid[:, None]
  gap = np.where(act, teacher.logp_BxL - traj.behavior_logp_BxL, np.nan)
  return MethodOutput(
    np.zeros(traj.action_mask_BxL.shape, np.float32),
    loss_inputs={"vocab_kl": VocabKLInput(np.asarray(teacher.hidden_BxLxD, np.float32), act.astype(np.float32))},
    metrics={
      "teacher_policy_gap": _teacher_gap(traj, teacher),
      "hsd_peers_found_frac": float(np.mean(np.asarray(teacher.peer_B) >= 0)),
      "hsd_distilled_frac": float(np.mean(valid)),
    },
    details={"teacher_gap_BxL": gap.astype(np.float32)},
  )


def hsd_grpo(traj: Trajectory, k: Mapping[str, Any]) -> MethodOutput:
  """HSD, this library's earlier reading: GRPO plus dense_coef * the clipped log-ratio of the peer-conditioned
  self-teacher to the policy (credit.hsd_token_advantages)."""
  seq = _outcome(traj, k["scale"], k["eps"])
  teacher = read_output(traj, "teacher_peer", PeerTeacherOutput)
  a = per_rollout(
    credit.hsd_token_advantages,
    _pick(k, "clip"),
    _teacher_or_nan(traj, teacher, teacher.logp_BxL),
    traj.behavior_logp_BxL,
    traj.action_mask_BxL,
  )
  adv = _on_actions(seq, traj) + k["dense_coef"] * a
  return MethodOutput(
    adv.astype(np.float32),
    seq[:, None] * traj.turn_mask_BxT,
    metrics={
      "teacher_policy_gap": _teacher_gap(traj, teacher),
      "hsd_peers_found_frac": float(np.mean(np.asarray(teacher.peer_B) >= 0)),
    },
    details={"dense_advantage_BxL": np.where(traj.action_mask_BxL, k["dense_coef"] * a, np.nan)},
  )


def _gear_features(traj: Trajectory) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(valid_B, divergence_BxL, student entropy_BxL) of the teacher_divergence pass: an invalid pass reads as
  divergence 0 everywhere, so GEAR equals GRPO for that rollout (docs/methods/gear.md). The segments follow the
  policy's own entropy (the student's)."""
  teacher = read_output(traj, "teacher_divergence", DivergenceOutput)
  valid = pass_valid(traj, teacher)
  div = np.where(valid[:, None], teacher.divergence_BxL, 0.0).astype(np.float32)
  return valid, div, np.asarray(teacher.student_entropy_BxL, np.float32)


def _gear_output(traj, seq, adv, seg_start, div, valid, details) -> MethodOutput:
  spikes = (seg_start == np.arange(seg_start.shape[1])[None, :]).sum(axis=1)
  in_seg = (seg_start >= 0).sum(axis=1)
  return MethodOutput(
    adv.astype(np.float32),
    seq[:, None] * traj.turn_mask_BxT,
    metrics={
      "gear_spikes_per_rollout": float(spikes.mean()),
      "gear_segment_tokens_per_rollout": float(in_seg.mean()),
      "gear_divergence_mean": _action_mean(div, traj.action_mask_BxL & valid[:, None]),
    },
    details=dict(details, segment_start_BxL=seg_start, divergence_BxL=np.where(traj.action_mask_BxL, div, np.nan)),
  )


def gear(traj: Trajectory, k: Mapping[str, Any]) -> MethodOutput:
  """GEAR (arXiv 2605.11853, from its summaries and captions): the GRPO advantage times a sign-aware weight of the
  normalised divergence from the ground-truth-conditioned self-teacher; segments open at d̂ > lambda_kl and end where
  the entropy exceeds lambda_h times the onset's (credit.gear_advantages, credit.gear_segments)."""
  seq = _outcome(traj, k["scale"], k["eps"])
  valid, div, ent = _gear_features(traj)
  seg_knobs = _pick(k, "lambda_kl", "lambda_h", "min_divergence")
  adv = per_rollout(credit.gear_advantages, dict(seg_knobs, alpha=k["alpha"]), seq, div, ent, traj.action_mask_BxL)
  seg_start = per_rollout(credit.gear_segments, seg_knobs, div, ent, traj.action_mask_BxL)
  on = traj.action_mask_BxL & (seq[:, None] != 0)
  with np.errstate(invalid="ignore", divide="ignore"):
    weight = np.where(on, adv / seq[:, None], np.nan)
  return _gear_output(traj, seq, adv, seg_start, div, valid, {"token_weight_BxL": weight})


def gear_v0(traj: Trajectory, k: Mapping[str, Any]) -> MethodOutput:
  """GEAR v0, this library's earlier reading: the GRPO advantage redistributed over divergence-anchored segments
  (mean + k_sigma std spikes, 1 + alpha tanh weights normalised to mean 1, not sign-aware;
  credit.gear_v0_advantages)."""
  seq = _outcome(traj, k["scale"], k["eps"])
  valid, div, ent = _gear_features(traj)
  seg_knobs = _pick(k, "k_sigma", "tau_low", "entropy_floor", "eps")
  adv = per_rollout(
    credit.gear_v0_advantages,
    dict(seg_knobs, alpha=k["alpha"], normalize=k["normalize"]),
    seq,
    div,
    ent,
    traj.action_mask_BxL,
  )
  seg_start = per_rollout(credit.gear_v0_segments, seg_knobs, div, ent, traj.action_mask_BxL)
  return _gear_output(traj, seq, adv, seg_start, div, valid, {})


SGCD_MIXED_GROUPS = ("skip", "keep")


def _sgcd(traj: Trajectory, k: Mapping[str, Any], weights: Callable, knobs: dict, low: float, high: float):
  """SGCD's shared body: GRPO's token advantages times the weights `weights(div, ent, action, **knobs)` of the
  teacher_sibling pass, dynamic sampling by `mixed_groups`, metrics with the weights' bounds [low, high]."""
  if k["mixed_groups"] not in SGCD_MIXED_GROUPS:
    raise credit.KnobError("sgcd", "mixed_groups", f"must be one of {SGCD_MIXED_GROUPS}", k["mixed_groups"])
  seq = _outcome(traj, k["scale"], k["eps"])
  teacher = read_output(traj, "teacher_sibling", DivergenceOutput)
  summaries = read_output(traj, "sibling_summary", SiblingSummaryOutput)
  valid = pass_valid(traj, teacher)
  div = _teacher_or_nan(traj, teacher, teacher.divergence_BxL)
  ent = _teacher_or_nan(traj, teacher, teacher.entropy_BxL)
  w = per_rollout(weights, knobs, div, ent, traj.action_mask_BxL)
  mixed = np.asarray(summaries.mixed_B, bool)
  groups = np.asarray(traj.group_ids_B)
  unmixed = len(set(groups[~mixed].tolist()))
  skip = k["mixed_groups"] == "skip"
  act = traj.action_mask_BxL & valid[:, None]
  at_min, at_max = np.isclose(w, low), np.isclose(w, high)
  return MethodOutput(
    (_on_actions(seq, traj) * w).astype(np.float32),
    seq[:, None] * traj.turn_mask_BxT,
    metrics={
      "teacher_policy_gap": _teacher_gap(traj, teacher),
      "sgcd_mixed_groups": len(set(groups.tolist())) - unmixed,
      "sgcd_groups_skipped": unmixed if skip else 0,
      "sgcd_divergence_mean": _action_mean(np.nan_to_num(div), act),
      "sgcd_weight_mean": _action_mean(w, act),
      "sgcd_weight_std": float(w[act].std()) if act.any() else 0.0,
      # Tokens whose weight sits at a bound (v2.1: 1 = not amplified, c = amplified to the cap).
      "sgcd_weight_clipped_frac": _action_mean((at_min | at_max).astype(np.float32), act),
      "sgcd_weight_at_min_frac": _action_mean(at_min.astype(np.float32), act),
      "sgcd_weight_at_max_frac": _action_mean(at_max.astype(np.float32), act),
      "sgcd_summary_tokens": float(np.mean(np.asarray(summaries.summary_tokens_B)[mixed])) if mixed.any() else 0.0,
    },
    details={
      "credit_weight_BxL": np.where(act, w, np.nan),
      "divergence_BxL": np.where(act, div, np.nan),
    },
    keep_B=mixed if skip else None,
  )


def sgcd(traj: Trajectory, k: Mapping[str, Any]) -> MethodOutput:
  """SGCD (arXiv 2606.12634, from its abstract and summaries): GRPO's token advantages times the amplify-only weight
  W = clip(1 + gamma · s, 1, c) of a salience s in [0, 1] from the reverse KL and the entropy of a teacher shown its
  group's sibling-contrast credit reference (credit.sgcd_token_weights). W >= 1: the teacher never shrinks or flips a
  token's advantage; no distillation loss. Dynamic sampling: a group without both a successful and a failed
  rollout has no reference; with mixed_groups="skip" (the paper) it leaves the update (`keep_B`), with "keep" it
  trains as GRPO (W = 1).

  Raises:
    ValueError: `sgcd: knob `mixed_groups` must be one of ...` for another value (said by config key in
      `check_knobs`), and whatever credit.sgcd_token_weights raises for its knobs.
  """
  knobs = _pick(k, "gamma", "c", "entropy_coef", "salience")
  return _sgcd(traj, k, credit.sgcd_token_weights, knobs, 1.0, k["c"])


def sgcd_v0(traj: Trajectory, k: Mapping[str, Any]) -> MethodOutput:
  """SGCD v0, this library's earlier reading: weights clip(1 + alpha (f / mean f - 1), w_min, w_max) with mean 1, so
  some tokens are shrunk (credit.sgcd_v0_token_weights); otherwise as `sgcd`."""
  knobs = _pick(k, "alpha", "entropy_coef", "w_min", "w_max")
  return _sgcd(traj, k, credit.sgcd_v0_token_weights, knobs, k["w_min"], k["w_max"])


def hsd_grpo_validate(k: Mapping[str, Any], c) -> None:
  """hsd_grpo's dense_coef, the weight of its dense term in the advantage (no credit function reads it): a finite
  number >= 0 (a negative weight flips the term)."""
  v = k["dense_coef"]
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
    raise ValueError(
      f"config.credit.{c.credit.method}.dense_coef = {v!r}: must be a finite number >= 0 (a negative weight flips the "
      "term)"
    )


def hsd_validate(k: Mapping[str, Any], c) -> None:
  """HSD's own checks: beta a finite number >= 0 (the reference KL's weight; the paper's 0.001); the teacher is the
  policy (the loss reads the teacher's hidden states against the policy's current head, which is that teacher's
  distribution only when the teacher is the policy); no second KL to the reference (`loss.kl_coef`: beta is HSD's)."""
  beta = k["beta"]
  if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta < float("inf"):
    raise ValueError(f"config.credit.hsd.beta = {beta!r}: must be a finite number >= 0 (the paper's 0.001)")
  if c.teacher.source not in ("", "policy"):
    raise ValueError(
      f"config.teacher.source = {c.teacher.source!r}: HSD's teacher is the policy itself (the paper's self-teacher; "
      "its distillation reads the teacher's hidden states against the policy's output head), leave it '' or 'policy'"
      " (hsd_grpo takes another teacher)"
    )
  if c.loss.kl_coef > 0:
    raise ValueError(
      f"config.loss.kl_coef = {c.loss.kl_coef}: HSD has its own KL to the reference, config.credit.hsd.beta; set "
      "loss.kl_coef to 0"
    )


def opd(traj: Trajectory, k: Mapping[str, Any]) -> MethodOutput:
  """On-policy distillation: token advantage = teacher - policy log-prob of the sampled token."""
  teacher = read_output(traj, "teacher_plain", TeacherOutput)
  a = per_rollout(credit.opd_token_advantages, {}, teacher.logp_BxL, traj.behavior_logp_BxL, traj.action_mask_BxL)
  adv = np.where(pass_valid(traj, teacher)[:, None], a, 0.0).astype(np.float32)
  return MethodOutput(adv, metrics={"teacher_policy_gap": _teacher_gap(traj, teacher)})


_OUTCOME: dict[str, Any] = {"scale": "group", "eps": 1e-6}


METHODS: dict[str, Method] = {
  "grpo": Method(grpo, dict(_OUTCOME), teacher=None, summary="outcome-only group-normalised baseline"),
  "drgrpo": Method(drgrpo, {"eps": 1e-6}, teacher=None, summary="GRPO without std normalisation"),
  "rloo": Method(rloo, {}, teacher=None, summary="leave-one-out baseline"),
  "gigpo": Method(
    gigpo,
    dict(_OUTCOME, gamma=0.95, omega=1.0, state_key="observation"),
    teacher=None,
    summary="episode + step-group advantages at shared anchor states",
  ),
  # TRACE's scorer is always the frozen reference (the gold_answer pass), never config.teacher.source. The knobs
  # are the paper's symbols with its defaults (arXiv 2607.13988); its pass's gold_reduce="mean" scores ℓ̄, the mean per-token
  # log-prob. value="raw_delta", td_horizon=1, terminal_scale=0, std="sample", dense_norm="group_rms",
  # gold_reduce="sum" and alpha_turn=beta is this library's v1 TRACE (not the paper's raw-delta ablation, which changes
  # only value="raw_delta").
  "trace": Method(
    trace,
    dict(
      alpha_out=1.0,
      alpha_turn=0.2,
      gap_eps=0.1,
      value="log_ratio",
      td_horizon=3,
      td_gamma=0.8,
      terminal_scale=2.0,
      std="population",
      dense_norm="none",
      eps=1e-6,
    ),
    ("gold_answer",),
    teacher=None,
    summary="outcome + K-step TD turn credit of the reference's log-ratio gold-answer state values",
  ),
  # CrEST as published (arXiv 2608.13179): its knob defaults, and its teacher the fixed initial model (the frozen
  # reference) shown, per unit, the ground truth of the units before it (App. C.1; teacher_context="all": every
  # unit sees the whole session's ground truth). docs/methods/crest.md.
  "crest": Method(
    crest,
    dict(_OUTCOME, lam=0.3, clip_eps=0.28, tau=2.0, rho=0.5, direction_gate=True),
    ("teacher_privileged",),
    teacher="reference",
    summary="verified unit advantages, bounded fixed-teacher amplification of the tokens it agrees on",
  ),
  "toolopd": Method(
    toolopd,
    dict(
      _OUTCOME,
      max_credit=2.0,
      normalize=True,
      distill_coef=0.1,
      # The distillation's gradient at most half the policy gradient's norm (PolicyLossConfig.grad_caps): with no
      # cap it was about six times GRPO's whole gradient and the policy fell below its warm start on both
      # long-horizon testbeds (docs/methods/toolopd.md). inf: no cap (the earlier reading).
      distill_max_grad_ratio=0.5,
    ),
    ("hindsight_skill", "teacher_plain", "teacher_skill"),
    ("distill",),
    teacher="reference",
    summary="GRPO + hindsight-skill-weighted distillation",
  ),
  # HSD (arXiv 2606.15576) from its summaries: the full-vocabulary KL(teacher || student) to the current policy shown
  # a successful peer (+ the gold answer; the answer alone without one) and beta = 0.001 KL to the reference, no
  # reward term (docs/methods/hsd.md). A math/code paper; its use on tool-use rollouts is this library's extension.
  "hsd": Method(
    hsd,
    dict(beta=0.001),
    ("teacher_peer_states",),
    ("vocab_kl", "reference_kl"),
    summary="full-vocabulary distillation from the policy shown a successful peer and the gold answer",
    validate=hsd_validate,
  ),
  "hsd_grpo": Method(
    hsd_grpo,
    dict(_OUTCOME, clip=1.0, dense_coef=0.1),
    ("teacher_peer",),
    summary="HSD, this library's earlier reading (GRPO plus a clipped sampled-token log-ratio to the peer teacher)",
    validate=hsd_grpo_validate,
    variant_of="hsd",
  ),
  # GEAR (arXiv 2605.11853) from its summaries and captions: Table 2's defaults (lambda_H = 1.5, alpha = 0.2,
  # lambda_KL = 0.1); the normalisation of the divergence and the linear sign-aware weight are our readings
  # (docs/methods/gear.md).
  "gear": Method(
    gear,
    dict(_OUTCOME, alpha=0.2, lambda_kl=0.1, lambda_h=1.5, min_divergence=1e-6),
    ("teacher_divergence",),
    summary="sign-aware weights of divergence-anchored segments rescale the GRPO advantage",
  ),
  "gear_v0": Method(
    gear_v0,
    dict(_OUTCOME, alpha=1.0, k_sigma=2.0, tau_low=0.1, entropy_floor=1.0, normalize=True),
    ("teacher_divergence",),
    summary="GEAR, this library's earlier reading (not sign-aware, weights of mean 1)",
    variant_of="gear",
  ),
  # SGCD (arXiv 2606.12634) from its abstract and summaries: the amplify-only W = clip(1 + gamma·s, 1, c), gamma = 1,
  # c = 2, mixed groups only; the salience s is our reading (docs/methods/sgcd.md). The paper's summariser is an
  # external LLM; by default the method's teacher (the policy) writes the summary, as a stand-in.
  "sgcd": Method(
    sgcd,
    dict(
      _OUTCOME,
      gamma=1.0,
      c=2.0,
      entropy_coef=1.0,
      salience="max",
      mixed_groups="skip",
    ),
    ("sibling_summary", "teacher_sibling"),
    summary="GRPO amplified, at most c-fold, where a teacher shown how successful and failed siblings differ departs",
  ),
  "sgcd_v0": Method(
    sgcd_v0,
    dict(
      _OUTCOME,
      alpha=0.5,  # = 1 - w_min: 1 + alpha·(f/f̄ − 1) >= w_min for every f >= 0, so the floor never binds
      entropy_coef=1.0,
      w_min=0.5,
      w_max=2.0,
      mixed_groups="skip",
    ),
    ("sibling_summary", "teacher_sibling"),
    summary="SGCD, this library's earlier reading (weights in [w_min, w_max] of mean 1: some tokens shrunk)",
    variant_of="sgcd",
  ),
  "opd": Method(
    opd,
    {},
    ("teacher_plain",),
    teacher="",
    min_group_size=1,
    summary="on-policy distillation from a teacher checkpoint",
  ),
}
