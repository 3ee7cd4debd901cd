"""Policy-gradient loss pieces (optax style: small functions, combined by the caller).

Shape letters: B sequences, L tokens. Log-probs are in nats. Every aggregation returns a
(numerator, denominator) pair so that summing both over micro-batches and dividing once gives exactly
the full-batch value (spec: credit.md, "Losses").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxcredit.credit.numerics import expm1_minus_x

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")


def ppo_clip_token_loss(
  logp_BxL: jax.Array,
  behavior_logp_BxL: jax.Array,
  adv_BxL: jax.Array,
  *,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  dual_clip: float | None = None,
  max_log_ratio: float = 20.0,
) -> tuple[jax.Array, jax.Array]:
  """Per-token PPO clipped surrogate loss (to minimise).

    ρ = exp(clamp(logp - logp_behavior, ±max_log_ratio))
    ℓ = -min(ρ·A, clip(ρ, 1-eps_low, 1+eps_high)·A)
    dual clip (A < 0): ℓ = min(ℓ, -dual_clip·A)

  Sources: Schulman et al. 2017 (PPO); DAPO (Yu et al. 2025) for asymmetric eps; Ye et al. 2020 for the
  dual clip.

  Args:
    logp_BxL: float32 log-probs of the sampled tokens under the current policy.
    behavior_logp_BxL: float32 log-probs recorded when sampling (no gradient flows into them).
    adv_BxL: float32 token advantages (no gradient).
    eps_low, eps_high: clip range below and above 1.
    dual_clip: c > 1 bounds the loss of negative-advantage tokens, or None.
    max_log_ratio: clamp on the log-ratio before exp, so a stale token cannot overflow.

  Returns:
    (loss_BxL, clipped_BxL): float32 loss per token and a float32 0/1 indicator of tokens whose ratio
    was clipped (for the clip-fraction metric).

  Raises:
    ValueError: if eps_low/eps_high are negative or dual_clip <= 1.
  """
  if eps_low < 0 or eps_high < 0:
    raise ValueError(f"eps_low ({eps_low}) and eps_high ({eps_high}) must be >= 0")
  if dual_clip is not None and dual_clip <= 1:
    raise ValueError(f"dual_clip must be > 1 or None, got {dual_clip}")
  adv = jax.lax.stop_gradient(adv_BxL.astype(jnp.float32))
  log_ratio = jnp.clip(logp_BxL - jax.lax.stop_gradient(behavior_logp_BxL), -max_log_ratio, max_log_ratio)
  ratio = jnp.exp(log_ratio)
  unclipped = ratio * adv
  clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
  loss = -jnp.minimum(unclipped, clipped)
  if dual_clip is not None:
    loss = jnp.where(adv < 0, jnp.minimum(loss, -dual_clip * adv), loss)
  was_clipped = (clipped < unclipped).astype(jnp.float32)
  return loss, was_clipped


def aggregate(
  values_BxL: jax.Array,
  mask_BxL: jax.Array,
  mode: str = "token-mean",
  *,
  max_len: int | None = None,
  seq_ids_BxL: jax.Array | None = None,
  num_seqs: jax.Array | float | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Reduces per-token values to a (numerator, denominator) pair; the loss is numerator / denominator.

    token-mean:               Σ_b Σ_i m·v / Σ_b Σ_i m
    seq-mean-token-mean:      Σ_b (Σ_i m·v / Σ_i m) / B'      (B' = sequences with a token)
    seq-mean-token-sum:       Σ_b Σ_i m·v / B'
    seq-mean-token-sum-norm:  Σ_b Σ_i m·v / (B·max_len)       (Dr.GRPO: a constant denominator)

  A sequence is a row, or with `seq_ids_BxL` (packed batches, `jaxcredit.train.loop.update.pack_update_batch`) the tokens of a row
  sharing an id. For micro-batching, sum numerators and denominators over micro-batches and divide once (a
  sequence must not straddle two micro-batches).

  Args:
    values_BxL: float32 per-token values.
    mask_BxL: bool/0-1 mask of tokens that count.
    mode: one of AGGREGATIONS.
    max_len: the constant L_max of seq-mean-token-sum-norm (default: L of the input).
    seq_ids_BxL: int sequence of each token within its row, in [0, L) (default: one sequence per row).
    num_seqs: B of seq-mean-token-sum-norm, sequences without a token included (default: the rows).

  Returns:
    (numerator, denominator) float32 scalars.

  Raises:
    ValueError: for an unknown mode or mismatched shapes.
  """
  if values_BxL.shape != mask_BxL.shape or values_BxL.ndim != 2:
    raise ValueError(f"values_BxL {values_BxL.shape} and mask_BxL {mask_BxL.shape} must both be [B, L]")
  if seq_ids_BxL is not None and seq_ids_BxL.shape != mask_BxL.shape:
    raise ValueError(f"seq_ids_BxL {seq_ids_BxL.shape} must have the shape of mask_BxL {mask_BxL.shape}")
  if mode not in AGGREGATIONS:
    raise ValueError(f"aggregation mode must be one of {AGGREGATIONS}, got {mode!r}")
  m = mask_BxL.astype(jnp.float32)
  v = jnp.where(m > 0, values_BxL, 0.0)
  if mode == "token-mean":
    return jnp.sum(v * m), jnp.sum(m)
  if mode == "seq-mean-token-sum-norm":
    length = values_BxL.shape[1] if max_len is None else max_len
    seqs = values_BxL.shape[0] if num_seqs is None else num_seqs
    return jnp.sum(v * m), jnp.asarray(seqs, jnp.float32) * length
  if seq_ids_BxL is None:
    per_seq_sum, per_seq_count = jnp.sum(v * m, axis=1), jnp.sum(m, axis=1)
  else:
    b, l = values_BxL.shape
    ids = (jnp.arange(b, dtype=jnp.int32)[:, None] * l + seq_ids_BxL.astype(jnp.int32)).reshape(-1)
    n = values_BxL.size
    per_seq_sum = jax.ops.segment_sum((v * m).reshape(-1), ids, num_segments=n)
    per_seq_count = jax.ops.segment_sum(m.reshape(-1), ids, num_segments=n)
  has_tokens = (per_seq_count > 0).astype(jnp.float32)
  if mode == "seq-mean-token-mean":
    return jnp.sum(per_seq_sum / jnp.maximum(per_seq_count, 1.0)), jnp.sum(has_tokens)
  return jnp.sum(per_seq_sum), jnp.sum(has_tokens)


def kl_penalty(logp_BxL: jax.Array, ref_logp_BxL: jax.Array, kind: str = "k3", *, clamp: float = 10.0) -> jax.Array:
  """Per-token estimate of KL(π ‖ π_ref) from the sampled token's log-probs (Schulman 2020, "Approximating
  KL divergence").

    k1 = log π - log π_ref;  k2 = ½ (log π - log π_ref)²;  k3 = exp(log π_ref - log π) - (log π_ref - log π) - 1

  k3 is evaluated by `credit.numerics.expm1_minus_x`, accurate to a few ulps relative however close the
  policies are (the direct form above is pure rounding below a log-ratio of about 3e-4).

  Args:
    logp_BxL: float32 current-policy log-probs of the sampled tokens.
    ref_logp_BxL: float32 reference log-probs of the same tokens (no gradient).
    kind: "k1", "k2" or "k3" (k3 is non-negative and low-variance).
    clamp: the log-ratio is clamped to ±clamp before exp.

  Raises:
    ValueError: for an unknown kind.
  """
  if kind not in KL_ESTIMATORS:
    raise ValueError(f"kl estimator must be one of {KL_ESTIMATORS}, got {kind!r}")
  log_ratio = jnp.clip(jax.lax.stop_gradient(ref_logp_BxL) - logp_BxL, -clamp, clamp)
  if kind == "k1":
    return -log_ratio
  if kind == "k2":
    return 0.5 * jnp.square(log_ratio)
  # e^r − 1 − r is O(r²): the direct form's rounding (about 1e-7) swamps it below |r| ≈ 1e-3, where near-equal
  # policies live; credit.numerics evaluates it to a few ulps relative.
  return expm1_minus_x(log_ratio)


def token_cross_entropy(logp_BxL: jax.Array) -> jax.Array:
  """Per-token negative log-likelihood (supervised warm start)."""
  return -logp_BxL
