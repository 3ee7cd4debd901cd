"""Importing jaxcredit before JAX starts its backends keeps libtpu's start-up error off a machine without TPUs."""

import importlib.util
import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed (no message to hide)")
def test_no_libtpu_error_on_a_machine_without_tpu_chips():
  env = {k: v for k, v in os.environ.items() if k not in ("TPU_WORKER_HOSTNAMES", "JAX_PLATFORMS")}
  code = "import jaxcredit, jax, os; jax.devices(); print(os.environ.get('TPU_WORKER_HOSTNAMES'))"
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
  assert p.returncode == 0, p.stderr[-2000:]
  if p.stdout.strip() != "localhost":
    pytest.skip("this machine has TPU chips (or a Google PCI device): the variable is left to the TPU runtime")
  assert "INVALID_ARGUMENT" not in p.stderr and "Source Location Trace" not in p.stderr, p.stderr[-2000:]
  # Without the import first, the same start-up prints the error (so the check above can fail).
  p = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], capture_output=True, text=True, env=env,
                     timeout=120)
  assert "INVALID_ARGUMENT" in p.stderr
