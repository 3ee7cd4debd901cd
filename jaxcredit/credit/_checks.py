"""Trace-time validation shared by the credit functions.

Shapes are written as comma-separated axis letters with an optional `+k` offset ("G", "G,T+1", "" for a
scalar). The first array that uses a letter binds it; every later use must agree. Errors name the function,
the argument, the expected shape and what was passed, so they fail at trace time, never inside XLA.
Knobs are Python scalars or strings; they are checked eagerly and must not be traced values.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np


def _parse(spec: str) -> list[tuple[str, int]]:
  if not spec:
    return []
  dims = []
  for token in spec.split(","):
    letter, _, offset = token.strip().partition("+")
    dims.append((letter, int(offset) if offset else 0))
  return dims


class Shapes:
  """Binds axis letters to sizes across the array arguments of one call."""

  def __init__(self, fn: str):
    self.fn = fn
    self.sizes: dict[str, int] = {}

  def _check(self, name: str, x: jax.Array, spec: str) -> None:
    dims = _parse(spec)
    if x.ndim != len(dims):
      raise ValueError(
        f"{self.fn}: `{name}` must have rank {len(dims)} with shape [{spec}], got shape {tuple(x.shape)}."
      )
    for axis, ((letter, offset), size) in enumerate(zip(dims, x.shape)):
      if letter in self.sizes:
        want = self.sizes[letter] + offset
        if size != want:
          bound = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
          raise ValueError(
            f"{self.fn}: `{name}` must have shape [{spec}] with {bound}, got shape {tuple(x.shape)} "
            f"(axis {axis} is {size}, expected {want})."
          )
      else:
        if size - offset < 0:
          raise ValueError(
            f"{self.fn}: `{name}` must have shape [{spec}], got shape {tuple(x.shape)} "
            f"(axis {axis} needs at least {offset} entries)."
          )
        if letter == "G" and size - offset == 0:
          raise ValueError(
            f"{self.fn}: `{name}` has an empty group axis (shape {tuple(x.shape)}); a group needs at least one rollout."
          )
        self.sizes[letter] = size - offset

  def float(self, name: str, x: Any, spec: str) -> jax.Array:
    """Checks the shape of a real-valued input and casts it to float32."""
    x = jnp.asarray(x)
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_):
      raise ValueError(f"{self.fn}: `{name}` must be a real array of shape [{spec}], got dtype {x.dtype}.")
    self._check(name, x, spec)
    return x.astype(jnp.float32)

  def mask(self, name: str, x: Any, spec: str) -> jax.Array:
    """Checks the shape of a mask (None means all True) and casts it to bool (nonzero is True)."""
    if x is None:
      dims = _parse(spec)
      missing = [l for l, _ in dims if l not in self.sizes]
      if missing:
        raise ValueError(f"{self.fn}: cannot infer the shape [{spec}] of `{name}`=None.")
      return jnp.ones([self.sizes[l] + o for l, o in dims], jnp.bool_)
    x = jnp.asarray(x)
    self._check(name, x, spec)
    return x if x.dtype == jnp.bool_ else x != 0

  def index(self, name: str, x: Any, spec: str) -> jax.Array:
    """Checks the shape of an integer index array and casts it to int32."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.integer):
      raise ValueError(f"{self.fn}: `{name}` must be an integer (int32) array of shape [{spec}], got dtype {x.dtype}.")
    self._check(name, x, spec)
    return x.astype(jnp.int32)

  def flag(self, name: str, x: Any) -> jax.Array:
    """Checks a bool (or integer) scalar, possibly traced."""
    x = jnp.asarray(x)
    if not (x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.integer)):
      raise ValueError(f"{self.fn}: `{name}` must be a bool scalar (e.g. `reward > threshold`), got dtype {x.dtype}.")
    self._check(name, x, "")
    return x if x.dtype == jnp.bool_ else x != 0


_NO_VALUE = object()


class KnobError(ValueError):
  """A knob outside its function's range: `str(e)` is "<fn>: knob `<knob>` <rule>, got <value>.", and the parts are
  attributes (`fn`, `knob`, `rule`, `value`), so a caller can say it by its own name for the knob (the trainer says
  `config.credit.<method>.<knob> = <value>: <rule>`)."""

  def __init__(self, fn: str, knob: str, rule: str, value: Any = _NO_VALUE):
    self.fn, self.knob, self.rule, self.value = fn, knob, rule, value
    got = "" if value is _NO_VALUE else f", got {value!r}"
    super().__init__(f"{fn}: knob `{knob}` {rule}{got}.")


def _static(fn: str, name: str, value: Any) -> None:
  if isinstance(value, jax.core.Tracer):
    raise KnobError(
      fn,
      name,
      "must be a static Python value, got a traced array; pass it through `static_argnames` or `functools.partial` "
      "when you jit or vmap",
    )


def knob_float(
  fn: str,
  name: str,
  value: Any,
  *,
  gt: float | None = None,
  ge: float | None = None,
  lt: float | None = None,
  le: float | None = None,
  allow_inf: bool = False,
) -> float:
  """Returns `value` as a Python float after checking it is a static, ordered, in-range scalar."""
  _static(fn, name, value)
  if isinstance(value, (str, bytes)) or np.ndim(value) != 0:
    raise KnobError(fn, name, "must be a real scalar", value)
  try:
    v = float(value)
  except (TypeError, ValueError) as e:
    raise KnobError(fn, name, "must be a real scalar", value) from e
  if math.isnan(v) or (math.isinf(v) and not allow_inf):
    raise KnobError(fn, name, "must be finite", v)
  if gt is not None and not v > gt:
    raise KnobError(fn, name, f"must be > {gt}", v)
  if ge is not None and not v >= ge:
    raise KnobError(fn, name, f"must be >= {ge}", v)
  if lt is not None and not v < lt:
    raise KnobError(fn, name, f"must be < {lt}", v)
  if le is not None and not v <= le:
    raise KnobError(fn, name, f"must be <= {le}", v)
  return v


def knob_choice(fn: str, name: str, value: Any, choices: Iterable[str]) -> str:
  _static(fn, name, value)
  choices = tuple(choices)
  if not isinstance(value, str) or value not in choices:
    raise KnobError(fn, name, f"must be one of {choices}", value)
  return value


def knob_bool(fn: str, name: str, value: Any) -> bool:
  _static(fn, name, value)
  if not isinstance(value, (bool, np.bool_)):
    raise KnobError(fn, name, "must be a Python bool", value)
  return bool(value)


def knob_int(fn: str, name: str, value: Any, *, ge: int | None = None) -> int:
  """Returns `value` as a Python int after checking it is a static integer (not a bool) in range."""
  _static(fn, name, value)
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    raise KnobError(fn, name, "must be a Python int", value)
  if ge is not None and value < ge:
    raise KnobError(fn, name, f"must be >= {ge}", value)
  return int(value)
