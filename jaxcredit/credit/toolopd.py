"""ToolOPD: outcome-aware hindsight credit for action-level distillation.

Shape letter: L tokens. Batch: `jax.vmap(toolopd_token_weights)(logp_skill_BxL, logp_base_BxL, success_B,
action_mask_BxL)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcredit.credit import _checks

Array = jax.Array
ArrayLike = jax.typing.ArrayLike


def toolopd_token_weights(
  logp_skill: ArrayLike,
  logp_base: ArrayLike,
  success: ArrayLike,
  action_mask: ArrayLike,
  *,
  max_credit: float = 2.0,
  normalize: bool = True,
) -> Array:
  """ToolOPD's outcome-aware hindsight token weights for one rollout.

      δ_i = log p_teacher(a_i | ctx, hindsight skill) − log p_teacher(a_i | ctx)
      c_i = clip(δ_i, 0, max_credit)     if the rollout succeeded (keep support for successful decisions)
      c_i = clip(−δ_i, 0, max_credit)    if it failed (keep the discouragement of failed decisions)
      w_i = c_i / mean(c over action tokens)  when normalize and that mean > 0, else w_i = c_i

  Conflicting and irrelevant tokens get 0, and so does a token with a non-finite δ; the mean counts every
  action token (zeros included). Reversing `success` with the trajectory fixed moves all weight from the tokens
  with δ > 0 to those with δ < 0. Stop-gradient. The trainer adds λ_d · Σ_i w_i · d_i / N, with d_i a
  sampled-token reverse-KL distillation term toward the skilled teacher.

  Args:
    logp_skill: [L] float, teacher log-prob of the sampled token with the hindsight skill in context, nats.
    logp_base: [L] float, the same teacher without the skill, nats.
    success: bool scalar (may be traced), whether the rollout succeeded.
    action_mask: [L] bool, True on generated tokens.
    max_credit: > 0, clip on the per-token credit.
    normalize: bool, divide by the mean credit over action tokens.

  Returns:
    w: [L] float32 >= 0; exactly 0.0 off the action tokens.

  Raises:
    ValueError: `logp_skill`, `logp_base`, `action_mask` are not all [L]; `success` is not a bool scalar;
      max_credit <= 0; normalize is not a bool.

  Source: ToolOPD (outcome-aware hindsight credit for on-policy distillation of tool use). No paper was found:
  every formula above is this library's reading of the method's description (hindsight skills make the teacher's
  credit outcome-aware and reweight a distillation loss); docs/methods/toolopd.md.
  """
  fn = "toolopd_token_weights"
  max_credit = _checks.knob_float(fn, "max_credit", max_credit, gt=0.0)
  normalize = _checks.knob_bool(fn, "normalize", normalize)
  shapes = _checks.Shapes(fn)
  skill_L = shapes.float("logp_skill", logp_skill, "L")
  base_L = shapes.float("logp_base", logp_base, "L")
  success = shapes.flag("success", success)
  action_L = shapes.mask("action_mask", action_mask, "L")

  delta_L = skill_L - base_L
  signed_L = jnp.where(success, delta_L, -delta_L)
  credit_L = jnp.where(action_L & jnp.isfinite(delta_L), jnp.clip(signed_L, 0.0, max_credit), 0.0)
  if normalize:
    n = jnp.maximum(jnp.sum(action_L.astype(jnp.float32)), 1.0)  # float sums vectorise; ints don't
    mean = jnp.sum(credit_L) / n
    credit_L = jnp.where(mean > 0, credit_L / jnp.where(mean > 0, mean, 1.0), credit_L)
  return lax.stop_gradient(credit_L)
