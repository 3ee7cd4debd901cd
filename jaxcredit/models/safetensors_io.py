"""safetensors files read and written without safetensors or torch: the header, one tensor's bytes, a whole HF
folder's inventory (single file or index with shards), and a writer that streams tensors into a file.

Each tensor is read on its own: a seek and a read of its bytes into a NumPy array, bfloat16 and float8 through
ml_dtypes. `safetensors.safe_open` memory-maps the shard, so every page it touches counts as resident, and its NumPy
backend reads BF16 only once ml_dtypes happens to be imported.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import ml_dtypes
import numpy as np

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


def iter_hf_tensors(folder: str | os.PathLike) -> Iterator[tuple[str, np.ndarray]]:
  """(name, array) for every tensor of an HF folder, shard by shard in file order (for tests and tools)."""
  inventory, layout = read_inventory(folder)
  for file in layout["files"]:
    for name in layout["files"][file]["tensors"]:
      yield name, read_tensor(inventory[name])
