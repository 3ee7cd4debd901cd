"""Scale-invariant float32 statistics shared by the credit functions (group means, stds, RMS).

A float32 square overflows above about 1.8e19 and underflows below about 1e-19, so a std or an RMS taken of
raw values is wrong (inf, hence advantages of 0, or 0, hence a division by eps alone) long before the values
themselves leave float32's range. Every statistic here is taken of the values divided by a power of two 2^k
near their largest magnitude, so the scaled values lie in (-1, 1) and nothing overflows or underflows:

    x_s = x · 2^(-k),   k = the exponent of max_valid |x| (frexp: max |x| = f · 2^k, f in [0.5, 1))
    mean(x) = 2^k mean(x_s),   std(x) = 2^k std(x_s),   (x − μ) / (σ + eps) = (x_s − μ_s) / (σ_s + eps · 2^(-k))

Multiplying by a power of two is exact in binary floating point (away from overflow and subnormals), so each
float32 operation on the scaled values rounds exactly as it did on the raw values: for ordinary inputs the
results are bit-identical to the unscaled formulas, and c · x gives the same result as x for c = 2^j.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


def _pow2(e: Array) -> Array:
  """2^e as float32, exactly, for int32 e in [-126, 127] (built from its exponent bits, not by pow)."""
  return lax.bitcast_convert_type((e.astype(jnp.int32) + 127) << 23, jnp.float32)


def ldexp(x: Array, e: Array) -> Array:
  """x · 2^e for int32 e in [-252, 254], exact unless the result overflows or is subnormal.

  Two factors, each a normal float32, so 2^e itself never overflows (`jnp.ldexp` computes 2^e with pow).
  """
  a = jnp.floor_divide(e, 2)
  return x * _pow2(a) * _pow2(e - a)


def scale_exponent(x: Array, valid: Array, axis: int | None = None) -> Array:
  """k (int32, reduced over `axis` with keepdims) with |x| < 2^k for every valid finite entry; 0 if none is nonzero.

  In [-149, 128] for float32: `ldexp(x, -k)` and `ldexp(y, k)` stay in `ldexp`'s range.
  """
  biggest = jnp.max(jnp.where(valid & jnp.isfinite(x), jnp.abs(x), 0.0), axis=axis, keepdims=True)
  return jnp.frexp(biggest)[1].astype(jnp.int32)


def scaled(x: Array, valid: Array, axis: int | None = None) -> tuple[Array, Array]:
  """(x · 2^(-k), k) with k = `scale_exponent(x, valid, axis)`: the valid entries scaled into (-1, 1).

  Entries that are not valid (or not finite) are left to the caller to mask.
  """
  k = scale_exponent(x, valid, axis)
  return ldexp(x, -k), k
