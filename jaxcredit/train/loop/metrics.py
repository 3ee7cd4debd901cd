"""Metrics a researcher can plot: `<workdir>/metrics.jsonl`, TensorBoard, and `curves.png` at the end."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

from jaxcredit.atomic_files import write_text_atomic

# A panel appears only when the run logged the metric (the method-specific ones come from METHODS' functions).
PLOTTED = (
  "reward_mean",
  "success_rate",
  "mean_turns",
  "tool_calls",
  "adv_mean",
  "adv_std",
  "loss",
  "kl",
  "loss_distill",
  "grad_share_distill",
  "clip_frac",
  "teacher_policy_gap",
  "td_reward_abs_mean",
  "crest_direction_gate_frac",
  "toolopd_credited_frac",
  "hsd_peers_found_frac",
  "gear_spikes_per_rollout",
  "sgcd_weight_std",
  "sgcd_groups_skipped",
  "tokens_per_s",
  "tokens_per_s_per_chip",
  "mfu",
  "eval_success_rate",
)

# The parts of an RL step's time, drawn in one panel ("step_s split").
STEP_SPLIT = ("rollout_s", "passes_s", "credit_s", "update_s")


def _clean(v: Any) -> Any:
  if isinstance(v, (np.generic, np.ndarray)):
    v = v.item() if np.ndim(v) == 0 else v.tolist()
  if hasattr(v, "item") and not isinstance(v, (list, dict, str)):
    try:
      v = v.item()
    except Exception:  # noqa: BLE001 - a non-scalar array-like stays as is
      pass
  if isinstance(v, float) and not math.isfinite(v):
    return str(v)
  return v


class MetricsWriter:
  """Appends one JSON row per call to metrics.jsonl and mirrors scalars to TensorBoard.

  Rows carry `phase` ("sft", "rl" or "eval") and `step` (RL steps count from 1; warm-start rows count their
  own steps). On resume, `truncate_after(phase, step)` drops rows of steps that the checkpoint does not
  contain (they will be re-run), so a curve never holds two different values for one step.
  """

  def __init__(self, workdir: str, *, tensorboard: bool = True, enabled: bool = True):
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.enabled = enabled  # False on every host but process 0 of a multi-host run
    self._tb = None
    if tensorboard and enabled:
      try:
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
      except ImportError:
        self._tb = None

  def write(self, phase: str, step: int, metrics: dict) -> dict:
    row = {"phase": phase, "step": int(step), **{k: _clean(v) for k, v in metrics.items()}}
    if not self.enabled:
      return row
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")
    if self._tb is not None:
      for k, v in row.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
          self._tb.add_scalar(f"{phase}/{k}", v, step)
      self._tb.flush()
    return row

  def rows(self) -> list[dict]:
    if not os.path.exists(self.path):
      return []
    with open(self.path) as f:
      return [json.loads(line) for line in f if line.strip()]

  def truncate_after(self, phase: str, step: int) -> int:
    """Removes rows of `phase` with step > `step` (atomically). Returns how many were removed."""
    if not self.enabled:
      return 0
    rows = self.rows()
    keep = [r for r in rows if not (r.get("phase") == phase and r.get("step", 0) > step)]
    if len(keep) != len(rows):
      write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in keep))
    return len(rows) - len(keep)

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def curve_panels(rows: list[dict]) -> list[str]:
  """The panels `plot_curves` draws for these rows: the warm-start loss, every PLOTTED metric some RL row has, the
  evals, and the split of the step's time when the rows carry it."""
  rl = [r for r in rows if r.get("phase") == "rl"]
  panels = [k for k in PLOTTED if any(isinstance(r.get(k), (int, float)) for r in rl)]
  panels = ["sft_loss"] + panels + ["eval_success_rate"]
  if any(isinstance(r.get("rollout_s"), (int, float)) for r in rl):
    panels.append("step_s split")
  return panels


def plot_curves(workdir: str, rows: list[dict]) -> str:
  """Writes `<workdir>/curves.png`: one panel per plotted metric, RL rows against step, eval markers."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rl = [r for r in rows if r.get("phase") == "rl"]
  sft = [r for r in rows if r.get("phase") == "sft"]
  ev = [r for r in rows if r.get("phase") == "eval"]
  panels = curve_panels(rows)
  cols = 4
  nrows = -(-len(panels) // cols)
  fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3 * nrows), squeeze=False)
  for ax, name in zip(axes.flat, panels):
    if name == "sft_loss":
      xs = [r["step"] for r in sft if "loss" in r]
      ax.plot(xs, [r["loss"] for r in sft if "loss" in r], marker=".")
      ax.set_xlabel("warm-start step")
    elif name == "step_s split":
      for key in STEP_SPLIT:
        pts = [(r["step"], r[key]) for r in rl if isinstance(r.get(key), (int, float))]
        if pts:
          ax.plot(*zip(*pts), marker=".", label=key[:-2])
      ax.legend(fontsize=7)
      ax.set_xlabel("RL step")
      ax.set_ylabel("seconds")
    elif name == "eval_success_rate":
      labels = [r.get("stage", str(r["step"])) for r in ev]
      ax.bar(range(len(ev)), [r.get("success_rate", 0.0) for r in ev])
      ax.set_xticks(range(len(ev)), labels, rotation=20, fontsize=7)
      ax.set_ylim(0, 1)
    else:
      pts = [(r["step"], r[name]) for r in rl if isinstance(r.get(name), (int, float))]
      if pts:
        ax.plot(*zip(*pts), marker=".")
      ax.set_xlabel("RL step")
    ax.set_title(name)
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(panels) :]:
    ax.axis("off")
  # Fixed margins: tight_layout draws the whole figure once more to measure it (half of this function's time).
  fig.subplots_adjust(
    left=0.05, right=0.98, bottom=0.5 / (3 * nrows), top=1 - 0.35 / (3 * nrows), wspace=0.3, hspace=0.45
  )
  path = os.path.join(workdir, "curves.png")
  fig.savefig(path, dpi=80)
  plt.close(fig)
  return path
