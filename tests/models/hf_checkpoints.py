"""Random Hugging Face checkpoints for the HF conversion tests: transformers models saved locally (torch CPU), and
hand-written safetensors folders (NumPy only) for the refusal tests."""

import json
from pathlib import Path

import numpy as np

from jaxcredit.models.hf import config_from_hf, hf_slots, write_safetensors

TINY = dict(
  vocab_size=96,
  hidden_size=64,
  intermediate_size=96,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=16,
  rms_norm_eps=1e-6,
)


def torch_model(model_type: str, **overrides):
  """A transformers model with random weights of every parameter (norm weights around 1), in eval mode."""
  import torch
  from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
  )

  classes = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
  }
  config_cls, model_cls = classes[model_type]
  kwargs = dict(TINY, **overrides)
  seed = kwargs.pop("seed", 0)
  torch.manual_seed(seed)
  model = model_cls(config_cls(**kwargs))
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.normal_(1.0, 0.1)
      else:
        p.normal_(0.0, 0.1)
  return model.eval()


def save_hf(model, folder, *, dtype=None, max_shard_size="40KB") -> Path:
  """save_pretrained into folder (sharded by max_shard_size), optionally cast to a torch dtype first."""
  if dtype is not None:
    model = model.to(dtype)
  model.save_pretrained(folder, max_shard_size=max_shard_size)
  return Path(folder)


def write_numpy_hf(folder, hf_config: dict, *, drop=(), extra=None, reshape=None, shards=2, seed=0) -> Path:
  """A safetensors folder whose tensors follow hf_config (random float32), in `shards` files with an index.

  drop: tensor names left out. extra: {name: array} added. reshape: {name: shape} written with that shape.
  """
  folder = Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "config.json").write_text(json.dumps(hf_config))
  rng = np.random.default_rng(seed)
  cfg = config_from_hf(hf_config)
  tensors = {
    s.hf_name: rng.standard_normal((reshape or {}).get(s.hf_name, s.hf_shape)).astype(np.float32)
    for s in hf_slots(cfg)
    if s.hf_name not in drop
  }
  tensors.update(extra or {})
  names = list(tensors)
  groups = [names[i::shards] for i in range(shards)]
  weight_map = {}
  for i, group in enumerate(groups):
    file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
    write_safetensors(folder / file, [(n, tensors[n].dtype, tensors[n].shape) for n in group], lambda n: tensors[n])
    weight_map.update({n: file for n in group})
  (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
  return folder


def qwen3_config(**overrides) -> dict:
  """A config.json dict of a tiny Qwen3 (transformers v5 spelling)."""
  base = dict(
    TINY,
    model_type="qwen3",
    rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
    hidden_act="silu",
    tie_word_embeddings=False,
  )
  return {**base, **overrides}


def qwen3_moe_config(**overrides) -> dict:
  base = dict(
    qwen3_config(),
    model_type="qwen3_moe",
    num_local_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
  )
  return {**base, **overrides}
