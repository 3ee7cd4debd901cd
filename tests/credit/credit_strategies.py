"""Hypothesis strategies shared by the credit tests.

Shapes come from a few fixed sizes and knobs from a few fixed values, so each jitted function compiles only a
handful of times per test run. Values come from grids of exactly representable numbers where the tested
formula has a threshold, so "away from thresholds" holds by construction and the float32 loop reference and
the jitted code agree to rounding.
"""

import numpy as np
from hypothesis import strategies as st

GROUP_SIZES = (1, 3, 8)
TOKEN_LENGTHS = (1, 16, 40)
REWARD_GRID = (-2.0, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 3.0)
NONFINITE = (float("nan"), float("inf"), float("-inf"))


def arrays(draw, shape, elements):
  """A float32 array of `shape` whose entries are drawn from `elements` (a strategy)."""
  size = int(np.prod(shape))
  return np.asarray(draw(st.lists(elements, min_size=size, max_size=size)), np.float32).reshape(shape)


def bools(draw, shape, p_true=None):
  size = int(np.prod(shape))
  element = st.booleans() if p_true is None else st.sampled_from([True] * p_true + [False])
  return np.asarray(draw(st.lists(element, min_size=size, max_size=size)), bool).reshape(shape)


def grid_or_nonfinite(grid, p_nonfinite=8):
  """Mostly grid values, sometimes NaN/inf (about one draw in `p_nonfinite`)."""
  return st.one_of(*([st.sampled_from(grid)] * (p_nonfinite - 1)), st.sampled_from(NONFINITE))


def logp_grid():
  """Log-probabilities on a 1/16 grid in [-12, 0] (exact in float32)."""
  return st.integers(-192, 0).map(lambda k: k / 16.0)
