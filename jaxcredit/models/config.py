"""Model configuration shared by the decoder, the loaders and the checkpoint cache."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

_DTYPES = ("float32", "bfloat16", "float16")


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
        dtype: parameter and compute dtype name ("float32", "bfloat16", "float16"); norms, softmax and logits run
            in float32 regardless.
        remat: rematerialise each layer's activations in the backward pass (jax.checkpoint on the layer body).

    Raises:
        ValueError: naming the field, for a non-positive size, num_heads not divisible by num_kv_heads, a
            non-positive rope_theta or rms_norm_eps, or an unknown dtype.
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
    dtype: str = "float32"
    remat: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                             f"ModelConfig.num_kv_heads ({self.num_kv_heads})")
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"ModelConfig.{name} must be a positive number, got {value!r}")
        for name in ("tie_word_embeddings", "qk_norm", "remat"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ModelConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"ModelConfig.dtype must be one of {_DTYPES}, got {self.dtype!r}")

    @property
    def jnp_dtype(self) -> jnp.dtype:
        """The parameter/compute dtype as a jnp dtype."""
        return jnp.dtype(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-serialisable dict of every field."""
        return dataclasses.asdict(self)

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
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.name not in d and f.default is dataclasses.MISSING)
        if missing:
            raise ValueError(f"ModelConfig.from_dict is missing required keys {missing}")
        return cls(**d)
