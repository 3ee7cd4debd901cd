"""The credit and loss cases for tests: tests/data/credit_cases.json (in the repository), plus any case found only in
$JAXCREDIT_SHARED/cases/credit_cases.json or <repo>/../shared/cases/credit_cases.json when that file exists (an
extra source: a clone without it runs every test)."""

import json
import os
from pathlib import Path

REPO_CASES = Path(__file__).resolve().parent / "data" / "credit_cases.json"


def shared_dir() -> Path:
  env = os.environ.get("JAXCREDIT_SHARED")
  return Path(env) if env else Path(__file__).resolve().parents[1] / ".." / "shared"


def cases() -> list[dict]:
  """Every case: the repository's copy first, then cases whose ids only the shared file has."""
  with open(REPO_CASES) as f:
    out = json.load(f)["cases"]
  extra = shared_dir() / "cases" / "credit_cases.json"
  if extra.is_file():
    known = {c["id"] for c in out}
    with open(extra) as f:
      out += [c for c in json.load(f)["cases"] if c["id"] not in known]
  return out


def case(case_id: str) -> dict:
  for c in cases():
    if c["id"] == case_id:
      return c
  raise KeyError(f"no case {case_id!r} in {REPO_CASES}")
