"""CrEST: turn-segmented verified advantages with entropy-gated self-teacher token modulation.

Shape letters: G rollouts in a group, U verified units (user turns, or whatever the environment verifies),
L tokens. Batch of P groups: `jax.vmap(crest_advantages)(turn_rewards_PxGxU, turn_mask_PxGxU, turn_ids_PxGxL,
action_mask_PxGxL, teacher_logp_PxGxL, policy_logp_PxGxL, teacher_entropy_PxGxL, sample_mask_PxG)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcredit.credit import _checks
from jaxcredit.credit import _segments
from jaxcredit.credit import outcome

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

MAX_LOG_RATIO_LIMIT = 80.0


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

  Source: CrEST ("turn-segmented verified advantages"); docs/credit.md, "CrEST".
  """
  fn = "crest_turn_advantages"
  scale = _checks.knob_choice(fn, "scale", scale, outcome.SCALES)
  eps = _checks.knob_float(fn, "eps", eps, gt=0.0)
  shapes = _checks.Shapes(fn)
  rewards_GxU = shapes.float("turn_rewards", turn_rewards, "G,U")
  tmask_GxU = shapes.mask("turn_mask", turn_mask, "G,U")
  smask_G = shapes.mask("sample_mask", sample_mask, "G")
  return outcome.group_normalise(rewards_GxU, tmask_GxU & smask_G[:, None], scale=scale, eps=eps)


def _check_modulation_knobs(fn: str, tau, temperature, max_log_ratio) -> tuple[float, float, float]:
  tau = _checks.knob_float(fn, "tau", tau, allow_inf=True)
  temperature = _checks.knob_float(fn, "temperature", temperature, gt=0.0)
  max_log_ratio = _checks.knob_float(fn, "max_log_ratio", max_log_ratio, ge=0.0)
  if max_log_ratio > MAX_LOG_RATIO_LIMIT:
    raise ValueError(
      f"{fn}: knob `max_log_ratio` must be <= {MAX_LOG_RATIO_LIMIT} (exp overflows float32), got {max_log_ratio}."
    )
  return tau, temperature, max_log_ratio


def _unit_adv(adv_U: Array, ids_L: Array, action_L: Array) -> Array:
  """turn_to_token for CrEST (stop-gradient, batched through _segments): A_u(i) on unit tokens, else 0."""
  num_units = adv_U.shape[0]
  if num_units == 0:
    return jnp.zeros(ids_L.shape, jnp.float32)
  adv_L = _segments.lookup(adv_U, ids_L)
  return jnp.where(action_L & (ids_L >= 0) & (ids_L < num_units) & jnp.isfinite(adv_L), adv_L, 0.0)


def _token_weights(
  adv_L: Array,
  ids_L: Array,
  action_L: Array,
  num_units: int,
  teacher_L: Array,
  policy_L: Array,
  entropy_L: Array,
  *,
  tau: float,
  temperature: float,
  max_log_ratio: float,
) -> Array:
  """crest_token_weights on checked arrays, given adv_L = _unit_adv(turn_adv, ...)."""
  if num_units == 0:
    return jnp.zeros(ids_L.shape, jnp.float32)
  in_unit_L = action_L & (ids_L >= 0) & (ids_L < num_units)
  gap_L = teacher_L - policy_L
  gate_L = jax.nn.sigmoid((tau - entropy_L) / temperature)
  mod_L = jnp.exp(jnp.clip(jnp.sign(adv_L) * gap_L, -max_log_ratio, max_log_ratio))
  finite_L = jnp.isfinite(teacher_L) & jnp.isfinite(policy_L) & jnp.isfinite(entropy_L)
  raw_L = jnp.where(finite_L & in_unit_L, 1.0 + gate_L * (mod_L - 1.0), 1.0)
  sums_U = _segments.unit_sums(raw_L, ids_L, in_unit_L, num_units)
  counts_U = _segments.unit_sums(jnp.ones_like(raw_L), ids_L, in_unit_L, num_units)
  mean_L = _segments.lookup(sums_U / jnp.maximum(counts_U, 1.0), ids_L)
  return lax.stop_gradient(jnp.where(in_unit_L, raw_L / mean_L, 0.0))


def crest_token_weights(
  turn_adv: ArrayLike,
  turn_ids: ArrayLike,
  action_mask: ArrayLike,
  teacher_logp: ArrayLike,
  policy_logp: ArrayLike,
  teacher_entropy: ArrayLike,
  *,
  tau: float = 1.0,
  temperature: float = 0.25,
  max_log_ratio: float = 2.0,
) -> Array:
  """CrEST's entropy-gated self-teacher token weights for one rollout.

      gap_i = log p_teacher(a_i) − log p_policy(a_i)         (privileged self-teacher vs student)
      g_i   = sigmoid((tau − H_teacher,i) / temperature)      (a confident teacher modulates)
      m_i   = exp(clip(sign(A_u(i)) · gap_i, −max_log_ratio, max_log_ratio))
      raw_i = 1 + g_i · (m_i − 1);   w_i = raw_i / mean(raw over the action tokens of unit u(i))

  In a positive unit, tokens the teacher endorses weigh more; in a negative unit, tokens it disowns weigh
  more. A token whose teacher log-prob, policy log-prob or entropy is not finite is not modulated (raw = 1).
  Invariants: w >= 0; mean of w over each unit's action tokens is 1; sign(A_u · w_i) = sign(A_u);
  teacher == policy gives w = 1; tau = -inf (gate closed) gives w = 1. Stop-gradient.
  Batch: vmap over leading axes, e.g. `jax.vmap(jax.vmap(functools.partial(crest_token_weights, tau=0.5)))`.

  Args:
    turn_adv: [U] float, the unit advantages of this rollout (crest_turn_advantages row).
    turn_ids: [L] int32, the unit index of each action token, -1 elsewhere.
    action_mask: [L] bool, True on generated tokens.
    teacher_logp: [L] float, self-teacher (privileged context) log-prob of the sampled token, nats.
    policy_logp: [L] float, the policy's log-prob of the sampled token, nats.
    teacher_entropy: [L] float, the teacher's predictive entropy at each token, nats.
    tau: entropy gate centre in nats (may be ±inf).
    temperature: > 0, gate softness in nats.
    max_log_ratio: in [0, 80], clip on sign(A)·gap before the exp (keeps w finite in float32).

  Returns:
    w: [L] float32 weights; exactly 0.0 off the action tokens and on tokens whose unit is outside [0, U).

  Raises:
    ValueError: a token array is not [L] (all must match), `turn_ids` is not integer, `turn_adv` is not [U],
      or temperature <= 0, max_log_ratio outside [0, 80], tau is NaN.

  Source: CrEST ("entropy-gated self-teacher modulation"); docs/credit.md, "CrEST".
  """
  fn = "crest_token_weights"
  knobs = _check_modulation_knobs(fn, tau, temperature, max_log_ratio)
  shapes = _checks.Shapes(fn)
  adv_U = shapes.float("turn_adv", turn_adv, "U")
  ids_L = shapes.index("turn_ids", turn_ids, "L")
  action_L = shapes.mask("action_mask", action_mask, "L")
  teacher_L = shapes.float("teacher_logp", teacher_logp, "L")
  policy_L = shapes.float("policy_logp", policy_logp, "L")
  entropy_L = shapes.float("teacher_entropy", teacher_entropy, "L")
  tau, temperature, max_log_ratio = knobs
  adv_L = _unit_adv(adv_U, ids_L, action_L)
  return _token_weights(
    adv_L,
    ids_L,
    action_L,
    adv_U.shape[0],
    teacher_L,
    policy_L,
    entropy_L,
    tau=tau,
    temperature=temperature,
    max_log_ratio=max_log_ratio,
  )


def crest_advantages(
  turn_rewards: ArrayLike,
  turn_mask: ArrayLike,
  turn_ids: ArrayLike,
  action_mask: ArrayLike,
  teacher_logp: ArrayLike,
  policy_logp: ArrayLike,
  teacher_entropy: ArrayLike,
  sample_mask: ArrayLike | None = None,
  *,
  scale: str = "group",
  eps: float = 1e-6,
  tau: float = 1.0,
  temperature: float = 0.25,
  max_log_ratio: float = 2.0,
) -> Array:
  """CrEST token advantages for one group: verified unit advantage times the self-teacher token weight.

      A_unit = crest_turn_advantages(turn_rewards, turn_mask, sample_mask)            [G, U]
      w[g]   = crest_token_weights(A_unit[g], turn_ids[g], ..., tau, temperature, max_log_ratio)
      A[g, i] = A_unit[g, u(i)] · w[g, i]

  Args:
    turn_rewards: [G, U] float verified unit rewards.
    turn_mask: [G, U] bool, units each rollout reached.
    turn_ids: [G, L] int32 unit index per action token (-1 elsewhere).
    action_mask: [G, L] bool.
    teacher_logp, policy_logp, teacher_entropy: [G, L] float (see crest_token_weights).
    sample_mask: [G] bool or None (all True).
    scale, eps: as crest_turn_advantages. tau, temperature, max_log_ratio: as crest_token_weights.

  Returns:
    [G, L] float32 token advantages; exactly 0.0 off action tokens, on invalid units and invalid samples.

  Raises:
    ValueError: any array not of its shape above (the message names it), or a bad knob.

  Source: CrEST; docs/credit.md, "CrEST".
  """
  fn = "crest_advantages"
  scale = _checks.knob_choice(fn, "scale", scale, outcome.SCALES)
  eps = _checks.knob_float(fn, "eps", eps, gt=0.0)
  tau, temperature, max_log_ratio = _check_modulation_knobs(fn, tau, temperature, max_log_ratio)
  shapes = _checks.Shapes(fn)
  rewards_GxU = shapes.float("turn_rewards", turn_rewards, "G,U")
  tmask_GxU = shapes.mask("turn_mask", turn_mask, "G,U")
  ids_GxL = shapes.index("turn_ids", turn_ids, "G,L")
  action_GxL = shapes.mask("action_mask", action_mask, "G,L")
  teacher_GxL = shapes.float("teacher_logp", teacher_logp, "G,L")
  policy_GxL = shapes.float("policy_logp", policy_logp, "G,L")
  entropy_GxL = shapes.float("teacher_entropy", teacher_entropy, "G,L")
  smask_G = shapes.mask("sample_mask", sample_mask, "G")

  adv_GxU = outcome.group_normalise(rewards_GxU, tmask_GxU & smask_G[:, None], scale=scale, eps=eps)

  def one(adv_U, ids_L, action_L, teacher_L, policy_L, entropy_L):
    adv_L = _unit_adv(adv_U, ids_L, action_L)
    w_L = _token_weights(
      adv_L,
      ids_L,
      action_L,
      adv_U.shape[0],
      teacher_L,
      policy_L,
      entropy_L,
      tau=tau,
      temperature=temperature,
      max_log_ratio=max_log_ratio,
    )
    return adv_L * w_L

  return jax.vmap(one)(adv_GxU, ids_GxL, action_GxL, teacher_GxL, policy_GxL, entropy_GxL)
