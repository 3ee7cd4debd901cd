"""TRACE: turn credit from a frozen reference's log-probability of the gold answer at every tool-call boundary.

Source: "TRACE: Turn-level Reward Assignment via Credit Estimation for Long-Horizon Agents", Tao et al., arXiv
2607.13988, Sec. 3.2-3.3 (Eq. 6-12) and Algorithm 1. The paper's pipeline, one function per step:

  trace_state_values   V_t = log(d_0 / d_t),  d_t = −ℓ̄_t + ε          (state value, Eq. 6-7)
  trace_td_rewards     δ_t = V_{t+1} − V_t   (one-step TD of V)
  trace_turn_rewards   r_t = K-step discounted mean of δ + terminal fill
  trace_advantages     A_t = α_out · A_out + α_turn · r_t              (mixing, Eq. 10-12)

The terminal fill λ_term · γ^(n−t) · A_out is Algorithm 1's, as this project's specification (v2.0) writes it.
Where the paper leaves a detail open, the reading taken here (docs/methods/trace.md, lists them all):
- the K-step window is cut at the last transition and normalised by the discounts it actually uses;
- the final-answer turn gets the outcome term only (the paper has a final-answer token rule that the sources at
  hand do not define);
- ε = 0.1 in training (the appendix's worked example uses ε = 0.001);
- a boundary whose scoring failed is skipped, never read as log p = 0 (the paper scores every boundary).

ℓ̄_t is the frozen reference's mean per-token log-probability of the gold answer y* given the boundary state s_t
(s_0: before the first assistant turn; s_t: right after the t-th tool observation), in nats.

Shape letters: G rollouts in a group, T turns, T+1 boundaries (s_0 .. s_T). A batch of P groups:
`jax.vmap(functools.partial(trace_advantages, alpha_turn=0.2))(rewards_PxG, gold_logp_PxGxT1,
boundary_mask_PxGxT1, turn_mask_PxGxT, sample_mask_PxG)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcredit.credit import _checks, _stats, outcome

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

VALUES = ("log_ratio", "raw_delta")
STDS = {"population": 0, "sample": 1}  # std name -> ddof
DENSE_NORMS = ("none", "group_rms")


def _value_knobs(fn: str, gap_eps: float, value: str) -> tuple[float, str]:
  return _checks.knob_float(fn, "gap_eps", gap_eps, gt=0.0), _checks.knob_choice(fn, "value", value, VALUES)


def _turn_knobs(fn: str, td_horizon: int, td_gamma: float, terminal_scale: float) -> tuple[int, float, float]:
  return (
    _checks.knob_int(fn, "td_horizon", td_horizon, ge=0),
    _checks.knob_float(fn, "td_gamma", td_gamma, ge=0.0, le=1.0),
    _checks.knob_float(fn, "terminal_scale", terminal_scale, ge=0.0),
  )


def _potential(gold_T1: Array, gap_eps: float, value: str) -> Array:
  """Φ_t with V_t = Φ_t − Φ_0: −log d_t (log_ratio) or ℓ̄_t (raw_delta).

  A mean log-probability above 0 is rounding (a log-probability is <= 0): it is read as 0, so d_t = gap_eps.
  Differences of Φ make a redundant call (equal ℓ̄) exactly 0 and keep δ telescoping to V_last.
  """
  if value == "raw_delta":
    return gold_T1
  return -jnp.log(gap_eps - jnp.minimum(gold_T1, 0.0))


def _valid(gold_T1: Array, mask_T1: Array) -> Array:
  return mask_T1 & jnp.isfinite(gold_T1)


def _state_values(gold_T1: Array, valid_T1: Array, gap_eps: float, value: str) -> Array:
  phi_T1 = _potential(jnp.where(valid_T1, gold_T1, 0.0), gap_eps, value)
  return jnp.where(valid_T1 & valid_T1[..., :1], phi_T1 - phi_T1[..., :1], 0.0)


def _td_rewards(gold_T1: Array, valid_T1: Array, gap_eps: float, value: str) -> tuple[Array, Array]:
  """(δ[..., T], has_next[..., T]) on checked arrays; any leading batch axes (the boundary axis is last)."""
  phi_T1 = _potential(jnp.where(valid_T1, gold_T1, 0.0), gap_eps, value)
  iota_T1 = lax.broadcasted_iota(jnp.int32, gold_T1.shape, gold_T1.ndim - 1)
  # p(t): the latest valid boundary <= t; a failed score is skipped, never read as log p = 0.
  latest_T1 = lax.cummax(jnp.where(valid_T1, iota_T1, -1), axis=gold_T1.ndim - 1)
  prev_T = jnp.take_along_axis(phi_T1, jnp.maximum(latest_T1[..., :-1], 0), axis=-1)
  has_next_T = valid_T1[..., 1:] & valid_T1[..., :1]
  return jnp.where(has_next_T, phi_T1[..., 1:] - prev_T, 0.0), has_next_T


def _turn_rewards(
  delta_T: Array, has_next_T: Array, outcome_adv: Array, td_horizon: int, td_gamma: float, terminal_scale: float
) -> Array:
  """trace_turn_rewards for one rollout on checked inputs: δ[T], has_next[T], A_out scalar -> r[T]."""
  num_turns = delta_T.shape[0]
  if num_turns == 0:
    return jnp.zeros((0,), jnp.float32)
  t_T = jnp.arange(num_turns, dtype=jnp.int32)
  n = jnp.max(jnp.where(has_next_T, t_T + 1, 0))  # the number of transitions up to the last scored one
  live_T = t_T < n
  if td_horizon > 0:
    # W[t, s] = γ^(s − t) for t <= s < min(t + K, n): the K-step window, cut at the trajectory's last transition.
    steps = np.arange(num_turns)[None, :] - np.arange(num_turns)[:, None]
    disc_TxT = np.where((steps >= 0) & (steps < td_horizon), np.power(td_gamma, np.maximum(steps, 0)), 0.0)
    w_TxT = jnp.where(t_T[None, :] < n, jnp.asarray(disc_TxT, jnp.float32), 0.0)
    den_T = jnp.sum(w_TxT, axis=1)
    window_T = jnp.where(den_T > 0, (w_TxT @ delta_T) / jnp.where(den_T > 0, den_T, 1.0), 0.0)
  else:
    window_T = jnp.zeros((num_turns,), jnp.float32)
  # Terminal fill where the window reaches the last transition (t + K − 1 >= n − 1; K = 0: t = n − 1 only).
  reaches_T = live_T & (t_T + max(td_horizon, 1) - 1 >= n - 1)
  adv = jnp.where(jnp.isfinite(outcome_adv), outcome_adv, 0.0)
  fill_T = terminal_scale * jnp.power(jnp.float32(td_gamma), (n - t_T).astype(jnp.float32)) * adv
  return jnp.where(live_T, window_T + jnp.where(reaches_T, fill_T, 0.0), 0.0)


def trace_state_values(
  gold_logp: ArrayLike, boundary_mask: ArrayLike, *, gap_eps: float = 0.1, value: str = "log_ratio"
) -> Array:
  """TRACE's state values of one rollout: the log-ratio of the remaining gap to the gold answer.

      d_t = −ℓ̄_t + gap_eps                                  (remaining gap; ε = gap_eps)
      V_t = log(d_0 / d_t)                                  (value="log_ratio", the paper's)
      V_t = ℓ̄_t − ℓ̄_0                                       (value="raw_delta", the paper's ablation row)

  V_0 = 0, and V rises as the gold answer becomes predictable; the same raw gain in ℓ̄ is worth more near the
  answer (small d) than far from it. A mean log-probability above 0 is read as 0 (rounding). An invalid boundary
  (mask False or a non-finite ℓ̄) gives 0.0, and every V is 0.0 when boundary 0 is invalid.
  Batch: `jax.vmap(trace_state_values)(gold_logp_BxT1, boundary_mask_BxT1)`.

  Args:
    gold_logp: [T+1] float, ℓ̄_t: the frozen reference's mean per-token log-probability of the gold answer given
      boundary state s_t, nats (<= 0).
    boundary_mask: [T+1] bool, False where s_t does not exist or its scoring failed.
    gap_eps: > 0, the paper's ε (0.1), part of the definition of d_t.
    value: "log_ratio" or "raw_delta".

  Returns:
    V: [T+1] float32.

  Raises:
    ValueError: `gold_logp` is not [T+1], `boundary_mask` does not match it, or a knob is invalid.

  Source: "TRACE: Turn-level Reward Assignment via Credit Estimation for Long-Horizon Agents", Tao et al., arXiv
  2607.13988, Sec. 3.2, Eq. 6-7 (state value); the value-definition ablation's "raw log-probability delta" row
  (value="raw_delta": 32.4 against the log-ratio's 35.5 on BrowseComp-Plus, Qwen3-4B).
  Appendix example (gap_eps=0.001): ℓ̄ = [−5.1187, −1.5712] gives V_1 = 1.1806; [−10.6570, −7.1061] gives 0.4052.
  """
  fn = "trace_state_values"
  gap_eps, value = _value_knobs(fn, gap_eps, value)
  shapes = _checks.Shapes(fn)
  gold_T1 = shapes.float("gold_logp", gold_logp, "T+1")
  valid_T1 = _valid(gold_T1, shapes.mask("boundary_mask", boundary_mask, "T+1"))
  return _state_values(gold_T1, valid_T1, gap_eps, value)


def trace_td_rewards(
  gold_logp: ArrayLike, boundary_mask: ArrayLike, *, gap_eps: float = 0.1, value: str = "log_ratio"
) -> Array:
  """TRACE's one-step TD rewards of one rollout: the change in state value each turn's action brings.

      δ_t = V_{t+1} − V_{p(t)}   if boundary t+1 is valid, else 0,      t = 0 .. T−1
      p(t) = the latest valid boundary <= t

  Turn t's action leads from s_t to s_{t+1}. A failed score is skipped, never read as log p = 0; if boundary 0 is
  invalid every δ is 0. Telescoping: Σ_t δ_t = V_last over the valid boundaries; a redundant tool call (the same
  ℓ̄ as the previous valid boundary) gets exactly 0 and leaves every other δ unchanged. The final-answer turn has
  no next boundary, so its δ is 0. Batch: `jax.vmap(trace_td_rewards)(gold_logp_BxT1, boundary_mask_BxT1)`.

  Args:
    gold_logp: [T+1] float, ℓ̄_t per boundary (see `trace_state_values`), nats.
    boundary_mask: [T+1] bool, valid boundaries.
    gap_eps: > 0, ε of the remaining gap.
    value: "log_ratio" (paper) or "raw_delta" (its ablation row).

  Returns:
    δ: [T] float32.

  Raises:
    ValueError: shapes disagree or a knob is invalid.

  Source: "TRACE: Turn-level Reward Assignment via Credit Estimation for Long-Horizon Agents", Tao et al., arXiv
  2607.13988, Sec. 3.3 (one-step TD of the state value; Algorithm 1). Skipping invalid boundaries is ours (the
  paper scores every boundary).
  Example (gap_eps=0.1): ℓ̄ = [−5, −3, −3, −1, 0] gives δ = [0.497838, 0, 1.036092, 2.397895].
  """
  fn = "trace_td_rewards"
  gap_eps, value = _value_knobs(fn, gap_eps, value)
  shapes = _checks.Shapes(fn)
  gold_T1 = shapes.float("gold_logp", gold_logp, "T+1")
  valid_T1 = _valid(gold_T1, shapes.mask("boundary_mask", boundary_mask, "T+1"))
  return _td_rewards(gold_T1, valid_T1, gap_eps, value)[0]


def trace_turn_rewards(
  gold_logp: ArrayLike,
  boundary_mask: ArrayLike,
  outcome_adv: ArrayLike,
  *,
  gap_eps: float = 0.1,
  value: str = "log_ratio",
  td_horizon: int = 3,
  td_gamma: float = 0.8,
  terminal_scale: float = 2.0,
) -> Array:
  """TRACE's turn credit of one rollout: a K-step discounted look-ahead of δ plus a terminal fill.

      n   = 1 + the last turn with a valid next boundary (the last transition; 0 if none)
      K'  = min(K, n − t)
      c_t = Σ_{j<K'} γ^j δ_{t+j} / Σ_{j<K'} γ^j                 (K = td_horizon; K = 0: c_t = 0)
      fill_t = λ_term · γ^(n−t) · A_out   where t + K − 1 >= n − 1 (the window reaches the end; K = 0: t = n − 1)
      r_t = c_t + fill_t   for t < n;   r_t = 0 for t >= n (the final answer: the outcome term carries it)

  K = 0 is the paper's ablation with no dense look-ahead (TRACE then differs from GRPO by the fill only).
  A non-finite `outcome_adv` is read as 0. Batch: `jax.vmap(trace_turn_rewards)` over leading axes.

  Args:
    gold_logp: [T+1] float, ℓ̄_t per boundary, nats.
    boundary_mask: [T+1] bool, valid boundaries.
    outcome_adv: scalar float, A_out of this rollout (`trace_advantages` passes the group-standardised outcome).
    gap_eps: > 0, ε of the remaining gap.
    value: "log_ratio" or "raw_delta".
    td_horizon: int >= 0, K.
    td_gamma: in [0, 1], γ.
    terminal_scale: >= 0, λ_term.

  Returns:
    r: [T] float32.

  Raises:
    ValueError: shapes disagree (`outcome_adv` must be a scalar) or a knob is invalid.

  Source: "TRACE: Turn-level Reward Assignment via Credit Estimation for Long-Horizon Agents", Tao et al., arXiv
  2607.13988, Sec. 3.3 and Algorithm 1 (K-step look-ahead, terminal fill; K = 3, γ = 0.8, λ_term = 2); the K = 0
  ablation. Our reading where the paper is open: the window cut at n with its own normaliser (module docstring).
  Example: ℓ̄ = [−5, −3, −3, −1, 0], A_out = 1: r = [0.475794, 1.992658, 2.921338, 3.997895].
  """
  fn = "trace_turn_rewards"
  gap_eps, value = _value_knobs(fn, gap_eps, value)
  td_horizon, td_gamma, terminal_scale = _turn_knobs(fn, td_horizon, td_gamma, terminal_scale)
  shapes = _checks.Shapes(fn)
  gold_T1 = shapes.float("gold_logp", gold_logp, "T+1")
  valid_T1 = _valid(gold_T1, shapes.mask("boundary_mask", boundary_mask, "T+1"))
  adv = shapes.float("outcome_adv", outcome_adv, "")
  delta_T, has_next_T = _td_rewards(gold_T1, valid_T1, gap_eps, value)
  return _turn_rewards(delta_T, has_next_T, adv, td_horizon, td_gamma, terminal_scale)


def trace_advantages(
  rewards: ArrayLike,
  gold_logp: ArrayLike,
  boundary_mask: ArrayLike,
  turn_mask: ArrayLike,
  sample_mask: ArrayLike | None = None,
  *,
  alpha_out: float = 1.0,
  alpha_turn: float = 0.2,
  gap_eps: float = 0.1,
  value: str = "log_ratio",
  td_horizon: int = 3,
  td_gamma: float = 0.8,
  terminal_scale: float = 2.0,
  std: str = "population",
  dense_norm: str = "none",
  eps: float = 1e-6,
) -> Array:
  """TRACE's turn advantages for one group: the outcome advantage plus the turn credit.

      A_out[g] = (R_g − μ) / (σ + eps)  over the valid samples; σ the population std (std="population",
                 the paper's) or ddof=1 (std="sample"); 0 for a zero-variance group or < 2 valid samples
      r[g]     = trace_turn_rewards(gold_logp[g], boundary_mask[g], A_out[g], ...)             [G, T]
      r~       = r                                    (dense_norm="none", the paper's: credit stays per rollout)
      r~       = r / (sqrt(mean_D r²) + eps)          (dense_norm="group_rms", this library's v1 scaling; D =
                                                       real turns of valid samples whose next boundary is valid;
                                                       r~ = 0 when D is empty)
      A[g, t]  = alpha_out · A_out[g] + alpha_turn · r~[g, t]   on real turns of valid samples, else 0

  σ and the RMS are taken of values divided by a power of two near their largest magnitude (exact, see
  `outcome.group_normalise`), so rewards and gold log-probs of any float32 scale are normalised alike.
  The final-answer turn (t >= n) gets alpha_out · A_out. alpha_turn = 0 gives GRPO (population std) broadcast to
  turns. Dense terms apply to valid samples even when the group has < 2 valid samples (A_out = 0 there, so the
  fill is 0 too). Tokens: `turn_to_token(A[g], turn_ids[g], action_mask[g])`. Batch: vmap over a leading P axis.

  Args:
    rewards: [G] float outcome rewards (NaN/inf marks the sample invalid).
    gold_logp: [G, T+1] float, ℓ̄_t per boundary (the reference's mean per-token gold-answer log-prob), nats.
    boundary_mask: [G, T+1] bool, valid boundaries.
    turn_mask: [G, T] bool, real turns.
    sample_mask: [G] bool or None (all True).
    alpha_out: >= 0, α_out.
    alpha_turn: >= 0, α_turn.
    gap_eps: as `trace_turn_rewards` (so are value, td_horizon, td_gamma and terminal_scale).
    std: "population" or "sample".
    dense_norm: "none" or "group_rms".
    eps: > 0, added to σ (and to the RMS).

  Returns:
    [G, T] float32 turn advantages; exactly 0.0 on padded turns and invalid samples.

  Raises:
    ValueError: shapes disagree (the message names the argument and [G], [G,T+1], [G,T]), or a knob is invalid.

  Source: "TRACE: Turn-level Reward Assignment via Credit Estimation for Long-Horizon Agents", Tao et al., arXiv
  2607.13988, Sec. 3.3, Eq. 10-12 (mixing; α_out = 1, α_turn = 0.2; A_out with the population std; the dense
  term stays trajectory-local, not normalised over the group). dense_norm="group_rms" and std="sample" are not
  the paper's (this library's v1).
  Example: rewards [1, 0, 0, 1], ℓ̄ row 0 = [−5, −3, −3, −1, 0] (4 transitions, 5 turns): A row 0 =
  [1.095157, 1.398529, 1.584265, 1.799576, 0.999998].
  """
  fn = "trace_advantages"
  alpha_out = _checks.knob_float(fn, "alpha_out", alpha_out, ge=0.0)
  alpha_turn = _checks.knob_float(fn, "alpha_turn", alpha_turn, ge=0.0)
  gap_eps, value = _value_knobs(fn, gap_eps, value)
  td_horizon, td_gamma, terminal_scale = _turn_knobs(fn, td_horizon, td_gamma, terminal_scale)
  std = _checks.knob_choice(fn, "std", std, tuple(STDS))
  dense_norm = _checks.knob_choice(fn, "dense_norm", dense_norm, DENSE_NORMS)
  eps = _checks.knob_float(fn, "eps", eps, gt=0.0)
  shapes = _checks.Shapes(fn)
  rewards_G = shapes.float("rewards", rewards, "G")
  gold_GxT1 = shapes.float("gold_logp", gold_logp, "G,T+1")
  bmask_GxT1 = shapes.mask("boundary_mask", boundary_mask, "G,T+1")
  turn_GxT = shapes.mask("turn_mask", turn_mask, "G,T")
  sample_G = shapes.mask("sample_mask", sample_mask, "G")

  valid_G = sample_G & jnp.isfinite(rewards_G)
  out_G = outcome.group_normalise(rewards_G, sample_G, scale="group", eps=eps, ddof=STDS[std])
  delta_GxT, has_next_GxT = _td_rewards(gold_GxT1, _valid(gold_GxT1, bmask_GxT1), gap_eps, value)
  r_GxT = jax.vmap(lambda d, h, a: _turn_rewards(d, h, a, td_horizon, td_gamma, terminal_scale))(
    delta_GxT, has_next_GxT, out_G
  )
  keep_GxT = turn_GxT & valid_G[:, None]
  if dense_norm == "group_rms":
    dense_GxT = keep_GxT & has_next_GxT
    n_dense = jnp.sum(dense_GxT, dtype=jnp.int32)
    # Scaled by a power of two near the largest |r| (exact, `_stats`), so r² neither overflows nor underflows.
    rs_GxT, k = _stats.scaled(r_GxT, dense_GxT)
    sq_GxT = jnp.where(dense_GxT, rs_GxT * rs_GxT, 0.0)
    denom = jnp.sqrt(jnp.sum(sq_GxT) / jnp.maximum(n_dense, 1).astype(jnp.float32)) + _stats.ldexp(jnp.float32(eps), -k)
    r_GxT = jnp.where(n_dense > 0, rs_GxT / jnp.where(denom > 0, denom, 1.0), 0.0)
  return jnp.where(keep_GxT, alpha_out * out_G[:, None] + alpha_turn * r_GxT, 0.0)
