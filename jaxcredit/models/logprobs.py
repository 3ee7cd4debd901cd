"""Log-probabilities of tokens under a temperature-scaled policy, shared by the sampler and the trainer.

Both record log softmax(logits / temperature) of the *untruncated* distribution: top-p changes which token
is drawn, never the recorded log-prob, so the on-policy ratio is exactly 1 up to floating point.

`chunked_logprobs_and_entropies` computes log-probs and entropies from final hidden states and the output head
chunk by chunk (sequence and vocabulary), so neither the forward nor the backward pass holds [B, L, V] logits;
`sequence_logprobs` uses it. `logprobs_from_logits` is the plain reference over full logits.
`packed_slot_logprobs` scores chosen tokens of packed rows (a shared prefix plus appended segments, e.g. one
copy of a gold answer per boundary) in one forward.
`chunked_reverse_kl` computes the full-vocabulary KL(student ‖ teacher) from two models' hidden states and
heads the same way (the teacher passes' divergence, docs/teacher-passes.md).

Letters: B batch, L tokens, V vocabulary, D hidden width.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxcredit.credit.numerics import expm1_minus_x, x_minus_log1p


def temperature_log_softmax(logits_xV: jax.Array, temperature: float | jax.Array) -> jax.Array:
  """log softmax(logits / temperature) over the last axis, in float32 nats.

  Args:
      logits_xV: float logits, any leading shape, vocabulary last.
      temperature: positive scalar (Python float or traced array).

  Returns:
      float32 array with the shape of `logits_xV`.
  """
  return jax.nn.log_softmax(logits_xV.astype(jnp.float32) / jnp.asarray(temperature, jnp.float32), axis=-1)


def logprobs_from_logits(
  logits_BxLxV: jax.Array, tokens_BxL: jax.Array, token_mask_BxL: jax.Array, temperature: float | jax.Array
) -> jax.Array:
  """Per-token log-probs of a sequence from the logits of a full forward pass over it.

      logp[b, t] = log softmax(logits[b, t-1] / temperature)[tokens[b, t]]   if mask[b, t] and mask[b, t-1]
      logp[b, t] = 0                                                          otherwise (incl. t = 0)

  So the first real token of every row (which has no real prefix; left or right padding alike) and every
  padding token get 0.

  Args:
      logits_BxLxV: logits, position t predicting token t+1.
      tokens_BxL: int token ids.
      token_mask_BxL: bool, True where the slot holds a real token.
      temperature: positive scalar.

  Returns:
      logp_BxL: float32 nats.

  Raises:
      ValueError: for mismatched ranks or shapes (at trace time).
  """
  if logits_BxLxV.ndim != 3:
    raise ValueError(f"logits_BxLxV must have rank 3, got shape {logits_BxLxV.shape}")
  if tokens_BxL.shape != logits_BxLxV.shape[:2] or token_mask_BxL.shape != tokens_BxL.shape:
    raise ValueError(
      f"tokens_BxL {tokens_BxL.shape} and token_mask_BxL {token_mask_BxL.shape} must equal the "
      f"first two dims of logits_BxLxV {logits_BxLxV.shape}"
    )
  logp_BxLm1xV = temperature_log_softmax(logits_BxLxV[:, :-1], temperature)
  next_BxLm1 = tokens_BxL[:, 1:].astype(jnp.int32)
  logp_BxLm1 = jnp.take_along_axis(logp_BxLm1xV, next_BxLm1[..., None], axis=-1)[..., 0]
  mask_BxL = token_mask_BxL.astype(bool)
  valid_BxLm1 = mask_BxL[:, 1:] & mask_BxL[:, :-1]
  logp_BxLm1 = jnp.where(valid_BxLm1, logp_BxLm1, 0.0)
  return jnp.pad(logp_BxLm1, ((0, 0), (1, 0)))


DEFAULT_SEQ_CHUNK = 512
DEFAULT_VOCAB_CHUNK = 8192
# Finite stand-in for -inf (padded vocabulary columns, the initial running max, a target not yet seen):
# exp(_NEG - m) == 0 and 0 * _NEG == 0 in float32, so neither the values nor the gradients see inf or NaN.
_NEG = -1e30


def _chunk_size(name: str, value: int | None, default: int, full: int) -> int:
  """A validated chunk size, clipped to the full extent `full` (the default when `value` is None)."""
  if value is None:
    return max(min(default, full), 1)
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
    raise ValueError(f"{name} must be a positive int, got {value!r}")
  return max(min(int(value), full), 1)


def _default_vocab_chunk(v: int) -> int:
  """V itself up to DEFAULT_VOCAB_CHUNK; above it, the largest divisor of V in [DEFAULT_VOCAB_CHUNK / 2,
  DEFAULT_VOCAB_CHUNK] if there is one (no padding, so no copy of a tied head: 151936 = 32 · 4748), else
  DEFAULT_VOCAB_CHUNK."""
  if v <= DEFAULT_VOCAB_CHUNK:
    return v
  for c in range(DEFAULT_VOCAB_CHUNK, DEFAULT_VOCAB_CHUNK // 2 - 1, -1):
    if v % c == 0:
      return c
  return DEFAULT_VOCAB_CHUNK


def _check_temperature(temperature: float | jax.Array) -> None:
  if isinstance(temperature, jax.core.Tracer):
    return
  t = np.asarray(temperature)
  if t.ndim != 0:
    raise ValueError(f"temperature must be a scalar, got shape {t.shape}")
  if not t > 0:
    raise ValueError(f"temperature must be > 0, got {temperature!r}")


def _chunk_grid(seq_chunk, vocab_chunk, temperature, l: int, v: int) -> tuple[int, int, int, int]:
  """(Lc, Vc, n_l, n_v): the checked chunk sizes of L positions and V vocabulary columns and the number of chunks
  of each (the last one padded), after checking the temperature; the chunked heads' shared argument checks."""
  lc = _chunk_size("seq_chunk", seq_chunk, DEFAULT_SEQ_CHUNK, l)
  vc = _chunk_size("vocab_chunk", vocab_chunk, _default_vocab_chunk(v), v)
  _check_temperature(temperature)
  return lc, vc, -(-l // lc), -(-v // vc)


def chunked_logprobs_and_entropies(
  h_BxLxD: jax.Array,
  head_DxV: jax.Array,
  targets_BxL: jax.Array,
  temperature: float | jax.Array,
  *,
  seq_chunk: int | None = None,
  vocab_chunk: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Log-prob of a target token and entropy at every position, without materialising the [B, L, V] logits.

  With z = (h[b, l] · head) / temperature, a float32 vector over the V vocabulary entries:

      logp[b, l]    = z[targets[b, l]] - logsumexp(z)
      entropy[b, l] = logsumexp(z) - Σ_v softmax(z)_v · z_v          (= -Σ_v p_v log p_v)

  The sequence is processed `seq_chunk` positions at a time (lax.scan) and, for each such chunk, the vocabulary
  `vocab_chunk` columns at a time (lax.scan) with an online logsumexp: a running maximum m (held constant under
  differentiation; the results do not depend on it), s = Σ exp(z - m) and t = Σ exp(z - m) · (z - m), rescaled
  by exp(m_old - m_new) when the maximum grows, and the target's logit picked up in the vocabulary chunk that
  holds it. Then logp = z_target - m - log s and entropy = log s - t / s (both terms >= 0, so entropy >= 0).

  The gradient is a custom VJP: the forward pass keeps only h, the head, the targets and per position the
  logsumexp and the entropy; the backward pass recomputes each [B, seq_chunk, vocab_chunk] block of logits once
  and turns it into dz (d logp/dz_u = [u = target] - p_u, d entropy/dz_u = -p_u (log p_u + entropy)), then
  into dh += dz · head_c and dhead_c += dzᵀ · h. No [B, L, V] or [B, seq_chunk, V] array exists in the forward
  or the backward pass: the peak extra memory is O(B · seq_chunk · vocab_chunk) plus the head's gradient.
  Forward plus backward cost four logits-sized matrix products (autodiff through checkpointed chunks cost
  five: docs/benchmarks.md, "The training forward+backward"). logp and entropy are both differentiable with
  respect to h, head and temperature (reverse mode only).

  L and V need not be multiples of the chunk sizes: the sequence is zero-padded (padded positions are dropped
  from the outputs) and padded vocabulary columns get the logit -1e30, which contributes exactly 0.

  Args:
      h_BxLxD: final hidden states, any float dtype (bfloat16 is fine: the products accumulate in float32).
      head_DxV: output projection, any float dtype; logits are h · head (for a tied embedding table E [V, D],
          pass E.T: the transpose cancels against the [V, D] layout used internally).
      targets_BxL: int token ids in [0, V). Ids outside that range (not checked: they may be traced) match no
          column and give logp ≈ -1e30; their entropy is still correct.
      temperature: positive scalar (Python float or array, possibly traced).
      seq_chunk: positions per sequence chunk, a positive int; default min(512, L). Clipped to L.
      vocab_chunk: vocabulary columns per chunk, a positive int, clipped to V. Default: V up to 8192; above,
          the largest divisor of V in [4096, 8192] when there is one (no padding), else 8192.

  Returns:
      (logp_BxL, entropy_BxL): float32, in nats.

  Raises:
      ValueError: at trace time, naming the argument, for a wrong rank, h and head disagreeing on D, targets not
          of shape [B, L] or not integer, h or head not floating point, a non-positive (or non-int) chunk size,
          or a concrete temperature that is not a positive scalar.
  """
  if getattr(h_BxLxD, "ndim", None) != 3:
    raise ValueError(f"h_BxLxD must have rank 3, got shape {np.shape(h_BxLxD)}")
  if getattr(head_DxV, "ndim", None) != 2:
    raise ValueError(f"head_DxV must have rank 2, got shape {np.shape(head_DxV)}")
  h_BxLxD, head_DxV, targets_BxL = jnp.asarray(h_BxLxD), jnp.asarray(head_DxV), jnp.asarray(targets_BxL)
  b, l, d = h_BxLxD.shape
  if head_DxV.shape[0] != d:
    raise ValueError(f"head_DxV {head_DxV.shape} must have as many rows as h_BxLxD {h_BxLxD.shape} has features ({d})")
  if targets_BxL.shape != (b, l):
    raise ValueError(f"targets_BxL must have shape {(b, l)} (the first two dims of h_BxLxD), got {targets_BxL.shape}")
  if not jnp.issubdtype(targets_BxL.dtype, jnp.integer):
    raise ValueError(f"targets_BxL must be integer token ids, got dtype {targets_BxL.dtype}")
  if not jnp.issubdtype(h_BxLxD.dtype, jnp.floating):
    raise ValueError(f"h_BxLxD must be floating point, got dtype {h_BxLxD.dtype}")
  if not jnp.issubdtype(head_DxV.dtype, jnp.floating):
    raise ValueError(f"head_DxV must be floating point, got dtype {head_DxV.dtype}")
  v = head_DxV.shape[1]
  if v == 0:
    raise ValueError(f"head_DxV must have at least one vocabulary column, got shape {head_DxV.shape}")
  lc, vc, n_l, n_v = _chunk_grid(seq_chunk, vocab_chunk, temperature, l, v)
  if l == 0 or b == 0:
    return jnp.zeros((b, l), jnp.float32), jnp.zeros((b, l), jnp.float32)

  temperature = jnp.asarray(temperature, jnp.float32)

  # Vocabulary chunks as [n_v, Vc, D]: a free reshape of the [V, D] layout (a tied table's own).
  head_VxD = jnp.pad(head_DxV.T, ((0, n_v * vc - v), (0, 0)))
  head_NvxVcxD = head_VxD.reshape(n_v, vc, d)

  h_BxLpxD = jnp.pad(h_BxLxD, ((0, 0), (0, n_l * lc - l), (0, 0)))
  h_NlxBxLcxD = h_BxLpxD.reshape(b, n_l, lc, d).transpose(1, 0, 2, 3)
  tgt_BxLp = jnp.pad(targets_BxL.astype(jnp.int32), ((0, 0), (0, n_l * lc - l)))
  tgt_NlxBxLc = tgt_BxLp.reshape(b, n_l, lc).transpose(1, 0, 2)

  logp_NlxBxLc, entropy_NlxBxLc = _chunked_logp_entropy(h_NlxBxLcxD, head_NvxVcxD, tgt_NlxBxLc, temperature, v)
  logp_BxL = logp_NlxBxLc.transpose(1, 0, 2).reshape(b, n_l * lc)[:, :l]
  entropy_BxL = entropy_NlxBxLc.transpose(1, 0, 2).reshape(b, n_l * lc)[:, :l]
  return logp_BxL, entropy_BxL


def _logits_chunk(h_BxLcxD, head_VcxD, offset, temperature, v):
  """z = h · head_cᵀ / temperature (float32) for one vocabulary chunk, -1e30 on padded columns; and the columns."""
  vc = head_VcxD.shape[0]
  b, lc, d = h_BxLcxD.shape
  # As one [B·Lc, D] x [D, Vc] product: XLA:CPU runs the rank-3 einsum with extra layout copies.
  z_BxLcxVc = (
    jnp.einsum("td,vd->tv", h_BxLcxD.reshape(b * lc, d), head_VcxD, preferred_element_type=jnp.float32).reshape(
      b, lc, vc
    )
    / temperature
  )
  col_Vc = offset + jnp.arange(vc, dtype=jnp.int32)
  return jnp.where(col_Vc < v, z_BxLcxVc, _NEG), col_Vc


def _chunked_forward(h_NlxBxLcxD, head_NvxVcxD, tgt_NlxBxLc, temperature, v):
  """(logp, entropy, logsumexp), each [Nl, B, Lc] float32, by an online logsumexp over the vocabulary chunks."""
  n_v, vc, _ = head_NvxVcxD.shape
  offset_Nv = jnp.arange(n_v, dtype=jnp.int32) * vc

  def seq_body(_, xs):
    h_BxLcxD, tgt_BxLc = xs

    def vocab_body(carry, xs):
      m_BxLc, s_BxLc, t_BxLc, zt_BxLc = carry
      head_VcxD, offset = xs
      z_BxLcxVc, col_Vc = _logits_chunk(h_BxLcxD, head_VcxD, offset, temperature, v)
      m_new = jnp.maximum(m_BxLc, jnp.max(z_BxLcxVc, axis=-1))
      alpha = jnp.exp(m_BxLc - m_new)
      zc_BxLcxVc = z_BxLcxVc - m_new[..., None]
      e_BxLcxVc = jnp.exp(zc_BxLcxVc)
      s_new = alpha * s_BxLc + jnp.sum(e_BxLcxVc, axis=-1)
      t_new = alpha * (t_BxLc + (m_BxLc - m_new) * s_BxLc) + jnp.sum(e_BxLcxVc * zc_BxLcxVc, axis=-1)
      hit_BxLcxVc = col_Vc == tgt_BxLc[..., None]
      zt_new = jnp.where(
        jnp.any(hit_BxLcxVc, axis=-1), jnp.sum(jnp.where(hit_BxLcxVc, z_BxLcxVc, 0.0), axis=-1), zt_BxLc
      )
      return (m_new, s_new, t_new, zt_new), None

    b, lc = tgt_BxLc.shape
    neg_BxLc = jnp.full((b, lc), _NEG, jnp.float32)
    zero_BxLc = jnp.zeros((b, lc), jnp.float32)
    (m_BxLc, s_BxLc, t_BxLc, zt_BxLc), _ = jax.lax.scan(
      vocab_body, (neg_BxLc, zero_BxLc, zero_BxLc, neg_BxLc), (head_NvxVcxD, offset_Nv)
    )
    log_s_BxLc = jnp.log(s_BxLc)
    return None, ((zt_BxLc - m_BxLc) - log_s_BxLc, log_s_BxLc - t_BxLc / s_BxLc, m_BxLc + log_s_BxLc)

  _, (logp, entropy, lse) = jax.lax.scan(seq_body, None, (h_NlxBxLcxD, tgt_NlxBxLc))
  return logp, entropy, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _chunked_logp_entropy(h_NlxBxLcxD, head_NvxVcxD, tgt_NlxBxLc, temperature, v):
  logp, entropy, _ = _chunked_forward(h_NlxBxLcxD, head_NvxVcxD, tgt_NlxBxLc, temperature, v)
  return logp, entropy


def _chunked_logp_entropy_fwd(h_NlxBxLcxD, head_NvxVcxD, tgt_NlxBxLc, temperature, v):
  logp, entropy, lse = _chunked_forward(h_NlxBxLcxD, head_NvxVcxD, tgt_NlxBxLc, temperature, v)
  return (logp, entropy), (h_NlxBxLcxD, head_NvxVcxD, tgt_NlxBxLc, temperature, entropy, lse)


def _chunked_logp_entropy_bwd(v, residuals, cotangents):
  """Each block of logits is recomputed once; with p = softmax(z) and H the entropy,

      d logp / dz_u    = [u = target] - p_u
      d entropy / dz_u = -p_u (log p_u + H)

  and z = h · headᵀ / temperature gives dh, dhead and dtemperature = -Σ dz · z / temperature."""
  h_NlxBxLcxD, head_NvxVcxD, tgt_NlxBxLc, temperature, entropy_NlxBxLc, lse_NlxBxLc = residuals
  g_logp_NlxBxLc, g_ent_NlxBxLc = cotangents
  n_v, vc, d = head_NvxVcxD.shape
  offset_Nv = jnp.arange(n_v, dtype=jnp.int32) * vc

  def seq_body(carry, xs):
    dhead_NvxVcxD, dtemp = carry
    h_BxLcxD, tgt_BxLc, ent_BxLc, lse_BxLc, g_logp_BxLc, g_ent_BxLc = xs

    def vocab_body(carry, xs):
      dh_BxLcxD, dtemp = carry
      head_VcxD, offset = xs
      z_BxLcxVc, col_Vc = _logits_chunk(h_BxLcxD, head_VcxD, offset, temperature, v)
      logp_BxLcxVc = z_BxLcxVc - lse_BxLc[..., None]
      p_BxLcxVc = jnp.exp(logp_BxLcxVc)
      hit_BxLcxVc = (col_Vc == tgt_BxLc[..., None]) & (col_Vc < v)
      dz_BxLcxVc = g_logp_BxLc[..., None] * (hit_BxLcxVc.astype(jnp.float32) - p_BxLcxVc) - g_ent_BxLc[
        ..., None
      ] * p_BxLcxVc * (logp_BxLcxVc + ent_BxLc[..., None])
      dz_BxLcxVc = jnp.where(col_Vc < v, dz_BxLcxVc, 0.0)
      dtemp = dtemp - jnp.sum(jnp.where(col_Vc < v, dz_BxLcxVc * z_BxLcxVc, 0.0)) / temperature
      dzs_TxVc = (dz_BxLcxVc / temperature).reshape(b * lc, vc)
      dh_BxLcxD = dh_BxLcxD + jnp.einsum(
        "tv,vd->td", dzs_TxVc.astype(head_VcxD.dtype), head_VcxD, preferred_element_type=jnp.float32
      ).reshape(b, lc, d)
      dhead_VcxD = jnp.einsum(
        "tv,td->vd", dzs_TxVc.astype(h_BxLcxD.dtype), h_BxLcxD.reshape(b * lc, d), preferred_element_type=jnp.float32
      )
      return (dh_BxLcxD, dtemp), dhead_VcxD

    b, lc, _ = h_BxLcxD.shape
    (dh_BxLcxD, dtemp), dhead_c = jax.lax.scan(
      vocab_body, (jnp.zeros((b, lc, d), jnp.float32), dtemp), (head_NvxVcxD, offset_Nv)
    )
    return (dhead_NvxVcxD + dhead_c, dtemp), dh_BxLcxD

  (dhead_NvxVcxD, dtemp), dh_NlxBxLcxD = jax.lax.scan(
    seq_body,
    (jnp.zeros(head_NvxVcxD.shape, jnp.float32), jnp.zeros((), jnp.float32)),
    (h_NlxBxLcxD, tgt_NlxBxLc, entropy_NlxBxLc, lse_NlxBxLc, g_logp_NlxBxLc, g_ent_NlxBxLc),
  )
  tgt_zero = np.zeros(tgt_NlxBxLc.shape, jax.dtypes.float0)
  return (
    dh_NlxBxLcxD.astype(h_NlxBxLcxD.dtype),
    dhead_NvxVcxD.astype(head_NvxVcxD.dtype),
    tgt_zero,
    dtemp.astype(temperature.dtype),
  )


_chunked_logp_entropy.defvjp(_chunked_logp_entropy_fwd, _chunked_logp_entropy_bwd)


def _check_tokens_and_mask(tokens_BxL, token_mask_BxL) -> tuple[jax.Array, jax.Array]:
  tokens_BxL = jnp.asarray(tokens_BxL)
  mask_BxL = jnp.asarray(token_mask_BxL)
  if tokens_BxL.ndim != 2:
    raise ValueError(f"tokens_BxL must have rank 2, got shape {tokens_BxL.shape}")
  if not jnp.issubdtype(tokens_BxL.dtype, jnp.integer):
    raise ValueError(f"tokens_BxL must be integer token ids, got dtype {tokens_BxL.dtype}")
  if mask_BxL.shape != tokens_BxL.shape:
    raise ValueError(f"token_mask_BxL {mask_BxL.shape} must have the shape of tokens_BxL {tokens_BxL.shape}")
  return tokens_BxL.astype(jnp.int32), mask_BxL.astype(bool)


def _packed_args(tokens_BxL, positions_BxL, segment_ids_BxL, prefix_limit_BxL) -> dict:
  """The checked packing keyword arguments of `model.hidden_states` (only those given)."""
  shape = tokens_BxL.shape
  kwargs = {}
  for name, value in (
    ("positions_BxL", positions_BxL),
    ("segment_ids_BxL", segment_ids_BxL),
    ("prefix_limit_BxL", prefix_limit_BxL),
  ):
    if value is None:
      continue
    value = jnp.asarray(value)
    if value.shape != shape:
      raise ValueError(f"{name} {value.shape} must have the shape of tokens_BxL {shape}")
    if not jnp.issubdtype(value.dtype, jnp.integer):
      raise ValueError(f"{name} must be integers, got dtype {value.dtype}")
    kwargs[name] = value.astype(jnp.int32)
  if "segment_ids_BxL" in kwargs and "positions_BxL" not in kwargs:
    raise ValueError(
      "segment_ids_BxL needs explicit positions_BxL: the default positions (a count of the "
      "real tokens) do not restart a packed segment at its prefix length"
    )
  if "prefix_limit_BxL" in kwargs and "segment_ids_BxL" not in kwargs:
    raise ValueError("prefix_limit_BxL needs segment_ids_BxL")
  return kwargs


def packed_predictor_slots(
  token_mask_BxL: jax.Array, segment_ids_BxL: jax.Array, prefix_limit_BxL: jax.Array | None = None
) -> jax.Array:
  """pred_BxL: the slot whose hidden state predicts each token of a packed row, -1 where there is none.

      pred[b, t] = max{s < t : allowed[b, t, s]}     (allowed: `jaxcredit.models.attention.packed_attention_mask`)

  i.e. the latest slot before t that t attends to: t-1 inside a segment (and on the plain prefix), but
  prefix_limit[t] - 1 for the first token of an appended segment, whose context is the prefix up to its limit,
  not the previous segment's last token that happens to precede it in the packed row.
  """
  from jaxcredit.models.attention import packed_attention_mask

  l = token_mask_BxL.shape[1]
  allowed_BxLxS = packed_attention_mask(token_mask_BxL, segment_ids_BxL, prefix_limit_BxL)
  slot_S = jnp.arange(l, dtype=jnp.int32)
  before_BxLxS = allowed_BxLxS & (slot_S[None, None, :] < slot_S[None, :, None])
  return jnp.max(jnp.where(before_BxLxS, slot_S[None, None, :], -1), axis=-1).astype(jnp.int32)


def sequence_logprobs_and_entropies(
  model,
  tokens_BxL: jax.Array,
  token_mask_BxL: jax.Array,
  temperature: float | jax.Array,
  *,
  seq_chunk: int | None = None,
  vocab_chunk: int | None = None,
  positions_BxL: jax.Array | None = None,
  segment_ids_BxL: jax.Array | None = None,
  prefix_limit_BxL: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Per-token log-probs of `tokens_BxL` under `model`, and the entropies of the distributions that scored them.

  One forward pass without a cache up to the final norm (`model.hidden_states`), then
  `chunked_logprobs_and_entropies` against the output head, so the [B, L, V] logits never exist.

      logp[b, t]    = log softmax(z_{t-1})[tokens[b, t]]        if mask[b, t] and mask[b, t-1], else 0
      entropy[b, t] = -Σ_v softmax(z_{t-1})_v log softmax(z_{t-1})_v   on the same positions, else 0

  where z_{t-1} = logits[b, t-1] / temperature, untruncated (top-p never enters). The prediction made at
  position t-1 is stored at position t, aligned with the token it scores; t = 0, each row's first real token
  and padding get 0 (as in `logprobs_from_logits`). Positions are cumsum(mask) - 1, so left-padded rows score
  as if unpadded.

  Packed rows (segment_ids_BxL given; see `Decoder.hidden_states` for the segment mask): the predictor of token
  t is not t-1 but `packed_predictor_slots`: the latest slot before t that t attends to. Inside a segment that
  is t-1; for the first token of an appended segment k >= 1 it is the prefix slot prefix_limit[t] - 1 (a copy
  of a continuation appended after the prefix's last boundary is predicted from the prefix position where it
  would have started, not from the token before it in the packed row). The hidden states are gathered at the
  predictor slots and scored against the head, so each token's log-prob equals a separate forward over its own
  context. A token with no predictor (or a pad) gets 0.

  Works eagerly or inside a transform (nnx.jit, or jax.jit over nnx.merge(graphdef, state)), and under
  jax.grad with memory O(B · seq_chunk · vocab_chunk) for the head (see `chunked_logprobs_and_entropies`).

  Args:
      model: a `jaxcredit.models.Decoder` (its `hidden_states`, `embedding` [V, D] and `lm_head` [D, V] or
          None when tied are used).
      tokens_BxL: int token ids.
      token_mask_BxL: bool, True where the slot holds a real token.
      temperature: positive scalar, the sampler's temperature.
      seq_chunk: positions per chunk (default min(512, L)).
      vocab_chunk: vocabulary columns per chunk (default: see `chunked_logprobs_and_entropies`).
      positions_BxL: int RoPE positions (default cumsum(mask) - 1; required with segment_ids_BxL).
      segment_ids_BxL, prefix_limit_BxL: the packed-row description, passed to `model.hidden_states`.

  Returns:
      (logp_BxL, entropy_BxL): float32 nats.

  Raises:
      ValueError: at trace time, naming the argument, for tokens that are not rank 2 integers, a mask or packing
          argument of another shape, segment_ids_BxL without positions_BxL, a non-positive chunk size or a
          concrete non-positive temperature (and whatever `model.hidden_states` raises).
  """
  tokens_BxL, mask_BxL = _check_tokens_and_mask(tokens_BxL, token_mask_BxL)
  packing = _packed_args(tokens_BxL, positions_BxL, segment_ids_BxL, prefix_limit_BxL)
  # Checked again below; checking first spares an eager caller the forward pass before the error.
  _chunk_size("seq_chunk", seq_chunk, DEFAULT_SEQ_CHUNK, 1)
  _chunk_size("vocab_chunk", vocab_chunk, DEFAULT_VOCAB_CHUNK, 1)
  _check_temperature(temperature)
  if "segment_ids_BxL" in packing:
    h_BxLxD, _ = model.hidden_states(tokens_BxL, token_mask_BxL=mask_BxL, **packing)
    pred_BxL = packed_predictor_slots(mask_BxL, packing["segment_ids_BxL"], packing.get("prefix_limit_BxL"))
    h_pred_BxLxD = jnp.take_along_axis(h_BxLxD, jnp.maximum(pred_BxL, 0)[..., None], axis=1)
    logp_BxL, entropy_BxL = chunked_logprobs_and_entropies(
      h_pred_BxLxD, model.output_head_DxV(), tokens_BxL, temperature, seq_chunk=seq_chunk, vocab_chunk=vocab_chunk
    )
    valid_BxL = mask_BxL & (pred_BxL >= 0)
    return jnp.where(valid_BxL, logp_BxL, 0.0), jnp.where(valid_BxL, entropy_BxL, 0.0)
  positions_BxL = packing.get("positions_BxL")
  if positions_BxL is None:
    positions_BxL = jnp.maximum(jnp.cumsum(mask_BxL.astype(jnp.int32), axis=-1) - 1, 0)
  h_BxLxD, _ = model.hidden_states(tokens_BxL, positions_BxL=positions_BxL, token_mask_BxL=mask_BxL)
  # Position t predicts token t+1; the last position's target is a dummy (dropped), which keeps L whole so a
  # length that is a multiple of seq_chunk needs no padding.
  next_BxL = jnp.pad(tokens_BxL[:, 1:], ((0, 0), (0, 1)))
  logp_BxL, entropy_BxL = chunked_logprobs_and_entropies(
    h_BxLxD, model.output_head_DxV(), next_BxL, temperature, seq_chunk=seq_chunk, vocab_chunk=vocab_chunk
  )
  valid_BxLm1 = mask_BxL[:, 1:] & mask_BxL[:, :-1]
  logp_BxL = jnp.pad(jnp.where(valid_BxLm1, logp_BxL[:, :-1], 0.0), ((0, 0), (1, 0)))
  entropy_BxL = jnp.pad(jnp.where(valid_BxLm1, entropy_BxL[:, :-1], 0.0), ((0, 0), (1, 0)))
  return logp_BxL, entropy_BxL


def packed_slot_logprobs(
  model,
  tokens_BxL: jax.Array,
  token_mask_BxL: jax.Array,
  slots_BxG: jax.Array,
  temperature: float | jax.Array,
  *,
  positions_BxL: jax.Array,
  segment_ids_BxL: jax.Array,
  prefix_limit_BxL: jax.Array | None = None,
  vocab_chunk: int | None = None,
) -> jax.Array:
  """Log-probs of the tokens at chosen slots of packed rows: `sequence_logprobs(...)[b, slots[b, g]]` with
  the same packing arguments, but the output head runs on the G chosen slots only, not on all L.

  One forward over the packed rows (`model.hidden_states` with the segment mask), then for each chosen slot t
  the hidden state of its predictor `packed_predictor_slots(...)[b, t]` (t-1 inside a segment; the prefix slot
  prefix_limit[t] - 1 for the first token of an appended segment) is gathered and scored against the head with
  `chunked_logprobs_and_entropies`. This is how TRACE scores a gold answer after every boundary of a rollout in
  one forward (`jaxcredit.scoring.gold.score_gold_answers_packed`): the rollout's prefix is run once, the head
  only on the (T+1)·|y*| gold tokens.

  Args:
      model: a `jaxcredit.models.Decoder`.
      tokens_BxL, token_mask_BxL: the packed rows and their real-token mask.
      slots_BxG: int slots in [0, L) whose tokens to score (padding entries may repeat any slot; the caller
          ignores them).
      temperature: positive scalar.
      positions_BxL, segment_ids_BxL, prefix_limit_BxL: as `sequence_logprobs_and_entropies`.
      vocab_chunk: vocabulary columns per chunk.

  Returns:
      logp_BxG: float32 nats; 0 where the slot is a pad or its token has no predictor.

  Raises:
      ValueError: as `sequence_logprobs_and_entropies`, and for slots_BxG that are not [B, G] integers.
  """
  tokens_BxL, mask_BxL = _check_tokens_and_mask(tokens_BxL, token_mask_BxL)
  packing = _packed_args(tokens_BxL, positions_BxL, segment_ids_BxL, prefix_limit_BxL)
  slots_BxG = jnp.asarray(slots_BxG)
  if slots_BxG.ndim != 2 or slots_BxG.shape[0] != tokens_BxL.shape[0]:
    raise ValueError(f"slots_BxG must have shape [B={tokens_BxL.shape[0]}, G], got {slots_BxG.shape}")
  if not jnp.issubdtype(slots_BxG.dtype, jnp.integer):
    raise ValueError(f"slots_BxG must be integer slot indices, got dtype {slots_BxG.dtype}")
  _chunk_size("vocab_chunk", vocab_chunk, DEFAULT_VOCAB_CHUNK, 1)
  _check_temperature(temperature)
  slots_BxG = slots_BxG.astype(jnp.int32)
  h_BxLxD, _ = model.hidden_states(tokens_BxL, token_mask_BxL=mask_BxL, **packing)
  pred_BxL = packed_predictor_slots(mask_BxL, packing["segment_ids_BxL"], packing.get("prefix_limit_BxL"))
  pred_BxG = jnp.take_along_axis(pred_BxL, slots_BxG, axis=1)
  h_BxGxD = jnp.take_along_axis(h_BxLxD, jnp.maximum(pred_BxG, 0)[..., None], axis=1)
  targets_BxG = jnp.take_along_axis(tokens_BxL, slots_BxG, axis=1)
  logp_BxG, _ = chunked_logprobs_and_entropies(
    h_BxGxD, model.output_head_DxV(), targets_BxG, temperature, vocab_chunk=vocab_chunk
  )
  valid_BxG = jnp.take_along_axis(mask_BxL, slots_BxG, axis=1) & (pred_BxG >= 0)
  return jnp.where(valid_BxG, logp_BxG, 0.0)


def predictor_hidden_states(
  model,
  tokens_BxL: jax.Array,
  token_mask_BxL: jax.Array,
  *,
  slots_BxK: jax.Array | None = None,
  positions_BxL: jax.Array | None = None,
  segment_ids_BxL: jax.Array | None = None,
  prefix_limit_BxL: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The final hidden state that predicts each scored token, its target token and whether it has a predictor.

  The pieces `sequence_logprobs_and_entropies` (no slots: every position) and `packed_slot_logprobs` (packed
  rows, `slots_BxK`) score against the output head, for losses that need the whole predicted distribution, not
  only the sampled token's log-prob (HSD's full-vocabulary distillation: `jaxcredit.train.loop.step`, "vocab_kl"):

      h[b, k] = hidden_states[b, pred[b, s_k]],   target[b, k] = tokens[b, s_k]

  with s_k = k unpacked (pred[b, t] = t - 1) or slots[b, k] packed (pred = `packed_predictor_slots`). So
  `chunked_logprobs_and_entropies(h, model.output_head_DxV(), target, T)[0]` where valid equals
  `sequence_logprobs(...)` / `packed_slot_logprobs(...)` at those tokens (tests/sampling/test_chunked_logprobs.py).

  Args:
      model: a `jaxcredit.models.Decoder`.
      tokens_BxL, token_mask_BxL: int ids and their bool real-token mask.
      slots_BxK: int slots of packed rows to score, or None: every position of unpacked rows (K = L).
      positions_BxL, segment_ids_BxL, prefix_limit_BxL: as `sequence_logprobs_and_entropies`; slots_BxK needs
          the packed description.

  Returns:
      (h_BxKxD in the model's compute dtype, targets_BxK int32, valid_BxK bool: a real token with a predictor;
      elsewhere h is some row's state and must be masked by the caller).

  Raises:
      ValueError: as `packed_slot_logprobs`, and slots_BxK without segment_ids_BxL.
  """
  tokens_BxL, mask_BxL = _check_tokens_and_mask(tokens_BxL, token_mask_BxL)
  packing = _packed_args(tokens_BxL, positions_BxL, segment_ids_BxL, prefix_limit_BxL)
  if slots_BxK is None:
    if "segment_ids_BxL" in packing:
      raise ValueError("packed rows (segment_ids_BxL) are scored at slots_BxK: pass them")
    positions = packing.get("positions_BxL")
    if positions is None:
      positions = jnp.maximum(jnp.cumsum(mask_BxL.astype(jnp.int32), axis=-1) - 1, 0)
    h_BxLxD, _ = model.hidden_states(tokens_BxL, positions_BxL=positions, token_mask_BxL=mask_BxL)
    h_pred_BxLxD = jnp.pad(h_BxLxD[:, :-1], ((0, 0), (1, 0), (0, 0)))
    valid_BxL = mask_BxL & jnp.pad(mask_BxL[:, :-1], ((0, 0), (1, 0)))
    return h_pred_BxLxD, tokens_BxL, valid_BxL
  slots = jnp.asarray(slots_BxK)
  if slots.ndim != 2 or slots.shape[0] != tokens_BxL.shape[0] or not jnp.issubdtype(slots.dtype, jnp.integer):
    raise ValueError(f"slots_BxK must be integer slots of shape [B={tokens_BxL.shape[0]}, K], got {slots.shape}")
  if "segment_ids_BxL" not in packing:
    raise ValueError("slots_BxK scores packed rows: pass positions_BxL and segment_ids_BxL")
  slots = slots.astype(jnp.int32)
  h_BxLxD, _ = model.hidden_states(tokens_BxL, token_mask_BxL=mask_BxL, **packing)
  pred_BxL = packed_predictor_slots(mask_BxL, packing["segment_ids_BxL"], packing.get("prefix_limit_BxL"))
  pred_BxK = jnp.take_along_axis(pred_BxL, slots, axis=1)
  h_BxKxD = jnp.take_along_axis(h_BxLxD, jnp.maximum(pred_BxK, 0)[..., None], axis=1)
  valid_BxK = jnp.take_along_axis(mask_BxL, slots, axis=1) & (pred_BxK >= 0)
  return h_BxKxD, jnp.take_along_axis(tokens_BxL, slots, axis=1), valid_BxK


def sequence_logprobs(
  model, tokens_BxL: jax.Array, token_mask_BxL: jax.Array, temperature: float | jax.Array, **options
) -> jax.Array:
  """Per-token log-probs of `tokens_BxL` under `model`, one full forward pass without a cache: the log-probs of
  `sequence_logprobs_and_entropies`, whose arguments it takes.

  logp[b, t] is the log-prob (nats) of token t given the tokens before it, under log softmax(logits /
  temperature), untruncated: the prediction made at position t-1 is stored at position t, aligned with the
  token it scores. It is 0 at t = 0, at each row's first real token and at padding (see `logprobs_from_logits`,
  which computes the same from full logits). Positions are cumsum(mask) - 1, so left-padded rows score as if
  unpadded. The logits are computed chunk by chunk and never held whole, also under jax.grad (the unused
  entropies cost a few elementwise ops per chunk).

  Works eagerly or inside a transform (nnx.jit, or jax.jit over nnx.merge(graphdef, state)).

  Args:
      model, tokens_BxL, token_mask_BxL, temperature: as `sequence_logprobs_and_entropies`.
      **options: its keyword-only arguments: seq_chunk, vocab_chunk, and the packed-row description
          positions_BxL, segment_ids_BxL, prefix_limit_BxL (a packed token is scored from its predictor slot).

  Returns:
      logp_BxL: float32 nats.

  Raises:
      ValueError: as `sequence_logprobs_and_entropies`.
      TypeError: a keyword it does not take.
  """
  return sequence_logprobs_and_entropies(model, tokens_BxL, token_mask_BxL, temperature, **options)[0]


def chunked_reverse_kl(
  h_student_BxLxD: jax.Array,
  head_student_DxV: jax.Array,
  h_teacher_BxLxD: jax.Array,
  head_teacher_DxV: jax.Array,
  temperature: float | jax.Array,
  *,
  seq_chunk: int | None = None,
  vocab_chunk: int | None = None,
) -> jax.Array:
  """Reverse KL(student ‖ teacher) over the full vocabulary at every position, without [B, L, V] logits.

  With z_s = (h_student[b, l] · head_student) / temperature and z_t = (h_teacher[b, l] · head_teacher) /
  temperature, float32 vectors over the V vocabulary entries, p = softmax(z):

      kl[b, l] = Σ_v p_s(v) (log p_s(v) - log p_t(v))

  computed in a form that keeps float32's relative accuracy when the two distributions nearly agree (the
  textbook A / S_s - log S_s + log S_t subtracts numbers of size log V to leave one of size 1e-5: with a
  student/teacher pair 0.01 apart it was up to 6% off per position). With the maxima m_s, m_t over the
  vocabulary, the centred log-ratio e(v) = (z_s(v) - z_t(v)) - (m_s - m_t), E the expectation under p_s, and
  φ(e) = e^-e - 1 + e >= 0 (`credit.numerics.expm1_minus_x(-e)`), the exact identity

      log p_s - log p_t = e - log E[e^-e]     (softmax is shift-invariant: log S_t - log S_s = log E[e^-e])
      kl = E[e] + log1p(y),  y = E[e^-e] - 1 = E[φ(e)] - E[e]
         = E[φ(e)] - ψ(y),   ψ(y) = y - log1p(y) >= 0  (`credit.numerics.x_minus_log1p`)

  is used where |y| < 0.5: both terms are O(Var e) when the distributions are close and are computed with
  their own relative accuracy (no term of size |e| or log V is subtracted; z_s - z_t's rounding is recovered
  exactly), so the relative error stays below 1e-4, typically 1e-6, near-equal or not
  (tests/sampling/test_reverse_kl_accuracy.py: float64 references, gaps 1e-4 to 0.3, divergences down to 1e-12). Far apart (|y| >= 0.5, the divergence is then not small) kl = E[e] + log S_t - log S_s.
  With S_s = Σ exp(z_s - m_s), S_t = Σ exp(z_t - m_t), A = Σ exp(z_s - m_s) e and P = Σ exp(z_s - m_s) φ(e),
  E[e] = A / S_s and E[φ(e)] = P / S_s. The sums are kept online, `vocab_chunk` columns at a time (lax.scan),
  each rescaled when a running maximum grows, which also moves the centre m_s - m_t by some δ: A and P are
  moved with it exactly (A' = A - δ S_s; P' = e^δ P + φ(-δ) S_s - expm1(δ) A, from
  φ(e - δ) = e^δ φ(e) + φ(-δ) - expm1(δ) e); the sequence is processed `seq_chunk` positions at a time. So the largest logits block is [B, seq_chunk, vocab_chunk] per model, never [B, L, V]. Both chunk
  bodies are wrapped in `jax.checkpoint` (as in `chunked_logprobs_and_entropies`), so the result is also
  differentiable with respect to both hidden states and heads at the same memory bound.

  The result is clipped at 0 from below (the exact value is >= 0; rounding could leave a few ulps below it). It is exactly 0 where the student's and the teacher's logits are identical.
  Padded vocabulary columns get the logit -1e30 in both models and contribute exactly 0; padded positions are
  dropped from the output.

  Args:
      h_student_BxLxD: the student's final hidden states at the positions that predict each token, any float
          dtype.
      head_student_DxV: the student's output projection [D, V] (for a tied table E [V, D], pass E.T).
      h_teacher_BxLxD: the teacher's final hidden states, aligned with the student's: [B, L, D_t], where D_t
          may differ from the student's D (a teacher of another size sharing the vocabulary).
      head_teacher_DxV: the teacher's output projection [D_t, V], same V as the student's.
      temperature: positive scalar (Python float or array, possibly traced), applied to both models.
      seq_chunk: positions per sequence chunk, a positive int; default min(512, L). Clipped to L.
      vocab_chunk: vocabulary columns per chunk, a positive int, clipped to V (default as in
          `chunked_logprobs_and_entropies`).

  Returns:
      kl_BxL: float32, in nats, >= 0.

  Raises:
      ValueError: at trace time, naming the argument, for a wrong rank, a hidden state and its head disagreeing
          on D, the two hidden states not sharing [B, L], the two heads not sharing V (or V = 0), a non-floating
          input, a non-positive (or non-int) chunk size, or a concrete temperature that is not a positive scalar.
  """
  for name, x, rank in (
    ("h_student_BxLxD", h_student_BxLxD, 3),
    ("head_student_DxV", head_student_DxV, 2),
    ("h_teacher_BxLxD", h_teacher_BxLxD, 3),
    ("head_teacher_DxV", head_teacher_DxV, 2),
  ):
    if getattr(x, "ndim", None) != rank:
      raise ValueError(f"{name} must have rank {rank}, got shape {np.shape(x)}")
    if not jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating):
      raise ValueError(f"{name} must be floating point, got dtype {jnp.asarray(x).dtype}")
  hs, ws = jnp.asarray(h_student_BxLxD), jnp.asarray(head_student_DxV)
  ht, wt = jnp.asarray(h_teacher_BxLxD), jnp.asarray(head_teacher_DxV)
  b, l, ds = hs.shape
  dt = ht.shape[2]
  if ht.shape[:2] != (b, l):
    raise ValueError(f"h_teacher_BxLxD {ht.shape} must share [B, L] with h_student_BxLxD {hs.shape}")
  if ws.shape[0] != ds:
    raise ValueError(
      f"head_student_DxV {ws.shape} must have as many rows as h_student_BxLxD {hs.shape} has features ({ds})"
    )
  if wt.shape[0] != dt:
    raise ValueError(
      f"head_teacher_DxV {wt.shape} must have as many rows as h_teacher_BxLxD {ht.shape} has features ({dt})"
    )
  v = ws.shape[1]
  if wt.shape[1] != v:
    raise ValueError(f"head_teacher_DxV {wt.shape} and head_student_DxV {ws.shape} must share the vocabulary size V")
  if v == 0:
    raise ValueError(f"the heads must have at least one vocabulary column, got shape {ws.shape}")
  lc, vc, n_l, n_v = _chunk_grid(seq_chunk, vocab_chunk, temperature, l, v)
  if l == 0 or b == 0:
    return jnp.zeros((b, l), jnp.float32)

  temperature = jnp.asarray(temperature, jnp.float32)

  def vocab_chunks(w_DxV):
    d = w_DxV.shape[0]
    return jnp.pad(w_DxV.T, ((0, n_v * vc - v), (0, 0))).reshape(n_v, vc, d)

  def seq_chunks(h_BxLxD):
    d = h_BxLxD.shape[2]
    return jnp.pad(h_BxLxD, ((0, 0), (0, n_l * lc - l), (0, 0))).reshape(b, n_l, lc, d).transpose(1, 0, 2, 3)

  ws_NvxVcxD, wt_NvxVcxD = vocab_chunks(ws), vocab_chunks(wt)
  offset_Nv = jnp.arange(n_v, dtype=jnp.int32) * vc

  def seq_body(_, xs):
    hs_BxLcxD, ht_BxLcxD = xs

    def logits(h_BxLcxD, w_VcxD, col_Vc):
      z = jnp.einsum("bld,vd->blv", h_BxLcxD, w_VcxD, preferred_element_type=jnp.float32) / temperature
      return jnp.where(col_Vc < v, z, _NEG)

    def vocab_body(carry, xs):
      ms, ss, mt, st, a, p = carry
      ws_VcxD, wt_VcxD, offset = xs
      col_Vc = offset + jnp.arange(vc, dtype=jnp.int32)
      zs = logits(hs_BxLcxD, ws_VcxD, col_Vc)
      zt = logits(ht_BxLcxD, wt_VcxD, col_Vc)
      ms_new = jnp.maximum(ms, jax.lax.stop_gradient(jnp.max(zs, axis=-1)))
      mt_new = jnp.maximum(mt, jax.lax.stop_gradient(jnp.max(zt, axis=-1)))
      alpha_s, alpha_t = jnp.exp(ms - ms_new), jnp.exp(mt - mt_new)
      # The centre c = m_s - m_t moves by delta; e' = e - delta, w' = alpha_s w, and alpha_s e^delta = alpha_t:
      #   A' = alpha_s (A - delta S),  P' = alpha_t P + alpha_s phi(-delta) S - alpha_s expm1(delta) A.
      # For delta > 30 (e^delta overflows) alpha_s phi(-delta) = alpha_t - alpha_s - alpha_s delta and
      # alpha_s expm1(delta) = alpha_t - alpha_s; the first chunk has S = A = P = 0 and alpha = 0.
      delta = (ms_new - mt_new) - (ms - mt)
      big = delta > 30.0
      delta_c = jnp.where(big, 0.0, delta)
      shift_s = jnp.where(big, alpha_t - alpha_s - alpha_s * delta, alpha_s * expm1_minus_x(delta_c))
      shift_a = jnp.where(big, alpha_t - alpha_s, alpha_s * jnp.expm1(delta_c))
      # e exactly as d - c plus one rounding: z_s - z_t rounds by an ulp of the logits (about 2e-6 at 30, as much
      # as a 1e-4 gap between the distributions), so its rounding error is recovered (TwoSum, Knuth) and added
      # after the centre is taken off (d - c is exact when the two are close, i.e. when e is small).
      d = zs - zt
      zs_part = d + zt
      d_err = (zs - zs_part) - (zt + (d - zs_part))
      e = (d - (ms_new - mt_new)[..., None]) + d_err
      es = jnp.exp(zs - ms_new[..., None])
      et = jnp.exp(zt - mt_new[..., None])
      # phi(e) = e^-e - 1 + e overflows for e < -88, where es < e^-88: there es phi(e) = et - es + es e.
      far = e < -60.0
      phi = jnp.where(far, et - es + es * e, es * expm1_minus_x(-jnp.where(far, 0.0, e)))
      a_new = alpha_s * (a - delta * ss) + jnp.sum(es * e, axis=-1)
      p_new = alpha_t * p + shift_s * ss - shift_a * a + jnp.sum(phi, axis=-1)
      ss_new = alpha_s * ss + jnp.sum(es, axis=-1)
      st_new = alpha_t * st + jnp.sum(et, axis=-1)
      return (ms_new, ss_new, mt_new, st_new, a_new, p_new), None

    neg = jnp.full((b, lc), _NEG, jnp.float32)
    zero = jnp.zeros((b, lc), jnp.float32)
    (_, ss, _, st, a, p), _ = jax.lax.scan(
      jax.checkpoint(vocab_body), (neg, zero, neg, zero, zero, zero), (ws_NvxVcxD, wt_NvxVcxD, offset_Nv)
    )
    mu, phi_mean = a / ss, p / ss
    y = phi_mean - mu  # E_s[e^-e] - 1 = S_t / S_s - 1
    near = jnp.abs(y) < 0.5
    kl_near = phi_mean - x_minus_log1p(jnp.where(near, y, 0.0))
    kl_far = mu + (jnp.log(st) - jnp.log(ss))
    return None, jnp.maximum(jnp.where(near, kl_near, kl_far), 0.0)

  _, kl_NlxBxLc = jax.lax.scan(jax.checkpoint(seq_body), None, (seq_chunks(hs), seq_chunks(ht)))
  return kl_NlxBxLc.transpose(1, 0, 2).reshape(b, n_l * lc)[:, :l]
