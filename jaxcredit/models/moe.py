"""The Qwen3-MoE mixture-of-experts MLP: top-k routing, the experts as ragged grouped matmuls or a dense sum, and
the expert-parallel version under a mesh (a shard_map).

Shape letters: B batch, L tokens, T = B·L tokens flattened, D model width, E experts, K experts per token (top-k),
Fm expert MLP width, P (token, expert) pairs.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp

from jaxcredit.models.config import ModelConfig
from jaxcredit.sharding import constrain


def route(cfg: ModelConfig, h_TxD: jax.Array, router_DxE: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Qwen3-MoE routing: float32 softmax over the E router logits, top-k, optional renormalisation.

  Returns:
    (weights_TxK in h's dtype, expert ids_TxK int32), as Hugging Face `Qwen3MoeTopKRouter`.
  """
  logits_TxE = jnp.einsum("td,de->te", h_TxD, router_DxE)
  probs_TxE = jax.nn.softmax(logits_TxE.astype(jnp.float32), axis=-1)
  weights_TxK, experts_TxK = jax.lax.top_k(probs_TxE, cfg.num_experts_per_tok)
  if cfg.norm_topk_prob:
    weights_TxK = weights_TxK / jnp.sum(weights_TxK, axis=-1, keepdims=True)
  return weights_TxK.astype(h_TxD.dtype), experts_TxK.astype(jnp.int32)


def moe_mlp(cfg: ModelConfig, h_BxLxD: jax.Array, p: Mapping[str, jax.Array]) -> jax.Array:
  """Mixture of SwiGLU experts: Σ_k w_k · down_e(silu(gate_e(h)) · up_e(h)) over each token's top-k experts e.

  `cfg.moe_impl == "ragged"`: the T·k (token, expert) pairs are sorted by expert and run as three
  `jax.lax.ragged_dot` grouped matmuls (no capacity, nothing dropped). "dense": every expert runs on every
  token and the outputs are combined with the sparse router weights (E/k times the FLOPs; exact the same sum).
  """
  b, l, d = h_BxLxD.shape
  e = cfg.num_experts
  mesh = jax.sharding.get_abstract_mesh()
  if cfg.moe_impl == "ragged" and not mesh.empty and mesh.size > 1:
    return _moe_sharded(cfg, h_BxLxD, p, mesh)  # routes inside the shard_map
  h_TxD = h_BxLxD.reshape(b * l, d)
  weights_TxK, experts_TxK = route(cfg, h_TxD, p["router"])
  if cfg.moe_impl == "dense":
    combine_TxE = jnp.sum(jax.nn.one_hot(experts_TxK, e, dtype=weights_TxK.dtype) * weights_TxK[..., None], axis=1)
    gate_TxExF = jnp.einsum("td,edf->tef", h_TxD, p["we_gate"])
    up_TxExF = jnp.einsum("td,edf->tef", h_TxD, p["we_up"])
    act_TxExF = constrain(
      jax.nn.silu(gate_TxExF) * up_TxExF, ("activation_batch", "activation_expert", "activation_mlp")
    )
    out_TxD = jnp.einsum("tef,efd,te->td", act_TxExF, p["we_down"], combine_TxE)
    return out_TxD.reshape(b, l, d)
  out_TxD = _ragged_experts(h_TxD, weights_TxK, experts_TxK, p["we_gate"], p["we_up"], p["we_down"], 0)
  return out_TxD.reshape(b, l, d)


def _ragged_experts(h_TxD, weights_TxK, experts_TxK, w_gate, w_up, w_down, first_expert):
  """Σ_k w_k · expert(h) over the (token, expert) pairs whose expert is one of the E_loc experts held here
  (ids first_expert .. first_expert + E_loc - 1); other pairs contribute 0. Ragged grouped matmuls."""
  t, k = experts_TxK.shape
  e_loc = w_gate.shape[0]
  local = experts_TxK.reshape(-1) - first_expert
  valid = (local >= 0) & (local < e_loc)
  group = jnp.where(valid, local, e_loc)  # pairs for other shards' experts sort to the end, in no group
  order = jnp.argsort(group, stable=True)
  group_sizes = jnp.bincount(group, length=e_loc + 1)[:e_loc].astype(jnp.int32)
  x_PxD = jnp.take(h_TxD, order // k, axis=0)
  gate_PxF = jax.lax.ragged_dot(x_PxD, w_gate, group_sizes)
  up_PxF = jax.lax.ragged_dot(x_PxD, w_up, group_sizes)
  y_PxD = jax.lax.ragged_dot(jax.nn.silu(gate_PxF) * up_PxF, w_down, group_sizes)
  y_TKxD = jnp.zeros_like(y_PxD).at[order].set(y_PxD, unique_indices=True)
  w_TK = jnp.where(valid, weights_TxK.reshape(-1), 0).astype(y_TKxD.dtype)
  return jnp.sum((y_TKxD * w_TK[:, None]).reshape(t, k, -1), axis=1)


def _moe_sharded(cfg: ModelConfig, h_BxLxD: jax.Array, p: Mapping[str, jax.Array], mesh) -> jax.Array:
  """Expert-parallel `moe_mlp` under a mesh (a `jax.shard_map`; GSPMD cannot partition ragged_dot well).

  Each device holds its rows of tokens and E/ep experts (ep = the expert axis size the sharding table gives
  the expert weights). Its tokens are all-gathered over the expert axis, routed, run through the local experts
  only, and the partial sums are reduce-scattered back over the expert axis. Weights sharded on other axes
  (fsdp on D, tensor on Fm) are all-gathered inside, as fsdp does for dense layers.
  """
  from jax.sharding import PartitionSpec as P

  from jaxcredit.sharding import logical_to_spec

  shape = dict(mesh.shape)
  b, l, d = h_BxLxD.shape

  def full(spec, ndim):
    return tuple(spec) + (None,) * (ndim - len(spec))

  h_spec = full(logical_to_spec(("activation_batch", None, None), h_BxLxD.shape, shape), 3)
  r_spec = full(logical_to_spec(("embed", "router_experts"), p["router"].shape, shape), 2)
  g_spec = full(logical_to_spec(("expert", "embed", "mlp"), p["we_gate"].shape, shape), 3)
  d_spec = full(logical_to_spec(("expert", "mlp", "embed"), p["we_down"].shape, shape), 3)
  expert_axes = g_spec[0]
  if expert_axes != d_spec[0]:
    raise ValueError(f"expert weights shard E differently: we_gate {g_spec}, we_down {d_spec}")
  token_axes = h_spec[0] if h_spec[0] is not None else ()
  token_axes = token_axes if isinstance(token_axes, tuple) else (token_axes,)
  ep_axes = () if expert_axes is None else expert_axes if isinstance(expert_axes, tuple) else (expert_axes,)
  gather_tokens = tuple(a for a in token_axes if a in ep_axes)  # tokens sharded over the expert axes too

  def gather(x, spec, skip=0):
    for axis, names in enumerate(spec):
      if axis != skip and names is not None:
        x = jax.lax.all_gather(x, names, axis=axis, tiled=True)
    return x

  def local(h, router, w_gate, w_up, w_down):
    router = gather(router, r_spec, skip=-1)
    w_gate, w_up = gather(w_gate, g_spec), gather(w_up, g_spec)
    w_down = gather(w_down, d_spec)
    hb, hl, _ = h.shape
    h_TxD = h.reshape(hb * hl, d)
    if gather_tokens:
      h_TxD = jax.lax.all_gather(h_TxD, gather_tokens, axis=0, tiled=True)
    weights, experts = route(cfg, h_TxD, router)
    first = jax.lax.axis_index(ep_axes) * w_gate.shape[0] if ep_axes else 0
    out = _ragged_experts(h_TxD, weights, experts, w_gate, w_up, w_down, first)
    if gather_tokens:
      out = jax.lax.psum_scatter(out, gather_tokens, scatter_dimension=0, tiled=True)
      rest = tuple(a for a in ep_axes if a not in gather_tokens)
      if rest:
        out = jax.lax.psum(out, rest)
    elif ep_axes:
      out = jax.lax.psum(out, ep_axes)
    return out.reshape(hb, hl, d)

  fn = jax.shard_map(
    local,
    mesh=mesh,
    in_specs=(P(*h_spec), P(*r_spec), P(*g_spec), P(*g_spec), P(*d_spec)),
    out_specs=P(*h_spec),
    check_vma=False,
  )
  return fn(h_BxLxD, p["router"], p["we_gate"], p["we_up"], p["we_down"])
