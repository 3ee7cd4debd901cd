"""Outcome baselines: GRPO, Dr.GRPO, RLOO, and the turn -> token broadcast.

Shape letters: G rollouts in a group, T turns, L tokens. Each function handles one group or one rollout;
for a batch of P groups, vmap over the leading axis:

  adv_PxG = jax.vmap(functools.partial(grpo_advantages, scale="none"))(rewards_PxG, mask_PxG)
  adv_PxGxL = jax.vmap(jax.vmap(turn_to_token))(turn_adv_PxGxT, turn_ids_PxGxL, action_mask_PxGxL)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxcredit.credit import _checks, _stats

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

SCALES = ("group", "none")


def group_normalise(x_GxK: Array, valid_GxK: Array, *, scale: str, eps: float, ddof: int = 1) -> Array:
  """GRPO-normalises each column of `x_GxK` over its valid rows (axis 0). Inputs are already checked.

  The std divides by n − ddof: ddof=1 (unbiased, as verl, TRL and OpenRLHF) or ddof=0 (the population std, as
  TRACE's outcome term).

  Statistics are taken on values shifted by the column's first valid entry: the result is the same, float32
  keeps more digits, and a column whose valid values are all equal becomes exactly 0 after the shift, so it
  gives exactly 0 with no special case. Columns with fewer than 2 valid rows give 0.

  Scale-invariant: each column is first divided by a power of two near its largest valid magnitude
  (`_stats.scaled`, exact), and eps by the same power, so rewards of 1e20 or 1e-20 are normalised like rewards
  of 1 (their squares would overflow or underflow float32) and ordinary inputs give bit-identical results.
  scale="none" returns R − μ in the rewards' unit, which is inf only where the exact value exceeds float32.
  """
  valid_GxK = valid_GxK & jnp.isfinite(x_GxK)
  n_K = jnp.sum(valid_GxK, axis=0, dtype=jnp.int32)
  xs_GxK, k_1xK = _stats.scaled(x_GxK, valid_GxK, axis=0)
  first_1xK = jnp.argmax(valid_GxK, axis=0)[None]
  x0_1xK = jnp.take_along_axis(xs_GxK, first_1xK, axis=0)
  y_GxK = jnp.where(valid_GxK, xs_GxK - x0_1xK, 0.0)
  mean_K = jnp.sum(y_GxK, axis=0) / jnp.maximum(n_K, 1).astype(jnp.float32)
  dev_GxK = jnp.where(valid_GxK, y_GxK - mean_K, 0.0)
  if scale == "group":
    var_K = jnp.sum(dev_GxK * dev_GxK, axis=0) / jnp.maximum(n_K - ddof, 1).astype(jnp.float32)
    # eps · 2^-k can flush to 0 (tiny eps, huge rewards); the denominator is then 0 only where every dev is 0.
    denom_1xK = jnp.sqrt(var_K) + _stats.ldexp(jnp.float32(eps), -k_1xK)
    dev_GxK = dev_GxK / jnp.where(denom_1xK > 0, denom_1xK, 1.0)
  else:
    dev_GxK = _stats.ldexp(dev_GxK, k_1xK)
  return jnp.where(valid_GxK & (n_K >= 2), dev_GxK, 0.0)


def check_normalise_knobs(fn: str, scale: str, eps: float) -> tuple[str, float]:
  """`group_normalise`'s knobs for the public function `fn`: scale one of SCALES, eps > 0 and finite."""
  return _checks.knob_choice(fn, "scale", scale, SCALES), _checks.knob_float(fn, "eps", eps, gt=0.0)


def grpo_advantages(
  rewards: ArrayLike, sample_mask: ArrayLike | None = None, *, scale: str = "group", eps: float = 1e-6
) -> Array:
  """GRPO (scale="group") or Dr.GRPO (scale="none") outcome advantages for one group.

      valid_g = sample_mask_g ∧ isfinite(R_g),   n = Σ_g valid_g
      μ = mean_{valid} R,   σ = std_{valid}(R, ddof=1)
      A_g = (R_g − μ) / (σ + eps)   (scale="group")
      A_g = R_g − μ                 (scale="none", Dr.GRPO)
      A_g = 0 if g is invalid, if n < 2, or if all valid R are equal (exactly 0).

  Statistics are computed on R shifted by the first valid reward (same value, better float32 precision) and
  divided by a power of two near the largest |R| (exact): A(c·R) = A(R) for any c > 0 while σ dominates eps,
  from rewards of 1e-30 to 1e30 (a float32 variance of raw rewards overflows above about 1e19).
  Batch of groups: `jax.vmap(grpo_advantages)(rewards_PxG, mask_PxG)`; under `jax.jit` pass `scale` and
  `eps` as static arguments.

  Args:
    rewards: [G] float, the scalar reward of each rollout. NaN/inf marks the sample invalid.
    sample_mask: [G] bool or None (all True); False marks a rollout to exclude (e.g. no action tokens).
    scale: "group" (divide by the group std) or "none" (Dr.GRPO, centring only).
    eps: > 0, added to σ.

  Returns:
    [G] float32 advantages; exactly 0.0 on invalid samples.

  Raises:
    ValueError: `rewards` is not [G], `sample_mask` is not [G], `scale` is unknown or `eps` <= 0.

  Source: Shao et al. 2024, "DeepSeekMath" (GRPO); Liu et al. 2025, "Understanding R1-Zero-Like Training"
  (Dr.GRPO); docs/methods/outcome.md.
  """
  fn = "grpo_advantages"
  scale, eps = check_normalise_knobs(fn, scale, eps)
  shapes = _checks.Shapes(fn)
  rewards_G = shapes.float("rewards", rewards, "G")
  mask_G = shapes.mask("sample_mask", sample_mask, "G")
  return group_normalise(rewards_G, mask_G, scale=scale, eps=eps)


def rloo_advantages(rewards: ArrayLike, sample_mask: ArrayLike | None = None) -> Array:
  """REINFORCE leave-one-out advantages for one group.

      A_i = R_i − mean_{j ≠ i, valid} R_j = R_i − (Σ_{valid} R − R_i) / (n − 1)

  Invalid samples (masked or non-finite reward) neither get nor give a baseline; A is 0 on them, and 0 for
  every sample when n < 2. Computed on rewards shifted by the first valid one, so equal rewards give exactly 0,
  and divided by a power of two near the largest (exact), so rewards up to float32's largest never overflow.
  Batch of groups: `jax.vmap(rloo_advantages)(rewards_PxG, mask_PxG)`.

  Args:
    rewards: [G] float rewards.
    sample_mask: [G] bool or None (all True).

  Returns:
    [G] float32 advantages; exactly 0.0 on invalid samples.

  Raises:
    ValueError: `rewards` or `sample_mask` is not [G].

  Source: Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!"; Ahmadian et al. 2024,
  "Back to Basics: Revisiting REINFORCE Style Optimization" (RLOO); docs/methods/outcome.md.
  """
  shapes = _checks.Shapes("rloo_advantages")
  rewards_G = shapes.float("rewards", rewards, "G")
  valid_G = shapes.mask("sample_mask", sample_mask, "G") & jnp.isfinite(rewards_G)
  n = jnp.sum(valid_G, dtype=jnp.int32)
  # Scaled by a power of two near the largest reward (exact; see group_normalise), so the sums never overflow.
  xs_G, k_1 = _stats.scaled(rewards_G, valid_G)
  y_G = jnp.where(valid_G, xs_G - xs_G[jnp.argmax(valid_G)], 0.0)
  others_mean_G = (jnp.sum(y_G) - y_G) / jnp.maximum(n - 1, 1).astype(jnp.float32)
  return jnp.where(valid_G & (n >= 2), _stats.ldexp(y_G - others_mean_G, k_1), 0.0)


def turn_to_token(turn_values: ArrayLike, turn_ids: ArrayLike, action_mask: ArrayLike) -> Array:
  """Broadcasts per-turn values onto the action tokens of one rollout.

      out_i = turn_values[turn_ids_i]  if action_mask_i and 0 <= turn_ids_i < T, else 0

  A non-finite turn value is treated as masked (0). Batch: `jax.vmap(turn_to_token)` over leading axes.

  Args:
    turn_values: [T] float, one value per turn (or per verified unit U).
    turn_ids: [L] int32, the turn index of each action token, -1 on other tokens.
    action_mask: [L] bool, True on tokens the policy generated.

  Returns:
    [L] float32; exactly 0.0 off the action tokens and on tokens whose turn id is outside [0, T).

  Raises:
    ValueError: wrong rank, mismatched lengths of `turn_ids` / `action_mask`, or non-integer `turn_ids`.

  Source: docs/methods/outcome.md.
  """
  shapes = _checks.Shapes("turn_to_token")
  values_T = shapes.float("turn_values", turn_values, "T")
  ids_L = shapes.index("turn_ids", turn_ids, "L")
  action_L = shapes.mask("action_mask", action_mask, "L")
  return gather_turns(values_T, ids_L, action_L)


def gather_turns(values_T: Array, ids_L: Array, action_L: Array) -> Array:
  """turn_to_token on checked arrays."""
  num_turns = values_T.shape[0]
  inside_L = action_L & (ids_L >= 0) & (ids_L < num_turns)
  if num_turns == 0:
    return jnp.zeros(ids_L.shape, jnp.float32)
  out_L = values_T[jnp.clip(ids_L, 0, num_turns - 1)]
  return jnp.where(inside_L & jnp.isfinite(out_L), out_L, 0.0)
