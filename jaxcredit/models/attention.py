"""The decoder's exact attention: grouped-query attention with a float32 softmax (plain, over a cache's old keys
and the new ones without concatenating them, and for one decode query), the packed-row mask, and the choice among
the full, chunked (`chunked_attention`) and splash (`splash`) kernels for a cache-free forward.

Shape letters: B batch, L queries in this call, S keys (cache slots), H query heads, K key/value heads,
G = H / K query heads per kv head, Dh head width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxcredit.models.config import ModelConfig

# Added to masked attention scores before the float32 softmax; finite so that a fully masked row stays finite.
_MASKED_SCORE = -1e30


def attention(q_BxLxHxDh: jax.Array, k_BxSxKxDh: jax.Array, v_BxSxKxDh: jax.Array, mask_BxLxS: jax.Array) -> jax.Array:
  """Exact grouped-query attention with a float32 softmax.

  out_i = Σ_s softmax_s(q_i·k_s / sqrt(Dh) over allowed s) v_s; query head h reads kv head h // G.
  A query with no allowed key (a pad query) gets a zero output rather than NaN.

  Args:
    q_BxLxHxDh: queries.
    k_BxSxKxDh, v_BxSxKxDh: keys and values (K divides H).
    mask_BxLxS: bool, True where query l may attend to key s.

  Returns:
    [B, L, H, Dh] in q's dtype.
  """
  b, l, h, dh = q_BxLxHxDh.shape
  k = k_BxSxKxDh.shape[2]
  if l == 1:
    return _single_query_attention(q_BxLxHxDh, k_BxSxKxDh, v_BxSxKxDh, mask_BxLxS)
  q_BxLxKxGxDh = q_BxLxHxDh.reshape(b, l, k, h // k, dh)
  scores_BxKxGxLxS = jnp.einsum("blkgd,bskd->bkgls", q_BxLxKxGxDh, k_BxSxKxDh, preferred_element_type=jnp.float32) * (
    dh**-0.5
  )
  allowed_Bx1x1xLxS = mask_BxLxS[:, None, None, :, :]
  scores_BxKxGxLxS = jnp.where(allowed_Bx1x1xLxS, scores_BxKxGxLxS, _MASKED_SCORE)
  probs_BxKxGxLxS = jax.nn.softmax(scores_BxKxGxLxS, axis=-1)
  probs_BxKxGxLxS = jnp.where(allowed_Bx1x1xLxS, probs_BxKxGxLxS, 0.0)
  out_BxLxKxGxDh = jnp.einsum(
    "bkgls,bskd->blkgd", probs_BxKxGxLxS.astype(v_BxSxKxDh.dtype), v_BxSxKxDh, preferred_element_type=jnp.float32
  )
  return out_BxLxKxGxDh.reshape(b, l, h, dh).astype(q_BxLxHxDh.dtype)


def two_part_attention(
  q_BxLxHxDh: jax.Array,
  k_old_BxSxKxDh: jax.Array,
  v_old_BxSxKxDh: jax.Array,
  mask_old_BxLxS: jax.Array,
  k_new_BxLxKxDh: jax.Array,
  v_new_BxLxKxDh: jax.Array,
  mask_new_BxLxL: jax.Array,
) -> jax.Array:
  """`attention` over the union of old (cached) and new keys, without concatenating them.

  One softmax over both parts: with m the max score over allowed keys of either part,
  out = (Σ_old e^{s-m} v + Σ_new e^{s-m} v) / (Σ_old e^{s-m} + Σ_new e^{s-m}). A query with no allowed key
  gets a zero output. Keys/values may be in a lower precision; the math is float32.
  """
  b, l, h, dh = q_BxLxHxDh.shape
  kh = k_old_BxSxKxDh.shape[2]
  q_BxLxKxGxDh = q_BxLxHxDh.reshape(b, l, kh, h // kh, dh).astype(jnp.float32) * (dh**-0.5)
  k_old = k_old_BxSxKxDh.astype(jnp.float32)
  v_old = v_old_BxSxKxDh.astype(jnp.float32)
  if l == 1:  # decode step: broadcast-multiply-and-reduce is ~2x faster than dot_general on XLA:CPU
    s_old_BxLxKxGxS = jnp.sum(q_BxLxKxGxDh[:, 0, None] * k_old[:, :, :, None, :], axis=-1)  # B S K G
    s_old_BxLxKxGxS = jnp.moveaxis(s_old_BxLxKxGxS, 1, -1)[:, None]
  else:
    s_old_BxLxKxGxS = jnp.einsum("blkgd,bskd->blkgs", q_BxLxKxGxDh, k_old)
  s_new_BxLxKxGxL = jnp.einsum("blkgd,bmkd->blkgm", q_BxLxKxGxDh, k_new_BxLxKxDh.astype(jnp.float32))
  allow_old = mask_old_BxLxS[:, :, None, None, :]
  allow_new = mask_new_BxLxL[:, :, None, None, :]
  s_old_BxLxKxGxS = jnp.where(allow_old, s_old_BxLxKxGxS, _MASKED_SCORE)
  s_new_BxLxKxGxL = jnp.where(allow_new, s_new_BxLxKxGxL, _MASKED_SCORE)
  m = jnp.maximum(jnp.max(s_old_BxLxKxGxS, axis=-1, keepdims=True), jnp.max(s_new_BxLxKxGxL, axis=-1, keepdims=True))
  p_old = jnp.where(allow_old, jnp.exp(s_old_BxLxKxGxS - m), 0.0)
  p_new = jnp.where(allow_new, jnp.exp(s_new_BxLxKxGxL - m), 0.0)
  denom = jnp.sum(p_old, axis=-1, keepdims=True) + jnp.sum(p_new, axis=-1, keepdims=True)
  if l == 1:
    o_old = jnp.sum(jnp.moveaxis(p_old[:, 0], -1, 1)[..., None] * v_old[:, :, :, None, :], axis=1)[:, None]
  else:
    o_old = jnp.einsum("blkgs,bskd->blkgd", p_old, v_old)
  o_new = jnp.einsum("blkgm,bmkd->blkgd", p_new, v_new_BxLxKxDh.astype(jnp.float32))
  out = (o_old + o_new) / jnp.maximum(denom, 1e-30)
  return out.reshape(b, l, h, dh).astype(q_BxLxHxDh.dtype)


def _single_query_attention(
  q_Bx1xHxDh: jax.Array, k_BxSxKxDh: jax.Array, v_BxSxKxDh: jax.Array, mask_Bx1xS: jax.Array
) -> jax.Array:
  """`attention` for one query per row (a decode step), as broadcast-multiply-and-reduce.

  Same math as the einsum path; XLA:CPU runs these tiny batched contractions about 2x faster this way than as
  dot_generals (measured: 2.1 ms against 4.8 ms per layer at B=8, S=384, H=9, K=3, Dh=64).
  """
  b, _, h, dh = q_Bx1xHxDh.shape
  k = k_BxSxKxDh.shape[2]
  q_BxKxGxDh = q_Bx1xHxDh.reshape(b, k, h // k, dh).astype(jnp.float32)
  scores_BxSxKxG = jnp.sum(q_BxKxGxDh[:, None] * k_BxSxKxDh.astype(jnp.float32)[:, :, :, None, :], axis=-1)
  scores_BxSxKxG = scores_BxSxKxG * (dh**-0.5)
  allowed_BxSx1x1 = mask_Bx1xS[:, 0, :, None, None]
  scores_BxSxKxG = jnp.where(allowed_BxSx1x1, scores_BxSxKxG, _MASKED_SCORE)
  probs_BxSxKxG = jax.nn.softmax(scores_BxSxKxG, axis=1)
  probs_BxSxKxG = jnp.where(allowed_BxSx1x1, probs_BxSxKxG, 0.0)
  out_BxKxGxDh = jnp.sum(probs_BxSxKxG[..., None] * v_BxSxKxDh.astype(jnp.float32)[:, :, :, None, :], axis=1)
  return out_BxKxGxDh.reshape(b, 1, h, dh).astype(q_Bx1xHxDh.dtype)


def packed_attention_mask(
  token_mask_BxL: jax.Array, segment_ids_BxL: jax.Array, prefix_limit_BxL: jax.Array | None = None
) -> jax.Array:
  """mask_BxLxS (S = L) of a packed row: a shared prefix (segment 0) and segments k >= 1 appended after it.

      allowed[b, q, s] = token_mask[b, s] & s <= q
                         & (segment[b, s] == segment[b, q] | (segment[b, s] == 0 & s < prefix_limit[b, q]))

  prefix_limit defaults to 0 (each segment sees only itself); it is irrelevant on segment 0, whose tokens see
  the prefix causally anyway. With one segment 0 (all zeros) this is the plain causal-and-padding mask.
  """
  l = token_mask_BxL.shape[1]
  seg_BxL = jnp.asarray(segment_ids_BxL).astype(jnp.int32)
  slot_L = jnp.arange(l, dtype=jnp.int32)
  causal_LxS = slot_L[None, :] <= slot_L[:, None]
  same_BxLxS = seg_BxL[:, :, None] == seg_BxL[:, None, :]
  if prefix_limit_BxL is None:
    allowed_BxLxS = same_BxLxS
  else:
    limit_BxL = jnp.asarray(prefix_limit_BxL).astype(jnp.int32)
    in_prefix_BxLxS = (seg_BxL[:, None, :] == 0) & (slot_L[None, None, :] < limit_BxL[:, :, None])
    allowed_BxLxS = same_BxLxS | in_prefix_BxLxS
  return causal_LxS[None] & token_mask_BxL.astype(jnp.bool_)[:, None, :] & allowed_BxLxS


def attention_impl(cfg: ModelConfig, length: int) -> str:
  """The attention used for a cache-free forward over `length` tokens: cfg.attention_impl, with "auto" meaning
  splash on TPU (when length is a multiple of 128, the kernel's tile), chunked when length >
  cfg.attention_chunk, full otherwise."""
  if cfg.attention_impl != "auto":
    return cfg.attention_impl
  if jax.default_backend() == "tpu" and length % 128 == 0:
    return "splash"
  return "chunked" if length > cfg.attention_chunk else "full"
