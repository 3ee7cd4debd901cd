"""Causal attention through the Pallas TPU splash-attention kernel (jax.experimental.pallas.ops.tpu).

On TPU the kernel runs compiled (Mosaic); elsewhere it runs in Pallas interpret mode, which is how the tests
exercise this path on CPU (slowly: use it only on small shapes there). Pads are handled with segment ids: real
tokens are segment 1 and pads segment 0, so real tokens attend only to earlier real tokens; a pad's own output is
finite and meaningless (as in the other implementations).

Under a mesh (`jax.set_mesh`) the kernel is wrapped in `jax.shard_map` over the batch and kv-head axes, with the
specs the sharding table gives the activations: a Pallas call cannot be partitioned by GSPMD.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxcredit import sharding


def splash_causal_attention(
  q_BxLxHxDh: jax.Array,
  k_BxLxKxDh: jax.Array,
  v_BxLxKxDh: jax.Array,
  token_mask_BxL: jax.Array,
  *,
  block: int = 512,
  interpret: bool | None = None,
) -> jax.Array:
  """Causal GQA with the splash kernel: softmax(q·kᵀ/sqrt(Dh) + causal and pad mask) v.

  Args:
    q_BxLxHxDh: queries after RoPE; k_BxLxKxDh, v_BxLxKxDh: keys/values (K divides H).
    token_mask_BxL: bool, True for real tokens.
    block: preferred query/key block of the kernel; the first of (block, 512, 256, 128) that divides L is used,
      else L itself (on TPU, L should be a multiple of 128).
    interpret: run the kernel in Pallas interpret mode (default: when the backend is not TPU).

  Returns:
    [B, L, H, Dh] in q's dtype.

  Raises:
    ValueError: L not a multiple of the block.
  """
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

  b, l, h, dh = q_BxLxHxDh.shape
  kh = k_BxLxKxDh.shape[2]
  g = h // kh
  blk = next((c for c in (block, 512, 256, 128) if c <= l and l % c == 0), l)
  if l % blk:
    raise ValueError(
      f"splash attention needs L ({l}) to be a multiple of its block ({blk}); pad the batch "
      f"(config.train.length_bucket) or use attention_impl='chunked'"
    )
  if interpret is None:
    interpret = jax.default_backend() != "tpu"
  sizes = sk.BlockSizes(
    block_q=blk,
    block_kv=blk,
    block_kv_compute=blk,
    block_q_dkv=blk,
    block_kv_dkv=blk,
    block_kv_dkv_compute=blk,
    block_q_dq=blk,
    block_kv_dq=blk,
  )
  mask = sm.MultiHeadMask([sm.CausalMask((l, l)) for _ in range(g)])

  def local(q, k, v, seg):
    # q [b, K, G, L, Dh] (pre-scaled), k/v [b, K, L, Dh], seg [b, L]: one MQA kernel per (row, kv head).
    kernel = sk.make_splash_mqa_single_device(mask=mask, block_sizes=sizes, interpret=interpret)
    per_head = jax.vmap(kernel, in_axes=(0, 0, 0, None))
    per_row = jax.vmap(lambda q, k, v, s: per_head(q, k, v, sk.SegmentIds(q=s, kv=s)))
    return per_row(q, k, v, seg)

  q = jnp.moveaxis(q_BxLxHxDh.reshape(b, l, kh, g, dh), 1, 3) * jnp.asarray(dh**-0.5, q_BxLxHxDh.dtype)
  k = jnp.moveaxis(k_BxLxKxDh, 1, 2)
  v = jnp.moveaxis(v_BxLxKxDh, 1, 2)
  seg = token_mask_BxL.astype(jnp.int32)
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and mesh.size > 1:
    shape = dict(mesh.shape)
    batch = sharding.logical_to_spec(("activation_batch",), (b,), shape)
    heads = sharding.logical_to_spec((None, "activation_kv_heads"), (b, kh), shape)
    bax = batch[0] if len(batch) else None
    hax = heads[1] if len(heads) > 1 else None
    local = jax.shard_map(
      local, in_specs=(P(bax, hax), P(bax, hax), P(bax, hax), P(bax)), out_specs=P(bax, hax), check_vma=False
    )
  out = local(q, k, v, seg)  # b K G L Dh
  return jnp.moveaxis(out, 3, 1).reshape(b, l, h, dh).astype(q_BxLxHxDh.dtype)
