"""Every case of shared/cases/credit_cases.json whose `fn` is a jaxcredit.credit function, with its exact values.

The file lives outside the repository: $JAXCREDIT_SHARED/cases/credit_cases.json when that variable is set,
else <repo>/../shared/cases/credit_cases.json.
"""

import json
import os
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxcredit import credit


def _cases_path() -> Path:
  shared = os.environ.get("JAXCREDIT_SHARED")
  root = Path(shared) if shared else Path(__file__).resolve().parents[2] / ".." / "shared"
  return root / "cases" / "credit_cases.json"


def _decode(value):
  """JSON has no NaN/inf: the case file spells them as strings."""
  if isinstance(value, list):
    return [_decode(v) for v in value]
  if isinstance(value, str) and value in ("nan", "inf", "-inf"):
    return float(value)
  return value


def _load_cases():
  path = _cases_path()
  if not path.is_file():
    return [pytest.param(None, marks=pytest.mark.skip(reason=f"case file not found: {path}"), id="missing")]
  cases = json.loads(path.read_text())["cases"]
  mine = [c for c in cases if c.get("fn") in credit.__all__]
  return [pytest.param(c, id=c["id"]) for c in mine]


CASES = _load_cases()


def test_every_credit_library_case_is_collected():
  """A case owned by the credit library whose `fn` is not exported would otherwise be silently dropped."""
  path = _cases_path()
  if not path.is_file():
    pytest.skip(f"case file not found: {path}")
  owned = [c for c in json.loads(path.read_text())["cases"] if "credit library" in c.get("owner", "")]
  assert owned
  assert [c["id"] for c in owned if c["fn"] not in credit.__all__] == []


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_case(case, jit):
  fn = getattr(credit, case["fn"])
  kwargs = case.get("kwargs", {})
  args = {k: np.asarray(_decode(v)) for k, v in case["args"].items()}
  call = jax.jit(fn, static_argnames=tuple(kwargs)) if jit else fn
  got = np.asarray(call(**args, **kwargs))
  tol = case.get("tol", 1e-5)
  assert np.all(np.isfinite(got)), got
  if "expect" in case:
    np.testing.assert_allclose(got, np.asarray(case["expect"], np.float64), rtol=0, atol=tol)
  else:
    np.testing.assert_allclose(got[0], case["expect_first"], rtol=0, atol=tol)
    np.testing.assert_allclose(got[-1], case["expect_last"], rtol=0, atol=tol)
