"""Install the libtpu that matches the installed jax into a folder outside site-packages (default `.libtpu`).

`jaxcredit plan` compiles the training step for a TPU topology without a TPU; it needs libtpu. Installed into the
virtual environment (the `tpu` extra), libtpu makes every JAX process on a CPU machine try to start a TPU runtime
and print its start-up errors. Installed here instead, only the processes that point `TPU_LIBRARY_PATH` at it load
it (the test suite does so by itself when `.libtpu` exists):

    python tools/install_libtpu.py            # -> .libtpu/libtpu/libtpu.so
    TPU_LIBRARY_PATH=.libtpu/libtpu/libtpu.so jaxcredit plan --config configs/quickstart.py --topology v5p:2x2x2

The version is jax's own `jax[tpu]` requirement (from the installed jax's metadata), so the two always match.
"""

import argparse
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, requires, version


def libtpu_requirement() -> str:
  """The `libtpu==...` requirement of the installed jax's `tpu` extra, e.g. 'libtpu==0.0.42.*'.

  Raises:
    SystemExit: jax is not installed, or its metadata names no libtpu.
  """
  try:
    reqs = requires("jax") or []
  except PackageNotFoundError:
    raise SystemExit("install_libtpu: jax is not installed in this Python; install jaxcredit first")
  for r in reqs:
    spec, _, marker = r.partition(";")
    if spec.strip().startswith("libtpu") and "tpu" in marker:
      return spec.strip().replace(" ", "")
  raise SystemExit(f"install_libtpu: jax {version('jax')} names no libtpu in its 'tpu' extra")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("target", nargs="?", default=".libtpu", help="folder to install into (default .libtpu)")
  args = parser.parse_args(argv)
  req = libtpu_requirement()
  cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target", args.target, req]
  print(f"install_libtpu: {req} -> {args.target}/libtpu/libtpu.so", flush=True)
  return subprocess.call(cmd)


if __name__ == "__main__":
  sys.exit(main())
