"""Causal grouped-query attention in blocks (flash-style, pure XLA): never an [L, L] score matrix.

Shape letters: B batch, L tokens, H query heads, K key/value heads, G = H / K, Dh head width, C block size.

Forward: for each block of C queries, loop over the key blocks at or before it with an online softmax (running max
m, running sum l, running weighted values), then out = acc / l and logsumexp = m + log l. Backward (a custom VJP,
Dao et al. 2022, "FlashAttention", Algorithm 2 in blocked form): recompute each block's probabilities from the
saved logsumexp; dV += Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − rowsum(dO ∘ O)), dQ += dS K, dK += dSᵀ Q. The saved
residuals are q, k, v, the output and the logsumexp, so memory is O(B·L·H·Dh + B·H·C²), not O(B·H·L²).

The loops are `lax.map` over query (or key) blocks and `fori_loop`s with data-dependent bounds over the causal
blocks, so blocks above the diagonal are skipped and compile time does not grow with L.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_MASKED = -1e30


def chunked_causal_attention(
  q_BxLxHxDh: jax.Array, k_BxLxKxDh: jax.Array, v_BxLxKxDh: jax.Array, key_mask_BxL: jax.Array, block: int = 512
) -> jax.Array:
  """Exact causal attention: query i attends key j when j <= i and key_mask[j]; float32 softmax.

  Equals `jaxcredit.models.attention.attention` with mask = tril & key_mask (a query with no allowed key gets a
  zero output), differentiable (custom VJP).

  Args:
    q_BxLxHxDh: queries (after RoPE).
    k_BxLxKxDh, v_BxLxKxDh: keys and values of the same L tokens (K divides H).
    key_mask_BxL: bool, True for real tokens (pads are never keys).
    block: C, the block size in tokens (L is padded up to a multiple of it internally).

  Returns:
    [B, L, H, Dh] in q's dtype.

  Raises:
    ValueError: for inconsistent shapes or a non-positive block.
  """
  b, l, h, dh = q_BxLxHxDh.shape
  if k_BxLxKxDh.shape[:2] != (b, l) or v_BxLxKxDh.shape != k_BxLxKxDh.shape or h % k_BxLxKxDh.shape[2]:
    raise ValueError(
      f"chunked_causal_attention: q {q_BxLxHxDh.shape}, k {k_BxLxKxDh.shape} and v "
      f"{v_BxLxKxDh.shape} are not [B, L, H, Dh] / [B, L, K, Dh] with K dividing H"
    )
  if key_mask_BxL.shape != (b, l):
    raise ValueError(f"chunked_causal_attention: key_mask_BxL {key_mask_BxL.shape} must be {(b, l)}")
  if block <= 0:
    raise ValueError(f"chunked_causal_attention: block must be positive, got {block}")
  block = min(block, l)
  pad = (-l) % block
  if pad:
    q_BxLxHxDh = jnp.pad(q_BxLxHxDh, ((0, 0), (0, pad), (0, 0), (0, 0)))
    k_BxLxKxDh = jnp.pad(k_BxLxKxDh, ((0, 0), (0, pad), (0, 0), (0, 0)))
    v_BxLxKxDh = jnp.pad(v_BxLxKxDh, ((0, 0), (0, pad), (0, 0), (0, 0)))
    key_mask_BxL = jnp.pad(key_mask_BxL, ((0, 0), (0, pad)))
  out = _flash(q_BxLxHxDh, k_BxLxKxDh, v_BxLxKxDh, key_mask_BxL.astype(jnp.bool_), block)
  return out[:, :l]


def _blocks(x, block):
  """[B, Lp, ...] -> [n, B, C, ...] (block-major, for lax.map / dynamic indexing)."""
  b, lp = x.shape[:2]
  return jnp.moveaxis(x.reshape(b, lp // block, block, *x.shape[2:]), 1, 0)


def _unblocks(x):
  n, b, c = x.shape[:3]
  return jnp.moveaxis(x, 0, 1).reshape(b, n * c, *x.shape[3:])


def _scores(q_i, k_j, mask_j, i, j, block):
  """Scaled scores [B, K, G, C, C] of query block i (q_i [B, C, K, G, Dh], pre-scaled) against key block j,
  and the bool allowed mask (causal by absolute index, key mask)."""
  s = jnp.einsum("bqkgd,bskd->bkgqs", q_i, k_j)
  q_pos = i * block + jnp.arange(block)
  k_pos = j * block + jnp.arange(block)
  allowed = (q_pos[:, None] >= k_pos[None, :])[None, None, None] & mask_j[:, None, None, None, :]
  return jnp.where(allowed, s, _MASKED), allowed


def _forward(q, k, v, mask, block):
  b, lp, h, dh = q.shape
  kh = k.shape[2]
  g = h // kh
  scale = dh**-0.5
  qb = _blocks((q.astype(jnp.float32) * scale).reshape(b, lp, kh, g, dh), block)  # n B C K G Dh
  kb, vb = _blocks(k.astype(jnp.float32), block), _blocks(v.astype(jnp.float32), block)
  mb = _blocks(mask, block)

  def one_query_block(args):
    i, q_i = args

    def body(j, carry):
      m, s_sum, acc = carry
      s, allowed = _scores(q_i, kb[j], mb[j], i, j, block)
      m_new = jnp.maximum(m, jnp.max(s, axis=-1))
      p = jnp.where(allowed, jnp.exp(s - m_new[..., None]), 0.0)
      corr = jnp.exp(m - m_new)
      return (
        m_new,
        s_sum * corr + jnp.sum(p, axis=-1),
        acc * corr[..., None] + jnp.einsum("bkgqs,bskd->bkgqd", p, vb[j]),
      )

    init = (
      jnp.full((b, kh, g, block), _MASKED, jnp.float32),
      jnp.zeros((b, kh, g, block), jnp.float32),
      jnp.zeros((b, kh, g, block, dh), jnp.float32),
    )
    m, s_sum, acc = jax.lax.fori_loop(0, i + 1, body, init)
    out = acc / jnp.maximum(s_sum, 1e-30)[..., None]
    lse = jnp.where(s_sum > 0, m + jnp.log(jnp.maximum(s_sum, 1e-30)), -_MASKED)
    return out, lse

  n = lp // block
  out_nBKGCD, lse_nBKGC = jax.lax.map(one_query_block, (jnp.arange(n), qb))
  # -> [B, Lp, H, Dh]
  out = jnp.moveaxis(out_nBKGCD, 4, 2)  # n B C K G Dh
  out = _unblocks(out).reshape(b, lp, h, dh)
  return out, lse_nBKGC


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, mask, block):
  out, _ = _forward(q, k, v, mask, block)
  return out.astype(q.dtype)


def _flash_fwd(q, k, v, mask, block):
  out, lse = _forward(q, k, v, mask, block)
  out_q = out.astype(q.dtype)
  return out_q, (q, k, v, mask, out_q, lse)


def _flash_bwd(block, residuals, d_out):
  q, k, v, mask, out, lse = residuals
  b, lp, h, dh = q.shape
  kh = k.shape[2]
  g = h // kh
  n = lp // block
  scale = dh**-0.5
  q5 = q.astype(jnp.float32).reshape(b, lp, kh, g, dh)
  do5 = d_out.astype(jnp.float32).reshape(b, lp, kh, g, dh)
  delta = jnp.sum(do5 * out.astype(jnp.float32).reshape(b, lp, kh, g, dh), axis=-1)  # B Lp K G
  qb, dob = _blocks(q5 * scale, block), _blocks(do5, block)  # n B C K G Dh
  deltab = jnp.moveaxis(_blocks(delta, block), 2, -1)  # n B K G C
  kb, vb = _blocks(k.astype(jnp.float32), block), _blocks(v.astype(jnp.float32), block)
  mb = _blocks(mask, block)

  def probs(i, j):
    s, allowed = _scores(qb[i], kb[j], mb[j], i, j, block)
    p = jnp.where(allowed, jnp.exp(s - lse[i][..., None]), 0.0)  # B K G Cq Ck
    dp = jnp.einsum("bqkgd,bskd->bkgqs", dob[i], vb[j])
    ds = p * (dp - deltab[i][..., None])
    return p, ds

  def dq_block(i):
    def body(j, dq):
      _, ds = probs(i, j)
      return dq + jnp.einsum("bkgqs,bskd->bqkgd", ds, kb[j])

    return jax.lax.fori_loop(0, i + 1, body, jnp.zeros((b, block, kh, g, dh), jnp.float32)) * scale

  def dkv_block(j):
    def body(i, carry):
      dk, dv = carry
      p, ds = probs(i, j)
      return (dk + jnp.einsum("bkgqs,bqkgd->bskd", ds, qb[i]), dv + jnp.einsum("bkgqs,bqkgd->bskd", p, dob[i]))

    zero = jnp.zeros((b, block, kh, dh), jnp.float32)
    return jax.lax.fori_loop(j, n, body, (zero, zero))

  dq = _unblocks(jax.lax.map(dq_block, jnp.arange(n))).reshape(b, lp, h, dh)
  dk, dv = jax.lax.map(dkv_block, jnp.arange(n))
  return dq.astype(q.dtype), _unblocks(dk).astype(k.dtype), _unblocks(dv).astype(v.dtype), None


_flash.defvjp(_flash_fwd, _flash_bwd)
