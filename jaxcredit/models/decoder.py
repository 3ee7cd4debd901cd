"""Decoder-only transformer in Flax NNX: the Llama path (SmolLM2) with the Qwen3 switches.

Shape letters: B batch, L tokens in this call, S cache slots, N layers, D model width, H query heads,
K key/value heads, G = H / K query heads per kv head, Dh head width, F MLP width, V vocabulary.

The N decoder blocks keep their parameters stacked along a leading [N] axis and run as one `jax.lax.scan` over a
pure per-layer function, so compile time does not grow with depth; `ModelConfig.remat` wraps that function in
`jax.checkpoint`. RoPE uses the Hugging Face layout (rotate_half over the two halves of Dh, not interleaved pairs),
so weights converted from Hugging Face checkpoints need no permutation. Norms, softmax and logits run in float32.

Call the model under jit (`nnx.jit`, or `jax.jit` over `nnx.split` / `nnx.merge`): an eager call retraces the scan
every time. For decoding, donate the cache to the jitted step (`donate_argnums`): each layer then writes only its
new slots in place.

This module holds the parameters (`DecoderLayers`, their initialisation, `compute_params`, `param_shapes`,
`set_params`), one block's math and the `Decoder` module. Its parts live beside it: `rope` (rotary tables),
`attention` (exact attention, the packed-row mask, the kernel choice), `kv_cache` (`KVCache`, `init_cache`), `moe`
(the mixture-of-experts MLP) and `logical_axes` (the parameter -> logical axes table); their names are still
importable from here.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcredit import trees
from jaxcredit.models.attention import attention, attention_impl, packed_attention_mask, two_part_attention
from jaxcredit.models.chunked_attention import chunked_causal_attention
from jaxcredit.models.config import ModelConfig
from jaxcredit.models.kv_cache import KVCache
from jaxcredit.models.logical_axes import _PARAM_LOGICAL_AXES, ACTIVATION_AXES
from jaxcredit.models.moe import moe_mlp
from jaxcredit.models.rope import apply_rope, rope_cos_sin
from jaxcredit.sharding import constrain

# Names this module held before issue 33 split it, still importable from here (`X as X`: an intended re-export).
from jaxcredit.models.attention import _MASKED_SCORE as _MASKED_SCORE
from jaxcredit.models.attention import _single_query_attention as _single_query_attention
from jaxcredit.models.kv_cache import init_cache as init_cache
from jaxcredit.models.logical_axes import default_logical_axes as default_logical_axes
from jaxcredit.models.moe import _moe_sharded as _moe_sharded
from jaxcredit.models.moe import _ragged_experts as _ragged_experts
from jaxcredit.models.moe import route as route
from jaxcredit.models.rope import rope_inv_freq as rope_inv_freq


# Per-layer parameter names in the stacked `DecoderLayers` module.
_LAYER_PARAMS = (
  "attn_norm",
  "wq",
  "wk",
  "wv",
  "wo",
  "q_norm",
  "k_norm",
  "mlp_norm",
  "w_gate",
  "w_up",
  "w_down",
  "router",
  "we_gate",
  "we_up",
  "we_down",
)


def param_logical_axes(cfg: ModelConfig) -> dict[str, tuple[str, ...]]:
  """Logical axis names of every parameter of `Decoder(cfg)` by '/'-joined path (see jaxcredit.sharding)."""
  return {name: _PARAM_LOGICAL_AXES[name] for name in param_shapes(cfg)}


def rms_norm(x_BxLxD: jax.Array, w_D: jax.Array, eps: float) -> jax.Array:
  """RMSNorm over the last axis, computed in float32 (as Hugging Face Llama/Qwen3 do), returned in x's dtype.

  y = w · x / sqrt(mean(x²) + eps)
  """
  x32 = x_BxLxD.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
  return (w_D.astype(jnp.float32) * x32).astype(x_BxLxD.dtype)


@functools.partial(jax.jit, static_argnums=1)
def _random_params(key: jax.Array, cfg: ModelConfig) -> dict[str, Any]:
  """Initial parameters: N(0, 0.02²) matrices, unit norm weights, in cfg.param_dtype (cfg.dtype when "").

  One normal draw for all matrices, sliced: a separate draw per shape costs a PRNG compile per shape, which
  dominates start-up of small models on CPU.
  """
  n, d, f, v = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
  h, k, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  dense = {"embedding": (v, d), "wq": (n, d, h, dh), "wk": (n, d, k, dh), "wv": (n, d, k, dh), "wo": (n, h, dh, d)}
  if cfg.is_moe:
    e, fm = cfg.num_experts, cfg.moe_intermediate_size
    dense.update(router=(n, d, e), we_gate=(n, e, d, fm), we_up=(n, e, d, fm), we_down=(n, e, fm, d))
  else:
    dense.update(w_gate=(n, d, f), w_up=(n, d, f), w_down=(n, f, d))
  if not cfg.tie_word_embeddings:
    dense["lm_head"] = (d, v)
  sizes = [int(np.prod(shape)) for shape in dense.values()]
  flat = 0.02 * jax.random.normal(key, (sum(sizes),), jnp.float32)
  drawn = {
    name: part.reshape(shape).astype(cfg.jnp_param_dtype)
    for (name, shape), part in zip(dense.items(), jnp.split(flat, np.cumsum(sizes)[:-1]))
  }
  ones = {"attn_norm": (n, d), "mlp_norm": (n, d)}
  if cfg.qk_norm:
    ones.update(q_norm=(n, dh), k_norm=(n, dh))
  layers = {name: value for name, value in drawn.items() if name not in ("embedding", "lm_head")}
  layers.update({name: jnp.ones(shape, cfg.jnp_param_dtype) for name, shape in ones.items()})
  out = {"embedding": drawn["embedding"], "layers": layers, "final_norm": jnp.ones((d,), cfg.jnp_param_dtype)}
  if "lm_head" in drawn:
    out["lm_head"] = drawn["lm_head"]
  return out


def compute_params(cfg: ModelConfig, tree: Any) -> Any:
  """`tree`'s floating arrays cast to the compute dtype cfg.dtype (no-op for arrays already in it).

  The forward pass reads every parameter through this, so parameters stored in float32 (cfg.param_dtype, the
  master weights of mixed-precision training) run bfloat16 matmuls when cfg.dtype is bfloat16. Inside the
  layer scan it casts one layer at a time: never a second full copy of the stack.
  """
  dtype = cfg.jnp_dtype

  def cast(x):
    return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype else x

  return jax.tree.map(cast, tree)


class DecoderLayers(nnx.Module):
  """The N decoder blocks' parameters, each stacked along a leading [N] axis.

  Per layer: attn_norm [D], wq [D, H, Dh], wk/wv [D, K, Dh], wo [H, Dh, D], q_norm/k_norm [Dh] (only with
  qk_norm), mlp_norm [D], and either the dense MLP w_gate/w_up [D, F], w_down [F, D] or (num_experts E > 0) the
  router [D, E] and experts we_gate/we_up [E, D, Fm], we_down [E, Fm, D]. Projections are stored input-major (x @ w), i.e.
  the transpose of a Hugging Face nn.Linear weight, reshaped to heads.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, values: Mapping[str, jax.Array] | None = None):
    if values is None:
      values = _random_params(rngs.params(), cfg)["layers"]
    for name in _LAYER_PARAMS:
      setattr(self, name, nnx.Param(values[name]) if name in values else None)

  def stacked(self) -> dict[str, jax.Array]:
    """The stacked parameter arrays by name (q_norm/k_norm only when present)."""
    return {name: getattr(self, name)[...] for name in _LAYER_PARAMS if getattr(self, name) is not None}


def _project_heads(h_BxLxD: jax.Array, w_DxHxDh: jax.Array) -> jax.Array:
  """h · w as one dot with a single contracting dimension: [B, L, D] x [D, H·Dh] -> [B, L, H, Dh].

  Same values as einsum("bld,dhk->blhk"), with the weight flattened to [D, H·Dh] and (on CPU, `_dense`) the
  tokens to [B·L, D]: XLA:CPU lowered the rank-3 form to dots with extra layout copies (one SmolLM2 layer's
  forward+backward took 0.22 s that way against 0.165 s flattened; docs/benchmarks.md, "The training
  forward+backward").
  """
  d, h, dh = w_DxHxDh.shape
  return _dense(h_BxLxD, w_DxHxDh.reshape(d, h * dh)).reshape(*h_BxLxD.shape[:-1], h, dh)


def _flatten_dots() -> bool:
  """Whether dense layers run as [B·L, D] matrix products (XLA:CPU, where that is 25% faster per layer) rather
  than as [B, L, D] einsums (accelerators: no reshape across a possibly sharded sequence axis)."""
  return jax.default_backend() == "cpu"


def _dense(x_BxLxD: jax.Array, w_DxN: jax.Array) -> jax.Array:
  """x · w over the last axis of x: [B, L, D] x [D, N] -> [B, L, N]; one [B·L, D] matrix product on CPU."""
  b, l, d = x_BxLxD.shape
  if not _flatten_dots():
    return jnp.einsum("bld,dn->bln", x_BxLxD, w_DxN)
  return jnp.dot(x_BxLxD.reshape(b * l, d), w_DxN).reshape(b, l, w_DxN.shape[-1])


def _qkv(
  cfg: ModelConfig, x_BxLxD: jax.Array, p: Mapping[str, jax.Array], cos_BxLxDh: jax.Array, sin_BxLxDh: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The block's attention inputs: q_BxLxHxDh, k_BxLxKxDh, v_BxLxKxDh from RMSNorm(x), qk-norm'd and rotated."""
  h_BxLxD = rms_norm(x_BxLxD, p["attn_norm"], cfg.rms_norm_eps)
  q_BxLxHxDh = _project_heads(h_BxLxD, p["wq"])
  k_BxLxKxDh = _project_heads(h_BxLxD, p["wk"])
  v_BxLxKxDh = _project_heads(h_BxLxD, p["wv"])
  if cfg.qk_norm:
    q_BxLxHxDh = rms_norm(q_BxLxHxDh, p["q_norm"], cfg.rms_norm_eps)
    k_BxLxKxDh = rms_norm(k_BxLxKxDh, p["k_norm"], cfg.rms_norm_eps)
  return (apply_rope(q_BxLxHxDh, cos_BxLxDh, sin_BxLxDh), apply_rope(k_BxLxKxDh, cos_BxLxDh, sin_BxLxDh), v_BxLxKxDh)


# ModelConfig.remat_policy -> what a rematerialised layer saves for its backward pass (None: only its inputs).
_REMAT_POLICIES = {
  "nothing": None,
  "dots": jax.checkpoint_policies.dots_saveable,
  "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _rematerialised(cfg: ModelConfig, body):
  """The scanned layer function as the backward pass sees it: itself (every residual saved), or with
  cfg.remat, wrapped in jax.checkpoint with cfg.remat_policy."""
  if not cfg.remat:
    return body
  return jax.checkpoint(body, prevent_cse=False, policy=_REMAT_POLICIES[cfg.remat_policy])


def _out_projection_and_mlp(
  cfg: ModelConfig, x_BxLxD: jax.Array, p: Mapping[str, jax.Array], attn_BxLxHxDh: jax.Array
) -> jax.Array:
  """The rest of the block: x += attn · wo; x += MLP(RMSNorm(x)) with a SwiGLU or a mixture of SwiGLU experts."""
  b, l, h, dh = attn_BxLxHxDh.shape
  wo_HDhxD = p["wo"].reshape(h * dh, p["wo"].shape[-1])
  x_BxLxD = x_BxLxD + _dense(attn_BxLxHxDh.reshape(b, l, h * dh), wo_HDhxD)
  x_BxLxD = constrain(x_BxLxD, ACTIVATION_AXES)
  h_BxLxD = rms_norm(x_BxLxD, p["mlp_norm"], cfg.rms_norm_eps)
  if cfg.is_moe:
    return x_BxLxD + moe_mlp(cfg, h_BxLxD, p)
  gate_BxLxF = _dense(h_BxLxD, p["w_gate"])
  up_BxLxF = _dense(h_BxLxD, p["w_up"])
  act_BxLxF = constrain(jax.nn.silu(gate_BxLxF) * up_BxLxF, ("activation_batch", "activation_length", "activation_mlp"))
  return x_BxLxD + _dense(act_BxLxF, p["w_down"])


def _check_rank(name: str, x: Any, rank: int, shape: tuple[int, ...] | None = None):
  if getattr(x, "ndim", None) != rank:
    raise ValueError(f"{name} must have rank {rank}, got shape {getattr(x, 'shape', None)}")
  if shape is not None and tuple(x.shape) != tuple(shape):
    raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")


class Decoder(nnx.Module):
  """Decoder-only transformer: embedding, N scanned pre-norm blocks, final RMSNorm, tied or untied head.

  Parameters: embedding [V, D]; layers (DecoderLayers, stacked [N, ...]); final_norm [D]; lm_head [D, V] only
  when cfg.tie_word_embeddings is False (otherwise the head is embeddingᵀ).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    values = _random_params(rngs.params(), cfg)
    self.embedding = nnx.Param(values["embedding"])
    self.layers = DecoderLayers(cfg, rngs=rngs, values=values["layers"])
    self.final_norm = nnx.Param(values["final_norm"])
    self.lm_head = nnx.Param(values["lm_head"]) if "lm_head" in values else None

  def __call__(self, tokens_BxL: jax.Array, **options) -> tuple[jax.Array, KVCache | None]:
    """Float32 logits_BxLxV for every token, and the updated cache (None without one): `hidden_states` with the
    same keyword arguments, then the output head.

    See `hidden_states` for the arguments and errors.
    """
    h_BxLxD, cache = self.hidden_states(tokens_BxL, **options)
    return self.logits(h_BxLxD), cache

  def hidden_states(
    self,
    tokens_BxL: jax.Array,
    *,
    positions_BxL: jax.Array | None = None,
    token_mask_BxL: jax.Array | None = None,
    cache: KVCache | None = None,
    segment_ids_BxL: jax.Array | None = None,
    prefix_limit_BxL: jax.Array | None = None,
    cache_is_empty: bool = False,
    cache_window: int | None = None,
    merge_write: bool = False,
  ) -> tuple[jax.Array, KVCache | None]:
    """Runs the blocks and the final norm.

    Args:
      tokens_BxL: int token ids.
      positions_BxL: int RoPE positions. Default: the count of real tokens before each token, i.e.
        cumsum(token_mask) - 1 clipped at 0, plus (with a cache) the real tokens already in the cache. So
        left-padded prompts start at position 0 at their first real token, right padding works too, and decode
        steps continue where the prompt stopped.
      token_mask_BxL: bool, True for real tokens (default all True). Pad tokens never serve as keys; their own
        outputs are finite but meaningless.
      cache: None for a plain causal forward over the L tokens. Otherwise the L tokens' keys/values are written
        at slots [cache.index, cache.index + L) of every row, their mask bits set from token_mask_BxL, and each
        token attends to the real slots at or before its own. The caller keeps index + L <= capacity (inside
        jit an overflow cannot be detected: dynamic_update_slice would clamp the write).
      segment_ids_BxL: None (the default) for a plain causal forward. Otherwise a packed row: int, 0 on the
        shared prefix, k >= 1 on the k-th appended segment (e.g. one copy of a continuation per prefix length;
        values on pads are ignored). With it, query q may attend to key s when
          token_mask[s] & s <= q & (segment[s] == segment[q] | (segment[s] == 0 & s < prefix_limit[q])),
        i.e. every segment is causal within itself, the prefix (segment 0) is plainly causal, and a token of
        segment k >= 1 also sees the prefix slots before its limit. See `packed_attention_mask`. Pass
        positions_BxL too (the default positions count real tokens, which is wrong for a packed row: a
        segment continues from its own prefix length, see `jaxcredit.scoring.gold`).
      prefix_limit_BxL: int, per token of a segment k >= 1 the number of prefix slots it may attend to (slots
        [0, limit)); ignored on segment 0. Default: 0 (segments see only themselves). Only with
        segment_ids_BxL.
      cache_is_empty: static; the caller promises the cache holds nothing yet (index 0, no real slot: a
        prefill). The L tokens then attend only to each other with the cache-free attention (chunked for long
        prompts: never a [L, capacity] score matrix) and their keys/values are written to the cache as usual.
      cache_window: static; with a cache, read only slots [0, cache_window) of it as old keys (default: all
        of them). The caller promises cache.index <= cache_window (no real slot at or after the window). A
        decode step then reads the part of the cache that holds tokens, not its whole capacity.
      merge_write: static; with a cache, the L tokens' keys/values are written only where token_mask_BxL is
        True, and the slots of [index, index + L) where it is False keep what the cache holds (their mask bits
        too); the old keys are the cache's real slots wherever they lie (its mask alone, not slot < index).
        A sampler uses it to extend rows whose histories end together: a short row's cached tokens may sit
        inside the block, before its new tokens. The caller promises that every real slot of a row precedes
        that row's new tokens and that no new token's slot is already real.

    Packed (segment) calls always run the "full" attention, whatever cfg.attention_impl says: the chunked and
    splash kernels know only a causal-and-padding mask (splash's segment ids cannot express "also the prefix up
    to a limit"), and a packed row is a forward-only scoring row of moderate length, so the [B, L, L] mask and
    the O(B·H·L²) float32 scores of the full path are affordable. The default path (both None) is unchanged.

    Returns:
      (h_BxLxD after the final norm, in cfg.dtype; the cache with index += L, or None).

    Raises:
      ValueError: at trace time, for a wrong rank or shape of any argument, a cache of another model shape, or
        (when known statically) more tokens than the cache has slots; prefix_limit_BxL without segment_ids_BxL;
        segment_ids_BxL together with a cache (packed rows are cache-free).
    """
    cfg = self.cfg
    _check_rank("tokens_BxL", tokens_BxL, 2)
    b, l = tokens_BxL.shape
    if not jnp.issubdtype(tokens_BxL.dtype, jnp.integer):
      raise ValueError(f"tokens_BxL must be integer token ids, got dtype {tokens_BxL.dtype}")
    if token_mask_BxL is None:
      token_mask_BxL = jnp.ones((b, l), jnp.bool_)
    _check_rank("token_mask_BxL", token_mask_BxL, 2, (b, l))
    token_mask_BxL = token_mask_BxL.astype(jnp.bool_)
    if positions_BxL is not None:
      _check_rank("positions_BxL", positions_BxL, 2, (b, l))
    packed = segment_ids_BxL is not None
    if prefix_limit_BxL is not None and not packed:
      raise ValueError("prefix_limit_BxL needs segment_ids_BxL (it only applies to packed segments)")
    if packed:
      if cache is not None:
        raise ValueError(
          "segment_ids_BxL / prefix_limit_BxL describe a packed, cache-free forward; "
          "they cannot be combined with a cache"
        )
      _check_rank("segment_ids_BxL", segment_ids_BxL, 2, (b, l))
      if prefix_limit_BxL is not None:
        _check_rank("prefix_limit_BxL", prefix_limit_BxL, 2, (b, l))

    if cache is not None:
      expected = (cfg.num_layers, b, cache.capacity, cfg.num_kv_heads, cfg.head_dim)
      _check_rank("cache.k_NxBxSxKxDh", cache.k_NxBxSxKxDh, 5, expected)
      _check_rank("cache.v_NxBxSxKxDh", cache.v_NxBxSxKxDh, 5, expected)
      _check_rank("cache.mask_BxS", cache.mask_BxS, 2, (b, cache.capacity))
      if l > cache.capacity:
        raise ValueError(
          f"{l} tokens do not fit a cache of {cache.capacity} slots; pass a larger max_len to init_cache"
        )
      if not isinstance(cache.index, jax.core.Tracer):
        if int(cache.index) + l > cache.capacity:
          raise ValueError(
            f"cache.index {int(cache.index)} + {l} tokens exceeds the cache's "
            f"{cache.capacity} slots; pass a larger max_len to init_cache"
          )
      if cache_window is not None and not (isinstance(cache_window, int) and 1 <= cache_window <= cache.capacity):
        raise ValueError(f"cache_window must be an int in [1, {cache.capacity}], got {cache_window!r}")
    elif cache_window is not None or merge_write:
      raise ValueError("cache_window and merge_write need a cache")
    if merge_write and cache_is_empty:
      raise ValueError("merge_write extends a cache that holds tokens; it cannot be combined with cache_is_empty")

    if positions_BxL is None:
      seen_B = jnp.zeros((b,), jnp.int32) if cache is None else jnp.sum(cache.mask_BxS, axis=-1, dtype=jnp.int32)
      positions_BxL = jnp.maximum(seen_B[:, None] + jnp.cumsum(token_mask_BxL, axis=-1, dtype=jnp.int32) - 1, 0)
    cos_BxLxDh, sin_BxLxDh = rope_cos_sin(positions_BxL, cfg.head_dim, cfg.rope_theta, cfg)

    if packed:
      mask_BxLxS = packed_attention_mask(token_mask_BxL, segment_ids_BxL, prefix_limit_BxL)
      index = None
    elif cache is None:
      causal_LxL = jnp.tril(jnp.ones((l, l), jnp.bool_))
      mask_BxLxS = causal_LxL[None, :, :] & token_mask_BxL[:, None, :]  # only built by the "full" path
      index = None
    else:
      index = cache.index.astype(jnp.int32)
      written_BxL = token_mask_BxL
      if merge_write:
        written_BxL = token_mask_BxL | jax.lax.dynamic_slice(cache.mask_BxS, (0, index), (b, l))
      new_mask_BxS = jax.lax.dynamic_update_slice(cache.mask_BxS, written_BxL, (0, index))
      window = cache.capacity if cache_window is None else cache_window
      slot_S = jnp.arange(window, dtype=jnp.int32)
      # Keys come in two parts: the cache's slots before `index` (old tokens; with merge_write every real
      # slot) and the L new tokens.
      old_mask_BxS = cache.mask_BxS[:, :window]
      if not merge_write:
        old_mask_BxS = old_mask_BxS & (slot_S < index)[None, :]
      mask_old_BxLxS = jnp.broadcast_to(old_mask_BxS[:, None, :], (b, l, window))
      mask_new_BxLxL = jnp.tril(jnp.ones((l, l), jnp.bool_))[None, :, :] & token_mask_BxL[:, None, :]

    x_BxLxD = constrain(
      compute_params(cfg, jnp.take(self.embedding[...], tokens_BxL, axis=0)), ACTIVATION_AXES
    )  # gather, then cast: only the B·L rows are converted
    params = self.layers.stacked()

    if cache is None:
      impl = "full" if packed else attention_impl(cfg, l)

      def body(x_BxLxD, p):
        p = compute_params(cfg, p)
        q_BxLxHxDh, k_BxLxKxDh, v_BxLxKxDh = _qkv(cfg, x_BxLxD, p, cos_BxLxDh, sin_BxLxDh)
        if impl == "chunked":
          attn_BxLxHxDh = chunked_causal_attention(
            q_BxLxHxDh, k_BxLxKxDh, v_BxLxKxDh, token_mask_BxL, cfg.attention_chunk
          )
        elif impl == "splash":
          from jaxcredit.models.splash import splash_causal_attention

          attn_BxLxHxDh = splash_causal_attention(q_BxLxHxDh, k_BxLxKxDh, v_BxLxKxDh, token_mask_BxL)
        else:
          attn_BxLxHxDh = attention(q_BxLxHxDh, k_BxLxKxDh, v_BxLxKxDh, mask_BxLxS)
        attn_BxLxHxDh = constrain(attn_BxLxHxDh, ("activation_batch", "activation_length", "activation_heads", None))
        return _out_projection_and_mlp(cfg, x_BxLxD, p, attn_BxLxHxDh), None

      body = _rematerialised(cfg, body)
      x_BxLxD, _ = jax.lax.scan(body, x_BxLxD, params)
    else:
      # Each layer reads its cache slice (a scanned input, never written back whole), attends to it and to
      # the L new keys/values without writing them into a copy of the slice, and emits only the new
      # keys/values. One dynamic_update_slice after the scan writes them into the [N, ...] cache, in place
      # when the caller donates it. Carrying the whole cache through the scan cost a full copy per layer.
      fresh_impl = attention_impl(cfg, l) if cache_is_empty else None

      def body(x_BxLxD, layer):
        p, k_cache_BxSxKxDh, v_cache_BxSxKxDh = layer
        p = compute_params(cfg, p)
        q_BxLxHxDh, k_BxLxKxDh, v_BxLxKxDh = _qkv(cfg, x_BxLxD, p, cos_BxLxDh, sin_BxLxDh)
        k_new = k_BxLxKxDh.astype(k_cache_BxSxKxDh.dtype)
        v_new = v_BxLxKxDh.astype(v_cache_BxSxKxDh.dtype)
        if fresh_impl == "chunked":
          attn_BxLxHxDh = chunked_causal_attention(
            q_BxLxHxDh, k_BxLxKxDh, v_BxLxKxDh, token_mask_BxL, cfg.attention_chunk
          )
        elif fresh_impl == "splash":
          from jaxcredit.models.splash import splash_causal_attention

          attn_BxLxHxDh = splash_causal_attention(q_BxLxHxDh, k_BxLxKxDh, v_BxLxKxDh, token_mask_BxL)
        elif fresh_impl is not None:
          attn_BxLxHxDh = attention(q_BxLxHxDh, k_BxLxKxDh, v_BxLxKxDh, mask_new_BxLxL)
        else:
          attn_BxLxHxDh = two_part_attention(
            q_BxLxHxDh,
            k_cache_BxSxKxDh[:, :window],
            v_cache_BxSxKxDh[:, :window],
            mask_old_BxLxS,
            k_BxLxKxDh,
            v_BxLxKxDh,
            mask_new_BxLxL,
          )
        return _out_projection_and_mlp(cfg, x_BxLxD, p, attn_BxLxHxDh), (k_new, v_new)

      body = _rematerialised(cfg, body)
      x_BxLxD, (k_NxBxLxKxDh, v_NxBxLxKxDh) = jax.lax.scan(
        body, x_BxLxD, (params, cache.k_NxBxSxKxDh, cache.v_NxBxSxKxDh)
      )
      start = (0, 0, index, 0, 0)
      if merge_write:
        keep_1xBxLx1x1 = token_mask_BxL[None, :, :, None, None]
        size = k_NxBxLxKxDh.shape
        k_NxBxLxKxDh = jnp.where(keep_1xBxLx1x1, k_NxBxLxKxDh, jax.lax.dynamic_slice(cache.k_NxBxSxKxDh, start, size))
        v_NxBxLxKxDh = jnp.where(keep_1xBxLx1x1, v_NxBxLxKxDh, jax.lax.dynamic_slice(cache.v_NxBxSxKxDh, start, size))
      k_NxBxSxKxDh = jax.lax.dynamic_update_slice(cache.k_NxBxSxKxDh, k_NxBxLxKxDh, start)
      v_NxBxSxKxDh = jax.lax.dynamic_update_slice(cache.v_NxBxSxKxDh, v_NxBxLxKxDh, start)

    h_BxLxD = rms_norm(x_BxLxD, compute_params(cfg, self.final_norm[...]), cfg.rms_norm_eps)
    if cache is None:
      return h_BxLxD, None
    return h_BxLxD, KVCache(
      k_NxBxSxKxDh=k_NxBxSxKxDh, v_NxBxSxKxDh=v_NxBxSxKxDh, mask_BxS=new_mask_BxS, index=index + l
    )

  def output_head_DxV(self) -> jax.Array:
    """The output projection as [D, V] in the compute dtype: lm_head, or the transposed embedding table when tied
    (for heads computed outside `logits`, such as the chunked log-probs of `jaxcredit.models.logprobs`)."""
    if self.lm_head is None:
      return compute_params(self.cfg, self.embedding[...]).T
    return compute_params(self.cfg, self.lm_head[...])

  def logits(self, h_BxLxD: jax.Array) -> jax.Array:
    """Float32 logits_BxLxV = h · embeddingᵀ (tied) or h · lm_head (untied); h may have any leading axes."""
    tied = self.lm_head is None
    head = compute_params(self.cfg, self.embedding[...] if tied else self.lm_head[...])
    if not _flatten_dots():
      if tied:
        return jnp.einsum("...d,vd->...v", h_BxLxD, head, preferred_element_type=jnp.float32)
      return jnp.einsum("...d,dv->...v", h_BxLxD, head, preferred_element_type=jnp.float32)
    lead, d = h_BxLxD.shape[:-1], h_BxLxD.shape[-1]
    h_TxD = h_BxLxD.reshape(math.prod(lead), d)  # one matrix product (see `_dense`)
    if tied:
      logits_TxV = jnp.einsum("td,vd->tv", h_TxD, head, preferred_element_type=jnp.float32)
    else:
      logits_TxV = jnp.einsum("td,dv->tv", h_TxD, head, preferred_element_type=jnp.float32)
    return logits_TxV.reshape(*lead, logits_TxV.shape[-1])


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
  """The shape of every parameter of `Decoder(cfg)`, by '/'-joined path (e.g. 'layers/wq'), without allocating."""
  abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  flat = nnx.to_flat_state(nnx.state(abstract, nnx.Param))
  return {"/".join(str(k) for k in path): tuple(v.shape) for path, v in flat}


def set_params(model: Decoder, params: Mapping[str, Any]) -> None:
  """Replaces every parameter of `model` with the arrays in `params` (cast to cfg.param_dtype, else cfg.dtype).

  Args:
    model: the decoder to update in place; may be abstract (from `nnx.eval_shape`), so that loading a
      checkpoint never allocates a random initialisation.
    params: a nested dict of arrays mirroring `nnx.state(model, nnx.Param)`, e.g. {'embedding': .., 'layers':
      {'wq': .., ...}, 'final_norm': ..}, or a flat dict keyed by '/'-joined paths.

  Raises:
    ValueError: naming the parameter, for a missing or unexpected one or a shape other than `param_shapes`.
  """
  expected = param_shapes(model.cfg)
  flat = trees.flatten(params)
  missing = sorted(set(expected) - set(flat))
  unexpected = sorted(set(flat) - set(expected))
  if missing or unexpected:
    raise ValueError(f"parameters do not match the config: missing {missing}, unexpected {unexpected}")
  for name, shape in expected.items():
    actual = tuple(np.shape(flat[name]))
    if actual != shape:
      raise ValueError(f"parameter {name!r} has shape {actual}, expected {shape}")
  dtype = model.cfg.jnp_param_dtype
  for name in expected:
    *parents, leaf = name.split("/")
    owner = model
    for part in parents:
      owner = getattr(owner, part)
    getattr(owner, leaf).set_value(jnp.asarray(flat[name], dtype))
