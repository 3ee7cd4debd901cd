"""Hugging Face safetensors checkpoints (Llama, Qwen3, Qwen3-MoE) to converted checkpoints and back, streamed.

    stats = convert_hf("Qwen3-0.6B/", "converted/qwen3-0.6b")    # or: jaxcredit convert --hf DIR --out DIR
    model, cfg = jaxcredit.models.load("converted/qwen3-0.6b", mesh=mesh)
    export_hf("converted/qwen3-0.6b", "exported/")                # or: jaxcredit export --checkpoint DIR --out DIR

Conversion never holds the model. The safetensors headers of every shard are read first and checked against
config.json (every tensor present, of the shape the config implies, nothing else), so a refusal comes before
anything is written. Then each tensor is read on its own, transposed/reshaped to our layout, and written into its
slice of the stacked [N, ...] parameter of an orbax checkpoint, with a budget on the data not yet committed, so
resident memory stays near twice the largest tensor whatever the model size (see docs/benchmarks.md).

This module holds the conversions (`convert_hf`, `convert_gguf`) and the exports (`export_hf`, `save_hf_weights`).
Their parts live beside it, and their names are still importable from here: `safetensors_io` (reading and writing
safetensors files), `hf_config` (config.json <-> ModelConfig and its refusals), `tensor_map` (HF tensor names <->
parameter slices, the layout table, the checks before a conversion) and `param_store` (the streaming orbax
writer and reader, and the peak-memory meter).

A converted folder holds model_config.json, params/, source.json, tokenizer/ (when the source has tokenizer
files) and hf/ (the source config.json and generation_config.json, and shards.json: the source's shard files,
their tensors in file order and their `__metadata__`), which `export_hf` uses to write the same files back.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from jaxcredit import trees
from jaxcredit.models.config import ModelConfig
from jaxcredit.models.families import FAMILIES, family_of_config
from jaxcredit.models.hf_config import config_from_hf, hf_config_from_model_config
from jaxcredit.models.param_store import ParamsWriter, PeakMemory, open_params
from jaxcredit.models.safetensors_io import TensorInfo, read_inventory, read_tensor, write_safetensors
from jaxcredit.models.tensor_map import _PARAM_DTYPES, Slot, param_slots, plan_conversion

# Names this module held before issue 33 split it, still importable from here (`X as X`: an intended re-export).
from jaxcredit.models.hf_config import _HF_MOE_SIZES as _HF_MOE_SIZES
from jaxcredit.models.hf_config import _HF_SIZES as _HF_SIZES
from jaxcredit.models.hf_config import SUPPORTED_MODEL_TYPES as SUPPORTED_MODEL_TYPES
from jaxcredit.models.hf_config import llama3_from_freq_factors as llama3_from_freq_factors
from jaxcredit.models.param_store import _CHUNK_BYTES as _CHUNK_BYTES
from jaxcredit.models.param_store import _DATA_FILE_BYTES as _DATA_FILE_BYTES
from jaxcredit.models.param_store import _WRITE_BUDGET_BYTES as _WRITE_BUDGET_BYTES
from jaxcredit.models.param_store import _orbax_name as _orbax_name
from jaxcredit.models.param_store import _status_kib as _status_kib
from jaxcredit.models.param_store import _unit_ndim as _unit_ndim
from jaxcredit.models.safetensors_io import _ST_CODES as _ST_CODES
from jaxcredit.models.safetensors_io import _ST_DTYPES as _ST_DTYPES
from jaxcredit.models.safetensors_io import iter_hf_tensors as iter_hf_tensors
from jaxcredit.models.safetensors_io import read_safetensors_header as read_safetensors_header
from jaxcredit.models.tensor_map import _SKIPPED as _SKIPPED
from jaxcredit.models.tensor_map import _first as _first
from jaxcredit.models.tensor_map import _fused_expert_slots as _fused_expert_slots
from jaxcredit.models.tensor_map import hf_slots as hf_slots

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
  plan = plan_conversion(cfg, inventory, where=str(folder), model_type=hf["model_type"])
  embedding = FAMILIES[hf["model_type"]].hf_tensors["embedding"]
  dtype = canonical_dtype(dtype) or _PARAM_DTYPES[inventory[embedding].dtype]
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
  # The source's family names the tensors (a row that shares the features of an earlier one keeps its own names).
  names = FAMILIES[family_of_config(cfg, hf["model_type"])].hf_tensors
  slots = {s.hf_name: s for s in param_slots(cfg, names)}
  untie = untie_embeddings and cfg.tie_word_embeddings
  if untie:
    slots[names["lm_head"]] = Slot(names["lm_head"], (cfg.vocab_size, cfg.hidden_size), "embedding", (), False)
  dtypes = {name: stores[s.param].dtype.numpy_dtype for name, s in slots.items()}
  nbytes = {name: math.prod(s.hf_shape) * dtypes[name].itemsize for name, s in slots.items()}
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
  names = FAMILIES[family_of_config(cfg)].hf_tensors
  slots = {s.hf_name: s for s in param_slots(cfg, names)}
  if untie and cfg.tie_word_embeddings:
    slots[names["lm_head"]] = Slot(names["lm_head"], (cfg.vocab_size, cfg.hidden_size), "embedding", (), False)
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
