"""SGCD: sibling-guided credit distillation, amplify-only teacher weights on the GRPO token advantage.

    A_hat_t = A_t · W_t,   W_t = clip(1 + gamma · s_t, 1, c),   s_t ∈ [0, 1]   (gamma = 1, c = 2)

A teacher shown a training-only, step-wise credit reference (an external LLM's summary of how the successful and
failed siblings of a mixed group differ) scores the rollout; where the informed teacher departs from the student,
the token's advantage is amplified, by at most c, never shrunk or flipped. The weights are constants of the loss:
distillation is never an actor loss (the paper's ablation: an uncapped self-distillation loss drops AppWorld TGC
42.9 -> 38.2).

Shape letter: L tokens. Batch of B rollouts: `jax.vmap(sgcd_token_weights)(divergence_BxL, teacher_entropy_BxL,
action_mask_BxL)`; knobs through `functools.partial`.

Source: Ding, Xin, De la Cruz Weinstein, "Keep Policy Gradient in Charge: Sibling-Guided Credit Distillation for
Long-Horizon Tool-Use Agents", arXiv 2606.12634, known from its abstract and two agreeing machine-written summaries
of its PDF (the weight W = clip(1 + gamma · s, 1, c) with gamma = 1, c = 2 and a salience s in [0, 1] from
divergence spikes and teacher-entropy stability); the salience's exact formula is not in them and is our reading
(`sgcd_token_weights`, docs/methods/sgcd.md). `sgcd_v0_token_weights` keeps this library's earlier reading
(weights in [w_min, w_max] with mean 1, so about half of the tokens below 1), method `sgcd_v0`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcredit.credit import _checks, _stats

Array = jax.Array
ArrayLike = jax.typing.ArrayLike


def _features(fn: str, divergence, teacher_entropy, action_mask, entropy_coef: float) -> tuple[Array, Array]:
  """(live_L, f_L · 2^-k): the live tokens (action, finite features) and the entropy-damped reverse KL
  f = max(d, 0) / (1 + entropy_coef · max(H, 0)) there (0 elsewhere), scaled by a power of two (`_stats.scaled`,
  exact). Checks the three arrays' shapes, naming the argument."""
  shapes = _checks.Shapes(fn)
  div_L = shapes.float("divergence", divergence, "L")
  ent_L = shapes.float("teacher_entropy", teacher_entropy, "L")
  action_L = shapes.mask("action_mask", action_mask, "L")
  live_L = action_L & jnp.isfinite(div_L) & jnp.isfinite(ent_L)
  d_L = jnp.where(live_L, jnp.maximum(div_L, 0.0), 0.0)
  h_L = jnp.where(live_L, jnp.maximum(ent_L, 0.0), 0.0)
  f_s_L, _ = _stats.scaled(d_L / (1.0 + entropy_coef * h_L), live_L)
  return live_L, f_s_L


SALIENCE = ("max", "excess")
"""The salience readings of `sgcd_token_weights` (the paper's formula for s_t is not known)."""


def sgcd_token_weights(
  divergence: ArrayLike,
  teacher_entropy: ArrayLike,
  action_mask: ArrayLike,
  *,
  gamma: float = 1.0,
  c: float = 2.0,
  entropy_coef: float = 1.0,
  salience: str = "max",
) -> Array:
  """SGCD's amplify-only credit weights for one rollout, from detached teacher/student divergence features.

      live_t = action_t ∧ isfinite(d_t) ∧ isfinite(H_t)
      f_t    = max(d_t, 0) / (1 + entropy_coef · max(H_t, 0))     on live tokens   (nats)
      s_t    = f_t / max_live f                                   salience="max"    (the spike reaches 1)
      s_t    = clip(f_t / mean_live f − 1, 0, 1)                  salience="excess" (only above-average tokens)
      W_t    = clip(1 + gamma · s_t, 1, c)                        on live tokens when max_live f > 0
      W_t    = 1                                                  elsewhere (no teacher signal: exactly GRPO)

  d_t is the reverse KL(student ‖ teacher) at token t (the teacher shown the sibling-contrast credit reference, the
  student the policy without it) and H_t the teacher's entropy there. The caller multiplies: A_hat_t = A_t · W_t.
  Since 1 <= W_t <= c, A_hat_t has A_t's sign and at most c times its magnitude: the teacher only amplifies. A token
  where the informed teacher departs most from the student (a divergence spike) while the teacher itself is sure
  (low entropy) gets the most; a token where they agree keeps A_t. Stop-gradient.

  No signal gives exactly 1: d = 0 on every live token, no live token, or gamma = 0. A token off the action mask or
  with a non-finite feature (a rollout whose teacher pass is invalid: pass NaN) gets 1 and takes no part in the max
  or mean; the features of masked tokens never change another token's weight. The max and mean are taken of f
  scaled by a power of two (`_stats.scaled`, exact), so f and 2^j · f give the same weights and nothing overflows.

  Reading taken (docs/methods/sgcd.md): the summaries give W = clip(1 + gamma · s, 1, c), gamma = 1, c = 2 and a
  salience s in [0, 1] "from divergence spikes and teacher-entropy stability", without its formula. Ours: the
  teacher-entropy damping 1 / (1 + entropy_coef · H) (a teacher unsure of its own advice moves less) of the reverse
  KL, normalised by the rollout's largest such feature ("max"), or its excess over the rollout's mean, capped at 1
  ("excess"). The paper's reverse KL is over a top-K support (K not known); the library's pass computes it over the
  full vocabulary.

  Args:
    divergence: [L] float, reverse KL(student ‖ teacher) over the vocabulary at each token, nats (>= 0; a negative
      rounding residue counts as 0). NaN marks a token (or a whole rollout) without a teacher signal.
    teacher_entropy: [L] float, the teacher's predictive entropy at each token, nats.
    action_mask: [L] bool, True on generated tokens.
    gamma: >= 0, the amplification strength (the paper's gamma, default 1; 0: W = 1).
    c: >= 1, finite, the largest weight (the paper's c, default 2).
    entropy_coef: >= 0, how much the teacher's entropy damps its divergence, 1/nats (0: reverse KL alone).
    salience: "max" or "excess", the reading of s_t above.

  Returns:
    W: [L] float32 in [1, c]; exactly 1.0 off the action tokens and wherever there is no teacher signal.

  Raises:
    ValueError: the three arrays are not all [L] (naming the argument), or a knob is out of range (gamma < 0,
      c < 1 or not finite, entropy_coef < 0, salience not one of `SALIENCE`).

  Source:
  Ding, Xin, De la Cruz Weinstein, "Keep Policy Gradient in Charge: Sibling-Guided Credit Distillation for
  Long-Horizon Tool-Use Agents" (SGCD, arXiv 2606.12634), abstract and summaries: W = clip(1 + gamma · s, 1, c),
  gamma = 1, c = 2; the salience s is our reading; docs/methods/sgcd.md.
  """
  fn = "sgcd_token_weights"
  gamma = _checks.knob_float(fn, "gamma", gamma, ge=0.0)
  c = _checks.knob_float(fn, "c", c, ge=1.0)
  entropy_coef = _checks.knob_float(fn, "entropy_coef", entropy_coef, ge=0.0)
  salience = _checks.knob_choice(fn, "salience", salience, SALIENCE)
  live_L, f_s_L = _features(fn, divergence, teacher_entropy, action_mask, entropy_coef)
  top = jnp.max(f_s_L)  # f >= 0 and 0 off the live tokens
  if salience == "max":
    s_L = f_s_L / jnp.where(top > 0, top, 1.0)
  else:
    n = jnp.maximum(jnp.sum(live_L.astype(jnp.float32)), 1.0)
    mean_s = jnp.sum(f_s_L) / n
    s_L = jnp.clip(f_s_L / jnp.where(mean_s > 0, mean_s, 1.0) - 1.0, 0.0, 1.0)
  w_L = jnp.clip(1.0 + gamma * s_L, 1.0, c)
  return lax.stop_gradient(jnp.where(live_L & (top > 0), w_L, 1.0))


def _check_knobs(fn: str, alpha, entropy_coef, w_min, w_max) -> tuple[float, float, float, float]:
  alpha = _checks.knob_float(fn, "alpha", alpha, ge=0.0)
  entropy_coef = _checks.knob_float(fn, "entropy_coef", entropy_coef, ge=0.0)
  w_min = _checks.knob_float(fn, "w_min", w_min, gt=0.0, le=1.0)
  w_max = _checks.knob_float(fn, "w_max", w_max, ge=1.0)
  return alpha, entropy_coef, w_min, w_max


def sgcd_v0_token_weights(
  divergence: ArrayLike,
  teacher_entropy: ArrayLike,
  action_mask: ArrayLike,
  *,
  alpha: float = 0.5,
  entropy_coef: float = 1.0,
  w_min: float = 0.5,
  w_max: float = 2.0,
) -> Array:
  """SGCD v0 (this library's earlier reading, method `sgcd_v0`): bounded reassigning weights, some below 1.

      live_i = action_i ∧ isfinite(d_i) ∧ isfinite(H_i)
      f_i    = max(d_i, 0) / (1 + entropy_coef · max(H_i, 0))     on live tokens   (the credit feature, nats)
      f̄      = mean(f over live tokens)
      w_i    = clip(1 + alpha · (f_i / f̄ − 1), w_min, w_max)      on live tokens when f̄ > 0
      w_i    = 1                                                   elsewhere (no teacher signal: exactly GRPO)

  d_i is the dense reverse KL(student ‖ teacher) at token i (the teacher shown the sibling-contrast credit
  reference, the student the policy without it) and H_i the teacher's entropy there. A token where the informed
  teacher departs from the student more than the rollout's average gets more of the rollout's credit, one where it
  agrees gets less; a teacher unsure of its own advice (high H_i) moves less. The caller multiplies:
  A_i = w_i · A_i^GRPO. Since w_i >= w_min > 0 the sign of every token's advantage is the policy gradient's
  (sign(w_i · A_i) = sign(A_i)); the teacher only reassigns magnitudes, within [w_min, w_max]. Before the clip the
  weights have mean 1 over the live tokens (a reassignment, not an inflation). Stop-gradient.
  No signal gives exactly 1: d = 0 on every live token, no live token, or alpha = 0. A token off the action mask or
  with a non-finite feature (a rollout whose teacher pass is invalid: pass NaN) gets 1 and takes no part in f̄;
  the features of masked tokens never change another token's weight. f̄ is taken of f scaled by a power of two
  (`_stats.scaled`, exact), so f and c · f give the same weights for c = 2^j and nothing overflows.

  This is this library's v2.0 reading, from SGCD's abstract alone, kept so that earlier results stay reproducible
  (method `sgcd_v0`); it is not the paper's weight: with w_min < 1 it shrinks about half of the tokens (51% at w_min
  on the session testbed), which the paper's amplify-only W = clip(1 + gamma · s, 1, c) never does
  (`sgcd_token_weights`). The relative-divergence form f / f̄, the teacher-entropy damping
  1 / (1 + entropy_coef · H), the linear map with strength alpha and the clip to [w_min, w_max] are ours.

  Args:
    divergence: [L] float, reverse KL(student ‖ teacher) over the vocabulary at each token, nats (>= 0; a negative
      rounding residue counts as 0). NaN marks a token (or a whole rollout) without a teacher signal.
    teacher_entropy: [L] float, the teacher's predictive entropy at each token, nats.
    action_mask: [L] bool, True on generated tokens.
    alpha: >= 0, strength of the reassignment (0: w = 1). The default 0.5 = 1 − w_min keeps the floor from
      binding: a token with f = 0 gets exactly w_min. (At alpha = 1, on the quickstart's spiky divergences, 97-99%
      of the tokens sat at a bound, most at w_min.)
    entropy_coef: >= 0, how much the teacher's entropy damps its divergence, 1/nats (0: reverse KL alone).
    w_min: in (0, 1], the smallest weight.
    w_max: >= 1, the largest weight.

  Returns:
    w: [L] float32 in [w_min, w_max]; exactly 1.0 off the action tokens and wherever there is no teacher signal.

  Raises:
    ValueError: the three arrays are not all [L] (naming the argument), or a knob is out of range (alpha < 0,
      entropy_coef < 0, w_min outside (0, 1], w_max < 1, or any not finite).

  Source:
  Ding, Xin, De la Cruz Weinstein, "Keep Policy Gradient in Charge: Sibling-Guided Credit Distillation for
  Long-Horizon Tool-Use Agents" (SGCD, arXiv 2606.12634), abstract; every formula above is this library's v2.0
  reading; docs/methods/sgcd.md.
  """
  fn = "sgcd_v0_token_weights"
  alpha, entropy_coef, w_min, w_max = _check_knobs(fn, alpha, entropy_coef, w_min, w_max)
  live_L, f_s_L = _features(fn, divergence, teacher_entropy, action_mask, entropy_coef)
  n = jnp.maximum(jnp.sum(live_L.astype(jnp.float32)), 1.0)  # float sums vectorise; ints don't
  mean_s = jnp.sum(f_s_L) / n
  ratio_L = f_s_L / jnp.where(mean_s > 0, mean_s, 1.0)
  w_L = jnp.clip(1.0 + alpha * (ratio_L - 1.0), w_min, w_max)
  return lax.stop_gradient(jnp.where(live_L & (mean_s > 0), w_L, 1.0))
