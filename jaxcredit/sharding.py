"""The one place for sharding rules: mesh construction and how batches and parameters are laid out.

Mesh axes: data (pure data parallel), fsdp (data parallel with parameters and optimizer state sharded),
tensor (reserved for tensor parallel; size 1 until the model annotates its logical axes).

Rules (MaxText style, a table the config can change):
  batch  -> ("data", "fsdp")   the leading axis of every batch array
  params -> "fsdp" on the largest parameter axis divisible by the fsdp size (the stacked-layer axis 0 of
            scanned parameters is skipped), replicated otherwise.
"""

from __future__ import annotations

import math
from typing import Mapping

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def make_mesh(shape: Mapping[str, int], devices=None) -> Mesh:
  """Builds a Mesh over `devices` (default: all) with axes MESH_AXES.

  Args:
    shape: sizes per axis name, e.g. {"data": 1, "fsdp": 8, "tensor": 1}. One axis may be -1: it takes
      the devices the others leave.

  Raises:
    ValueError: an unknown axis, more than one -1, or sizes whose product is not the device count.
  """
  unknown = set(shape) - set(MESH_AXES)
  if unknown:
    raise ValueError(f"config.mesh has unknown axes {sorted(unknown)}; known: {MESH_AXES}")
  devices = list(jax.devices() if devices is None else devices)
  sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f"config.mesh: at most one axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
  if -1 in sizes:
    rest = math.prod(s for s in sizes if s != -1)
    if len(devices) % rest:
      raise ValueError(f"config.mesh: {len(devices)} devices are not divisible by {rest}")
    sizes[sizes.index(-1)] = len(devices) // rest
  if any(s < 1 for s in sizes):
    raise ValueError(f"config.mesh sizes must be >= 1 (or one -1), got {dict(zip(MESH_AXES, sizes))}")
  n = math.prod(sizes)
  if n > len(devices):
    raise ValueError(f"config.mesh {dict(zip(MESH_AXES, sizes))} needs {n} devices, {len(devices)} available")
  return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                       devices=devices[:n])


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """Leading axis over the data-parallel axes, the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def param_spec(shape: tuple[int, ...], fsdp: int, *, stacked: bool) -> P:
  """PartitionSpec for one parameter under the fsdp rule above."""
  if fsdp <= 1 or not shape:
    return P()
  first = 1 if stacked and len(shape) > 1 else 0
  candidates = [(shape[i], i) for i in range(first, len(shape)) if shape[i] % fsdp == 0]
  if not candidates:
    return P()
  _, axis = max(candidates)
  spec = [None] * len(shape)
  spec[axis] = "fsdp"
  return P(*spec)


def param_shardings(params, mesh: Mesh, stacked_paths: tuple[str, ...] = ("layers",)):
  """NamedShardings for a parameter pytree (optimizer states follow their parameter's layout)."""
  fsdp = mesh.shape["fsdp"]

  def one(path, x):
    keys = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
    stacked = any(s in keys for s in stacked_paths)
    return NamedSharding(mesh, param_spec(tuple(np.shape(x)), fsdp, stacked=stacked))

  return jax.tree_util.tree_map_with_path(one, params)


def shard_batch(batch, mesh: Mesh):
  """Places every array of a batch pytree with its leading axis over the data-parallel axes.

  Raises:
    ValueError: if a leading axis is not divisible by the data-parallel size.
  """
  dp = mesh.shape["data"] * mesh.shape["fsdp"]

  def put(x):
    x = np.asarray(x)
    if x.ndim == 0:
      return jax.device_put(x, replicated(mesh))
    if x.shape[0] % dp:
      raise ValueError(f"batch axis {x.shape[0]} is not divisible by the data-parallel size {dp} "
                       f"(config.mesh data*fsdp); change the number of rollouts per step")
    return jax.device_put(x, batch_sharding(mesh, x.ndim))

  return jax.tree_util.tree_map(put, batch)
