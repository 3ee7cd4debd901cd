"""TPU chips and mesh specs as text: the chip table (and NVIDIA GPUs' peak FLOP/s, for MFU), and the parsers of `--topology v5p:4x4x4` and
`--mesh fsdp=16,tensor=4`. A leaf module (it needs only `jaxcredit.sharding`'s mesh axis names), read by the config's
validation, the trainer's throughput metrics and `jaxcredit plan`."""

from __future__ import annotations

import math
import re

from jaxcredit import sharding

# Per chip: HBM bytes and peak dense bf16 FLOP/s (Google Cloud TPU system architecture pages).
CHIPS = {
  "v4": {"hbm_bytes": 32 * 2**30, "peak_flops": 275e12},
  "v5e": {"hbm_bytes": 16 * 2**30, "peak_flops": 197e12},
  "v5p": {"hbm_bytes": 95 * 2**30, "peak_flops": 459e12},
  "v6e": {"hbm_bytes": 32 * 2**30, "peak_flops": 918e12},
}


# jax's device_kind -> the CHIPS row (what a running TPU reports itself as).
DEVICE_KINDS = {
  "TPU v4": "v4",
  "TPU v5 lite": "v5e",
  "TPU v5e": "v5e",
  "TPU v5": "v5p",
  "TPU v5p": "v5p",
  "TPU v6 lite": "v6e",
  "TPU v6e": "v6e",
}


# NVIDIA GPUs: a name in jax's device_kind ("NVIDIA H100 80GB HBM3", "NVIDIA L4") -> peak dense bf16 FLOP/s, without
# sparsity (NVIDIA's H100/H200, A100, L40S and L4 datasheets). Matched as a whole word, in this order ("H100 PCIe"
# before "H100"; "L4" is not "L40S").
GPU_PEAK_FLOPS = (
  ("H100 PCIe", 756e12),
  ("H100", 989e12),
  ("H200", 989e12),
  ("A100", 312e12),
  ("L40S", 362e12),
  ("L4", 121e12),
)


def peak_flops_per_chip(device_kind: str) -> float | None:
  """Dense bf16 peak FLOP/s of one chip of this jax `device_kind` ("TPU v5p", "TPU v5 lite", "NVIDIA H100 80GB
  HBM3", ...), or None for a kind in neither table (CPUs, other GPUs): then no MFU is reported."""
  generation = DEVICE_KINDS.get(device_kind)
  if generation is not None:
    return CHIPS[generation]["peak_flops"]
  for name, peak in GPU_PEAK_FLOPS:
    if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w])", device_kind):
      return peak
  return None


def parse_topology(topology: str) -> tuple[str, int]:
  """'v5p:4x4x4' -> ('v5p', 64 chips).

  Raises:
    ValueError: an unknown generation or a malformed shape.
  """
  m = re.fullmatch(r"(v4|v5e|v5p|v6e):(\d+(?:x\d+)*)", topology.strip())
  if not m or any(int(x) < 1 for x in m.group(2).split("x")):
    raise ValueError(f"--topology {topology!r} must look like v5p:4x4x4 with sizes >= 1 (generations: {sorted(CHIPS)})")
  rank = len(m.group(2).split("x"))
  if rank != TOPOLOGY_RANK[m.group(1)]:
    example = "v5p:4x4x4" if TOPOLOGY_RANK[m.group(1)] == 3 else f"{m.group(1)}:4x4"
    raise ValueError(
      f"--topology {topology!r}: a {m.group(1)} slice is a {TOPOLOGY_RANK[m.group(1)]}-D torus (e.g. {example}), "
      f"not {rank}-D"
    )
  return m.group(1), math.prod(int(x) for x in m.group(2).split("x"))


TOPOLOGY_RANK = {"v4": 3, "v5p": 3, "v5e": 2, "v6e": 2}
"""The axes of each generation's slice shapes: v4 and v5p are 3-D tori, v5e and v6e 2-D."""


def parse_mesh(spec: str) -> dict[str, int]:
  """'fsdp=16,tensor=4' -> {'fsdp': 16, 'tensor': 4}.

  Raises:
    ValueError: an unknown axis or a non-positive size.
  """
  out: dict[str, int] = {}
  for part in filter(None, (p.strip() for p in spec.split(","))):
    name, _, value = part.partition("=")
    if name not in sharding.MESH_AXES or not value.isdigit() or int(value) < 1:
      raise ValueError(f"--mesh entry {part!r} must be AXIS=N with N >= 1 and AXIS in {sharding.MESH_AXES}")
    if name in out:
      raise ValueError(f"--mesh names {name!r} twice: {spec!r}")
    out[name] = int(value)
  return out
