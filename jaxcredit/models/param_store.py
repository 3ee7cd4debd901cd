"""Parameters streamed into and out of an orbax checkpoint slice by slice, and the peak-memory meter that the
streaming's budget is measured with.

`ParamsWriter` writes each slice with TensorStore straight into the zarr arrays of an OCDBT orbax checkpoint (the
specs come from `orbax.checkpoint.type_handlers.get_json_tspec_write`; the chunks never span two layers or two
experts, so every write covers whole chunks). Data not yet committed is capped at `_WRITE_BUDGET_BYTES` (the next
tensor is read only once it fits) and OCDBT data files to `_DATA_FILE_BYTES`, so resident memory stays near twice the
largest tensor whatever the model size (see docs/benchmarks.md). The tree metadata (`_METADATA`,
`_CHECKPOINT_METADATA`) is written by orbax itself, from a save of a same-structured tree of one-element arrays, so
`orbax.checkpoint.StandardCheckpointer.restore` reads the result like any checkpoint it wrote, with shardings.
`open_params` opens the arrays of such a checkpoint for reading slice by slice.
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from jaxcredit import trees

# Bytes of tensor data handed to TensorStore and not yet committed, before the next read waits for the oldest.
_WRITE_BUDGET_BYTES = 32 << 20
# Zarr chunks are at most this large (smaller when one layer's or expert's slice is smaller), so that a sharded
# restore reads little beyond its own shard; OCDBT data files at most this large. Small files let OCDBT write a
# large tensor out piece by piece instead of assembling one data file for it (measured on a 128 MiB tensor: peak
# 1.6-2.1x the tensor with 8 MiB chunks and 16 MiB files, 2.9x with 64 MiB chunks and orbax's 2 GiB files).
_CHUNK_BYTES = 8 << 20
_DATA_FILE_BYTES = 16 << 20


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
