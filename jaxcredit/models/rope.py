"""Rotary position embeddings in the Hugging Face layout (rotate_half over the two halves of Dh, not interleaved
pairs), with the rope scalings transformers knows (linear, llama3, yarn) and llama.cpp's freq_factors.

Shape letters: B batch, L tokens, H heads, Dh head width. Weights converted from Hugging Face checkpoints need no
permutation for these tables.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxcredit.models.config import ModelConfig


def rope_inv_freq(cfg: ModelConfig) -> tuple[np.ndarray, float]:
  """RoPE inverse frequencies [Dh/2] (float32) and the cos/sin scale, as Hugging Face `ROPE_INIT_FUNCTIONS`.

  default: inv_freq_i = theta^(-2i/Dh). linear: inv_freq / factor. llama3: low frequencies divided by factor,
  high ones kept, a smooth ramp between (Llama 3.1). yarn: NTK-by-parts interpolation between inv_freq and
  inv_freq / factor with the beta_fast/beta_slow ramp, and cos/sin scaled by attention_factor (default
  0.1 ln(factor) + 1) (Peng et al. 2023, arXiv:2309.00071). freq_factors: inv_freq_i / freq_factors_i (llama.cpp's
  `rope_freqs.weight`, which holds the llama3 rule's divisors for Llama 3.x GGUF files).
  """
  dim = cfg.head_dim
  base = float(cfg.rope_theta)
  scaling = dict(cfg.rope_scaling)
  rope_type = scaling.get("rope_type", scaling.get("type", "default"))
  pos_freqs = (base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim))).astype(np.float32)
  inv_freq = (np.float32(1.0) / pos_freqs).astype(np.float32)
  if rope_type == "default":
    return inv_freq, 1.0
  if rope_type == "freq_factors":
    return (inv_freq / np.asarray(scaling["freq_factors"], np.float32)).astype(np.float32), 1.0
  factor = float(scaling["factor"])
  if rope_type == "linear":
    return (inv_freq / np.float32(factor)).astype(np.float32), 1.0
  original = float(scaling["original_max_position_embeddings"])
  if rope_type == "llama3":
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    wavelen = 2 * math.pi / inv_freq
    out = np.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < original / high) & ~(wavelen > original / low)
    return np.where(medium, smoothed, out).astype(np.float32), 1.0
  # yarn
  attention_factor = scaling.get("attention_factor")
  if attention_factor is None:

    def get_mscale(scale, mscale=1.0):
      return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    attention_factor = (
      get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
      if mscale and mscale_all_dim
      else get_mscale(factor)
    )
  beta_fast = scaling.get("beta_fast") or 32
  beta_slow = scaling.get("beta_slow") or 1

  def correction_dim(rotations):
    return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

  lo, hi = correction_dim(beta_fast), correction_dim(beta_slow)
  if scaling.get("truncate", True):
    lo, hi = math.floor(lo), math.ceil(hi)
  lo, hi = max(lo, 0), min(hi, dim - 1)
  if lo == hi:
    hi += 0.001
  ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - lo) / (hi - lo), 0, 1).astype(np.float32)
  extrapolation_factor = (1 - ramp).astype(np.float32)
  interpolation = (np.float32(1.0) / (np.float32(factor) * pos_freqs)).astype(np.float32)
  out = interpolation * (1 - extrapolation_factor) + inv_freq * extrapolation_factor
  return out.astype(np.float32), float(attention_factor)


def rope_cos_sin(
  positions_BxL: jax.Array, head_dim: int, theta: float, cfg: ModelConfig | None = None
) -> tuple[jax.Array, jax.Array]:
  """Rotary tables in the Hugging Face layout: float32 cos and sin of shape [B, L, Dh].

  angle = position · inv_freq (see `rope_inv_freq`; plain theta^(-2i/Dh) when cfg is None), repeated over both
  halves of Dh; cos and sin are multiplied by the rope scaling's attention factor (1 except for yarn).
  """
  if cfg is None:
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
    scale = 1.0
  else:
    inv_freq, scale = rope_inv_freq(cfg)
  angles_BxLxDh2 = positions_BxL.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
  angles_BxLxDh = jnp.concatenate([angles_BxLxDh2, angles_BxLxDh2], axis=-1)
  if scale == 1.0:
    return jnp.cos(angles_BxLxDh), jnp.sin(angles_BxLxDh)
  return jnp.cos(angles_BxLxDh) * scale, jnp.sin(angles_BxLxDh) * scale


def apply_rope(x_BxLxHxDh: jax.Array, cos_BxLxDh: jax.Array, sin_BxLxDh: jax.Array) -> jax.Array:
  """x·cos + rotate_half(x)·sin with rotate_half(x) = [-x2, x1] over the two halves of Dh; float32 math."""
  x32 = x_BxLxHxDh.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  out = x32 * cos_BxLxDh[:, :, None, :] + rotated * sin_BxLxDh[:, :, None, :]
  return out.astype(x_BxLxHxDh.dtype)
