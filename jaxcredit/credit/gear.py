"""GEAR: divergence spikes against a ground-truth-conditioned self-teacher anchor segments; a sign-aware weight
rescales the trajectory's GRPO advantage token by token.

    d̂_t = d_t / max_action d        onset: d̂_t > lambda_KL        segment end: H_t > lambda_H · H_onset
    c_t = d̂ at the segment's onset (inside a segment) or d̂_t (aligned tokens)
    A_t = A · (1 − alpha · c_t) if A > 0,   A · (1 + alpha · c_t) if A < 0

Shape letter: L tokens. Batch of P groups of G rollouts:
`jax.vmap(jax.vmap(functools.partial(gear_advantages, alpha=0.2)))(seq_adv_PxG, divergence_PxGxL,
entropy_PxGxL, action_mask_PxGxL)`.

Source: Li et al., "GEAR: Granularity-Adaptive Advantage Reweighting for LLM Agents via Self-Distillation", arXiv
2605.11853, known from its abstract and machine-written summaries that quote its figure and table captions verbatim
(Fig. 1: "modulated by a sign-aware weighting function"; Fig. 2: "normalized reverse-KL > 0.1"; Table 2: "lambda_H =
1.5, alpha = 0.2, and lambda_KL = 0.1"); its equations were not found, and where they leave a detail open the
function's docstring names the reading taken (docs/methods/gear.md). `gear_v0_segments` / `gear_v0_advantages`
keep this library's earlier reading (mean + k·std spikes, absolute extension floors, 1 + alpha·tanh weights
normalised to mean 1, not sign-aware), method `gear_v0`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxcredit.credit import _checks, _stats

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

KEEP = -2  # run code of a token that extends the open segment (see _carry_runs)
RUN_BLOCK = 8  # tokens per step of the segment scan


class _Spikes(NamedTuple):
  div_L: Array  # cleaned divergence: negative, non-finite or off the action tokens -> 0
  tau_s: Array  # spike threshold divided by 2^k, shape [..., 1]
  k: Array  # int32 [..., 1]: the statistics are of d · 2^-k (`_stats.scaled`)
  spike_L: Array  # bool: opens a segment
  extend_L: Array  # bool: action token that continues an open segment
  enough: Array  # bool [..., 1]: at least 2 action tokens


def _check_segment_knobs(fn: str, k_sigma, tau_low, entropy_floor, eps) -> tuple[float, float, float, float]:
  k_sigma = _checks.knob_float(fn, "k_sigma", k_sigma, ge=0.0)
  tau_low = _checks.knob_float(fn, "tau_low", tau_low, allow_inf=True)
  entropy_floor = _checks.knob_float(fn, "entropy_floor", entropy_floor, allow_inf=True)
  eps = _checks.knob_float(fn, "eps", eps, gt=0.0)
  return k_sigma, tau_low, entropy_floor, eps


def _spikes(
  div_L: Array, entropy_L: Array, action_L: Array, *, k_sigma: float, tau_low: float, entropy_floor: float, eps: float
) -> _Spikes:
  """Threshold, spikes and extension flags on checked arrays (token axis last, any leading axes).

  Written so that XLA materialises few token-sized temporaries: one masked copy of d feeds the sum, the max
  and the deviations, and the spread test max(d) - min(d) > eps is the equivalent any(max(d) - d_i > eps).
  The mean and std are of d · 2^-k, k the exponent of max(d) (`_stats.scaled`, exact): the same bits for
  ordinary divergences, and no overflow of d² (above about 1e19 it made τ = inf: no spike) nor underflow.
  """
  div_L = jnp.where(action_L & jnp.isfinite(div_L) & (div_L > 0), div_L, 0.0)  # 0 off the action tokens
  act_L = action_L.astype(jnp.float32)
  nf = jnp.sum(act_L, axis=-1, keepdims=True)
  top = jnp.max(div_L, axis=-1, keepdims=True)  # d >= 0, so the zeros off the action tokens never win
  k = jnp.frexp(top)[1].astype(jnp.int32)  # as _stats.scale_exponent, from the max already taken
  div_s = _stats.ldexp(div_L, -k)
  mean = jnp.sum(div_s, axis=-1, keepdims=True) / jnp.maximum(nf, 1.0)
  dev_L = (div_s - mean) * act_L
  std = jnp.sqrt(jnp.sum(dev_L * dev_L, axis=-1, keepdims=True) / jnp.maximum(nf - 1.0, 1.0))
  tau_s = mean + k_sigma * std
  spread = jnp.any(action_L & (top - div_L > eps), axis=-1, keepdims=True)
  enough = nf >= 2.0
  spike_L = action_L & (div_s > tau_s) & enough & spread
  extend_L = action_L & ((div_L >= tau_low) | (jnp.isfinite(entropy_L) & (entropy_L >= entropy_floor)))
  return _Spikes(div_L, tau_s, k, spike_L, extend_L, enough)


def _carry_runs(code_L: Array) -> Array:
  """out_i = out_(i-1) where code_i == KEEP, else code_i (out_(-1) = -1), along the last axis.

  The segment rule as one recurrence: a spike writes its value (its index, or its divergence), a token that
  can neither open nor extend a segment writes -1 (aligned), and an extending token keeps the open value.

  A sequential scan over blocks of RUN_BLOCK tokens: each step takes a [..., RUN_BLOCK] slab and walks its
  tokens with the batch as the vector width. Blocks keep the tokens contiguous, so under vmap the slabs are
  moved as whole cache lines instead of transposing token by token, and the loop runs L / RUN_BLOCK times.
  On CPU at [512, 8192] this is ~2x faster than a per-token `lax.scan` and ~5x faster than the associative
  scans behind `lax.cummax` (log2(L) strided passes).
  """
  num = code_L.shape[-1]
  num_blocks = -(-num // RUN_BLOCK)
  pad = [(0, 0)] * (code_L.ndim - 1) + [(0, num_blocks * RUN_BLOCK - num)]
  code_L = jnp.pad(code_L, pad, constant_values=KEEP)  # trailing KEEPs change nothing before them
  blocks = jnp.moveaxis(code_L.reshape(code_L.shape[:-1] + (num_blocks, RUN_BLOCK)), -2, 0)

  def step(open_value, block):
    outs = []
    for j in range(RUN_BLOCK):
      open_value = jnp.where(block[..., j] == KEEP, open_value, block[..., j])
      outs.append(open_value)
    return open_value, jnp.stack(outs, axis=-1)

  init = jnp.full(blocks.shape[1:-1], -1, code_L.dtype)
  _, out = lax.scan(step, init, blocks)
  return jnp.moveaxis(out, 0, -2).reshape(code_L.shape)[..., :num]


def gear_v0_segments(
  divergence: ArrayLike,
  entropy: ArrayLike,
  action_mask: ArrayLike,
  *,
  k_sigma: float = 2.0,
  tau_low: float = 0.1,
  entropy_floor: float = 1.0,
  eps: float = 1e-6,
) -> Array:
  """GEAR v0 (this library's earlier reading, method `gear_v0`): divergence-anchored segments for one rollout.

      d_i = max(divergence_i, 0) (non-finite -> 0); over action tokens: τ = mean(d) + k_sigma · std(d, ddof=1)
      spike_i = action_i ∧ d_i > τ   (no spikes with < 2 action tokens or max(d) − min(d) <= eps)
      a segment opens at each spike and extends over the following action tokens j while
        d_j >= tau_low ∨ entropy_j >= entropy_floor  (non-finite entropy counts as below the floor);
      it ends before the first token where both fall below, at the next spike (which opens a new segment),
      or at the first non-action token (a segment never crosses a tool observation).
      seg_start_i = index of the spike that opened token i's segment, −1 for aligned tokens.

  τ is computed scale-invariantly (of d divided by a power of two near max d, exact): divergences of any float32
  magnitude give the same spikes as d / c would for any c > 0 (eps and tau_low are absolute).
  Batch: `jax.vmap(gear_segments)` over leading axes.

  Args:
    divergence: [L] float >= 0, per-token reverse KL(student ‖ GT-conditioned teacher) over the vocabulary, or
      |log-ratio| of the sampled token when only log-probs exist.
    entropy: [L] float, the student's predictive entropy per token, nats.
    action_mask: [L] bool.
    k_sigma: >= 0, spike threshold in standard deviations above the mean.
    tau_low: absolute divergence floor that extends a segment (divergence units).
    entropy_floor: entropy (nats) at or above which a segment extends.
    eps: > 0, the minimum spread of d for spikes to exist.

  Returns:
    seg_start: [L] int32; −1 off the action tokens and on aligned tokens.

  Raises:
    ValueError: the arrays are not all [L]; k_sigma < 0; eps <= 0; tau_low or entropy_floor is NaN.

  Source:
  "GEAR: Granularity-Adaptive Advantage Reweighting for LLM Agents via Self-Distillation" (arXiv 2605.11853),
  divergence-anchored adaptive segments: the spike test and the extension rule are this library's v2.0 reading,
  kept so that earlier results stay reproducible; the paper's (from its captions) is `gear_segments`; docs/methods/gear.md.
  """
  fn = "gear_v0_segments"
  k_sigma, tau_low, entropy_floor, eps = _check_segment_knobs(fn, k_sigma, tau_low, entropy_floor, eps)
  shapes = _checks.Shapes(fn)
  div_L = shapes.float("divergence", divergence, "L")
  entropy_L = shapes.float("entropy", entropy, "L")
  action_L = shapes.mask("action_mask", action_mask, "L")
  sp = _spikes(div_L, entropy_L, action_L, k_sigma=k_sigma, tau_low=tau_low, entropy_floor=entropy_floor, eps=eps)
  iota_L = lax.broadcasted_iota(jnp.int32, div_L.shape, div_L.ndim - 1)
  return _carry_runs(jnp.where(sp.spike_L, iota_L, jnp.where(sp.extend_L, KEEP, -1)))


def gear_v0_advantages(
  seq_adv: ArrayLike,
  divergence: ArrayLike,
  entropy: ArrayLike,
  action_mask: ArrayLike,
  *,
  alpha: float = 1.0,
  k_sigma: float = 2.0,
  tau_low: float = 0.1,
  entropy_floor: float = 1.0,
  normalize: bool = True,
  eps: float = 1e-6,
) -> Array:
  """GEAR v0 (this library's earlier reading, method `gear_v0`): the sequence advantage redistributed toward
  divergence spikes, not sign-aware.

      aligned token:  u_i = 1 + alpha · tanh(d_i / (τ + eps))              (token resolution kept)
      segment token:  u_i = 1 + alpha · tanh(d_spike / (τ + eps))          (one weight per segment)
      w_i = u_i / mean(u over action tokens)  (normalize=True: redistributes, mean w = 1);  w_i = u_i otherwise
      w_i = 1 with fewer than 2 action tokens (τ undefined)
      A_i = seq_adv · w_i

  τ and the segments are those of gear_v0_segments. alpha = 0, or d = 0 everywhere, gives w = 1 (GRPO).
  Invariants: w > 0; all tokens of a segment share one weight; segments start exactly at spikes.
  Stop-gradient.

  Args:
    seq_adv: float scalar, the rollout's sequence-level advantage (e.g. grpo_advantages entry); a non-finite
      value gives 0.
    divergence: [L], as gear_segments (so are entropy and action_mask).
    alpha: >= 0, strength of the redistribution.
    k_sigma: as gear_v0_segments (so are tau_low, entropy_floor and eps; eps also guards τ = 0).
    normalize: bool, divide u by its mean over action tokens.

  Returns:
    [L] float32 token advantages; exactly 0.0 off the action tokens.

  Raises:
    ValueError: `seq_adv` is not a scalar, the token arrays are not all [L], alpha < 0, or a knob of
      gear_v0_segments is invalid.

  Source:
  "GEAR: Granularity-Adaptive Advantage Reweighting for LLM Agents via Self-Distillation" (arXiv 2605.11853), known
  from its abstract and summaries only: divergence spikes against a ground-truth-conditioned self-teacher anchor
  segments, aligned regions keep token resolution and departed segments are reweighted by the divergence at their
  anchor. The threshold τ, the tanh weight and the normalisation are this library's v2.0 reading, not the paper's:
  they do not depend on the advantage's sign, which the paper's weighting does (`gear_advantages`); docs/methods/gear.md.
  """
  fn = "gear_v0_advantages"
  alpha = _checks.knob_float(fn, "alpha", alpha, ge=0.0)
  normalize = _checks.knob_bool(fn, "normalize", normalize)
  k_sigma, tau_low, entropy_floor, eps = _check_segment_knobs(fn, k_sigma, tau_low, entropy_floor, eps)
  shapes = _checks.Shapes(fn)
  adv = shapes.float("seq_adv", seq_adv, "")
  div_L = shapes.float("divergence", divergence, "L")
  entropy_L = shapes.float("entropy", entropy, "L")
  action_L = shapes.mask("action_mask", action_mask, "L")
  sp = _spikes(div_L, entropy_L, action_L, k_sigma=k_sigma, tau_low=tau_low, entropy_floor=entropy_floor, eps=eps)
  # d >= 0, so a segment's anchor (the spike's divergence) never collides with the codes -1 and KEEP.
  spike_div_L = _carry_runs(jnp.where(sp.spike_L, sp.div_L, jnp.where(sp.extend_L, float(KEEP), -1.0)))
  anchor_L = jnp.where(spike_div_L >= 0, spike_div_L, sp.div_L)
  # d / (τ + eps) with d, τ and eps all divided by 2^k (exact), so a τ beyond float32's range is no inf.
  denom = sp.tau_s[0] + _stats.ldexp(jnp.float32(eps), -sp.k[0])
  u_L = 1.0 + alpha * jnp.tanh(_stats.ldexp(anchor_L, -sp.k[0]) / jnp.where(denom > 0, denom, 1.0))
  if normalize:
    n = jnp.maximum(jnp.sum(action_L.astype(jnp.float32)), 1.0)
    u_L = u_L / (jnp.sum(jnp.where(action_L, u_L, 0.0)) / n)
  w_L = jnp.where(sp.enough[0], u_L, 1.0)
  adv = jnp.where(jnp.isfinite(adv), adv, 0.0)
  return lax.stop_gradient(jnp.where(action_L, adv * w_L, 0.0))


# ---------------------------------------------------------------------------------------------------------------
# GEAR as its captions and summaries describe it (spec v2.1).


def _check_v21_knobs(fn: str, lambda_kl, lambda_h, min_divergence) -> tuple[float, float, float]:
  lambda_kl = _checks.knob_float(fn, "lambda_kl", lambda_kl, ge=0.0, lt=1.0)
  lambda_h = _checks.knob_float(fn, "lambda_h", lambda_h, ge=1.0, allow_inf=True)
  min_divergence = _checks.knob_float(fn, "min_divergence", min_divergence, gt=0.0)
  return lambda_kl, lambda_h, min_divergence


class _Normalised(NamedTuple):
  d_hat_L: Array  # d / max over the action tokens, in [0, 1]; 0 off the action tokens and without signal
  onset_L: Array  # bool: opens a segment


def _normalised(div_L: Array, action_L: Array, *, lambda_kl: float, min_divergence: float) -> _Normalised:
  """d̂ = d / max_action d (0 when that max is <= min_divergence: no signal) and the onsets d̂ > lambda_kl, on
  checked arrays with the token axis last. d / max is taken of both scaled by the same power of two (exact). The
  onset is decided as d > lambda_kl · max d, without the division: XLA's float32 division was one ulp above the
  correctly rounded quotient at a tie (d / max = 0.375 / 3.75 read as an onset at lambda_kl = 0.1)."""
  d_L = jnp.where(action_L & jnp.isfinite(div_L) & (div_L > 0), div_L, 0.0)
  top = jnp.max(d_L, axis=-1, keepdims=True)
  k = jnp.frexp(top)[1].astype(jnp.int32)
  top_s = _stats.ldexp(top, -k)
  signal = top > min_divergence
  d_s = _stats.ldexp(d_L, -k)
  d_hat_L = jnp.where(signal, d_s / jnp.where(signal, top_s, 1.0), 0.0)
  onset_L = d_s > jnp.float32(lambda_kl) * top_s
  return _Normalised(d_hat_L, action_L & signal & onset_L)


def _entropy_runs(onset_L: Array, entropy_L: Array, action_L: Array, lambda_h: float) -> Array:
  """seg_start_L (int32, -1 for aligned tokens) by the entropy-relative end rule, along the last axis.

  A walk over the tokens carrying the open segment's start and its onset's entropy H₀: an onset opens a segment
  (start = its index, H₀ = its entropy); an action token with finite entropy H <= lambda_h · H₀ extends it; any other
  token (entropy above the bound or not finite, or a non-action token) closes it and is aligned. Blocks of RUN_BLOCK
  tokens per scan step, as `_carry_runs`.
  """
  num = onset_L.shape[-1]
  num_blocks = -(-num // RUN_BLOCK)
  pad = [(0, 0)] * (onset_L.ndim - 1) + [(0, num_blocks * RUN_BLOCK - num)]

  def blocks(x, fill):
    x = jnp.pad(x, pad, constant_values=fill)
    return jnp.moveaxis(x.reshape(x.shape[:-1] + (num_blocks, RUN_BLOCK)), -2, 0)

  iota_L = lax.broadcasted_iota(jnp.int32, onset_L.shape, onset_L.ndim - 1)
  xs = (blocks(onset_L, False), blocks(entropy_L, jnp.nan), blocks(action_L, False), blocks(iota_L, -1))

  def step(carry, block):
    start, h0 = carry
    onset, ent, act, idx = block
    outs = []
    for j in range(RUN_BLOCK):
      below = True if math.isinf(lambda_h) else ent[..., j] <= lambda_h * h0  # inf · 0 would be NaN
      stays = act[..., j] & (start >= 0) & jnp.isfinite(ent[..., j]) & below
      start = jnp.where(onset[..., j], idx[..., j], jnp.where(stays, start, -1))
      h0 = jnp.where(onset[..., j], ent[..., j], h0)
      outs.append(start)
    return (start, h0), jnp.stack(outs, axis=-1)

  init = (jnp.full(onset_L.shape[:-1], -1, jnp.int32), jnp.zeros(onset_L.shape[:-1], jnp.float32))
  _, out = lax.scan(step, init, xs)
  return jnp.moveaxis(out, 0, -2).reshape(onset_L.shape[:-1] + (num_blocks * RUN_BLOCK,))[..., :num]


def gear_segments(
  divergence: ArrayLike,
  entropy: ArrayLike,
  action_mask: ArrayLike,
  *,
  lambda_kl: float = 0.1,
  lambda_h: float = 1.5,
  min_divergence: float = 1e-6,
) -> Array:
  """GEAR's adaptive segments for one rollout: opened by a normalised-divergence spike, closed by an entropy rise.

      d_t  = max(divergence_t, 0) on action tokens (non-finite -> 0)
      d̂_t  = d_t / max_action d          (all 0 when max_action d <= min_divergence: no teacher signal)
      onset_t = action_t ∧ d̂_t > lambda_KL
      a segment opens at each onset t₀ and extends over the following action tokens t while
        H_t <= lambda_H · H_t₀     (H finite);
      it ends before the first token whose entropy exceeds lambda_H times the onset's, at the next onset (which
      opens a new segment) or at the first non-action token (a segment never crosses a tool observation).
      seg_start_t = index of the onset that opened token t's segment, −1 for aligned tokens.

  Readings taken (the captions give the thresholds, not the equations; docs/methods/gear.md): the divergence is
  normalised by its largest value over the rollout's action tokens, so d̂ ∈ [0, 1] and the rollout's biggest spike
  always opens a segment when there is any signal above `min_divergence`; H is the student's (the policy's) entropy;
  the token whose entropy exceeds the bound is not part of the segment; a token with non-finite entropy ends it.
  d and d · 2^j give the same segments (the ratio is taken of both scaled by one power of two).
  Batch: `jax.vmap(gear_segments)` over leading axes.

  Args:
    divergence: [L] float, per-token reverse KL(student ‖ ground-truth-conditioned teacher) over the vocabulary,
      nats (>= 0; a negative rounding residue counts as 0; NaN: no signal at that token).
    entropy: [L] float, the student's predictive entropy per token, nats.
    action_mask: [L] bool.
    lambda_kl: in [0, 1), the onset threshold on d̂ (the paper's lambda_KL, default 0.1).
    lambda_h: >= 1 (inf: segments end only at the next onset or a non-action token), the entropy ratio that ends
      a segment (the paper's lambda_H, default 1.5).
    min_divergence: > 0, nats: a rollout whose largest divergence is at or below it has no segments.

  Returns:
    seg_start: [L] int32; −1 off the action tokens and on aligned tokens.

  Raises:
    ValueError: the arrays are not all [L] (naming the argument); lambda_kl outside [0, 1); lambda_h < 1;
      min_divergence <= 0 or not finite.

  Source:
  Li et al., "GEAR: Granularity-Adaptive Advantage Reweighting for LLM Agents via Self-Distillation" (arXiv
  2605.11853), from its summaries and verbatim captions (Fig. 2: "normalized reverse-KL > 0.1"; Table 2: "lambda_H =
  1.5, alpha = 0.2, and lambda_KL = 0.1"); docs/methods/gear.md.
  """
  fn = "gear_segments"
  lambda_kl, lambda_h, min_divergence = _check_v21_knobs(fn, lambda_kl, lambda_h, min_divergence)
  shapes = _checks.Shapes(fn)
  div_L = shapes.float("divergence", divergence, "L")
  entropy_L = shapes.float("entropy", entropy, "L")
  action_L = shapes.mask("action_mask", action_mask, "L")
  norm = _normalised(div_L, action_L, lambda_kl=lambda_kl, min_divergence=min_divergence)
  return _entropy_runs(norm.onset_L, entropy_L, action_L, lambda_h)


def gear_advantages(
  seq_adv: ArrayLike,
  divergence: ArrayLike,
  entropy: ArrayLike,
  action_mask: ArrayLike,
  *,
  alpha: float = 0.2,
  lambda_kl: float = 0.1,
  lambda_h: float = 1.5,
  min_divergence: float = 1e-6,
) -> Array:
  """GEAR token advantages for one rollout: the sequence advantage rescaled by a sign-aware weight of each token's
  (or its segment's onset's) normalised divergence.

      c_t = d̂ at seg_start_t for segment tokens, d̂_t for aligned tokens        (∈ [0, 1]; gear_segments)
      W_t = 1 − alpha · c_t   if A > 0   (a success: the tokens where the policy departed from the informed teacher
                                          get less of the credit)
      W_t = 1 + alpha · c_t   if A < 0   (a failure: they take more of the blame)
      A_t = A · W_t on action tokens, 0 elsewhere

  Every token of a segment shares its onset's weight; aligned tokens keep token resolution. alpha = 0, A = 0, or no
  divergence signal give A on every action token (GRPO). Since alpha < 1, W_t > 0: A_t keeps A's sign.
  Stop-gradient.

  Reading taken (docs/methods/gear.md): the captions say the weight is "sign-aware", and the summaries that a
  success's high-divergence tokens are down-weighted and a failure's up-weighted; the linear form 1 ∓ alpha · c with
  c = d̂ ∈ [0, 1] is ours. The weights are not renormalised (the mean |A_t| may differ from |A|).

  Args:
    seq_adv: float scalar, the rollout's sequence-level advantage (e.g. its grpo_advantages entry); a non-finite
      value gives 0.
    divergence: [L], as gear_segments (so are entropy and action_mask).
    alpha: in [0, 1), the weight's strength (the paper's alpha, default 0.2).
    lambda_kl: as gear_segments (so are lambda_h and min_divergence).

  Returns:
    [L] float32 token advantages; exactly 0.0 off the action tokens.

  Raises:
    ValueError: `seq_adv` is not a scalar, the token arrays are not all [L], alpha outside [0, 1), or a knob of
      gear_segments is invalid.

  Source:
  Li et al., "GEAR: Granularity-Adaptive Advantage Reweighting for LLM Agents via Self-Distillation" (arXiv
  2605.11853), summaries and captions (Fig. 1: "modulated by a sign-aware weighting function"; Table 2's defaults);
  docs/methods/gear.md.
  """
  fn = "gear_advantages"
  alpha = _checks.knob_float(fn, "alpha", alpha, ge=0.0, lt=1.0)
  lambda_kl, lambda_h, min_divergence = _check_v21_knobs(fn, lambda_kl, lambda_h, min_divergence)
  shapes = _checks.Shapes(fn)
  adv = shapes.float("seq_adv", seq_adv, "")
  div_L = shapes.float("divergence", divergence, "L")
  entropy_L = shapes.float("entropy", entropy, "L")
  action_L = shapes.mask("action_mask", action_mask, "L")
  norm = _normalised(div_L, action_L, lambda_kl=lambda_kl, min_divergence=min_divergence)
  seg_L = _entropy_runs(norm.onset_L, entropy_L, action_L, lambda_h)
  onset_credit_L = jnp.take_along_axis(norm.d_hat_L, jnp.maximum(seg_L, 0), axis=-1)
  credit_L = jnp.where(seg_L >= 0, onset_credit_L, norm.d_hat_L)
  adv = jnp.where(jnp.isfinite(adv), adv, 0.0)
  w_L = 1.0 + jnp.where(adv > 0, -alpha, alpha) * credit_L
  return lax.stop_gradient(jnp.where(action_L, adv * w_L, 0.0))
