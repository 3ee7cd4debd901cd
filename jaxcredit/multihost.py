"""Multi-process (multi-host) training helpers: which share of the work is this process's, and how results made on
one process reach all of them.

On a TPU pod every host runs the same program (`jax.distributed.initialize`, then `jaxcredit train`). The trainer
splits each RL step's prompt groups over the processes: each samples its share on its own devices with its own copy
of the policy (`local_copy`), then every process receives every rollout (`allgather_objects`), so the scoring
passes, the credit functions and the sharded update run on identical global inputs, as on one host. With one
process every function here is the identity (or nearly): single-host runs are unchanged.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxcredit import sharding


def process_count() -> int:
  return jax.process_count()


def is_primary() -> bool:
  """True on the process that writes the workdir's shared files (metrics, config.json, exports): process 0."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier `name` (no-op with one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def share(n: int, *, what: str, unit: str = "items") -> slice:
  """This process's contiguous share of `n` items split evenly over the processes.

  Raises:
    ValueError: `n` is not divisible by the process count (`what` names the config field, e.g.
      "config.rollout.prompts_per_step=6").
  """
  p, i = jax.process_count(), jax.process_index()
  if n % p:
    raise ValueError(f"{what}: {n} {unit} can't be split evenly over {p} processes; use a multiple of {p}")
  k = n // p
  return slice(i * k, (i + 1) * k)


def uneven_share(n: int) -> slice:
  """This process's contiguous share of `n` items, the first `n % P` processes taking one more (for work, like the
  held-out evals, whose results are gathered whatever their count)."""
  p, i = jax.process_count(), jax.process_index()
  k, r = divmod(n, p)
  start = i * k + min(i, r)
  return slice(start, start + k + (1 if i < r else 0))


def allgather_objects(obj: Any) -> list:
  """Every process's `obj` (any picklable value), in process order; [obj] with one process.

  Collective: every process must call it, in the same order. The values travel as pickled bytes through
  `multihost_utils.process_allgather` (two all-gathers: the lengths, then the bytes padded to the longest).
  """
  if jax.process_count() == 1:
    return [obj]
  data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
  lengths = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int64))).reshape(-1)
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[: data.size] = data
  gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(lengths), -1)
  return [pickle.loads(gathered[k, : int(n)].tobytes()) for k, n in enumerate(lengths)]


def to_host(x) -> np.ndarray:
  """A jax.Array's global value as numpy, also when it spans other processes' devices (then all-gathered:
  collective, every process must call it)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


def local_mesh_shape(mesh_shape: Mapping[str, int], num_processes: int) -> dict[str, int]:
  """The mesh shape each process samples on: `mesh_shape` divided by the process count, taken from the axes in
  order (data first, then fsdp, expert, tensor), so model-parallel axes stay whole as long as possible.

  Raises:
    ValueError: the axes can't be divided by the process count (names the mesh and the count).
  """
  shape = {k: int(v) for k, v in mesh_shape.items()}
  left = num_processes
  for axis in sharding.MESH_AXES:
    size = shape.get(axis, 1)
    g = math.gcd(size, left)
    shape[axis] = size // g
    left //= g
  if left != 1:
    raise ValueError(
      f"config.mesh {dict(mesh_shape)} can't be split over {num_processes} processes (each samples on its own "
      f"devices); use axis sizes whose product is a multiple of {num_processes}"
    )
  return shape


def local_copy(tree, local_mesh):
  """A copy of `tree` (jax.Arrays on a mesh over every process's devices) on `local_mesh` (this process's devices,
  the same axis names), each leaf with its own PartitionSpec: the sampler's own copy of a model. The identity with
  one process.

  One leaf at a time: all-gathered over the global mesh (replicated), then its copy on one local device placed on
  the local mesh; the replica is dropped before the next leaf, so at most one leaf is held whole per device.
  Collective: every process must call it, in the same order.
  """
  if jax.process_count() == 1:
    return tree

  def one(x):
    spec = x.sharding.spec if isinstance(x.sharding, jax.sharding.NamedSharding) else jax.sharding.PartitionSpec()
    target = jax.sharding.NamedSharding(local_mesh, spec)
    if x.is_fully_addressable:
      return jax.device_put(x, target)
    whole = jax.jit(lambda a: a, out_shardings=sharding.replicated(x.sharding.mesh))(x)
    out = jax.device_put(whole.addressable_shards[0].data, target)
    del whole
    return out

  return jax.tree.map(one, tree)


def mean_of(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
  """The per-key mean of the processes' metric dicts (keys missing on a process are averaged over the others)."""
  keys = sorted({k for r in rows for k in r})
  return {k: float(np.mean([r[k] for r in rows if k in r])) for k in keys}
