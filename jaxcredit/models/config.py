"""Model configuration shared by the decoder, the loaders and the checkpoint cache."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

_DTYPES = ("float32", "bfloat16", "float16")
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "freq_factors")
REMAT_POLICIES = ("nothing", "dots", "dots_no_batch")  # ModelConfig.remat_policy
ATTENTION_IMPLS = ("auto", "full", "chunked", "splash")
MOE_IMPLS = ("ragged", "dense")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a decoder-only transformer (Llama path with the Qwen3 switches).

  Attributes:
      vocab_size: V, rows of the embedding table.
      hidden_size: D, the residual stream width.
      intermediate_size: F, the SwiGLU MLP width.
      num_layers: N, decoder blocks (scanned over stacked parameters).
      num_heads: H, query heads.
      num_kv_heads: K, key/value heads (GQA: H % K == 0).
      head_dim: Dh, per-head width; need not equal D / H (Qwen3).
      rope_theta: RoPE base frequency.
      rms_norm_eps: epsilon inside every RMSNorm.
      tie_word_embeddings: the output head is the transposed embedding table.
      qk_norm: RMSNorm over Dh on q and k before RoPE (Qwen3).
      num_experts: E, routed experts per MoE layer (Qwen3-MoE); 0 for a dense MLP. Every layer is MoE when E > 0
          (mixed dense/MoE stacks cannot be scanned over one stacked parameter set and are refused by the loaders).
      num_experts_per_tok: top-k experts per token.
      moe_intermediate_size: Fm, each expert's SwiGLU width.
      norm_topk_prob: renormalise the top-k router probabilities to sum to 1 (Qwen3-MoE `norm_topk_prob`).
      rope_scaling: Hugging Face `rope_parameters` / `rope_scaling` minus rope_theta, as sorted (key, value)
          pairs (a dict is accepted and converted): rope_type "default", "linear" (factor), "llama3" (factor,
          low_freq_factor, high_freq_factor, original_max_position_embeddings) or "yarn" (factor,
          original_max_position_embeddings, optional beta_fast, beta_slow, attention_factor, truncate), or
          "freq_factors" (freq_factors: Dh/2 positive divisors, inv_freq_i / freq_factors_i, as llama.cpp applies a
          GGUF's `rope_freqs.weight` tensor; no transformers equivalent, so such a config is not exported).
      attention_impl: "full" (materialises [L, S] scores; exact reference), "chunked" (flash-style in XLA:
          blocks of attention_chunk queries x keys with an online softmax and a recomputing backward; never an
          [L, L] matrix), "splash" (the Pallas TPU splash kernel; Pallas interpret mode, slow, off TPU) or
          "auto" (splash on TPU when L is a multiple of 128, else chunked when L > attention_chunk, else full).
      attention_chunk: block size of the chunked attention, in tokens.
      moe_impl: "ragged" (tokens sorted by expert, `jax.lax.ragged_dot`: k/E of the dense FLOPs) or "dense"
          (every expert on every token, weighted by the sparse router weights: simple, E/k times the FLOPs).
      dtype: compute dtype name ("float32", "bfloat16", "float16"): every parameter is cast to it where the
          forward pass reads it; norms, softmax and logits run in float32 regardless.
      param_dtype: storage dtype of the parameters ("" = dtype). Mixed precision is param_dtype="float32" with
          dtype="bfloat16": float32 master weights (and so float32 AdamW moments), bfloat16 matmuls.
      remat: rematerialise each layer's activations in the backward pass (jax.checkpoint on the layer body).
      remat_policy: with remat=True, what a layer keeps from its forward pass for the backward pass (REMAT_POLICIES;
          ignored when remat is False, where every residual is kept; the trainer's config refuses that combination):
          "nothing" (the layer's input only: the whole layer is recomputed; least memory), "dots" (every matmul
          output, attention's two batched products included; the norms, RoPE, softmax and SwiGLU are recomputed)
          or "dots_no_batch" (the projections' outputs only; attention's products are recomputed too).
          `jax.checkpoint_policies` nothing_saveable, dots_saveable and dots_with_no_batch_dims_saveable. The
          gradients are the same up to float rounding. On a 2-core CPU, "dots" made SmolLM2's policy-gradient step
          11-16% faster than remat=False (`benchmarks/step_bench.py --remat-policies none,dots_no_batch,dots`,
          docs/benchmarks.md): writing every elementwise residual into the scan's stacked buffers costs more than
          recomputing it.

  Raises:
      ValueError: naming the field, for a non-positive size, num_heads not divisible by num_kv_heads, a
          non-positive rope_theta or rms_norm_eps, an unknown dtype, an unknown remat_policy, or rope_scaling of an
          unknown rope_type, missing keys, or freq_factors that are not head_dim/2 positive finite numbers.
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = True
  qk_norm: bool = False
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = True
  rope_scaling: tuple = ()
  attention_impl: str = "auto"
  attention_chunk: int = 512
  moe_impl: str = "ragged"
  dtype: str = "float32"
  remat: bool = False
  param_dtype: str = ""
  remat_policy: str = "nothing"

  def __post_init__(self):
    if isinstance(self.rope_scaling, dict) or isinstance(self.rope_scaling, list):
      items = self.rope_scaling.items() if isinstance(self.rope_scaling, dict) else self.rope_scaling
      # Lists (freq_factors, or any list from JSON) become tuples: the config is hashed as a static jit argument.
      pairs = ((str(k), tuple(v) if isinstance(v, list) else v) for k, v in items)
      object.__setattr__(self, "rope_scaling", tuple(sorted(pairs)))
    scaling = dict(self.rope_scaling)
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
      raise ValueError(
        f"ModelConfig.rope_scaling rope_type {rope_type!r} is not supported; supported: "
        f"{ROPE_TYPES} (dynamic and longrope depend on the sequence length at run time)"
      )
    needs = {
      "linear": ("factor",),
      "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
      "yarn": ("factor", "original_max_position_embeddings"),
      "freq_factors": ("freq_factors",),
    }.get(rope_type, ())
    missing = [k for k in needs if scaling.get(k) is None]
    if missing:
      raise ValueError(f"ModelConfig.rope_scaling of rope_type {rope_type!r} is missing {missing}")
    if rope_type == "freq_factors":
      factors = scaling["freq_factors"]
      ok = isinstance(factors, tuple) and all(
        isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f < float("inf") for f in factors
      )
      if not ok or len(factors) * 2 != self.head_dim:
        raise ValueError(
          f"ModelConfig.rope_scaling freq_factors must be head_dim/2 = {self.head_dim // 2} positive finite "
          f"numbers, got {factors!r}"
        )
    for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"ModelConfig.{name} must be an int >= 0, got {value!r}")
    if self.num_experts:
      if not 1 <= self.num_experts_per_tok <= self.num_experts:
        raise ValueError(
          f"ModelConfig.num_experts_per_tok must be in [1, num_experts={self.num_experts}], "
          f"got {self.num_experts_per_tok}"
        )
      if self.moe_intermediate_size <= 0:
        raise ValueError("ModelConfig.moe_intermediate_size must be positive when num_experts > 0")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"ModelConfig.attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}")
    if self.moe_impl not in MOE_IMPLS:
      raise ValueError(f"ModelConfig.moe_impl must be one of {MOE_IMPLS}, got {self.moe_impl!r}")
    if isinstance(self.attention_chunk, bool) or not isinstance(self.attention_chunk, int) or self.attention_chunk <= 0:
      raise ValueError(f"ModelConfig.attention_chunk must be a positive int, got {self.attention_chunk!r}")
    for name in (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_layers",
      "num_heads",
      "num_kv_heads",
      "head_dim",
    ):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of ModelConfig.num_kv_heads ({self.num_kv_heads})"
      )
    for name in ("rope_theta", "rms_norm_eps"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"ModelConfig.{name} must be a positive number, got {value!r}")
    for name in ("tie_word_embeddings", "qk_norm", "remat", "norm_topk_prob"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"ModelConfig.{name} must be a bool, got {getattr(self, name)!r}")
    if self.dtype not in _DTYPES:
      raise ValueError(f"ModelConfig.dtype must be one of {_DTYPES}, got {self.dtype!r}")
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f"ModelConfig.remat_policy must be one of {REMAT_POLICIES}, got {self.remat_policy!r}")
    if self.param_dtype not in ("",) + _DTYPES:
      raise ValueError(f"ModelConfig.param_dtype must be '' (= dtype) or one of {_DTYPES}, got {self.param_dtype!r}")

  @property
  def jnp_dtype(self) -> jnp.dtype:
    """The compute dtype as a jnp dtype."""
    return jnp.dtype(self.dtype)

  @property
  def jnp_param_dtype(self) -> jnp.dtype:
    """The parameters' storage dtype as a jnp dtype (param_dtype, or dtype when it is "")."""
    return jnp.dtype(self.param_dtype or self.dtype)

  @property
  def is_moe(self) -> bool:
    """True when the MLP of every layer is a routed mixture of experts."""
    return self.num_experts > 0

  def num_params(self, *, active: bool = False) -> int:
    """Parameter count; with active=True, only those one token uses (top-k of the experts, one head)."""
    d, n = self.hidden_size, self.num_layers
    attn = d * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
    norms = 2 * d + (2 * self.head_dim if self.qk_norm else 0)
    if self.is_moe:
      experts = self.num_experts_per_tok if active else self.num_experts
      mlp = d * self.num_experts + experts * 3 * d * self.moe_intermediate_size
    else:
      mlp = 3 * d * self.intermediate_size
    embed = self.vocab_size * d * (1 if self.tie_word_embeddings or active else 2)
    return n * (attn + norms + mlp) + embed + d

  def to_dict(self) -> dict[str, Any]:
    """Returns a JSON-serialisable dict of every field (rope_scaling as a dict)."""
    d = dataclasses.asdict(self)
    d["rope_scaling"] = dict(self.rope_scaling)
    return d

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
    """Builds a config from `to_dict()` output.

    Raises:
        ValueError: naming the keys that are not fields, the required keys that are missing, or (from
            validation) a bad value.
    """
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
      raise ValueError(f"unknown ModelConfig keys {unknown}; known keys are {sorted(names)}")
    missing = sorted(f.name for f in dataclasses.fields(cls) if f.name not in d and f.default is dataclasses.MISSING)
    if missing:
      raise ValueError(f"ModelConfig.from_dict is missing required keys {missing}")
    return cls(**d)
