"""Per-step throughput in the RL rows: tokens/s per chip, MFU on chips with a known peak, the split of the step."""

import types

import numpy as np
import pytest

from jaxcredit.train.loop import metrics as metrics_lib
from jaxcredit.train.commands import plan
from jaxcredit.train.loop import rl_step as rl_step_lib


def _run(kind: str, chips: int, active_params: int):
  device = types.SimpleNamespace(device_kind=kind)
  mesh = types.SimpleNamespace(size=chips, devices=np.array([device] * chips))
  cfg = types.SimpleNamespace(num_params=lambda active=False: active_params)
  return types.SimpleNamespace(mesh=mesh, model_cfg=cfg)


def test_tokens_per_chip_and_mfu_on_a_tpu():
  row = rl_step_lib.throughput_metrics(_run("TPU v5p", 64, 4_000_000_000), tokens=1_000_000, step_s=10.0)
  assert row["tokens_per_s_per_chip"] == pytest.approx(1_000_000 / 10.0 / 64)
  assert row["mfu"] == pytest.approx(6 * 4e9 * 1e6 / (10.0 * 64 * 459e12))


def test_no_mfu_where_the_peak_is_unknown():
  row = rl_step_lib.throughput_metrics(_run("cpu", 1, 135_000_000), tokens=1318, step_s=26.0)
  assert row == {"tokens_per_s_per_chip": pytest.approx(1318 / 26.0)}


@pytest.mark.parametrize(
  "kind,generation", [("TPU v4", "v4"), ("TPU v5 lite", "v5e"), ("TPU v5", "v5p"), ("TPU v6 lite", "v6e")]
)
def test_device_kinds_map_to_the_chip_table(kind, generation):
  assert plan.peak_flops_per_chip(kind) == plan.CHIPS[generation]["peak_flops"]


def test_the_curves_draw_the_step_split(tmp_path):
  rows = [{"phase": "sft", "step": 1, "loss": 1.0}]
  rows += [
    {
      "phase": "rl",
      "step": s,
      "reward_mean": 0.5,
      "rollout_s": 10.0 + s,
      "passes_s": 3.0,
      "credit_s": 0.01,
      "update_s": 15.0,
      "tokens_per_s_per_chip": 50.0,
    }  # fmt: skip
    for s in (1, 2, 3)
  ]
  path = metrics_lib.plot_curves(str(tmp_path), rows)
  import matplotlib.image

  image = matplotlib.image.imread(path)
  assert image.shape[0] > 100 and image.shape[1] > 100
  panels = metrics_lib.curve_panels(rows)
  assert "step_s split" in panels and "tokens_per_s_per_chip" in panels and "mfu" not in panels


@pytest.mark.parametrize(
  "kind, peak",
  [
    ("NVIDIA H100 80GB HBM3", 989e12),
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H200", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA L40S", 362e12),
    ("NVIDIA L4", 121e12),
    ("NVIDIA GeForce RTX 4090", None),
    ("cpu", None),
  ],
)
def test_nvidia_gpus_have_their_dense_bf16_peak(kind, peak):
  """A GPU's MFU is taken at its dense bf16 peak (no sparsity); an unknown kind reports no MFU."""
  assert plan.peak_flops_per_chip(kind) == peak
