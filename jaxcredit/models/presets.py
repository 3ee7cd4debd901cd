"""Published model shapes, for planning (`jaxcredit plan`) and tests, without downloading anything.

Values are the `config.json` of the Hugging Face checkpoints Qwen/Qwen3-4B and Qwen/Qwen3-30B-A3B (and
Qwen/Qwen3-0.6B) mapped to `ModelConfig` fields.
"""

from __future__ import annotations

import dataclasses

from jaxcredit.models.config import ModelConfig

_QWEN3 = dict(vocab_size=151936, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, qk_norm=True, dtype="bfloat16")
"""The fields every Qwen3 checkpoint's config.json sets alike (the dtype: its torch_dtype)."""

PRESETS: dict[str, ModelConfig] = {
  "qwen3-0.6b": ModelConfig(
    **_QWEN3,
    hidden_size=1024,
    intermediate_size=3072,
    num_layers=28,
    num_heads=16,
    num_kv_heads=8,
    tie_word_embeddings=True,
  ),
  "qwen3-4b": ModelConfig(
    **_QWEN3,
    hidden_size=2560,
    intermediate_size=9728,
    num_layers=36,
    num_heads=32,
    num_kv_heads=8,
    tie_word_embeddings=True,
  ),
  "qwen3-30b-a3b": ModelConfig(
    **_QWEN3,
    hidden_size=2048,
    intermediate_size=6144,
    num_layers=48,
    num_heads=32,
    num_kv_heads=4,
    tie_word_embeddings=False,
    num_experts=128,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
    norm_topk_prob=True,
  ),
}


# Hub ids whose config.json a preset is: `jaxcredit plan` sizes these without fetching anything (a training run
# still downloads the weights). A pinned revision (`@...`) is not mapped: its config may differ.
HUB_IDS = {"Qwen/Qwen3-0.6B": "qwen3-0.6b", "Qwen/Qwen3-4B": "qwen3-4b", "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b"}


def preset(name: str, **overrides) -> ModelConfig:
  """The ModelConfig of a published model by name, with fields replaced by `overrides`.

  Raises:
    ValueError: an unknown name (the known ones are listed).
  """
  key = HUB_IDS.get(name, name.lower().removeprefix("preset:"))
  if key not in PRESETS:
    raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
  return dataclasses.replace(PRESETS[key], **overrides)
