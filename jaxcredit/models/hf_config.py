"""A transformers config.json <-> ModelConfig: `config_from_hf` (with its refusals of what the decoder cannot run)
and `hf_config_from_model_config` for checkpoints that have no config.json (GGUF), whose llama.cpp rope_freqs are
written as the llama3 scaling that gives the same frequencies.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from jaxcredit.models.config import ModelConfig
from jaxcredit.models.families import FAMILIES, NOT_SUPPORTED_WHY, family_of_config

# The model_types of `FAMILIES` when this module was imported (`config_from_hf` reads the table itself, so a row
# added later is supported too).
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


_HF_SIZES = (
  "vocab_size",
  "hidden_size",
  "intermediate_size",
  "num_hidden_layers",
  "num_attention_heads",
  "num_key_value_heads",
  "head_dim",
)
_HF_MOE_SIZES = ("moe_intermediate_size", "num_experts", "num_local_experts", "num_experts_per_tok")


def config_from_hf(hf: Mapping[str, Any], *, dtype: str = "float32", where: str = "config.json") -> ModelConfig:
  """The ModelConfig of a transformers config.json (Llama, Qwen3, Qwen3-MoE).

  Accepts both spellings transformers has used: `rope_theta` + `rope_scaling` (v4, hub checkpoints) or
  `rope_parameters` {rope_theta, rope_type, ...} (v5), `num_experts` or `num_local_experts`; head_dim defaults
  to hidden_size / num_attention_heads, num_key_value_heads to num_attention_heads. As transformers does,
  llama3 and yarn scaling take original_max_position_embeddings from max_position_embeddings when absent, and
  a yarn factor of null is max_position_embeddings / original_max_position_embeddings.

  Args:
    hf: the parsed config.json.
    dtype: ModelConfig.dtype of the result.
    where: names the file in error messages.

  Raises:
    ValueError: one line naming `where` and the field, for an unsupported model_type (listing the supported
      ones), a missing required field, q/k/v/o or MLP biases, an activation other than silu, sliding-window
      attention, partial rotary embeddings, a MoE model whose layers are not all MoE (mlp_only_layers,
      decoder_sparse_step), a size that is not a positive int or an rms_norm_eps / rope_theta that is not a
      positive number, or a value ModelConfig refuses.
  """
  if not isinstance(hf, Mapping):
    raise ValueError(f"{where} must hold a JSON object, got {type(hf).__name__}")
  model_type = hf.get("model_type")
  family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
  if family is None:
    why = (
      f" ({NOT_SUPPORTED_WHY[model_type]})" if isinstance(model_type, str) and model_type in NOT_SUPPORTED_WHY else ""
    )
    raise ValueError(f"{where}: model_type {model_type!r} is not supported{why}; supported: {', '.join(FAMILIES)}")

  def need(key):
    if hf.get(key) is None:
      raise ValueError(f"{where}: required field {key!r} is missing")
    return hf[key]

  def refuse(condition, what):
    if condition:
      raise ValueError(f"{where}: {what} is not supported by the decoder")

  # Sizes are checked here under their config.json names: `x or default` below must never turn a 0 into the
  # default, and int("8") or int(2.5) must not pass (or fail) without naming the field.
  for key in _HF_SIZES + (_HF_MOE_SIZES if family.moe else ()):
    value = hf.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
      raise ValueError(f"{where}: {key} must be a positive int, got {value!r}")
  for key in ("rms_norm_eps", "rope_theta"):
    value = hf.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
      raise ValueError(f"{where}: {key} must be a positive number, got {value!r}")

  refuse(hf.get("attention_bias"), "attention_bias=true (q/k/v/o projection biases)")
  refuse(hf.get("mlp_bias"), "mlp_bias=true (MLP biases)")
  act = hf.get("hidden_act", "silu")
  refuse(act != "silu", f"hidden_act {act!r} (only 'silu')")
  refuse(hf.get("use_sliding_window"), "use_sliding_window=true (sliding-window attention)")
  layer_types = [t for t in (hf.get("layer_types") or ()) if t != "full_attention"]
  refuse(layer_types, f"layer_types {sorted(set(layer_types))} (only 'full_attention')")

  rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  theta = rope.pop("rope_theta", None)
  theta = float(theta if theta is not None else hf.get("rope_theta", 10000.0))
  partial = rope.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
  refuse(partial not in (None, 1, 1.0), f"partial_rotary_factor {partial}")
  if "type" in rope and "rope_type" not in rope:
    rope["rope_type"] = rope.pop("type")
  rope_type = rope.get("rope_type", "default")
  if rope_type in ("llama3", "yarn") and rope.get("original_max_position_embeddings") is None:
    rope["original_max_position_embeddings"] = hf.get(
      "original_max_position_embeddings", hf.get("max_position_embeddings")
    )
  if rope_type == "yarn" and rope.get("factor") is None and hf.get("max_position_embeddings"):
    rope["factor"] = hf["max_position_embeddings"] / rope["original_max_position_embeddings"]
  if rope_type == "default":
    rope = {}

  experts = hf.get("num_experts", hf.get("num_local_experts")) or 0
  for refusal in family.refusals:
    value = hf.get(refusal.field, refusal.default)
    refuse(not refusal.ok(value), refusal.what.format(value=value))
  if family.moe:
    need("moe_intermediate_size"), need("num_experts_per_tok")
    if not experts:
      raise ValueError(f"{where}: required field 'num_experts' (or 'num_local_experts') is missing")
  else:
    experts = 0
  heads = int(need("num_attention_heads"))
  hidden = int(need("hidden_size"))
  try:
    return ModelConfig(
      vocab_size=int(need("vocab_size")),
      hidden_size=hidden,
      intermediate_size=int(hf.get("intermediate_size") or need("moe_intermediate_size")),
      num_layers=int(need("num_hidden_layers")),
      num_heads=heads,
      num_kv_heads=int(hf.get("num_key_value_heads") or heads),
      head_dim=int(hf.get("head_dim") or hidden // heads),
      rope_theta=theta,
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
      qk_norm=family.qk_norm,
      num_experts=int(experts),
      num_experts_per_tok=int(hf.get("num_experts_per_tok") or 0) if experts else 0,
      moe_intermediate_size=int(hf.get("moe_intermediate_size") or 0) if experts else 0,
      norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
      rope_scaling=rope,
      dtype=dtype,
    )
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
  """A transformers (v5 spelling) config.json for cfg, for checkpoints that have no source config.json (GGUF):
  the model_type and architecture of cfg's row of `FAMILIES` (`family_of_config`: qwen3_moe when cfg has experts,
  qwen3 when it has qk-norm, llama otherwise).

  rope_scaling of rope_type "freq_factors" (a GGUF's `rope_freqs.weight`) is written as the llama3 scaling that
  gives the same frequencies (`llama3_from_freq_factors`): what llama.cpp's converter made the tensor from.

  Raises:
    ValueError: for a cfg whose features no row of `FAMILIES` has (`family_of_config`), or for freq_factors that no llama3 scaling reproduces: transformers and vLLM have no spelling for
      them, and exported as is the served model would rotate every position differently.
  """
  rope_scaling = dict(cfg.rope_scaling)
  if rope_scaling.get("rope_type") == "freq_factors":
    llama3 = llama3_from_freq_factors(cfg)
    if llama3 is None:
      raise ValueError(
        "ModelConfig.rope_scaling rope_type 'freq_factors' (from a GGUF's rope_freqs.weight) matches no llama3 "
        "scaling and has no transformers config.json equivalent; this model cannot be exported to a Hugging Face "
        "folder or served by vLLM"
      )
    rope_scaling = llama3
  model_type = family_of_config(cfg)
  out: dict[str, Any] = {
    "architectures": [FAMILIES[model_type].hf_architecture],
    "model_type": model_type,
    "vocab_size": cfg.vocab_size,
    "hidden_size": cfg.hidden_size,
    "intermediate_size": cfg.intermediate_size,
    "num_hidden_layers": cfg.num_layers,
    "num_attention_heads": cfg.num_heads,
    "num_key_value_heads": cfg.num_kv_heads,
    "head_dim": cfg.head_dim,
    "hidden_act": "silu",
    "rms_norm_eps": cfg.rms_norm_eps,
    "tie_word_embeddings": cfg.tie_word_embeddings,
    "attention_bias": False,
    "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default", **rope_scaling},
    "max_position_embeddings": 32768,
    "dtype": cfg.dtype,
  }
  if cfg.is_moe:
    out.update(
      num_experts=cfg.num_experts,
      num_experts_per_tok=cfg.num_experts_per_tok,
      moe_intermediate_size=cfg.moe_intermediate_size,
      norm_topk_prob=cfg.norm_topk_prob,
      decoder_sparse_step=1,
      mlp_only_layers=[],
    )
  return out


def llama3_from_freq_factors(cfg: ModelConfig) -> dict[str, Any] | None:
  """The llama3 rope scaling (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) whose
  frequencies equal cfg's freq_factors ones (float32, relative 1e-5), or None when none does.

  llama3 divides frequencies of wavelength above T_l = original / low by `factor`, keeps those below
  T_h = original / high, and between them divides by 1 / ((1 - s) / factor + s) with s linear in 1 / wavelength
  (0 at T_l, 1 at T_h). So factor is the largest divisor, and T_h, T_l come from a line fitted to s of the
  smoothed frequencies (or, with fewer than two, from thresholds between the kept and the divided ones); the
  four numbers are then checked by recomputing the frequencies."""
  from jaxcredit.models.rope import rope_inv_freq

  scaling = dict(cfg.rope_scaling)
  divisors = np.asarray(scaling["freq_factors"], np.float64)
  dim = cfg.head_dim
  wavelen = 2 * math.pi * float(cfg.rope_theta) ** (np.arange(0, dim, 2) / dim)
  factor = float(divisors.max())
  if not factor > 1:
    return None
  kept, divided = np.isclose(divisors, 1.0, rtol=1e-5), np.isclose(divisors, factor, rtol=1e-5)
  mid = ~kept & ~divided
  w_kept = wavelen[kept].max() if kept.any() else wavelen.min() / 2
  w_divided = wavelen[divided].min() if divided.any() else wavelen.max() * 2
  candidates = []
  if mid.sum() >= 2:
    s = (1 / divisors[mid] - 1 / factor) / (1 - 1 / factor)
    slope, intercept = np.polyfit(1 / wavelen[mid], s, 1)
    if slope > 0:
      x_low = -intercept / slope
      candidates.append((1 / (x_low + 1 / slope), 1 / x_low if x_low > 0 else math.inf))
  else:
    lo = wavelen[mid].min() if mid.any() else w_divided
    hi = wavelen[mid].max() if mid.any() else w_kept
    for t in (0.25, 0.5, 0.75):  # thresholds strictly between the kept, the smoothed and the divided wavelengths
      t_high = w_kept * (min(lo, hi) / w_kept) ** t
      if mid.any():
        x, s = 1 / wavelen[mid][0], (1 / divisors[mid][0] - 1 / factor) / (1 - 1 / factor)
        x_low = (x - s / t_high) / (1 - s) if s < 1 else None
        t_low = 1 / x_low if x_low and x_low > 0 else None
      else:
        t_low = w_kept * (w_divided / w_kept) ** (0.5 + t / 2)
      if t_low is not None:
        candidates.append((t_high, t_low))
  want, _ = rope_inv_freq(cfg)
  for t_high, t_low in candidates:
    if not 0 < t_high < t_low < math.inf:
      continue
    original = float(round(t_low)) if abs(t_low - round(t_low)) < 1e-3 * t_low else float(t_low)
    for digits in (6, None):  # the round numbers a config holds (Llama 3.1: 1 and 4) when they fit, else exact
      low, high = (float(x if digits is None else f"{x:.{digits}g}") for x in (original / t_low, original / t_high))
      llama3 = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": int(original) if original.is_integer() else original,
      }
      got, _ = rope_inv_freq(dataclasses.replace(cfg, rope_scaling=llama3))
      if np.allclose(got, want, rtol=1e-5, atol=0):
        return llama3
  return None
