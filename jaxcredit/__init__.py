"""jaxcredit: dense credit assignment for multi-turn tool-use LLM agents in JAX."""

import os as _os

__version__ = "0.1.0"


def _quiet_libtpu_without_tpu() -> None:
  """On a machine without TPU chips, give libtpu (installed by the `tpu` and `test` extras) a worker host name, so
  that starting JAX's backends does not print a 9-line INVALID_ARGUMENT error from libtpu's start-up. On a TPU VM
  (chips present) and where TPU_WORKER_HOSTNAMES is already set, nothing changes. Takes effect when jaxcredit is
  imported before JAX first initialises its backends (the CLI always does)."""
  if "TPU_WORKER_HOSTNAMES" in _os.environ:
    return
  import glob

  # Google's PCI vendor id (what jax's own TPU detection reads), or the TPU device files. jax itself is not
  # imported here: it reads JAX_PLATFORMS when imported, and the CLI sets that after importing jaxcredit.
  vendors = []
  for path in glob.glob("/sys/bus/pci/devices/*/vendor"):
    try:
      with open(path) as f:
        vendors.append(f.read().strip())
    except OSError:
      pass
  chips = vendors.count("0x1ae0") + len(glob.glob("/dev/accel*") + glob.glob("/dev/vfio/[0-9]*"))
  if chips == 0:
    _os.environ["TPU_WORKER_HOSTNAMES"] = "localhost"


_quiet_libtpu_without_tpu()
