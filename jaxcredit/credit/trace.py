"""TRACE: turn rewards from the temporal difference of a frozen reference's log-probability of the gold answer.

Shape letters: G rollouts in a group, T turns, T+1 tool-call boundaries (s_0 .. s_T).
Batch of P groups: `jax.vmap(functools.partial(trace_advantages, beta=0.5))(rewards_PxG, gold_logp_PxGxT1,
boundary_mask_PxGxT1, turn_mask_PxGxT, sample_mask_PxG)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcredit.credit import _checks
from jaxcredit.credit import outcome

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

DENSE_NORMS = ("group_rms", "none")


def _td_rewards(gold_T1: Array, valid_T1: Array) -> Array:
  """trace_td_rewards on checked arrays; works on any leading batch axes (the boundary axis is last)."""
  valid_T1 = valid_T1 & jnp.isfinite(gold_T1)
  iota_T1 = lax.broadcasted_iota(jnp.int32, gold_T1.shape, gold_T1.ndim - 1)
  # p(t): the latest valid boundary <= t. Differences are taken between raw log-probs: V_a − V_b equals
  # gold[a] − gold[b] (gold[0] cancels), and a redundant call (equal log-probs) then gives exactly 0.
  latest_T1 = lax.cummax(jnp.where(valid_T1, iota_T1, -1), axis=gold_T1.ndim - 1)
  prev_T = jnp.take_along_axis(gold_T1, jnp.maximum(latest_T1[..., :-1], 0), axis=-1)
  has_next_T = valid_T1[..., 1:] & valid_T1[..., :1]
  return jnp.where(has_next_T, gold_T1[..., 1:] - prev_T, 0.0)


def trace_td_rewards(gold_logp: ArrayLike, boundary_mask: ArrayLike) -> Array:
  """TRACE's TD log-ratio turn rewards for one rollout.

      V_t = log p_ref(y* | s_t) − log p_ref(y* | s_0)                     (log-ratio state value)
      r_t = V_{t+1} − V_{p(t)}  if boundary t+1 is valid, else 0,         t = 0 .. T−1
      p(t) = the latest valid boundary <= t

  An invalid boundary (mask False or a non-finite log-prob) is skipped, never read as log p = 0; if boundary 0
  is invalid every r_t is 0. Telescoping: Σ_t r_t = V_last − V_0 over the valid boundaries; a redundant tool
  call (same log-prob as the previous valid boundary) gets exactly 0 and leaves every other reward unchanged.
  The final-answer turn has no next boundary, so its r is 0 (the outcome term carries the answer's credit).
  Batch: `jax.vmap(trace_td_rewards)(gold_logp_BxT1, boundary_mask_BxT1)`.

  Args:
    gold_logp: [T+1] float, log p_ref(y* | s_t) in nats for each boundary state s_0 .. s_T.
    boundary_mask: [T+1] bool, False where s_t does not exist or its scoring failed.

  Returns:
    r: [T] float32 turn rewards.

  Raises:
    ValueError: `gold_logp` is not [T+1] with T >= 0 or `boundary_mask` does not match it.

  Source:
  "Of Errors and Echoes: Responsibility-Aware Credit Assignment for Tool-Use Agents" (TRACE):
  turn-level TD credit from a frozen reference's gold-answer log-probability;
  docs/credit.md, "TRACE".
  """
  shapes = _checks.Shapes("trace_td_rewards")
  gold_T1 = shapes.float("gold_logp", gold_logp, "T+1")
  valid_T1 = shapes.mask("boundary_mask", boundary_mask, "T+1")
  return _td_rewards(gold_T1, valid_T1)


def trace_advantages(
  rewards: ArrayLike,
  gold_logp: ArrayLike,
  boundary_mask: ArrayLike,
  turn_mask: ArrayLike,
  sample_mask: ArrayLike | None = None,
  *,
  beta: float = 1.0,
  scale: str = "group",
  dense_norm: str = "group_rms",
  eps: float = 1e-6,
) -> Array:
  """TRACE turn advantages for one group: GRPO outcome advantage plus normalised TD turn rewards.

      A_out = grpo_advantages(R, sample_mask, scale=scale, eps=eps)               [G]
      r[g] = trace_td_rewards(gold_logp[g], boundary_mask[g])                     [G, T]
      dense turns D = {(g, t): turn t real, sample g valid, boundaries 0 and t+1 valid}
      r~ = r / (sqrt(mean_{D} r²) + eps)   (dense_norm="group_rms"; r~ = 0 when D is empty)
      r~ = r                               (dense_norm="none")
      A[g, t] = A_out[g] + beta · r~[g, t]  on real turns of valid samples, else 0

  The RMS scaling has no centring, so a redundant call's r = 0 stays 0. beta = 0 gives GRPO broadcast to turns.
  Dense terms apply to valid samples even when the group has < 2 valid samples (A_out = 0 there).
  Tokens: `turn_to_token(A[g], turn_ids[g], action_mask[g])`. Batch: vmap over a leading P axis.

  Args:
    rewards: [G] float outcome rewards (NaN/inf marks the sample invalid).
    gold_logp: [G, T+1] float, log p_ref(y* | s_t) per boundary.
    boundary_mask: [G, T+1] bool, valid boundaries.
    turn_mask: [G, T] bool, real turns.
    sample_mask: [G] bool or None (all True).
    beta: >= 0, weight of the dense term.
    scale: "group" or "none", passed to grpo_advantages.
    dense_norm: "group_rms" or "none".
    eps: > 0.

  Returns:
    [G, T] float32 turn advantages; exactly 0.0 on padded turns and invalid samples.

  Raises:
    ValueError: shapes disagree (message names the argument and [G], [G,T+1], [G,T]), or a knob is invalid.

  Source:
  "Of Errors and Echoes: Responsibility-Aware Credit Assignment for Tool-Use Agents"; docs/credit.md, "TRACE".
  """
  fn = "trace_advantages"
  beta = _checks.knob_float(fn, "beta", beta, ge=0.0)
  scale = _checks.knob_choice(fn, "scale", scale, outcome.SCALES)
  dense_norm = _checks.knob_choice(fn, "dense_norm", dense_norm, DENSE_NORMS)
  eps = _checks.knob_float(fn, "eps", eps, gt=0.0)
  shapes = _checks.Shapes(fn)
  rewards_G = shapes.float("rewards", rewards, "G")
  gold_GxT1 = shapes.float("gold_logp", gold_logp, "G,T+1")
  bmask_GxT1 = shapes.mask("boundary_mask", boundary_mask, "G,T+1")
  turn_GxT = shapes.mask("turn_mask", turn_mask, "G,T")
  sample_G = shapes.mask("sample_mask", sample_mask, "G")

  valid_G = sample_G & jnp.isfinite(rewards_G)
  out_G = outcome.group_normalise(rewards_G, sample_G, scale=scale, eps=eps)
  r_GxT = _td_rewards(gold_GxT1, bmask_GxT1)
  keep_GxT = turn_GxT & valid_G[:, None]
  if dense_norm == "group_rms":
    bvalid_GxT1 = bmask_GxT1 & jnp.isfinite(gold_GxT1)
    dense_GxT = keep_GxT & bvalid_GxT1[:, :1] & bvalid_GxT1[:, 1:]
    n_dense = jnp.sum(dense_GxT, dtype=jnp.int32)
    sq = jnp.sum(jnp.where(dense_GxT, r_GxT * r_GxT, 0.0))
    rms = jnp.sqrt(sq / jnp.maximum(n_dense, 1).astype(jnp.float32))
    r_GxT = jnp.where(n_dense > 0, r_GxT / (rms + eps), 0.0)
  return jnp.where(keep_GxT, out_G[:, None] + beta * r_GxT, 0.0)
