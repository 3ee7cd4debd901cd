"""Hugging Face safetensors checkpoints (Llama, Qwen3, Qwen3-MoE) to converted checkpoints and back, streamed.

    stats = convert_hf("Qwen3-0.6B/", "converted/qwen3-0.6b")    # or: jaxcredit convert --hf DIR --out DIR
    model, cfg = jaxcredit.models.load("converted/qwen3-0.6b", mesh=mesh)
    export_hf("converted/qwen3-0.6b", "exported/")                # or: jaxcredit export --checkpoint DIR --out DIR

Shape letters: N layers, D model width, H query heads, K kv heads, Dh head width, F MLP width, E experts,
Fm expert MLP width, V vocabulary.

Conversion never holds the model. The safetensors headers of every shard are read first and checked against
config.json (every tensor present, of the shape the config implies, nothing else), so a refusal comes before
anything is written. Then each tensor is read on its own (a seek and a read of its bytes into a NumPy array,
bfloat16 through ml_dtypes; `safetensors.safe_open` memory-maps the shard, so every page it touches counts as
resident, and its NumPy backend reads BF16 only once ml_dtypes happens to be imported), transposed/reshaped to our
layout, and written into its slice of the stacked [N, ...] parameter with TensorStore, straight into the zarr
arrays of an OCDBT orbax checkpoint (the specs come from
`orbax.checkpoint.type_handlers.get_json_tspec_write`, the chunks never span two layers or two experts, so every
write covers whole chunks). Data not yet committed is capped at `_WRITE_BUDGET_BYTES` (the next tensor is read
only once it fits) and OCDBT data files to `_DATA_FILE_BYTES`, so resident memory stays near twice the largest
tensor whatever the model size (see docs/benchmarks.md). The tree metadata (`_METADATA`, `_CHECKPOINT_METADATA`) is
written by orbax itself, from a save of a same-structured tree of one-element arrays, so
`orbax.checkpoint.StandardCheckpointer.restore` reads the result like any checkpoint it wrote, with shardings.

Layout (HF nn.Linear weights are [out, in]; ours are input-major, reshaped to heads, stacked over layers):
    model.embed_tokens.weight [V, D]                   -> embedding [V, D]
    model.norm.weight [D]                              -> final_norm [D]
    lm_head.weight [V, D]                              -> lm_head [D, V] (transposed; absent when tied)
    model.layers.{i}.input_layernorm.weight            -> layers/attn_norm[i]
    model.layers.{i}.post_attention_layernorm.weight   -> layers/mlp_norm[i]
    model.layers.{i}.self_attn.{q,k,v}_proj.weight     -> layers/w{q,k,v}[i] [D, H|K, Dh]
    model.layers.{i}.self_attn.o_proj.weight           -> layers/wo[i] [H, Dh, D]
    model.layers.{i}.self_attn.{q,k}_norm.weight       -> layers/{q,k}_norm[i] [Dh] (Qwen3)
    model.layers.{i}.mlp.{gate,up,down}_proj.weight    -> layers/w_{gate,up,down}[i] (dense)
    model.layers.{i}.mlp.gate.weight [E, D]            -> layers/router[i] [D, E] (MoE)
    model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight -> layers/we_{gate,up,down}[i, e]
    model.layers.{i}.mlp.experts.gate_up_proj [E, 2Fm, D] and .down_proj [E, D, Fm] (the fused layout of
        transformers v5's in-memory module) are accepted on input; export writes the per-expert layout.
RoPE needs no permutation (HF and our decoder both use rotate_half). `rotary_emb.inv_freq` buffers of old
checkpoints are skipped, and so is `lm_head.weight` when the config ties the embeddings and it equals them (a head
that differs is refused: transformers would keep it untied).

A converted folder holds model_config.json, params/, source.json, tokenizer/ (when the source has tokenizer
files) and hf/ (the source config.json and generation_config.json, and shards.json: the source's shard files,
their tensors in file order and their `__metadata__`), which `export_hf` uses to write the same files back.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import ml_dtypes
import numpy as np

from jaxcredit import trees
from jaxcredit.models.config import ModelConfig

SUPPORTED_MODEL_TYPES = ("llama", "qwen3", "qwen3_moe")
# safetensors dtype codes <-> NumPy (bfloat16 and float8 from ml_dtypes: NumPy has none).
_ST_DTYPES = {
  "F64": np.dtype(np.float64),
  "F32": np.dtype(np.float32),
  "F16": np.dtype(np.float16),
  "BF16": np.dtype(ml_dtypes.bfloat16),
  "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
  "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
  "I64": np.dtype(np.int64),
  "I32": np.dtype(np.int32),
  "I16": np.dtype(np.int16),
  "I8": np.dtype(np.int8),
  "U8": np.dtype(np.uint8),
  "BOOL": np.dtype(np.bool_),
}
_ST_CODES = {dtype: code for code, dtype in _ST_DTYPES.items()}
# Parameter dtypes a converted checkpoint may hold (ModelConfig.dtype names), by safetensors code.
_PARAM_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
DTYPE_ALIASES = {
  "f32": "float32",
  "fp32": "float32",
  "float32": "float32",
  "bf16": "bfloat16",
  "bfloat16": "bfloat16",
  "f16": "float16",
  "fp16": "float16",
  "float16": "float16",
}
TOKENIZER_FILES = (
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "added_tokens.json",
  "vocab.json",
  "merges.txt",
  "tokenizer.model",
  "chat_template.jinja",
  "chat_template.json",
)
_HF_DIR = "hf"
_SKIPPED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
# Bytes of tensor data handed to TensorStore and not yet committed, before the next read waits for the oldest.
_WRITE_BUDGET_BYTES = 32 << 20
# Zarr chunks are at most this large (smaller when one layer's or expert's slice is smaller), so that a sharded
# restore reads little beyond its own shard; OCDBT data files at most this large. Small files let OCDBT write a
# large tensor out piece by piece instead of assembling one data file for it (measured on a 128 MiB tensor: peak
# 1.6-2.1x the tensor with 8 MiB chunks and 16 MiB files, 2.9x with 64 MiB chunks and orbax's 2 GiB files).
_CHUNK_BYTES = 8 << 20
_DATA_FILE_BYTES = 16 << 20


def canonical_dtype(name: str | None) -> str | None:
  """'bf16', 'fp32', 'float16', ... -> the ModelConfig.dtype name; None stays None.

  Raises:
    ValueError: for any other name, listing the accepted ones.
  """
  if name is None:
    return None
  if name not in DTYPE_ALIASES:
    raise ValueError(f"unsupported dtype {name!r}; use one of {sorted(DTYPE_ALIASES)}")
  return DTYPE_ALIASES[name]


# ----------------------------------------------------------------------------------------------------------------
# safetensors files: header and raw tensor bytes


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """Where one tensor lies in a safetensors file: dtype code ('BF16'), shape, absolute byte range."""

  name: str
  file: Path
  dtype: str
  shape: tuple[int, ...]
  start: int
  end: int


def read_safetensors_header(path: str | os.PathLike) -> tuple[dict[str, TensorInfo], dict[str, str]]:
  """The tensors of a safetensors file, in file order, and its `__metadata__` (without reading tensor data).

  Format: 8-byte little-endian header length n, n bytes of JSON {name: {dtype, shape, data_offsets: [b, e]},
  "__metadata__": {...}}, then the data; offsets are relative to the end of the header.

  Raises:
    FileNotFoundError: when the file is missing.
    ValueError: naming the file, for a truncated file, a header that is not JSON, an unknown dtype or a byte
      range that does not match the shape.
  """
  path = Path(path)
  size = path.stat().st_size
  with open(path, "rb") as f:
    head = f.read(8)
    n = int.from_bytes(head, "little") if len(head) == 8 else -1
    if n < 2 or 8 + n > size:
      raise ValueError(f"{path} is not a safetensors file (header length {n}, file size {size})")
    try:
      header = json.loads(f.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ValueError(f"{path}: the safetensors header is not JSON ({e})") from None
  metadata = header.pop("__metadata__", None) or {}
  tensors = []
  for name, entry in header.items():
    code, shape = entry.get("dtype"), tuple(int(s) for s in entry.get("shape", ()))
    if code not in _ST_DTYPES:
      raise ValueError(f"{path}: tensor {name!r} has dtype {code!r}; known: {sorted(_ST_DTYPES)}")
    begin, end = entry["data_offsets"]
    if end - begin != math.prod(shape) * _ST_DTYPES[code].itemsize or 8 + n + end > size:
      raise ValueError(
        f"{path}: tensor {name!r} of shape {shape} and dtype {code} has byte range "
        f"[{begin}, {end}), which does not fit it or the file"
      )
    tensors.append(TensorInfo(name, path, code, shape, 8 + n + begin, 8 + n + end))
  tensors.sort(key=lambda t: t.start)
  return {t.name: t for t in tensors}, metadata


def read_tensor(info: TensorInfo) -> np.ndarray:
  """The tensor's bytes read into a fresh array of its dtype and shape (a positioned read: no mmap)."""
  out = np.empty(info.end - info.start, np.uint8)
  with open(info.file, "rb", buffering=0) as f:
    f.seek(info.start)
    got = f.readinto(memoryview(out))
  if got != out.size:
    raise ValueError(f"{info.file}: tensor {info.name!r} is truncated ({got} of {out.size} bytes)")
  return out.view(_ST_DTYPES[info.dtype]).reshape(info.shape)


def write_safetensors(
  path: str | os.PathLike,
  entries: list[tuple[str, np.dtype, tuple[int, ...]]],
  produce: Callable[[str], np.ndarray],
  metadata: Mapping[str, str] | None = None,
) -> int:
  """Writes a safetensors file tensor by tensor: the header first (all shapes are known), then each tensor's
  bytes as `produce(name)` returns them, in the order of `entries`. Returns the bytes of tensor data written.

  Raises:
    ValueError: when produce returns another dtype or shape than its entry announced (an internal bug).
  """
  header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
  offset = 0
  for name, dtype, shape in entries:
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    header[name] = {
      "dtype": _ST_CODES[np.dtype(dtype)],
      "shape": list(shape),
      "data_offsets": [offset, offset + nbytes],
    }
    offset += nbytes
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as the safetensors writer pads it
  with open(path, "wb") as f:
    f.write(len(blob).to_bytes(8, "little"))
    f.write(blob)
    for name, dtype, shape in entries:
      array = np.ascontiguousarray(produce(name))
      assert array.dtype == np.dtype(dtype) and array.shape == tuple(shape), (name, array.dtype, array.shape)
      f.write(memoryview(array.reshape(-1).view(np.uint8)))
  return offset


def read_inventory(folder: str | os.PathLike) -> tuple[dict[str, TensorInfo], dict[str, Any]]:
  """Every tensor of an HF folder (model.safetensors, or the shards its model.safetensors.index.json lists),
  and the shard layout: {"files": {file name: {"tensors": [names in file order], "metadata": {...}}},
  "index_metadata": {...}}.

  Raises:
    FileNotFoundError: when the folder has neither file, or a shard the index lists is missing (named).
    ValueError: for an unreadable header, a tensor in two shards, or an index entry whose shard lacks it.
  """
  folder = Path(folder)
  index_path = folder / "model.safetensors.index.json"
  if index_path.is_file():
    index = json.loads(index_path.read_text())
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
      raise ValueError(f"{index_path} has no 'weight_map'")
    files = list(dict.fromkeys(weight_map.values()))
    index_metadata = index.get("metadata") or {}
  elif (folder / "model.safetensors").is_file():
    weight_map, files, index_metadata = None, ["model.safetensors"], None
  else:
    raise FileNotFoundError(
      f"{folder} has neither model.safetensors nor model.safetensors.index.json "
      f"(pytorch_model.bin checkpoints are not read: re-save them with safetensors)"
    )
  inventory: dict[str, TensorInfo] = {}
  layout: dict[str, Any] = {"files": {}, "index_metadata": index_metadata}
  for file in files:
    if not (folder / file).is_file():
      raise FileNotFoundError(f"shard {file} listed in {index_path} is missing")
    tensors, metadata = read_safetensors_header(folder / file)
    for name in tensors:
      if name in inventory:
        raise ValueError(f"tensor {name!r} is in both {inventory[name].file.name} and {file}")
    inventory.update(tensors)
    layout["files"][file] = {"tensors": list(tensors), "metadata": metadata}
  for name, file in (weight_map or {}).items():
    if name not in inventory or inventory[name].file.name != file:
      raise ValueError(f"{index_path} lists tensor {name!r} in {file}, which does not contain it")
  return inventory, layout


# ----------------------------------------------------------------------------------------------------------------
# config.json <-> ModelConfig


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
  if model_type not in SUPPORTED_MODEL_TYPES:
    why = " (qwen2 has q/k/v biases, which this decoder has not)" if model_type == "qwen2" else ""
    raise ValueError(
      f"{where}: model_type {model_type!r} is not supported{why}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
    )

  def need(key):
    if hf.get(key) is None:
      raise ValueError(f"{where}: required field {key!r} is missing")
    return hf[key]

  def refuse(condition, what):
    if condition:
      raise ValueError(f"{where}: {what} is not supported by the decoder")

  # Sizes are checked here under their config.json names: `x or default` below must never turn a 0 into the
  # default, and int("8") or int(2.5) must not pass (or fail) without naming the field.
  for key in _HF_SIZES + (_HF_MOE_SIZES if model_type == "qwen3_moe" else ()):
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
  if model_type == "qwen3_moe":
    refuse(
      hf.get("mlp_only_layers"),
      f"mlp_only_layers {hf.get('mlp_only_layers')} (dense layers among "
      f"MoE layers: the layers are scanned over one stacked parameter set)",
    )
    step = hf.get("decoder_sparse_step", 1)
    refuse(
      step not in (None, 1),
      f"decoder_sparse_step {step} (dense layers among MoE layers: the layers "
      f"are scanned over one stacked parameter set)",
    )
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
      qk_norm=model_type in ("qwen3", "qwen3_moe"),
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
  model_type qwen3_moe when cfg has experts, qwen3 when it has qk-norm, llama otherwise.

  rope_scaling of rope_type "freq_factors" (a GGUF's `rope_freqs.weight`) is written as the llama3 scaling that
  gives the same frequencies (`llama3_from_freq_factors`): what llama.cpp's converter made the tensor from.

  Raises:
    ValueError: for freq_factors that no llama3 scaling reproduces: transformers and vLLM have no spelling for
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
  model_type = "qwen3_moe" if cfg.is_moe else "qwen3" if cfg.qk_norm else "llama"
  arch = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
  out: dict[str, Any] = {
    "architectures": [arch[model_type]],
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
  from jaxcredit.models.decoder import rope_inv_freq

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


# ----------------------------------------------------------------------------------------------------------------
# The tensor map: one HF tensor <-> slices of our parameters


@dataclasses.dataclass(frozen=True)
class Slot:
  """One HF tensor's part that fills one slice of one of our parameters.

  ours = hf[rows].T (2-D, or over the last two axes of a 3-D expert block) reshaped to the slice's shape when
  `transpose`, else hf reshaped; `rows` selects along the HF output axis (the fused gate_up_proj's halves).
  """

  hf_name: str
  hf_shape: tuple[int, ...]
  param: str
  index: tuple[int, ...]
  transpose: bool
  rows: tuple[int, int] | None = None

  def to_ours(self, hf: np.ndarray, slice_shape: tuple[int, ...]) -> np.ndarray:
    if self.rows is not None:
      hf = hf[:, self.rows[0] : self.rows[1]]
    if self.transpose:
      hf = np.swapaxes(hf, -1, -2)
    return hf.reshape(slice_shape)

  def to_hf(self, ours: np.ndarray) -> np.ndarray:
    assert self.rows is None, "export writes the per-expert layout"
    if self.transpose:
      return np.ascontiguousarray(ours.reshape(self.hf_shape[::-1]).T)
    return ours.reshape(self.hf_shape)


def hf_slots(cfg: ModelConfig) -> list[Slot]:
  """Every HF tensor of cfg's checkpoint (per-expert MoE layout) with the parameter slice it maps to, in
  transformers' order: embedding, layer by layer, final norm, lm_head (when untied)."""
  d, v, f = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
  h, k, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  slots = [Slot("model.embed_tokens.weight", (v, d), "embedding", (), False)]
  for i in range(cfg.num_layers):
    p = f"model.layers.{i}."
    slots += [
      Slot(p + "input_layernorm.weight", (d,), "layers/attn_norm", (i,), False),
      Slot(p + "self_attn.q_proj.weight", (h * dh, d), "layers/wq", (i,), True),
      Slot(p + "self_attn.k_proj.weight", (k * dh, d), "layers/wk", (i,), True),
      Slot(p + "self_attn.v_proj.weight", (k * dh, d), "layers/wv", (i,), True),
      Slot(p + "self_attn.o_proj.weight", (d, h * dh), "layers/wo", (i,), True),
    ]
    if cfg.qk_norm:
      slots += [
        Slot(p + "self_attn.q_norm.weight", (dh,), "layers/q_norm", (i,), False),
        Slot(p + "self_attn.k_norm.weight", (dh,), "layers/k_norm", (i,), False),
      ]
    slots.append(Slot(p + "post_attention_layernorm.weight", (d,), "layers/mlp_norm", (i,), False))
    if cfg.is_moe:
      fm = cfg.moe_intermediate_size
      slots.append(Slot(p + "mlp.gate.weight", (cfg.num_experts, d), "layers/router", (i,), True))
      for e in range(cfg.num_experts):
        q = f"{p}mlp.experts.{e}."
        slots += [
          Slot(q + "gate_proj.weight", (fm, d), "layers/we_gate", (i, e), True),
          Slot(q + "up_proj.weight", (fm, d), "layers/we_up", (i, e), True),
          Slot(q + "down_proj.weight", (d, fm), "layers/we_down", (i, e), True),
        ]
    else:
      slots += [
        Slot(p + "mlp.gate_proj.weight", (f, d), "layers/w_gate", (i,), True),
        Slot(p + "mlp.up_proj.weight", (f, d), "layers/w_up", (i,), True),
        Slot(p + "mlp.down_proj.weight", (d, f), "layers/w_down", (i,), True),
      ]
  slots.append(Slot("model.norm.weight", (d,), "final_norm", (), False))
  if not cfg.tie_word_embeddings:
    slots.append(Slot("lm_head.weight", (v, d), "lm_head", (), True))
  return slots


def _fused_expert_slots(cfg: ModelConfig, i: int) -> list[Slot]:
  """Layer i's experts in transformers v5's fused layout: gate_up_proj [E, 2Fm, D] (gate rows first),
  down_proj [E, D, Fm]."""
  e, d, fm = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
  p = f"model.layers.{i}.mlp.experts."
  return [
    Slot(p + "gate_up_proj", (e, 2 * fm, d), "layers/we_gate", (i,), True, (0, fm)),
    Slot(p + "gate_up_proj", (e, 2 * fm, d), "layers/we_up", (i,), True, (fm, 2 * fm)),
    Slot(p + "down_proj", (e, d, fm), "layers/we_down", (i,), True),
  ]


def _first(names: list[str], limit: int = 5) -> str:
  more = f" and {len(names) - limit} more" if len(names) > limit else ""
  return ", ".join(repr(n) for n in names[:limit]) + more


def plan_conversion(
  cfg: ModelConfig, inventory: Mapping[str, TensorInfo], where: str = "checkpoint"
) -> dict[str, list[Slot]]:
  """Checks the checkpoint's tensors against cfg and maps each HF tensor name to the slots it fills.

  Raises:
    ValueError: one line naming `where` and the tensor(s): a missing tensor (with the shape the config
      implies), a tensor of another shape (actual and expected), tensors the config does not describe, a
      dtype other than F32/BF16/F16, or one parameter's tensors stored in different dtypes.
  """
  slots = hf_slots(cfg)
  if cfg.is_moe:
    fused = {i for i in range(cfg.num_layers) if f"model.layers.{i}.mlp.experts.gate_up_proj" in inventory}
    per_expert = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.\d+\.")
    slots = [s for s in slots if not ((m := per_expert.match(s.hf_name)) and int(m.group(1)) in fused)]
    slots += [s for i in sorted(fused) for s in _fused_expert_slots(cfg, i)]
  plan: dict[str, list[Slot]] = collections.defaultdict(list)
  for slot in slots:
    plan[slot.hf_name].append(slot)
  missing = [n for n in plan if n not in inventory]
  if missing:
    raise ValueError(
      f"{where} does not match its config.json: tensor {missing[0]!r} is missing (the config "
      f"implies shape {plan[missing[0]][0].hf_shape})"
      + (f"; {len(missing) - 1} more are missing" if len(missing) > 1 else "")
    )
  for name, (slot, *_) in plan.items():
    if inventory[name].shape != slot.hf_shape:
      raise ValueError(
        f"{where} does not match its config.json: tensor {name!r} has shape "
        f"{inventory[name].shape}, the config implies {slot.hf_shape}"
      )
  skipped = set()
  if cfg.tie_word_embeddings and "lm_head.weight" in inventory:
    head, embed = inventory["lm_head.weight"], inventory.get("model.embed_tokens.weight")
    if (
      embed is None
      or head.shape != embed.shape
      or head.dtype != embed.dtype
      or not np.array_equal(read_tensor(head), read_tensor(embed))
    ):
      raise ValueError(
        f"{where}: config.json ties the embeddings (tie_word_embeddings=true) but tensor "
        f"'lm_head.weight' differs from 'model.embed_tokens.weight' (transformers keeps such a "
        f"head untied); set tie_word_embeddings to false in config.json"
      )
    skipped.add("lm_head.weight")  # a stored copy of the tied embedding
  unexpected = [n for n in inventory if n not in plan and n not in skipped and not _SKIPPED.fullmatch(n)]
  if unexpected:
    raise ValueError(
      f"{where} does not match its config.json: unexpected tensors {_first(unexpected)} "
      f"(not part of a {cfg.num_layers}-layer {'MoE ' if cfg.is_moe else ''}model of this config)"
    )
  dtypes: dict[str, tuple[str, str]] = {}
  for name, param_slots in plan.items():
    code = inventory[name].dtype
    if code not in _PARAM_DTYPES:
      raise ValueError(f"{where}: tensor {name!r} has dtype {code}; supported: {sorted(_PARAM_DTYPES)}")
    for slot in param_slots:
      seen = dtypes.setdefault(slot.param, (code, name))
      if seen[0] != code:
        raise ValueError(
          f"{where}: tensors {seen[1]!r} ({seen[0]}) and {name!r} ({code}) of parameter "
          f"{slot.param} differ in dtype; pass a dtype to convert to one"
        )
  return dict(plan)


# ----------------------------------------------------------------------------------------------------------------
# Streaming orbax checkpoint writer and reader


def _unit_ndim(param: str) -> int:
  """Leading axes indexed by one write: () for global parameters, [N] for layers, [N, E] for experts."""
  if param.startswith("layers/we_"):
    return 2
  return 1 if param.startswith("layers/") else 0


def _orbax_name(param: str) -> str:
  return param.replace("/", ".")  # orbax names a leaf by its tree path joined with '.'


class ParamsWriter:
  """Writes an orbax (OCDBT, zarr) checkpoint of a nested parameter dict slice by slice.

      with ParamsWriter(folder / "params", {"layers/wq": ((N, D, H, Dh), "bfloat16"), ...}) as writer:
          writer.write("layers/wq", (i,), wq_i)          # any order, each slice once
      # on leaving without an exception: every pending write committed

  Each stacked parameter is chunked so that no chunk spans two layers (two experts for expert weights), so a
  slice write never reads back or rewrites another one. At most `budget_bytes` of written data (or one slice,
  when it is larger) wait for their commit at any time. TensorStore encodes straight from the arrays given to
  `write` (no copy): the caller must not modify them afterwards.
  """

  def __init__(
    self,
    directory: str | os.PathLike,
    arrays: Mapping[str, tuple[tuple[int, ...], str]],
    budget_bytes: int = _WRITE_BUDGET_BYTES,
  ):
    import orbax.checkpoint as ocp
    import tensorstore as ts
    from etils import epath

    self.directory = Path(directory)
    self.directory.mkdir(parents=True)
    self.arrays = dict(arrays)
    self.budget_bytes = budget_bytes
    self.pending: collections.deque = collections.deque()
    self.pending_bytes = 0
    self.written_bytes = 0
    context = ocp.type_handlers.get_ts_context(use_ocdbt=True)
    self.stores = {}
    for param, (shape, dtype) in self.arrays.items():
      unit = _unit_ndim(param)
      info = ocp.type_handlers.ParamInfo(
        name=_orbax_name(param),
        parent_dir=epath.Path(self.directory),
        is_ocdbt_checkpoint=True,
        use_zarr3=False,
        ts_context=context,
        ocdbt_target_data_file_size=_DATA_FILE_BYTES,
      )
      spec = ocp.type_handlers.get_json_tspec_write(
        info,
        use_ocdbt=True,
        global_shape=tuple(shape),
        local_shape=(1,) * unit + tuple(shape[unit:]),
        dtype=np.dtype(dtype),
        arg=ocp.SaveArgs(chunk_byte_size=_CHUNK_BYTES),
      )
      self.stores[param] = ts.open(spec, create=True, context=context).result()
    self._write_tree_metadata()

  def reserve(self, nbytes: int) -> None:
    """Waits for the oldest pending writes until nbytes more fit the budget (or nothing is pending): call it
    before reading the next tensor, so that at most one tensor beyond the budget is ever held."""
    while self.pending and self.pending_bytes + nbytes > self.budget_bytes:
      self._wait_oldest()

  def write(self, param: str, index: tuple[int, ...], value: np.ndarray) -> None:
    """Writes value into param[index] (value is cast to the parameter's dtype); returns once TensorStore has
    taken it, before it is committed (see `reserve`)."""
    value = np.asarray(value, self.stores[param].dtype.numpy_dtype)
    self.reserve(value.nbytes)
    # The arrays are fresh reads nobody modifies: TensorStore may encode from them instead of copying first.
    future = self.stores[param][index].write(value, can_reference_source_data_indefinitely=True)
    self.pending.append((future, value.nbytes))
    self.pending_bytes += value.nbytes
    self.written_bytes += value.nbytes

  def _wait_oldest(self):
    future, nbytes = self.pending.popleft()
    future.result()
    self.pending_bytes -= nbytes

  def __enter__(self) -> ParamsWriter:
    return self

  def __exit__(self, exc_type, exc, tb):
    if exc_type is None:
      while self.pending:
        self._wait_oldest()
      return False
    for future, _ in self.pending:  # let in-flight writes land before the caller removes the folder
      try:
        future.result()
      except Exception:  # noqa: BLE001 - the original exception is the one to report
        pass
    self.pending.clear()
    return False

  def _write_tree_metadata(self):
    """Lets orbax write the tree metadata files for this structure (they hold no shapes or dtypes: those are
    in the zarr arrays), from a save of one-element arrays into a scratch folder. Done first, so that its
    one-off cost (orbax's threads, JAX's CPU client) is not part of the streaming's memory."""
    import orbax.checkpoint as ocp

    tree = trees.unflatten({param: np.zeros((1,), self.stores[param].dtype.numpy_dtype) for param in self.arrays})
    scratch = Path(tempfile.mkdtemp(prefix=".orbax-metadata-", dir=self.directory.parent))
    try:
      with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(scratch / "params", tree)
        checkpointer.wait_until_finished()
      for name in ("_METADATA", "_CHECKPOINT_METADATA"):
        shutil.copyfile(scratch / "params" / name, self.directory / name)
    finally:
      shutil.rmtree(scratch, ignore_errors=True)


def open_params(directory: str | os.PathLike, names: list[str]) -> dict[str, Any]:
  """Read-only TensorStore handles (indexable, `.read().result()`) on the named parameters of an orbax
  checkpoint folder, for reading them slice by slice."""
  import orbax.checkpoint as ocp
  import tensorstore as ts
  from etils import epath

  context = ocp.type_handlers.get_ts_context(use_ocdbt=True)
  stores = {}
  for param in names:
    info = ocp.type_handlers.ParamInfo(
      name=_orbax_name(param),
      parent_dir=epath.Path(directory),
      is_ocdbt_checkpoint=True,
      use_zarr3=False,
      ts_context=context,
    )
    spec = ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=True)
    stores[param] = ts.open(spec, open=True, read=True, context=context).result()
  return stores


# ----------------------------------------------------------------------------------------------------------------
# Peak memory


def _status_kib(field: str) -> int | None:
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1])
  except OSError:
    pass
  return None


class PeakMemory:
  """Peak resident memory of this process above its resident memory at `__enter__`, in bytes.

  Linux: resets the high-water mark VmHWM on entry (writing 5 to /proc/self/clear_refs), so the peak is the
  region's own; `peak_bytes` is VmHWM - VmRSS at entry (None where /proc is unavailable).
  """

  def __enter__(self) -> PeakMemory:
    try:
      with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    except OSError:
      pass
    self.baseline_kib = _status_kib("VmRSS")
    return self

  def __exit__(self, *exc):
    return False

  @property
  def peak_bytes(self) -> int | None:
    hwm = _status_kib("VmHWM")
    if hwm is None or self.baseline_kib is None:
      return None
    return max(hwm - self.baseline_kib, 0) * 1024


# ----------------------------------------------------------------------------------------------------------------
# Atomic output folders


class _AtomicFolder:
  """A temporary sibling folder that becomes `target` on success and is removed on failure.

  Raises (on entry):
    FileExistsError: when target exists and is not an empty folder.
  """

  def __init__(self, target: Path, what: str):
    self.target = Path(target).expanduser().resolve()
    self.what = what

  def __enter__(self) -> Path:
    if self.target.exists() and not (self.target.is_dir() and not any(self.target.iterdir())):
      raise FileExistsError(f"{self.target} already exists; choose another {self.what} or remove it")
    self.target.parent.mkdir(parents=True, exist_ok=True)
    self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.tmp-", dir=self.target.parent))
    self.tmp.chmod(0o755)
    return self.tmp

  def __exit__(self, exc_type, exc, tb):
    try:
      if exc_type is None:
        if self.target.is_dir() and not any(self.target.iterdir()):
          self.target.rmdir()
        os.rename(self.tmp, self.target)
    finally:
      shutil.rmtree(self.tmp, ignore_errors=True)
    return False


# ----------------------------------------------------------------------------------------------------------------
# Conversion


def _progress(total: int, desc: str, enabled: bool):
  from tqdm import tqdm

  return tqdm(total=total, desc=desc, unit="tensor", disable=not enabled, dynamic_ncols=True)


def inspect_hf(
  folder: str | os.PathLike, *, dtype: str | None = None
) -> tuple[dict[str, Any], ModelConfig, dict[str, TensorInfo], dict[str, Any], dict[str, list[Slot]]]:
  """Reads and checks an HF folder without reading tensor data: (config.json, ModelConfig, inventory, shard
  layout, plan). cfg.dtype is `dtype` when given, else the embedding's dtype.

  Raises:
    FileNotFoundError: a missing folder, config.json or safetensors file.
    ValueError: see `config_from_hf` and `plan_conversion`.
  """
  folder = Path(folder).expanduser()
  if not folder.is_dir():
    raise FileNotFoundError(f"no Hugging Face checkpoint folder at {folder}")
  config_path = folder / "config.json"
  if not config_path.is_file():
    raise FileNotFoundError(f"{folder} has no config.json")
  try:
    hf = json.loads(config_path.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{config_path} is not JSON ({e})") from None
  if not isinstance(hf, dict):
    raise ValueError(f"{config_path} must hold a JSON object, got {type(hf).__name__}")
  cfg = config_from_hf(hf, where=str(config_path))
  inventory, layout = read_inventory(folder)
  plan = plan_conversion(cfg, inventory, where=str(folder))
  dtype = canonical_dtype(dtype) or _PARAM_DTYPES[inventory["model.embed_tokens.weight"].dtype]
  return hf, dataclasses.replace(cfg, dtype=dtype), inventory, layout, plan


def convert_hf(
  folder: str | os.PathLike, out: str | os.PathLike, *, dtype: str | None = None, progress: bool = False
) -> dict[str, Any]:
  """Converts an HF safetensors folder into a converted checkpoint folder, streaming tensor by tensor.

  Everything is checked before anything is written; the output is built in a temporary sibling folder that is
  renamed to `out` at the end, so a failure leaves nothing at `out`. Tokenizer files the folder has are copied
  to out/tokenizer/; config.json, generation_config.json and the shard layout go to out/hf/ for `export_hf`.

  Args:
    folder: holds config.json and model.safetensors or model.safetensors.index.json with its shards.
    out: the folder to create (must not exist, or be empty).
    dtype: store parameters in this dtype ("bf16", "f32", "f16" or the full names); default: keep each
      tensor's source dtype (cfg.dtype is then the embedding's).
    progress: show a tqdm bar over tensors on stderr.

  Returns:
    Stats: {"tensors", "bytes_read", "bytes_written", "largest_shard_bytes", "peak_rss_above_baseline_bytes",
    "seconds", "out"}.

  Raises:
    FileNotFoundError: a missing folder, config.json or shard.
    FileExistsError: out exists and is not empty.
    ValueError: see `inspect_hf`.
  """
  from jaxcredit.models.decoder import param_shapes

  start = time.perf_counter()
  hf, cfg, inventory, layout, plan = inspect_hf(folder, dtype=dtype)
  folder = Path(folder).expanduser().resolve()
  shapes = param_shapes(cfg)
  store_dtypes = {}
  for name, slots in plan.items():
    for slot in slots:
      store_dtypes[slot.param] = cfg.dtype if dtype else _PARAM_DTYPES[inventory[name].dtype]
  assert set(store_dtypes) == set(shapes), (sorted(store_dtypes), sorted(shapes))
  arrays = {param: (shapes[param], store_dtypes[param]) for param in shapes}
  bytes_read = 0
  with _AtomicFolder(Path(out), "--out") as tmp:
    with (
      ParamsWriter(tmp / "params", arrays) as writer,
      PeakMemory() as memory,
      _progress(len(plan), "converting", progress) as bar,
    ):
      for file in layout["files"]:
        for name in layout["files"][file]["tensors"]:
          if name not in plan:
            continue  # skipped: rotary inv_freq, a tied lm_head
          writer.reserve(inventory[name].end - inventory[name].start)
          array = read_tensor(inventory[name])
          bytes_read += array.nbytes
          for slot in plan[name]:
            slice_shape = shapes[slot.param][len(slot.index) :]
            writer.write(slot.param, slot.index, slot.to_ours(array, slice_shape))
          del array
          bar.update(1)
    _write_sidecars(tmp, cfg, {"format": "hf", "path": str(folder), "dtype": dtype}, folder)
    (tmp / _HF_DIR).mkdir()
    (tmp / _HF_DIR / "config.json").write_text(json.dumps(hf, indent=2))
    if (folder / "generation_config.json").is_file():
      shutil.copyfile(folder / "generation_config.json", tmp / _HF_DIR / "generation_config.json")
    (tmp / _HF_DIR / "shards.json").write_text(json.dumps(layout, indent=1))
  return {
    "out": str(Path(out).expanduser().resolve()),
    "tensors": len(plan),
    "bytes_read": bytes_read,
    "bytes_written": writer.written_bytes,
    "largest_shard_bytes": max((folder / f).stat().st_size for f in layout["files"]),
    "peak_rss_above_baseline_bytes": memory.peak_bytes,
    "seconds": time.perf_counter() - start,
  }


def _write_sidecars(tmp: Path, cfg: ModelConfig, source: dict[str, Any], tokenizer_from: Path | None) -> None:
  (tmp / "model_config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
  (tmp / "source.json").write_text(json.dumps(source, indent=1))
  if tokenizer_from is not None:
    found = [name for name in TOKENIZER_FILES if (tokenizer_from / name).is_file()]
    if found:
      (tmp / "tokenizer").mkdir()
      for name in found:
        shutil.copyfile(tokenizer_from / name, tmp / "tokenizer" / name)


def convert_gguf(
  path: str | os.PathLike, out: str | os.PathLike, *, dtype: str | None = None, progress: bool = False
) -> dict[str, Any]:
  """Converts a llama.cpp GGUF file (llama, qwen3) into a converted checkpoint folder with its tokenizer.

  The GGUF tensors are dequantised to float32 by `load_gguf` (the whole model in memory: GGUF files are single,
  mostly quantised files) and written through the same writer as `convert_hf`; float32 unless `dtype` says.

  Returns:
    Stats as `convert_hf` (largest_shard_bytes is the GGUF file's size).

  Raises:
    FileNotFoundError: no file at path. FileExistsError: out exists and is not empty.
    ValueError: an unsupported GGUF (see `load_gguf`) or dtype.
  """
  from jaxcredit.models.gguf_loader import load_gguf, open_gguf
  from jaxcredit.models.tokenizer import ChatTokenizer

  with PeakMemory() as memory:
    start = time.perf_counter()
    dtype = canonical_dtype(dtype)
    path = Path(path).expanduser().resolve()
    reader = open_gguf(path)
    cfg, params = load_gguf(reader)
    tokenizer = ChatTokenizer.from_gguf(reader)
    cfg = dataclasses.replace(cfg, dtype=dtype or "float32")
    flat = trees.flatten(params)
    with _AtomicFolder(Path(out), "--out") as tmp:
      arrays = {name: (tuple(value.shape), cfg.dtype) for name, value in flat.items()}
      with ParamsWriter(tmp / "params", arrays) as writer, _progress(len(flat), "converting", progress) as bar:
        for name, value in flat.items():
          writer.write(name, (), value)
          bar.update(1)
      _write_sidecars(tmp, cfg, {"format": "gguf", "gguf": str(path), "dtype": dtype}, None)
      tokenizer.save_pretrained(tmp / "tokenizer")
    return {
      "out": str(Path(out).expanduser().resolve()),
      "tensors": len(flat),
      "bytes_read": path.stat().st_size,
      "bytes_written": writer.written_bytes,
      "largest_shard_bytes": path.stat().st_size,
      "peak_rss_above_baseline_bytes": memory.peak_bytes,
      "seconds": time.perf_counter() - start,
    }


# ----------------------------------------------------------------------------------------------------------------
# Export


def _shard_plan(
  slots: list[Slot], nbytes: Mapping[str, int], stored: dict[str, Any] | None, max_shard_size: int
) -> dict[str, list[str]]:
  """Shard file -> HF tensor names in file order: the source's layout when it holds exactly these tensors,
  else greedy shards of at most max_shard_size bytes in transformers' order."""
  names = [s.hf_name for s in slots]
  if stored and sorted(n for f in stored["files"].values() for n in f["tensors"]) == sorted(names):
    return {file: list(entry["tensors"]) for file, entry in stored["files"].items()}
  groups: list[list[str]] = [[]]
  size = 0
  for name in names:
    if groups[-1] and size + nbytes[name] > max_shard_size:
      groups.append([])
      size = 0
    groups[-1].append(name)
    size += nbytes[name]
  if len(groups) == 1:
    return {"model.safetensors": groups[0]}
  n = len(groups)
  return {f"model-{i + 1:05d}-of-{n:05d}.safetensors": group for i, group in enumerate(groups)}


def export_hf(
  checkpoint: str | os.PathLike,
  out: str | os.PathLike,
  *,
  max_shard_size: int = 5 << 30,
  progress: bool = False,
  untie_embeddings: bool = False,
) -> dict[str, Any]:
  """Writes a converted checkpoint back as an HF safetensors folder, one layer slice at a time.

  Tensors keep the dtype each parameter is stored in; MoE experts are written per expert
  (`mlp.experts.{e}.{gate,up,down}_proj.weight`). A checkpoint converted from HF gets back the source's
  config.json (its "dtype" updated when the conversion cast), generation_config.json, tokenizer files, shard
  files and tensor order, so converting and exporting is bit-exact per tensor. Other checkpoints (GGUF) get a
  config.json from `hf_config_from_model_config` and shards of at most max_shard_size bytes. With
  `untie_embeddings`, a tied output head is written as its own `lm_head.weight` (a copy of the embedding) and
  config.json says `tie_word_embeddings: false` (the folder a vLLM server serves for `rollout.engine=vllm`;
  `save_hf_weights`, `untie`).

  Returns:
    {"out", "tensors", "files", "bytes_written", "seconds"}.

  Raises:
    FileNotFoundError: checkpoint is not a converted checkpoint folder.
    FileExistsError: out exists and is not empty.
    ValueError: a stored parameter whose shape does not match model_config.json (named).
  """
  from jaxcredit.models.decoder import param_shapes

  start = time.perf_counter()
  checkpoint = Path(checkpoint).expanduser().resolve()
  if not (checkpoint / "model_config.json").is_file() or not (checkpoint / "params").is_dir():
    raise FileNotFoundError(f"{checkpoint} is not a converted checkpoint: it needs model_config.json and params/")
  cfg = ModelConfig.from_dict(json.loads((checkpoint / "model_config.json").read_text()))
  shapes = param_shapes(cfg)
  stores = open_params(checkpoint / "params", list(shapes))
  for param, shape in shapes.items():
    if tuple(stores[param].shape) != shape:
      raise ValueError(
        f"{checkpoint}: stored parameter {param!r} has shape {tuple(stores[param].shape)}, "
        f"model_config.json implies {shape}"
      )
  slots = {s.hf_name: s for s in hf_slots(cfg)}
  untie = untie_embeddings and cfg.tie_word_embeddings
  if untie:
    slots["lm_head.weight"] = Slot("lm_head.weight", (cfg.vocab_size, cfg.hidden_size), "embedding", (), False)
  dtypes = {name: stores[s.param].dtype.numpy_dtype for name, s in slots.items()}
  nbytes = {name: math.prod(s.hf_shape) * dtypes[name].itemsize for name, s in slots.items()}
  hf_dir = checkpoint / _HF_DIR
  stored_layout = json.loads((hf_dir / "shards.json").read_text()) if (hf_dir / "shards.json").is_file() else None
  if (hf_dir / "config.json").is_file():
    hf = json.loads((hf_dir / "config.json").read_text())
    source_dtype = json.loads((checkpoint / "source.json").read_text()).get("dtype")
    if source_dtype:
      hf["dtype"] = cfg.dtype
      hf.pop("torch_dtype", None)
  else:
    hf = hf_config_from_model_config(cfg)
  if untie:
    hf["tie_word_embeddings"] = False
    stored_layout = None  # the source's shards do not hold lm_head.weight
  shards = _shard_plan(list(slots.values()), nbytes, stored_layout, max_shard_size)
  total = 0
  with _AtomicFolder(Path(out), "--out") as tmp, _progress(len(slots), "exporting", progress) as bar:

    def produce(name: str) -> np.ndarray:
      slot = slots[name]
      array = slot.to_hf(stores[slot.param][slot.index].read().result())
      bar.update(1)
      return array

    for file, names in shards.items():
      metadata = (
        stored_layout["files"][file]["metadata"]
        if stored_layout and file in stored_layout["files"]
        else {"format": "pt"}
      )
      total += write_safetensors(tmp / file, [(n, dtypes[n], slots[n].hf_shape) for n in names], produce, metadata)
    if len(shards) > 1:
      index_metadata = dict((stored_layout or {}).get("index_metadata") or {})
      index_metadata["total_size"] = total
      index = {"metadata": index_metadata, "weight_map": {n: f for f, ns in shards.items() for n in ns}}
      (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    (tmp / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    if (hf_dir / "generation_config.json").is_file():
      shutil.copyfile(hf_dir / "generation_config.json", tmp / "generation_config.json")
    if (checkpoint / "tokenizer").is_dir():
      for entry in (checkpoint / "tokenizer").iterdir():
        if entry.is_file():
          shutil.copyfile(entry, tmp / entry.name)
  return {
    "out": str(Path(out).expanduser().resolve()),
    "tensors": len(slots),
    "files": len(shards),
    "bytes_written": total,
    "seconds": time.perf_counter() - start,
  }


def save_hf_weights(
  cfg: ModelConfig,
  params: Mapping[str, Any],
  out: str | os.PathLike,
  *,
  max_shard_size: int = 5 << 30,
  untie: bool = False,
) -> dict[str, Any]:
  """Writes in-memory parameters as the safetensors shards of an HF folder (no config, no tokenizer): what a
  serving engine reloads its weights from (`jaxcredit.sampling.vllm_engine`).

  Args:
    cfg: the model's config.
    params: host arrays keyed by '/'-joined parameter path ('embedding', 'layers/wq', ...), as
      `Decoder.params` flattened; each is written in its own dtype.
    out: the folder; created if missing. Shard files and the index it already holds are replaced.
    max_shard_size: bytes per shard file.
    untie: with tied embeddings, also write `lm_head.weight` (a copy of the embedding), for a folder whose
      config.json says `tie_word_embeddings: false`. vLLM's CPU backend keeps its own packed copy of a tied output
      head, which an in-place weight reload leaves stale; an untied head is reloaded like any other weight.

  Returns:
    {"files": [shard file names], "bytes_written"}.

  Raises:
    ValueError: a parameter missing from `params` or with a shape other than cfg implies (named).
  """
  from jaxcredit.models.decoder import param_shapes

  for param, shape in param_shapes(cfg).items():
    if param not in params:
      raise ValueError(f"save_hf_weights: parameter {param!r} is missing")
    if tuple(np.shape(params[param])) != shape:
      raise ValueError(
        f"save_hf_weights: parameter {param!r} has shape {tuple(np.shape(params[param]))}, expected {shape}"
      )
  slots = {s.hf_name: s for s in hf_slots(cfg)}
  if untie and cfg.tie_word_embeddings:
    slots["lm_head.weight"] = Slot("lm_head.weight", (cfg.vocab_size, cfg.hidden_size), "embedding", (), False)
  dtypes = {name: np.asarray(params[s.param]).dtype for name, s in slots.items()}
  nbytes = {name: math.prod(s.hf_shape) * dtypes[name].itemsize for name, s in slots.items()}
  shards = _shard_plan(list(slots.values()), nbytes, None, max_shard_size)
  out = Path(out)
  out.mkdir(parents=True, exist_ok=True)
  for stale in list(out.glob("*.safetensors")) + list(out.glob("model.safetensors.index.json")):
    if stale.name not in shards:
      stale.unlink()

  def produce(name: str) -> np.ndarray:
    slot = slots[name]
    return slot.to_hf(np.asarray(params[slot.param])[slot.index])

  total = 0
  for file, names in shards.items():
    tmp = out / f".{file}.tmp"
    total += write_safetensors(tmp, [(n, dtypes[n], slots[n].hf_shape) for n in names], produce, {"format": "pt"})
    os.replace(tmp, out / file)
  if len(shards) > 1:
    index = {"metadata": {"total_size": total}, "weight_map": {n: f for f, ns in shards.items() for n in ns}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
  return {"files": list(shards), "bytes_written": total}


def iter_hf_tensors(folder: str | os.PathLike) -> Iterator[tuple[str, np.ndarray]]:
  """(name, array) for every tensor of an HF folder, shard by shard in file order (for tests and tools)."""
  inventory, layout = read_inventory(folder)
  for file in layout["files"]:
    for name in layout["files"][file]["tensors"]:
      yield name, read_tensor(inventory[name])
