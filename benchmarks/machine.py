"""The machine a benchmark ran on, recorded the same way in every benchmark's results JSON.

Every benchmark's JSON has a `machine` entry made by `machine_info()` when its measurements start and completed by
`record_load_after()` when they end: the load averages on both sides say whether other work shared the cores (this
project's numbers come from a 2-core machine that also runs tests), so two results are compared only where both
were quiet.
"""

import os
import platform
import sys


def machine_info(**extra):
  """The machine now: a dict for a results JSON's `machine` entry.

  Keys: `cpus` (os.cpu_count()), `platform`, `python`, `cpu_model` and `cpu_isa` (`cpu_info`), `jax` and `torch` (their versions, only for the modules the
  benchmark has imported), `torch_threads` (with torch), `xla_flags` and `glibc_tunables` (the XLA_FLAGS and
  GLIBC_TUNABLES environment variables, "" when unset: both change CPU timings), `load_avg_before` (the 1, 5 and 15
  minute load averages, in runnable processes), then `extra` (a benchmark's own facts: matmul rates, bandwidth, ...).
  """
  info = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
  info.update(cpu_info())
  info["xla_flags"] = os.environ.get("XLA_FLAGS", "")
  info["glibc_tunables"] = os.environ.get("GLIBC_TUNABLES", "")
  for name in ("jax", "torch"):
    if name in sys.modules:
      info[name] = sys.modules[name].__version__
  if "torch" in sys.modules:
    info["torch_threads"] = sys.modules["torch"].get_num_threads()
  info["load_avg_before"] = list(os.getloadavg())
  info.update(extra)
  return info


ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "amx_bf16")
"""The vector extensions XLA's CPU code generation picks from (its output, and so float rounding, can differ with them)."""


def cpu_info(cpuinfo: str = "/proc/cpuinfo") -> dict:
  """{"cpu_model": the first processor's model name, "cpu_isa": the `ISA_FLAGS` it has, in that order}; "" and []
  where the file is unreadable (not Linux). Results that repeat bit for bit on one CPU may not on another: XLA's CPU
  backend emits code for the host's vector extensions (docs/benchmarks.md)."""
  try:
    with open(cpuinfo) as f:
      text = f.read()
  except OSError:
    return {"cpu_model": platform.processor() or "", "cpu_isa": []}
  model, flags = "", set()
  for line in text.splitlines():
    key, _, value = line.partition(":")
    key = key.strip()
    if key == "model name" and not model:
      model = value.strip()
    elif key == "flags" and not flags:
      flags = set(value.split())
  return {"cpu_model": model, "cpu_isa": [f for f in ISA_FLAGS if f in flags]}


def record_load_after(info):
  """Adds `load_avg_after` (the 1, 5 and 15 minute load averages now) to a `machine_info()` dict; returns it."""
  info["load_avg_after"] = list(os.getloadavg())
  return info
