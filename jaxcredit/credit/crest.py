"""CrEST: turn-segmented verified advantages with a verifier-bounded self-teacher token factor.

    A_i = A_u(i) · φ_i,   A_u = per-unit GRPO of the verifier's rewards,   φ_i ∈ [1, 1 + lam · clip_eps]

The verifier sets the direction of every token's credit (sign A_u); the privileged self-teacher only amplifies,
by a bounded factor, the tokens it agrees on ("teach the magnitude, not the direction").

Shape letters: G rollouts in a group, U verified units (user turns, or whatever the environment verifies),
L tokens. Batch of P groups: `jax.vmap(crest_advantages)(turn_rewards_PxGxU, turn_mask_PxGxU, turn_ids_PxGxL,
action_mask_PxGxL, teacher_logp_PxGxL, policy_logp_PxGxL, sample_mask_PxG)`; knobs through `functools.partial`.

Source: "Teach the Magnitude, Not the Direction: Verifier-Bounded Credit Assignment for Multi-Turn Multi-step LLM
Agents" (Wang et al., arXiv 2608.13179), Eq. 2-10 and App. A; docs/methods/crest.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcredit.credit import _checks, _segments, outcome

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

# The z-score's guard on the surprisal std (the spec's "population std + 1e-6"); not a knob.
SURPRISAL_STD_EPS = 1e-6


def crest_turn_advantages(
  turn_rewards: ArrayLike,
  turn_mask: ArrayLike,
  sample_mask: ArrayLike | None = None,
  *,
  scale: str = "group",
  eps: float = 1e-6,
) -> Array:
  """CrEST's verified per-unit advantages: GRPO-normalise each unit over the rollouts that reached it.

      valid[g, u] = turn_mask[g, u] ∧ sample_mask[g] ∧ isfinite(turn_rewards[g, u])
      A[:, u] = grpo_advantages(turn_rewards[:, u], valid[:, u], scale=scale, eps=eps)

  Each unit u is its own group: fewer than 2 rollouts reaching u, or equal rewards among them, give exactly 0.
  The paper's group is the G rollouts of one fixed session; the std is the sample std (ddof=1), our convention
  (as grpo_advantages), which the paper does not fix.

  Args:
    turn_rewards: [G, U] float, the verifier's reward for unit u of rollout g.
    turn_mask: [G, U] bool, True where rollout g reached (and was verified on) unit u.
    sample_mask: [G] bool or None (all True).
    scale: "group" or "none" (as grpo_advantages).
    eps: > 0.

  Returns:
    [G, U] float32 unit advantages; exactly 0.0 where invalid.

  Raises:
    ValueError: `turn_rewards` is not [G, U], `turn_mask` is not [G, U], `sample_mask` is not [G], or a bad knob.

  Source:
  "Teach the Magnitude, Not the Direction: Verifier-Bounded Credit Assignment for Multi-Turn Multi-step LLM Agents"
  (CrEST, arXiv 2608.13179), Eq. 3; docs/methods/crest.md.
  """
  fn = "crest_turn_advantages"
  scale, eps = outcome.check_normalise_knobs(fn, scale, eps)
  shapes = _checks.Shapes(fn)
  rewards_GxU = shapes.float("turn_rewards", turn_rewards, "G,U")
  tmask_GxU = shapes.mask("turn_mask", turn_mask, "G,U")
  smask_G = shapes.mask("sample_mask", sample_mask, "G")
  return outcome.group_normalise(rewards_GxU, tmask_GxU & smask_G[:, None], scale=scale, eps=eps)


def _check_token_knobs(fn: str, lam, clip_eps, tau, rho, direction_gate) -> tuple[float, float, float, float, bool]:
  lam = _checks.knob_float(fn, "lam", lam, ge=0.0)
  clip_eps = _checks.knob_float(fn, "clip_eps", clip_eps, ge=0.0, lt=1.0)
  tau = _checks.knob_float(fn, "tau", tau, gt=0.0)
  rho = _checks.knob_float(fn, "rho", rho, ge=0.0, le=1.0)
  direction_gate = _checks.knob_bool(fn, "direction_gate", direction_gate)
  return lam, clip_eps, tau, rho, direction_gate


def _check_token_arrays(shapes: _checks.Shapes, spec: str, turn_ids, action_mask, teacher_logp, policy_logp):
  """The per-token arguments of crest_token_weights ("L") or crest_advantages ("G,L"), checked in this order."""
  return (
    shapes.index("turn_ids", turn_ids, spec),
    shapes.mask("action_mask", action_mask, spec),
    shapes.float("teacher_logp", teacher_logp, spec),
    shapes.float("policy_logp", policy_logp, spec),
  )


def _unit_adv(adv_U: Array, ids_L: Array, action_L: Array) -> Array:
  """turn_to_token for CrEST (stop-gradient, batched through _segments): A_u(i) on unit tokens, else 0."""
  num_units = adv_U.shape[0]
  if num_units == 0:
    return jnp.zeros(ids_L.shape, jnp.float32)
  adv_L = _segments.lookup(adv_U, ids_L)
  return jnp.where(action_L & (ids_L >= 0) & (ids_L < num_units) & jnp.isfinite(adv_L), adv_L, 0.0)


def _token_factor(
  adv_U: Array,
  ids_L: Array,
  action_L: Array,
  teacher_L: Array,
  policy_L: Array,
  knobs: tuple[float, float, float, float, bool],
) -> tuple[Array, Array]:
  """(A_u(i), φ_i) of one rollout on checked arrays: `_unit_adv`, then crest_token_weights' factor with
  knobs = (lam, clip_eps, tau, rho, direction_gate) from `_check_token_knobs`."""
  lam, clip_eps, tau, rho, direction_gate = knobs
  num_units = adv_U.shape[0]
  adv_L = _unit_adv(adv_U, ids_L, action_L)
  in_unit_L = action_L & (ids_L >= 0) & (ids_L < num_units)
  sign_L = jnp.sign(adv_L)
  # The surprisal statistics are over the rollout's action tokens (the paper's "response tokens") with a finite
  # policy log-prob, whatever their unit's advantage or the teacher's score.
  stats_L = action_L & jnp.isfinite(policy_L)
  surprisal_L = jnp.where(stats_L, -policy_L, 0.0)
  # The tokens the teacher may modulate.
  live_L = in_unit_L & (sign_L != 0.0) & jnp.isfinite(teacher_L) & jnp.isfinite(policy_L)
  teacher_L = jnp.where(live_L, teacher_L, 0.0)
  policy_L = jnp.where(live_L, policy_L, 0.0)
  signed_L = sign_L * ((teacher_L - policy_L) / tau)  # sign(A_u) · Δ_i                      Eq. 5
  w_L = jnp.clip(jnp.exp(signed_L), 1.0 - clip_eps, 1.0 + clip_eps)  #                       Eq. 6
  gate_L = live_L & (signed_L > 0.0) if direction_gate else live_L  #                       Eq. 7
  # (s − mean) / (std + 1e-6), population std, by the outcome baselines' scale-invariant statistic: equal
  # surprisals give exactly 0 (a rounded mean gave z ≈ −0.5 at s = 5.9 in 12 tokens), and surprisals above 1e19
  # nats no longer square to inf (z = 0 everywhere). 0 with fewer than 2 such tokens, as before.
  z_L = outcome.group_normalise(surprisal_L[:, None], stats_L[:, None], scale="group", eps=SURPRISAL_STD_EPS, ddof=0)
  e_L = jax.nn.sigmoid(z_L[:, 0])  #                                                         Eq. 8-9
  m_L = 1.0 + rho * (2.0 * e_L - 1.0)  #                                                     Eq. 8-9
  lam_L = jnp.clip(lam * gate_L * m_L, 0.0, lam)  #                                          Eq. 10
  phi_L = jnp.where(live_L, 1.0 + lam_L * (w_L - 1.0), 1.0)  #                               Eq. 4
  return adv_L, lax.stop_gradient(jnp.where(in_unit_L, phi_L, 0.0))


def crest_token_weights(
  turn_adv: ArrayLike,
  turn_ids: ArrayLike,
  action_mask: ArrayLike,
  teacher_logp: ArrayLike,
  policy_logp: ArrayLike,
  *,
  lam: float = 0.3,
  clip_eps: float = 0.28,
  tau: float = 2.0,
  rho: float = 0.5,
  direction_gate: bool = True,
) -> Array:
  """CrEST's verifier-bounded token factor φ for one rollout: the self-teacher amplifies, never redirects.

      Δ_i = (log p_teacher(a_i) − log p_policy(a_i)) / tau                     (Eq. 5)
      w_i = clip(exp(sign(A_u(i)) · Δ_i), 1 − clip_eps, 1 + clip_eps)          (Eq. 6)
      g_i = 1[sign(A_u(i)) · Δ_i > 0]                                          (Eq. 7, the direction gate)
      s_i = −log p_policy(a_i);   z_i = (s_i − mean s) / (std s + 1e-6)        (Eq. 8-9, the student's surprisal)
      m_i = 1 + rho · (2 · sigmoid(z_i) − 1)                                   (Eq. 8-9, the entropy gate)
      λ_i = clip(lam · g_i · m_i, 0, lam)                                      (Eq. 10)
      φ_i = 1 + λ_i · (w_i − 1)                                                (Eq. 4)

  The direction gate is off wherever the teacher disagrees with the verifier's sign, so the teacher can only
  amplify a token's credit (w_i > 1 where g_i = 1), never shrink or flip it. The entropy gate lowers that
  amplification on tokens the student found unsurprising (m_i < 1 below the rollout's mean surprisal); above the
  mean m_i > 1, but the clip in Eq. 10 caps λ_i at lam, so there λ_i = lam.
  No renormalisation. Properties (paper App. A): sign(A_u · φ_i) = sign(A_u) (P1); |φ_i − 1| <= lam · clip_eps
  (P2); φ_i >= 1 (P3); teacher == policy gives φ = 1; lam = 0 gives φ = 1 (the inter-turn-only ablation).
  Stop-gradient.
  A token is modulated ("live") when it is an action token of a unit in [0, U) with A_u(i) finite and ≠ 0 and both
  log-probs finite; every other unit token gets φ = 1.

  Readings taken where the paper leaves room (docs/methods/crest.md): the surprisal z-score is over the action
  tokens of the whole rollout with a finite policy log-prob (the paper's "response tokens"; not per unit, and
  whatever their unit's advantage), with their mean and population std (÷n) plus 1e-6; the surprisal is the
  student's (the policy's recorded log-prob of the sampled token), not the teacher's entropy.
  Batch: vmap over leading axes, e.g. `jax.vmap(jax.vmap(functools.partial(crest_token_weights, lam=0.5)))`.

  Args:
    turn_adv: [U] float, the unit advantages of this rollout (a crest_turn_advantages row).
    turn_ids: [L] int32, the unit index of each action token, -1 elsewhere.
    action_mask: [L] bool, True on generated tokens.
    teacher_logp: [L] float, the self-teacher's (privileged context) log-prob of the sampled token, nats.
    policy_logp: [L] float, the policy's log-prob of the sampled token, nats.
    lam: >= 0, the largest mixing weight λ (0: no token modulation).
    clip_eps: in [0, 1), the trust band of w around 1.
    tau: > 0, the log-ratio temperature, nats.
    rho: in [0, 1], the entropy gate's strength (0: m = 1).
    direction_gate: True (the paper): Eq. 7 as written. False: g_i = 1 on every live token, the ablation
      without the direction gate (ours: the teacher then also shrinks the tokens it disagrees on, to
      φ_i >= 1 − lam · clip_eps > 0, so P1 still holds but P3 does not).

  Returns:
    φ: [L] float32 in [1, 1 + lam · clip_eps] on unit tokens; exactly 0.0 off the action tokens and on tokens whose
    unit is outside [0, U).

  Raises:
    ValueError: a token array is not [L] (all must match), `turn_ids` is not integer, `turn_adv` is not [U], or a
      knob is out of range (lam < 0, clip_eps outside [0, 1), tau <= 0, rho outside [0, 1], or any not finite).

  Source:
  "Teach the Magnitude, Not the Direction: Verifier-Bounded Credit Assignment for Multi-Turn Multi-step LLM Agents"
  (CrEST, arXiv 2608.13179), Eq. 4-10, App. A (properties P1-P3); docs/methods/crest.md.
  """
  fn = "crest_token_weights"
  knobs = _check_token_knobs(fn, lam, clip_eps, tau, rho, direction_gate)
  shapes = _checks.Shapes(fn)
  adv_U = shapes.float("turn_adv", turn_adv, "U")
  ids_L, action_L, teacher_L, policy_L = _check_token_arrays(
    shapes, "L", turn_ids, action_mask, teacher_logp, policy_logp
  )
  return _token_factor(adv_U, ids_L, action_L, teacher_L, policy_L, knobs)[1]


def crest_advantages(
  turn_rewards: ArrayLike,
  turn_mask: ArrayLike,
  turn_ids: ArrayLike,
  action_mask: ArrayLike,
  teacher_logp: ArrayLike,
  policy_logp: ArrayLike,
  sample_mask: ArrayLike | None = None,
  *,
  scale: str = "group",
  eps: float = 1e-6,
  lam: float = 0.3,
  clip_eps: float = 0.28,
  tau: float = 2.0,
  rho: float = 0.5,
  direction_gate: bool = True,
) -> Array:
  """CrEST token advantages for one group: the verified unit advantage times the bounded self-teacher factor.

      A_unit  = crest_turn_advantages(turn_rewards, turn_mask, sample_mask)                 [G, U]   (Eq. 3)
      φ[g]    = crest_token_weights(A_unit[g], turn_ids[g], ..., lam, clip_eps, tau, rho)   [G, L]   (Eq. 4-10)
      A[g, i] = A_unit[g, u(i)] · φ[g, i]                                                            (Eq. 2)

  Args:
    turn_rewards: [G, U] float verified unit rewards.
    turn_mask: [G, U] bool, units each rollout reached.
    turn_ids: [G, L] int32 unit index per action token (-1 elsewhere).
    action_mask: [G, L] bool.
    teacher_logp: [G, L] float, nats (see crest_token_weights).
    policy_logp: [G, L] float, nats (see crest_token_weights).
    sample_mask: [G] bool or None (all True).
    scale: as crest_turn_advantages.
    eps: as crest_turn_advantages.
    lam: as crest_token_weights (so are clip_eps, tau, rho and direction_gate).

  Returns:
    [G, L] float32 token advantages; exactly 0.0 off action tokens, on invalid units and invalid samples.

  Raises:
    ValueError: any array not of its shape above (the message names it), or a bad knob.

  Source:
  "Teach the Magnitude, Not the Direction: Verifier-Bounded Credit Assignment for Multi-Turn Multi-step LLM Agents"
  (CrEST, arXiv 2608.13179), Eq. 2-10; docs/methods/crest.md.
  """
  fn = "crest_advantages"
  scale, eps = outcome.check_normalise_knobs(fn, scale, eps)
  knobs = _check_token_knobs(fn, lam, clip_eps, tau, rho, direction_gate)
  shapes = _checks.Shapes(fn)
  rewards_GxU = shapes.float("turn_rewards", turn_rewards, "G,U")
  tmask_GxU = shapes.mask("turn_mask", turn_mask, "G,U")
  ids_GxL, action_GxL, teacher_GxL, policy_GxL = _check_token_arrays(
    shapes, "G,L", turn_ids, action_mask, teacher_logp, policy_logp
  )
  smask_G = shapes.mask("sample_mask", sample_mask, "G")

  adv_GxU = outcome.group_normalise(rewards_GxU, tmask_GxU & smask_G[:, None], scale=scale, eps=eps)

  def one(adv_U, ids_L, action_L, teacher_L, policy_L):
    adv_L, phi_L = _token_factor(adv_U, ids_L, action_L, teacher_L, policy_L, knobs)
    return adv_L * phi_L

  return jax.vmap(one)(adv_GxU, ids_GxL, action_GxL, teacher_GxL, policy_GxL)
