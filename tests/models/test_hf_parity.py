"""Logit parity with transformers (torch CPU, float32) of HF checkpoints loaded with `jaxcredit.models.load`, and
the KV-cache decode path against the full forward. Random tiny checkpoints are saved sharded and converted."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from hf_checkpoints import save_hf, torch_model
from jaxcredit.models import init_cache, load

L = 64
ATOL = 1e-4

CONFIGS = {
  # Qwen3, tied, GQA 2, head_dim 32 != hidden / heads = 16, rope_theta 1e6.
  "qwen3_tied_gqa2_headdim32": (
    "qwen3",
    dict(tie_word_embeddings=True, head_dim=32, rope_parameters={"rope_theta": 1e6, "rope_type": "default"}),
  ),
  # Qwen3, untied, GQA 1 (multi-head), rope_theta 5e6 with yarn scaling (extrapolated past 16 positions).
  "qwen3_untied_gqa1_yarn": (
    "qwen3",
    dict(
      tie_word_embeddings=False,
      num_key_value_heads=4,
      max_position_embeddings=64,
      rope_parameters={"rope_theta": 5e6, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    ),
  ),
  # Qwen3, GQA 4 (8 query heads over 2 kv heads), linear rope scaling.
  "qwen3_gqa4_linear": (
    "qwen3",
    dict(
      tie_word_embeddings=False,
      num_attention_heads=8,
      num_key_value_heads=2,
      rope_parameters={"rope_theta": 1e6, "rope_type": "linear", "factor": 2.0},
    ),
  ),
  # Llama (no qk-norm), GQA 2, llama3 rope scaling.
  "llama_llama3": (
    "llama",
    dict(
      tie_word_embeddings=False,
      rope_parameters={
        "rope_theta": 5e5,
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
      },
    ),
  ),
  # Llama, tied, head_dim deleted from config.json (= hidden / heads).
  "llama_tied_no_head_dim": ("llama", dict(tie_word_embeddings=True)),
}
DROP_KEYS = {"llama_tied_no_head_dim": ("head_dim",)}
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, tie_word_embeddings=False)


def _tokens(vocab, seed=0):
  return np.random.default_rng(seed).integers(0, vocab, size=(1, L)).astype(np.int32)


def _torch_logits(model, tokens):
  with torch.no_grad():
    return model(torch.tensor(tokens, dtype=torch.long)).logits.float().numpy()


@nnx.jit
def _forward(model, tokens_BxL):
  return model(tokens_BxL)[0]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match_transformers(tmp_path, name):
  model_type, overrides = CONFIGS[name]
  reference = torch_model(model_type, **overrides)
  folder = save_hf(reference, tmp_path / "hf")
  if name in DROP_KEYS:
    hf = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({k: v for k, v in hf.items() if k not in DROP_KEYS[name]}))
  model, cfg = load(folder, cache_dir=tmp_path / "cache")
  tokens = _tokens(cfg.vocab_size)
  diff = np.max(np.abs(np.asarray(_forward(model, jnp.asarray(tokens))) - _torch_logits(reference, tokens)))
  print(f"{name}: max |logit diff| = {diff:.2e}")
  assert diff <= ATOL, (name, diff)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_moe_logits_match_transformers_both_impls(tmp_path, norm_topk_prob):
  reference = torch_model("qwen3_moe", norm_topk_prob=norm_topk_prob, seed=1, **MOE)
  folder = save_hf(reference, tmp_path / "hf")
  tokens = _tokens(reference.config.vocab_size, seed=1)
  expected = _torch_logits(reference, tokens)
  for impl in ("ragged", "dense"):
    model, cfg = load(folder, cache_dir=tmp_path / "cache", config_overrides={"moe_impl": impl})
    assert cfg.is_moe and cfg.norm_topk_prob is norm_topk_prob and cfg.moe_impl == impl
    diff = np.max(np.abs(np.asarray(_forward(model, jnp.asarray(tokens))) - expected))
    print(f"qwen3_moe norm_topk_prob={norm_topk_prob} {impl}: max |logit diff| = {diff:.2e}")
    assert diff <= ATOL, (impl, diff)


def test_kv_cache_decode_matches_full_forward(tmp_path):
  """Prefill 48 tokens, then 16 single-token steps under jit: each step's logits equal the full forward's at
  that position."""
  reference = torch_model("qwen3", tie_word_embeddings=False)
  model, cfg = load(save_hf(reference, tmp_path / "hf"), cache_dir=tmp_path / "cache")
  tokens = jnp.asarray(_tokens(cfg.vocab_size, seed=2))
  full_BxLxV = np.asarray(_forward(model, tokens))
  np.testing.assert_allclose(full_BxLxV, _torch_logits(reference, np.asarray(tokens)), atol=ATOL)

  @nnx.jit
  def step(model, tokens_BxL, cache):
    return model(tokens_BxL, cache=cache)

  cache = init_cache(cfg, 1, L)
  logits_BxLxV, cache = step(model, tokens[:, :48], cache)
  np.testing.assert_allclose(np.asarray(logits_BxLxV), full_BxLxV[:, :48], atol=ATOL)
  for t in range(48, L):
    logits_Bx1xV, cache = step(model, tokens[:, t : t + 1], cache)
    diff = np.max(np.abs(np.asarray(logits_Bx1xV)[:, 0] - full_BxLxV[:, t]))
    assert diff <= ATOL, (t, diff)
  assert int(cache.index) == L
