"""SGCD: sibling-guided credit distillation, bounded teacher weights on the GRPO token advantage.

    A_i = w_i · A_i^GRPO,   w_i ∈ [w_min, w_max],   w_min > 0   (the policy gradient keeps its sign)

A teacher shown a training-only, step-wise credit reference (an LLM's summary of how a successful and a failed
sibling of the same group differ) scores the rollout; where it departs from the student, the rollout's credit is
moved. The weights are constants of the loss: distillation is never an actor loss.

Shape letter: L tokens. Batch of B rollouts: `jax.vmap(sgcd_token_weights)(divergence_BxL, teacher_entropy_BxL,
action_mask_BxL)`; knobs through `functools.partial`.

Source: Ding, Xin, De la Cruz Weinstein, "Keep Policy Gradient in Charge: Sibling-Guided Credit Distillation for
Long-Horizon Tool-Use Agents", arXiv 2606.12634, known from its abstract only; every formula here is this library's
reading (docs/credit.md, "SGCD").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcredit.credit import _checks, _stats

Array = jax.Array
ArrayLike = jax.typing.ArrayLike


def _check_knobs(fn: str, alpha, entropy_coef, w_min, w_max) -> tuple[float, float, float, float]:
  alpha = _checks.knob_float(fn, "alpha", alpha, ge=0.0)
  entropy_coef = _checks.knob_float(fn, "entropy_coef", entropy_coef, ge=0.0)
  w_min = _checks.knob_float(fn, "w_min", w_min, gt=0.0, le=1.0)
  w_max = _checks.knob_float(fn, "w_max", w_max, ge=1.0)
  return alpha, entropy_coef, w_min, w_max


def sgcd_token_weights(
  divergence: ArrayLike,
  teacher_entropy: ArrayLike,
  action_mask: ArrayLike,
  *,
  alpha: float = 0.5,
  entropy_coef: float = 1.0,
  w_min: float = 0.5,
  w_max: float = 2.0,
) -> Array:
  """SGCD's bounded credit weights for one rollout, from detached teacher/student divergence features.

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

  Reading taken (the paper's equations are not available; docs/credit.md, "SGCD"): the abstract names dense
  teacher/student divergence, reverse KL and entropy, as what drives the credit reassignment, and bounded, detached
  weights on GRPO's token advantages. The relative-divergence form f / f̄, the teacher-entropy damping
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
  Long-Horizon Tool-Use Agents" (SGCD, arXiv 2606.12634), abstract; every formula above is our reading;
  docs/credit.md, "SGCD".
  """
  fn = "sgcd_token_weights"
  alpha, entropy_coef, w_min, w_max = _check_knobs(fn, alpha, entropy_coef, w_min, w_max)
  shapes = _checks.Shapes(fn)
  div_L = shapes.float("divergence", divergence, "L")
  ent_L = shapes.float("teacher_entropy", teacher_entropy, "L")
  action_L = shapes.mask("action_mask", action_mask, "L")

  live_L = action_L & jnp.isfinite(div_L) & jnp.isfinite(ent_L)
  d_L = jnp.where(live_L, jnp.maximum(div_L, 0.0), 0.0)
  h_L = jnp.where(live_L, jnp.maximum(ent_L, 0.0), 0.0)
  f_L = d_L / (1.0 + entropy_coef * h_L)
  f_s_L, _ = _stats.scaled(f_L, live_L)
  n = jnp.maximum(jnp.sum(live_L.astype(jnp.float32)), 1.0)  # float sums vectorise; ints don't
  mean_s = jnp.sum(f_s_L) / n
  ratio_L = f_s_L / jnp.where(mean_s > 0, mean_s, 1.0)
  w_L = jnp.clip(1.0 + alpha * (ratio_L - 1.0), w_min, w_max)
  return lax.stop_gradient(jnp.where(live_L & (mean_s > 0), w_L, 1.0))
