"""Per-unit table look-ups along the token axis, fast under vmap.

`jax.vmap` turns `table_U[ids_L]` into a gather with batch dimensions, which XLA lowers by materialising an index
array that pairs every token with its batch position (on CPU that index build costs several times the gather
itself). `lookup` carries its own batching rule instead: the batch axes are folded into the unit axis (row b's unit
u becomes b * U + u), so a batch of any depth is one flat, unbatched gather.

It is for credit weights, which are constants of the loss: inputs are stop-gradient'ed (custom_vmap functions
have no reverse-mode rule).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


def _batched(axis_size: int, args, in_batched):
  """Broadcasts unbatched arguments so every argument has the batch axis first."""
  return [a if b else jnp.broadcast_to(a, (axis_size,) + a.shape) for a, b in zip(args, in_batched)]


def _row_offsets(axis_size: int, num_units: int, ndim: int) -> Array:
  return (jnp.arange(axis_size, dtype=jnp.int32) * num_units).reshape((axis_size,) + (1,) * (ndim - 1))


@jax.custom_batching.custom_vmap
def _lookup(table_U: Array, unit_L: Array) -> Array:
  return table_U[unit_L]


@_lookup.def_vmap
def _lookup_vmap(axis_size, in_batched, table, unit):
  if not in_batched[0]:
    return _lookup(table, unit), in_batched[1]
  table, unit = _batched(axis_size, (table, unit), in_batched)
  num_units = table.shape[-1]
  return _lookup(table.reshape(-1), unit + _row_offsets(axis_size, num_units, unit.ndim)), True


def lookup(table_U: Array, ids_L: Array) -> Array:
  """table_U[clip(ids_L, 0, U - 1)] (stop-gradient). U must be >= 1."""
  num_units = table_U.shape[-1]
  return _lookup(lax.stop_gradient(table_U), jnp.clip(ids_L, 0, num_units - 1))
