"""JAX processes on a CPU machine stay quiet about TPUs.

- The test install puts no libtpu in site-packages (tools/install_libtpu.py puts it in .libtpu), so a bare
  `import jax; jax.devices()` never tries a TPU runtime and prints nothing on stderr.
- Where libtpu is installed after all (the `tpu` extra; here simulated with TPU_LIBRARY_PATH), importing jaxcredit
  before JAX starts its backends keeps libtpu's 9-line start-up error off a machine without TPU chips.
"""

import os
import subprocess
import sys

import pytest

from jaxcredit.train.commands import plan

_TPU_VARS = ("TPU_WORKER_HOSTNAMES", "JAX_PLATFORMS", "TPU_LIBRARY_PATH", "ALLOW_MULTIPLE_LIBTPU_LOAD")


def _clean_env(**extra):
  env = {k: v for k, v in os.environ.items() if k not in _TPU_VARS}
  env.update(extra)
  return env


def test_bare_jax_prints_nothing_after_the_test_install():
  import importlib.util

  assert importlib.util.find_spec("libtpu") is None, (
    "libtpu is installed in site-packages: the `test` extra must not bring it (tools/install_libtpu.py)"
  )
  p = subprocess.run(
    [sys.executable, "-c", "import jax; print(jax.devices()[0].platform)"],
    capture_output=True,
    text=True,
    env=_clean_env(),
    timeout=120,
  )
  assert p.returncode == 0 and p.stdout.strip() == "cpu", p.stderr[-2000:]
  assert p.stderr == "", p.stderr[-2000:]


@pytest.mark.skipif(
  plan.libtpu_library_path() is None,
  reason="no libtpu: run python tools/install_libtpu.py (the README's test command does)",
)
def test_no_libtpu_error_on_a_machine_without_tpu_chips():
  env = _clean_env(TPU_LIBRARY_PATH=plan.libtpu_library_path(), ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  code = "import jaxcredit, jax, os; jax.devices(); print(os.environ.get('TPU_WORKER_HOSTNAMES'))"
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
  assert p.returncode == 0, p.stderr[-2000:]
  if p.stdout.strip() != "localhost":
    pytest.skip("this machine has TPU chips (or a Google PCI device): the variable is left to the TPU runtime")
  assert "INVALID_ARGUMENT" not in p.stderr and "Source Location Trace" not in p.stderr, p.stderr[-2000:]
  # Without the import first, the same start-up prints the error (so the check above can fail).
  p = subprocess.run(
    [sys.executable, "-c", "import jax; jax.devices()"], capture_output=True, text=True, env=env, timeout=120
  )
  assert "INVALID_ARGUMENT" in p.stderr
