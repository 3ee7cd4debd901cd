"""GiGPO: a turn-level baseline from step groups, the turns of one group taken in the same anchor state.

Shape letters: G rollouts in a group, T turns, N = G·T (every turn of the group, flattened).
Batch of P groups: `jax.vmap(functools.partial(gigpo_advantages, gamma=0.9))(rewards_PxG, state_ids_PxGxT,
turn_mask_PxGxT, sample_mask_PxG)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcredit.credit import _checks, outcome

Array = jax.Array
ArrayLike = jax.typing.ArrayLike


def gigpo_advantages(
  rewards: ArrayLike,
  state_ids: ArrayLike,
  turn_mask: ArrayLike,
  sample_mask: ArrayLike | None = None,
  *,
  gamma: float = 0.95,
  omega: float = 1.0,
  scale: str = "group",
  eps: float = 1e-6,
) -> Array:
  """GiGPO turn advantages for one group: the GRPO episode term plus a step term over shared anchor states.

      valid_g = sample_mask_g ∧ isfinite(R_g);   real[g, t] = turn_mask[g, t] ∧ valid_g
      A_E = grpo_advantages(R, sample_mask, scale=scale, eps=eps)                              [G]
      R_t[g, t] = gamma^(n_g − 1 − t) · R_g,   n_g − 1 = the index of rollout g's last real turn
      step group of (g, t): S = {(g', t') : real[g', t'], state_ids[g', t'] = state_ids[g, t] >= 0}
      A_S[g, t] = (R_t[g, t] − mean_S R_t) / (std_S(R_t, ddof=1) + eps)   (scale="group")
      A_S[g, t] = R_t[g, t] − mean_S R_t                                  (scale="none")
      A_S = 0 when |S| < 2, when all R_t in S are equal (exactly 0), or when state_ids[g, t] < 0
      A[g, t] = A_E[g] + omega · A_S[g, t]  on real turns, else 0

  The outcome is the only reward, received after the last turn, so R_t is its discounted value at turn t.
  Step groups may join turns of different indices t (a state revisited later in another rollout) and several
  turns of one rollout. Each step group follows the outcome-baseline conventions (shift by its first member,
  ddof=1). Ids are compared pairwise over the N = G·T turns ([N, N] booleans), so arbitrary int32 hashes work
  with no table. omega = 0 gives exactly GRPO broadcast to the real turns.
  Tokens: `turn_to_token(A[g], turn_ids[g], action_mask[g])`. Batch: vmap over a leading P axis; under
  `jax.jit` pass the knobs as static arguments.

  Args:
    rewards: [G] float outcome rewards (NaN/inf marks the sample invalid).
    state_ids: [G, T] int32, an id of the state in which turn t was taken (equal ids = the same anchor state,
      e.g. a hash of the observation tokens before turn t); any negative id (-1) means none.
    turn_mask: [G, T] bool, real turns.
    sample_mask: [G] bool or None (all True).
    gamma: in [0, 1], discount of the outcome per turn before the last one.
    omega: >= 0 and finite, weight of the step term.
    scale: "group" or "none", for both the episode and the step term.
    eps: > 0, added to each std.

  Returns:
    [G, T] float32 turn advantages; exactly 0.0 on padded turns and invalid samples.

  Raises:
    ValueError: shapes disagree (message names the argument and [G], [G,T]), `state_ids` is not an integer
      array, or a knob is invalid (gamma outside [0, 1], omega < 0 or not finite, unknown scale, eps <= 0).

  Source: Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training" (GiGPO);
  docs/methods/gigpo.md.
  """
  fn = "gigpo_advantages"
  gamma = _checks.knob_float(fn, "gamma", gamma, ge=0.0)
  if gamma > 1.0:
    raise _checks.KnobError(fn, "gamma", "must be in [0, 1]", gamma)
  omega = _checks.knob_float(fn, "omega", omega, ge=0.0)
  scale, eps = outcome.check_normalise_knobs(fn, scale, eps)
  shapes = _checks.Shapes(fn)
  rewards_G = shapes.float("rewards", rewards, "G")
  ids_GxT = shapes.index("state_ids", state_ids, "G,T")
  turn_GxT = shapes.mask("turn_mask", turn_mask, "G,T")
  sample_G = shapes.mask("sample_mask", sample_mask, "G")

  num_g, num_turns = turn_GxT.shape
  if num_turns == 0:
    return jnp.zeros((num_g, 0), jnp.float32)
  valid_G = sample_G & jnp.isfinite(rewards_G)
  real_GxT = turn_GxT & valid_G[:, None]
  episode_G = outcome.group_normalise(rewards_G, sample_G, scale=scale, eps=eps)

  # Discount by the distance to the last real turn (not by the count of real turns), so a gap in turn_mask
  # never gives a negative power; the two agree when the real turns are a prefix.
  t_GxT = lax.broadcasted_iota(jnp.int32, (num_g, num_turns), 1)
  last_G = jnp.max(jnp.where(turn_GxT, t_GxT, -1), axis=1)
  power_GxT = jnp.maximum(last_G[:, None] - t_GxT, 0).astype(jnp.float32)
  step_return_N = jnp.where(real_GxT, jnp.float32(gamma) ** power_GxT * rewards_G[:, None], 0.0).reshape(-1)

  # Column i of the [N, N] problem is turn i's step group; group_normalise reads it over the rows j, so the
  # diagonal is each turn's own normalised value.
  ids_N = ids_GxT.reshape(-1)
  member_N = real_GxT.reshape(-1) & (ids_N >= 0)
  same_NxN = (ids_N[:, None] == ids_N[None, :]) & member_N[:, None] & member_N[None, :]
  x_NxN = jnp.broadcast_to(step_return_N[:, None], same_NxN.shape)
  step_N = jnp.diagonal(outcome.group_normalise(x_NxN, same_NxN, scale=scale, eps=eps))
  return jnp.where(real_GxT, episode_G[:, None] + omega * step_N.reshape(num_g, num_turns), 0.0)
