"""HSD: path-conditioned self-distillation from a successful peer rollout of the same group.

`hsd_select_peers` draws each rollout's peer; `hsd_token_kl` is the paper's objective per token (method `hsd`);
`hsd_token_advantages` is this library's earlier reading, a clipped sampled-token log-ratio added to GRPO's
advantage (method `hsd_grpo`). Shape letters: G rollouts in a group, L tokens. Batch of P groups: split the key and vmap,
`jax.vmap(hsd_select_peers)(rewards_PxG, mask_PxG, jax.random.split(key, P))`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcredit.credit import _checks

Array = jax.Array
ArrayLike = jax.typing.ArrayLike


def hsd_select_peers(
  rewards: ArrayLike, sample_mask: ArrayLike | None, key: Array, *, success_threshold: float = 0.5
) -> Array:
  """Picks, for each rollout, a uniformly random successful peer of its group to condition the teacher on.

      success_j = valid_j ∧ R_j > success_threshold                  (strict)
      peer[g] ~ Uniform{j ≠ g : success_j}   for valid g;  −1 when that set is empty or g is invalid

  With −1 the teacher falls back to gold-answer-only conditioning. Exactly uniform: the k-th eligible peer is
  taken with k ~ randint(0, count).

  Args:
    rewards: [G] float rewards (NaN/inf marks the sample invalid).
    sample_mask: [G] bool, or None (all True).
    key: a jax.random key (typed or raw uint32[2]).
    success_threshold: a reward strictly above it counts as success.

  Returns:
    peer: [G] int32 index into the group, or −1.

  Raises:
    ValueError: `rewards` / `sample_mask` not [G]; success_threshold not a finite scalar.

  Source:
  "Localizing Credit at the Divergence: Path-Conditioned Self-Distillation for LLM Reasoning" (HSD, arXiv 2606.15576);
  docs/methods/hsd.md.
  """
  fn = "hsd_select_peers"
  threshold = _checks.knob_float(fn, "success_threshold", success_threshold)
  shapes = _checks.Shapes(fn)
  rewards_G = shapes.float("rewards", rewards, "G")
  valid_G = shapes.mask("sample_mask", sample_mask, "G") & jnp.isfinite(rewards_G)
  num = rewards_G.shape[0]
  success_G = valid_G & (rewards_G > threshold)
  eligible_GxG = success_G[None, :] & ~jnp.eye(num, dtype=jnp.bool_)
  count_G = jnp.sum(eligible_GxG, axis=1, dtype=jnp.int32)
  pick_G = jax.random.randint(key, (num,), 0, jnp.maximum(count_G, 1), dtype=jnp.int32)
  rank_GxG = jnp.cumsum(eligible_GxG, axis=1, dtype=jnp.int32) - 1
  chosen_GxG = eligible_GxG & (rank_GxG == pick_G[:, None])
  peer_G = jnp.argmax(chosen_GxG, axis=1).astype(jnp.int32)
  return jnp.where(valid_G & (count_G > 0), peer_G, -1)


def hsd_token_advantages(
  teacher_logp: ArrayLike, policy_logp: ArrayLike, action_mask: ArrayLike, *, clip: float = 1.0
) -> Array:
  """HSD's dense per-token advantage: the clipped log-ratio of the peer-conditioned self-teacher to the policy.

      a_i = clip(log p_teacher(a_i) − log p_policy(a_i), −clip, clip)     (stop-gradient)

  The teacher is the policy conditioned on the peer rollout (+ gold answer); a_i is 0 where either log-prob is
  not finite and off the action tokens. Combined by the caller: A_i = A_out + λ · a_i.

  Args:
    teacher_logp: [L] float, the peer-conditioned teacher's log-prob of the sampled token, nats.
    policy_logp: [L] float, the policy's log-prob of the sampled token, nats.
    action_mask: [L] bool.
    clip: > 0.

  Returns:
    a: [L] float32 in [−clip, clip]; exactly 0.0 off the action tokens.

  Raises:
    ValueError: the three arrays are not all [L]; clip <= 0.

  Source:
  "Localizing Credit at the Divergence: Path-Conditioned Self-Distillation for LLM Reasoning" (HSD, Li et al., arXiv
  2606.15576), known from its abstract and summaries only: the teacher is the policy conditioned on a successful peer
  of the same group (and the gold answer), answer-only when no peer succeeded, and its signal concentrates at the
  divergence from the peer. The clipped log-ratio and its additive mix with the outcome advantage are this
  library's reading, not the paper's equations (the method `hsd_grpo`; the paper's objective is `hsd_token_kl`);
  with clip = inf, a is the paper's diagnostic credit (spec v2.1); docs/methods/hsd.md.
  """
  fn = "hsd_token_advantages"
  clip = _checks.knob_float(fn, "clip", clip, gt=0.0, allow_inf=True)
  shapes = _checks.Shapes(fn)
  teacher_L = shapes.float("teacher_logp", teacher_logp, "L")
  policy_L = shapes.float("policy_logp", policy_logp, "L")
  action_L = shapes.mask("action_mask", action_mask, "L")
  gap_L = teacher_L - policy_L
  ok_L = action_L & jnp.isfinite(gap_L)
  return lax.stop_gradient(jnp.where(ok_L, jnp.clip(gap_L, -clip, clip), 0.0))


def hsd_token_kl(
  teacher_logits: ArrayLike, student_logits: ArrayLike, action_mask: ArrayLike, *, temperature: float = 1.0
) -> Array:
  """HSD's per-token objective: the full-vocabulary KL from the peer-conditioned self-teacher to the student.

      q_t = softmax(sg(z_teacher,t) / T),  p_t = softmax(z_student,t / T)
      kl_t = Σ_v q_t(v) (log q_t(v) − log p_t(v))          on action tokens; 0 elsewhere

  The teacher is the current policy, stop-gradient, reading the prompt with a context prepended (the gold answer and
  one successful peer of the same group, `hsd_select_peers`; the answer alone without one); the student is the
  policy on the rollout as sampled. The paper averages kl_t over a rollout's action tokens and over the group and
  adds beta · KL(pi_theta ‖ pi_0) with beta = 0.001; no reward term (the verifier only picks peers). The gradient
  flows into `student_logits` only.

  This form takes whole [L, V] logits (for small vocabularies and for checking); the trainer computes the same
  from final hidden states, chunked over the vocabulary so a 151k vocabulary never makes an [L, V] array
  (`jaxcredit.train.loop.step`, loss term "vocab_kl").

  Args:
    teacher_logits: [L, V] float, the teacher's logits predicting each rollout token (aligned with it).
    student_logits: [L, V] float, the student's, aligned the same way.
    action_mask: [L] bool.
    temperature: > 0, applied to both (the sampling temperature).

  Returns:
    kl: [L] float32 nats, >= 0; exactly 0.0 off the action tokens and where the two logits rows are equal.

  Raises:
    ValueError: the logits not both [L, V] with the mask [L]; temperature not a finite scalar > 0.

  Source:
  "Localizing Credit at the Divergence: Path-Conditioned Self-Distillation for LLM Reasoning" (HSD, Li et al., arXiv
  2606.15576), from two agreeing machine-written summaries of the PDF (the text was not found): the objective
  "KL(teacher ‖ student) over the full vocabulary". Reading named here: "reverse KL" in the summaries is taken as
  written there, KL(teacher ‖ student) (mode-covering for the student); docs/methods/hsd.md.
  """
  fn = "hsd_token_kl"
  temperature = _checks.knob_float(fn, "temperature", temperature, gt=0.0)
  teacher = jnp.asarray(teacher_logits)
  student = jnp.asarray(student_logits)
  if teacher.ndim != 2 or student.shape != teacher.shape:
    raise ValueError(f"{fn}: teacher_logits {teacher.shape} and student_logits {student.shape} must both be [L, V]")
  shapes = _checks.Shapes(fn)
  action_L = shapes.mask("action_mask", action_mask, "L")
  if action_L.shape[0] != teacher.shape[0]:
    raise ValueError(f"{fn}: action_mask {action_L.shape} must be [L] with L = {teacher.shape[0]} of the logits")
  # Off-mask rows read as zeros, so whatever they hold (-inf, NaN) reaches neither the value nor the gradient.
  teacher = jnp.where(action_L[:, None], lax.stop_gradient(teacher.astype(jnp.float32)), 0.0)
  student = jnp.where(action_L[:, None], student.astype(jnp.float32), 0.0)
  log_q = jax.nn.log_softmax(teacher / temperature, axis=-1)
  log_p = jax.nn.log_softmax(student / temperature, axis=-1)
  # Entries the teacher gives no mass (-inf logits: a padded vocabulary) add 0, not 0 · (-inf - log p) = NaN.
  q = jnp.exp(log_q)
  kl_L = jnp.sum(jnp.where(q > 0, q * (log_q - jnp.where(q > 0, log_p, 0.0)), 0.0), axis=-1)
  return jnp.where(action_L, jnp.maximum(kl_L, 0.0), 0.0)
