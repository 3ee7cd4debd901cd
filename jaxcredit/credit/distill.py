"""On-policy distillation (OPD) baseline: per-token reverse-KL advantage toward a teacher.

Shape letter: L tokens. Batch: `jax.vmap(opd_token_advantages)` over leading axes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcredit.credit import _checks

Array = jax.Array
ArrayLike = jax.typing.ArrayLike


def opd_token_advantages(teacher_logp: ArrayLike, policy_logp: ArrayLike, action_mask: ArrayLike) -> Array:
  """On-policy distillation advantages for one rollout.

      a_i = log p_teacher(a_i) − log p_policy(a_i)      (stop-gradient)

  The sampled-token estimate of −KL(student ‖ teacher) at token i. 0 off the action tokens and where either
  log-prob is not finite.

  Args:
    teacher_logp: [L] float, the teacher's log-prob of the sampled token, nats.
    policy_logp: [L] float, the policy's log-prob of the sampled token, nats.
    action_mask: [L] bool.

  Returns:
    [L] float32; exactly 0.0 off the action tokens.

  Raises:
    ValueError: the three arrays are not all [L].

  Source: Agarwal et al. 2024, "On-Policy Distillation of Language Models" (GKD); Thinking Machines 2025,
  "On-Policy Distillation"; docs/methods/opd.md.
  """
  shapes = _checks.Shapes("opd_token_advantages")
  teacher_L = shapes.float("teacher_logp", teacher_logp, "L")
  policy_L = shapes.float("policy_logp", policy_logp, "L")
  action_L = shapes.mask("action_mask", action_mask, "L")
  gap_L = teacher_L - policy_L
  return lax.stop_gradient(jnp.where(action_L & jnp.isfinite(gap_L), gap_L, 0.0))
