"""Per-unit table look-ups and sums along the token axis, fast under vmap.

`jax.vmap` turns `table_U[ids_L]` and `zeros(U).at[ids_L].add(x_L)` into gathers and scatters with batch
dimensions, which XLA lowers by materialising an index array that pairs every token with its batch position
(on CPU that index build costs several times the gather or scatter itself). These helpers carry their own
batching rule instead: the batch axes are folded into the unit axis (row b's unit u becomes b * U + u), so a
batch of any depth is one flat, unbatched gather or scatter.

They are for credit weights, which are constants of the loss: inputs are stop-gradient'ed (custom_vmap
functions have no reverse-mode rule).
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


@jax.custom_batching.custom_vmap
def _unit_sums(values_L: Array, unit_L: Array, zeros_U: Array) -> Array:
  return zeros_U.at[unit_L].add(values_L, mode="drop")


@_unit_sums.def_vmap
def _unit_sums_vmap(axis_size, in_batched, values, unit, zeros):
  values, unit, zeros = _batched(axis_size, (values, unit, zeros), in_batched)
  num_units = zeros.shape[-1]
  flat = jnp.where(unit < num_units, unit + _row_offsets(axis_size, num_units, unit.ndim), zeros.size)
  sums = _unit_sums(values.reshape(-1), flat.reshape(-1), zeros.reshape(-1))
  return sums.reshape(zeros.shape), True


def unit_sums(values_L: Array, ids_L: Array, inside_L: Array, num_units: int) -> Array:
  """[U] sums of values_L over the tokens with inside_L and ids_L == u (stop-gradient)."""
  unit_L = jnp.where(inside_L, ids_L, num_units)  # out of range: the scatter drops it
  return _unit_sums(lax.stop_gradient(values_L), unit_L, jnp.zeros((num_units,), values_L.dtype))
