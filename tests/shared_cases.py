"""Access to ../shared/cases/credit_cases.json (or $JAXCREDIT_SHARED/cases/...) for tests."""

import json
import os
from pathlib import Path

import pytest


def shared_dir() -> Path:
  env = os.environ.get("JAXCREDIT_SHARED")
  return Path(env) if env else Path(__file__).resolve().parents[1] / ".." / "shared"


def cases() -> list[dict]:
  path = shared_dir() / "cases" / "credit_cases.json"
  if not path.exists():
    pytest.skip(f"shared cases not found at {path} (set JAXCREDIT_SHARED)")
  with open(path) as f:
    return json.load(f)["cases"]


def case(case_id: str) -> dict:
  for c in cases():
    if c["id"] == case_id:
      return c
  raise KeyError(f"no shared case {case_id!r}")
