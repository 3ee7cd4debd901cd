"""Reads a llama.cpp GGUF file into a `ModelConfig` and the parameter tree of `Decoder`.

Tensors are dequantised with NumPy by the `gguf` package (F32, F16, BF16, Q8_0, Q4_0, Q4_1, K-quants...), so
the weights are exactly what llama.cpp would compute with, in float32.

Layout notes:
- GGUF's NumPy shapes are the reverse of the ggml shape that llama.cpp prints: `attn_q.weight` printed as
  [D, H·Dh] reads as a NumPy [H·Dh, D] array, i.e. the Hugging Face nn.Linear layout [out, in].
- llama.cpp's converter permutes the rows of a Llama model's attn_q / attn_k so that its own RoPE can rotate
  interleaved pairs; `unpermute_rope_rows` undoes that to get back the Hugging Face (rotate_half) layout. Qwen3
  files are not permuted (llama.cpp runs Qwen3 with the "neox" RoPE, which is the Hugging Face one).
- The architectures read, their tensor names, whether their q/k rows are permuted and whether they carry
  `rope_freqs.weight` are the `gguf` field of their row of `jaxcredit.models.families.FAMILIES` (`GGUFSpec`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from jaxcredit.models.config import ModelConfig
from jaxcredit.models.families import FamilySpec, gguf_families
from jaxcredit.models.tensor_map import param_slots


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Inverse of llama.cpp convert_hf_to_gguf's `permute` for q/k projection rows.

  llama.cpp writes w.reshape(n_heads, 2, Dh/2, D).swapaxes(1, 2): within each head the rows of the two
  RoPE halves are interleaved. This maps them back: rows [h, i, j] -> [h, j, i] for i < Dh/2, j < 2.

  Args:
    w: [n_heads · Dh, D] rows as stored in the GGUF (NumPy layout).
    n_heads: H for attn_q, K for attn_k.

  Returns:
    [n_heads · Dh, D] in the Hugging Face layout.
  """
  rows = w.shape[0]
  assert rows % (2 * n_heads) == 0, (w.shape, n_heads)
  return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """llama.cpp's `permute` (Hugging Face layout -> GGUF layout); the inverse of `unpermute_rope_rows`."""
  rows = w.shape[0]
  assert rows % (2 * n_heads) == 0, (w.shape, n_heads)
  return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key: str, default: Any = None) -> Any:
  field = reader.fields.get(key)
  if field is None:
    return default
  return field.contents()


def gguf_metadata(path) -> dict[str, Any]:
  """Every metadata key of a GGUF file (path or GGUFReader) with its value (arrays as lists)."""
  reader = open_gguf(path)
  return {key: field.contents() for key, field in reader.fields.items()}


# `<arch>.*` keys that are sizes (positive integers).
_SIZE_KEYS = (
  "embedding_length",
  "attention.head_count",
  "attention.head_count_kv",
  "attention.key_length",
  "attention.value_length",
  "rope.dimension_count",
  "vocab_size",
  "feed_forward_length",
  "block_count",
)

# `<arch>.*` keys the loader reads, or that do not change the model's function (context_length: the trained length;
# rope.scaling.finetuned: a flag). Any other `<arch>.*` key is refused by name rather than silently dropped.
_KNOWN_ARCH_KEYS = frozenset(
  {
    *_SIZE_KEYS,
    "rope.freq_base",
    "attention.layer_norm_rms_epsilon",
    "context_length",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scale_linear",
    "rope.scaling.original_context_length",
    "rope.scaling.finetuned",
  }
)


def _rope_scaling(meta: dict[str, Any], arch: str) -> dict[str, Any]:
  """The RoPE scaling the metadata declares, as a ModelConfig.rope_scaling dict ({} for none).

  `<arch>.rope.scaling.type` "linear" with `<arch>.rope.scaling.factor`, or the older `<arch>.rope.scale_linear`,
  give linear scaling (positions divided by the factor, as transformers' "linear"); "none", or a factor of 1,
  gives none. Other types are refused by name."""
  kind = meta.get(f"{arch}.rope.scaling.type")
  kind = kind.decode() if isinstance(kind, bytes) else kind
  factor = meta.get(f"{arch}.rope.scaling.factor", meta.get(f"{arch}.rope.scale_linear"))
  if kind is None and f"{arch}.rope.scale_linear" in meta:
    kind = "linear"
  if kind in (None, "none") or (factor is not None and float(factor) == 1.0):
    return {}
  if kind != "linear":
    raise ValueError(
      f"GGUF metadata {arch}.rope.scaling.type={kind!r} is not supported (only 'linear' and "
      f"'none'); refusing rather than loading the model without its RoPE scaling"
    )
  if factor is None or not float(factor) > 0:
    raise ValueError(
      f"GGUF metadata {arch}.rope.scaling.type='linear' needs a positive {arch}.rope.scaling.factor, got {factor!r}"
    )
  return {"rope_type": "linear", "factor": float(factor)}


def _rope_freq_factors(rope_freqs: np.ndarray, head_dim: int, rope_scaling: dict[str, Any]) -> dict[str, Any]:
  """rope_scaling {"rope_type": "freq_factors", ...} from a `rope_freqs.weight` tensor, with a declared linear
  factor folded in (llama.cpp divides each frequency by both)."""
  factors = np.asarray(rope_freqs, np.float64).reshape(-1)
  if np.shape(rope_freqs) != (head_dim // 2,) or not np.all(np.isfinite(factors) & (factors > 0)):
    raise ValueError(
      f"GGUF tensor 'rope_freqs.weight' must hold head_dim/2 = {head_dim // 2} positive finite RoPE frequency "
      f"divisors, got shape {tuple(np.shape(rope_freqs))} with min {factors.min() if factors.size else None}"
    )
  factors = factors * float(rope_scaling.get("factor", 1.0))
  if np.all(factors == 1.0):
    return {}
  return {"rope_type": "freq_factors", "freq_factors": tuple(float(np.float32(f)) for f in factors)}


def config_from_metadata(
  meta: dict[str, Any], has_output: bool, dtype: str = "float32", rope_freqs: np.ndarray | None = None
) -> ModelConfig:
  """Maps `<arch>.*` metadata to a ModelConfig.

  head_dim is `<arch>.attention.key_length`, else D / H (as llama.cpp reads it). The vocabulary is
  `<arch>.vocab_size`, else the length of `tokenizer.ggml.tokens`. Linear RoPE scaling is read from
  `<arch>.rope.scaling.*` (see `_rope_scaling`). `rope_freqs` is the file's `rope_freqs.weight` tensor [Dh/2]
  (llama only): per-frequency divisors of the RoPE frequencies, which is how llama.cpp's converter stores a
  llama3 rope scaling; they become rope_scaling {"rope_type": "freq_factors"} (times a linear factor, as
  llama.cpp applies both).

  Raises:
    ValueError: for an architecture no row of `FAMILIES` reads (llama, qwen3), a missing required key (named), an `<arch>.*` key
      the loader does not understand (named: it could change the model, e.g. a sliding window or experts), a
      per-layer array where one number is needed (named), a size that is not a positive integer or a
      freq_base / layer_norm_rms_epsilon that is not a positive finite number (named), a RoPE scaling other than linear, a partial rotary
      dimension or value length that differs from head_dim, or a rope_freqs.weight of another shape than
      [head_dim/2] or with values that are not positive and finite.
  """
  arch = meta.get("general.architecture")
  family = _family(arch)
  unknown = sorted(k for k in meta if k.startswith(f"{arch}.") and k[len(arch) + 1 :] not in _KNOWN_ARCH_KEYS)
  if unknown:
    raise ValueError(
      f"GGUF metadata key {unknown[0]!r} is not understood by this loader and may change the "
      f"model; refusing rather than dropping it (all unknown keys: {unknown})"
    )

  for key in sorted(meta):
    # llama.cpp allows per-layer arrays for some keys (head_count_kv, feed_forward_length): a stack scanned over
    # one parameter shape cannot hold layers of different widths, and int() of a list would fail far from here.
    if key.startswith(f"{arch}.") and isinstance(meta[key], (list, tuple)):
      values = set(meta[key])
      if len(values) != 1:
        raise ValueError(f"GGUF metadata {key}={meta[key]!r} differs between layers; only one value is supported")
      meta = {**meta, key: values.pop()}

  for key in _SIZE_KEYS:
    value = meta.get(f"{arch}.{key}")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0):
      raise ValueError(f"GGUF metadata {arch}.{key} must be a positive integer, got {value!r}")
  for key in ("rope.freq_base", "attention.layer_norm_rms_epsilon"):
    value = meta.get(f"{arch}.{key}")
    if value is not None and (
      isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not 0 < value < float("inf")
    ):
      raise ValueError(f"GGUF metadata {arch}.{key} must be a positive finite number, got {value!r}")

  def need(key):
    full = f"{arch}.{key}"
    if full not in meta:
      raise ValueError(f"GGUF metadata lacks {full!r}")
    return meta[full]

  hidden = int(need("embedding_length"))
  heads = int(need("attention.head_count"))
  # As llama.cpp: the head width is key_length, else D / H; rope.dimension_count is the rotated part of it (a
  # smaller one, partial rotary, is refused below rather than taken for the head width).
  head_dim = meta.get(f"{arch}.attention.key_length")
  if head_dim is None:
    head_dim = hidden // heads
  for key in ("rope.dimension_count", "attention.value_length"):
    if f"{arch}.{key}" in meta and int(meta[f"{arch}.{key}"]) != int(head_dim):
      raise ValueError(
        f"GGUF metadata {arch}.{key}={int(meta[f'{arch}.{key}'])} differs from the head "
        f"dimension {int(head_dim)}; partial rotary / unequal value heads are not supported"
      )
  vocab = meta.get(f"{arch}.vocab_size")
  if vocab is None:
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None:
      raise ValueError(f"GGUF metadata lacks both {arch}.vocab_size and tokenizer.ggml.tokens")
    vocab = len(tokens)
  rope_scaling = _rope_scaling(meta, arch)
  if rope_freqs is not None:
    rope_scaling = _rope_freq_factors(rope_freqs, int(head_dim), rope_scaling)
  return ModelConfig(
    vocab_size=int(vocab),
    hidden_size=hidden,
    intermediate_size=int(need("feed_forward_length")),
    num_layers=int(need("block_count")),
    num_heads=heads,
    num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
    head_dim=int(head_dim),
    rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
    rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
    tie_word_embeddings=not has_output,
    qk_norm=family.qk_norm,
    rope_scaling=rope_scaling,
    dtype=dtype,
  )


def _family(arch) -> FamilySpec:
  """The row of `FAMILIES` whose `gguf.arch` is arch.

  Raises:
    ValueError: for an architecture no row reads (listing those that are).
  """
  families = gguf_families()
  if not isinstance(arch, str) or arch not in families:
    raise ValueError(f"unsupported GGUF general.architecture {arch!r}; supported: {sorted(families)}")
  return families[arch]


def open_gguf(path):
  """A `gguf.GGUFReader` for path (returned as is when path already is one).

  Raises:
    FileNotFoundError: when path does not exist.
  """
  from gguf import GGUFReader

  if isinstance(path, GGUFReader):
    return path
  if not os.path.isfile(os.fspath(path)):
    raise FileNotFoundError(f"no GGUF file at {os.fspath(path)}")
  return GGUFReader(os.fspath(path))


def load_gguf(path) -> tuple[ModelConfig, dict[str, Any]]:
  """Reads a GGUF file's config and dequantised float32 weights.

  Args:
    path: a llama.cpp GGUF file of a llama (e.g. SmolLM2) or qwen3 model, or a `gguf.GGUFReader` of one
      (parsing the metadata takes seconds; share one reader with `ChatTokenizer.from_gguf`).

  Returns:
    (cfg, params): params is a nested dict of float32 NumPy arrays in the layout of
    `nnx.state(Decoder(cfg), nnx.Param)`: embedding [V, D], layers/{attn_norm [N, D], wq [N, D, H, Dh],
    wk/wv [N, D, K, Dh], wo [N, H, Dh, D], q_norm/k_norm [N, Dh] (qwen3), mlp_norm [N, D], w_gate/w_up
    [N, D, F], w_down [N, F, D]}, final_norm [D], and lm_head [D, V] when the file has `output.weight`.

  Raises:
    FileNotFoundError: when path does not exist.
    ValueError: for an unsupported architecture, a missing or mis-shaped tensor (naming the tensor, the
      expected and the actual NumPy shape), a tensor the loader does not read (named), or metadata
      `config_from_metadata` refuses.
  """
  from gguf.quants import dequantize

  reader = open_gguf(path)
  tensors = {t.name: t for t in reader.tensors}
  arch = _field(reader, "general.architecture")
  gguf = _family(arch).gguf
  meta = {
    key: _field(reader, key) for key in reader.fields if key.startswith(f"{arch}.") or key in ("general.architecture",)
  }
  if f"{arch}.vocab_size" not in meta:
    meta["tokenizer.ggml.tokens"] = _field(reader, "tokenizer.ggml.tokens")
  # llama.cpp reads rope_freqs.weight for llama (Llama 3.x's llama3 scaling; `GGUFSpec.rope_freqs`); qwen3 has no
  # such tensor, and llama.cpp refuses a file with tensors it does not read, so it is refused below like any other
  # extra tensor.
  rope_freqs = None
  if gguf.rope_freqs and "rope_freqs.weight" in tensors:
    rope_freqs = dequantize(tensors["rope_freqs.weight"].data, tensors["rope_freqs.weight"].tensor_type)
  cfg = config_from_metadata(meta, has_output=gguf.tensors["lm_head"] in tensors, rope_freqs=rope_freqs)
  used = {"rope_freqs.weight"} if rope_freqs is not None else set()
  n, d, f, v = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
  h, k, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

  def read(name: str, shape: tuple[int, ...]) -> np.ndarray:
    used.add(name)
    tensor = tensors.get(name)
    if tensor is None:
      raise ValueError(f"GGUF tensor {name!r} is missing (expected shape {shape})")
    array = dequantize(tensor.data, tensor.tensor_type)
    if tuple(array.shape) != shape:
      raise ValueError(f"GGUF tensor {name!r} has shape {tuple(array.shape)}, expected {shape}")
    return np.asarray(array, np.float32)

  # GGUF tensors are in the Hugging Face layout ([out, in]) under the family's GGUF names: the HF map's slots
  # (`param_slots`) place them, after the q/k rows of a permuted family are put back in the HF order.
  heads = {"layers/wq": h, "layers/wk": k}
  slice_shapes = {
    "embedding": (v, d),
    "layers/attn_norm": (d,),
    "layers/wq": (d, h, dh),
    "layers/wk": (d, k, dh),
    "layers/wv": (d, k, dh),
    "layers/wo": (h, dh, d),
    "layers/q_norm": (dh,),
    "layers/k_norm": (dh,),
    "layers/mlp_norm": (d,),
    "layers/w_gate": (d, f),
    "layers/w_up": (d, f),
    "layers/w_down": (f, d),
    "final_norm": (d,),
    "lm_head": (d, v),
  }
  top: dict[str, np.ndarray] = {}
  layers: dict[str, np.ndarray] = {}
  for slot in param_slots(cfg, gguf.tensors):
    array = read(slot.hf_name, slot.hf_shape)
    if gguf.permuted_qk and slot.param in heads:
      array = unpermute_rope_rows(array, heads[slot.param])
    ours = slot.to_ours(array, slice_shapes[slot.param])
    if slot.index:
      name = slot.param.removeprefix("layers/")
      if name not in layers:
        layers[name] = np.empty((n, *ours.shape), np.float32)
      layers[name][slot.index] = ours
    else:
      top[slot.param] = np.ascontiguousarray(ours)
  params: dict[str, Any] = {"embedding": top.pop("embedding"), "layers": layers, **top}
  # A tensor nobody read could change the model (biases, per-layer rope factors, experts, extra layers):
  # refuse it by name rather than run without it.
  unread = sorted(set(tensors) - used)
  if unread:
    raise ValueError(
      f"GGUF tensor {unread[0]!r} is not read by this loader (a {n}-layer {arch} model) and may change the "
      f"model; refusing rather than dropping it (all unread tensors: {unread[:8]}"
      f"{f' and {len(unread) - 8} more' if len(unread) > 8 else ''})"
    )
  return cfg, params
