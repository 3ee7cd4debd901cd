"""Shared pytest configuration.

Hypothesis profiles: `default` (about 50 examples per property, for local runs) and `ci` (300 examples, for
.ci/run). Choose one with the environment variable HYPOTHESIS_PROFILE (default: `default`).
"""

import os

# libtpu (in the test extra, for deviceless TPU compiles) makes JAX try a TPU first; tests run on the CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_collection_modifyitems(config, items):
  """Tests marked `slow` (minutes of a real model on long prompts) run when JAXCREDIT_RUN_SLOW=1, as .ci/run sets
  it; `pytest -m slow` selects them alone."""
  if os.environ.get("JAXCREDIT_RUN_SLOW") == "1" or "slow" in (config.getoption("-m") or ""):
    return
  skip = pytest.mark.skip(reason="slow: set JAXCREDIT_RUN_SLOW=1 (CI does) or run pytest -m slow")
  for item in items:
    if "slow" in item.keywords:
      item.add_marker(skip)
