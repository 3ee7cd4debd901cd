"""`jaxcredit compare W1 W2 ...`: learning curves of several training runs overlaid, as PNG, JSON and an HTML page.

    result = compare_runs(["runs/grpo_s0", "runs/grpo_s1", "runs/trace_s0", "runs/trace_s1"], "runs/compare")

Runs whose configs differ only in `seed` (and the workdir, run length and logging keys) form one curve: the mean
over seeds with a band from the lowest to the highest seed. Curves are labelled by the config keys that tell the
groups apart (e.g. `credit.method=trace credit.trace.dense_norm=none`). Reads `<workdir>/metrics.jsonl` and
`<workdir>/config.json` (docs/viewer.md).
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
from typing import Any, Sequence

from jaxcredit import trees

# Panels: (phase, metric). RL rows are per step; eval rows are the held-out evaluations.
DEFAULT_METRICS = (
  ("rl", "success_rate"),
  ("rl", "reward_mean"),
  ("eval", "success_rate"),
  ("rl", "mean_turns"),
  ("rl", "tool_calls"),
  ("rl", "kl"),
  ("rl", "adv_std"),
)

# Keys that never tell runs apart (where a run writes, how long it runs, how often it logs).
IGNORED_KEYS = (
  "seed",
  "workdir",
  "total_steps",
  "checkpoint_every",
  "log_every",
  "log_rollouts_every",
  "log_rollouts_count",
  "progress",
  "tensorboard",
  "compilation_cache_dir",
  "model.cache_dir",
)


def _flatten(d: dict) -> dict:
  """{"a.b": the JSON text of the value} for every leaf of a nested config dict."""
  return {key: json.dumps(v, sort_keys=True) for key, v in trees.flatten(d, sep=".").items()}


def load_run(workdir: str) -> dict:
  """A run's config (flattened, JSON-encoded values) and metrics rows.

  Raises:
    ValueError: the workdir has no metrics.jsonl, or a line of it is not JSON (file and line named).
  """
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):
    raise ValueError(f"{workdir} has no metrics.jsonl: not a jaxcredit training workdir (or it has not logged yet)")
  rows = []
  with open(path, encoding="utf-8", errors="replace") as f:
    for n, line in enumerate(f, 1):
      if line.strip():
        try:
          row = json.loads(line)
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}, line {n}: not JSON ({e.msg})") from None
        step = row.get("step") if isinstance(row, dict) else None
        if not isinstance(row, dict) or not isinstance(step, int) or isinstance(step, bool):
          raise ValueError(f"{path}, line {n}: expected a JSON object with an integer 'step' (a metrics row)")
        rows.append(row)
  config = {}
  config_path = os.path.join(workdir, "config.json")
  if os.path.isfile(config_path):
    try:
      with open(config_path, encoding="utf-8") as f:
        saved = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ValueError(f"{config_path}: not a JSON training config ({e})") from None
    if not isinstance(saved, dict):
      raise ValueError(f"{config_path}: expected a JSON object (the training config), got {type(saved).__name__}")
    config = _flatten(saved)
  return {"workdir": workdir, "config": config, "rows": rows}


def group_runs(runs: Sequence[dict]) -> list[dict]:
  """Groups runs whose configs differ only in IGNORED_KEYS (seeds of one setting).

  Returns:
    [{"label": str, "runs": [run, ...], "seeds": [...]}], in the order each group first appears. The label names
    the config keys that differ between groups (key=value), or the first workdir's name when nothing differs.
  """
  groups: dict[tuple, dict] = {}
  for run in runs:
    key = tuple(sorted((k, v) for k, v in run["config"].items() if not k.startswith(IGNORED_KEYS)))
    if not run["config"]:  # no config.json: a group of its own
      key = (("workdir", run["workdir"]),)
    groups.setdefault(key, {"key": dict(key), "runs": []})["runs"].append(run)
  out = list(groups.values())
  differing = sorted({k for g in out for k in g["key"] if len({h["key"].get(k) for h in out}) > 1})
  for g in out:
    parts = [f"{k}={_short(g['key'].get(k))}" for k in differing if k != "workdir"]
    g["label"] = " ".join(parts) or os.path.basename(os.path.normpath(g["runs"][0]["workdir"]))
    g["seeds"] = [json.loads(r["config"].get("seed", "null")) for r in g["runs"]]
  return out


def _short(v: str | None) -> str:
  if v is None:
    return "-"
  try:
    x = json.loads(v)
  except (TypeError, json.JSONDecodeError):
    return str(v)
  return x if isinstance(x, str) else json.dumps(x)


def curve(runs: Sequence[dict], phase: str, metric: str) -> dict | None:
  """Mean and band over runs of one metric against step (steps every run logged; eval rows by their step).

  Returns:
    {"steps", "mean", "lo", "hi", "runs"} (lists), or None when no run logged the metric. lo/hi: the lowest and
    highest run at each step. The evals before and during the warm start are left out: they are logged at step 0 like
    the eval after it, where the RL curve starts.
  """
  per_run = []
  for run in runs:
    pts = {}
    for r in run["rows"]:
      v = r.get(metric)
      stage = str(r.get("stage", ""))
      if stage == "before_warm_start" or stage.startswith("sft_step_"):
        continue  # also step 0: the RL curve starts from the warm-started policy
      if r.get("phase") == phase and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        pts[int(r["step"])] = float(v)  # a resumed run's later row for a step wins
    if pts:
      per_run.append(pts)
  if not per_run:
    return None
  steps = sorted(set.intersection(*(set(p) for p in per_run)))
  values = [[p[s] for p in per_run] for s in steps]
  return {
    "steps": steps,
    "mean": [sum(v) / len(v) for v in values],
    "lo": [min(v) for v in values],
    "hi": [max(v) for v in values],
    "runs": len(per_run),
  }


def compare_runs(
  workdirs: Sequence[str], out_dir: str, *, metrics: Sequence[tuple[str, str]] = DEFAULT_METRICS
) -> dict:
  """Writes `out_dir/compare.png`, `compare.json` and `index.html` for the runs.

  Args:
    workdirs: training workdirs (each with metrics.jsonl; config.json groups seeds).
    out_dir: created if missing.
    metrics: (phase, metric) panels; a panel no run logged is left out.

  Returns:
    {"png", "json", "html": paths, "groups": [{"label", "seeds", "final": {panel: mean at the last common step}}]}.

  Raises:
    ValueError: no workdirs, a workdir listed twice, or one without metrics.jsonl.
  """
  if not workdirs:
    raise ValueError("give at least one training workdir")
  seen = set()
  for w in workdirs:
    if os.path.realpath(w) in seen:
      raise ValueError(f"workdir {w} is listed twice (links resolved)")
    seen.add(os.path.realpath(w))
  groups = group_runs([load_run(w) for w in workdirs])
  panels = []
  for phase, metric in metrics:
    curves = [(g, curve(g["runs"], phase, metric)) for g in groups]
    if any(c is not None for _, c in curves):
      panels.append((phase, metric, curves))
  os.makedirs(out_dir, exist_ok=True)
  png = os.path.join(out_dir, "compare.png")
  _plot(panels, png)
  summary = []
  for g in groups:
    final = {}
    for phase, metric, curves in panels:
      c = dict((id(h), c) for h, c in curves)[id(g)]
      if c is not None and c["steps"]:
        final[f"{phase}/{metric}"] = {
          "step": c["steps"][-1],
          "mean": c["mean"][-1],
          "lo": c["lo"][-1],
          "hi": c["hi"][-1],
        }
    summary.append(
      {"label": g["label"], "seeds": g["seeds"], "workdirs": [r["workdir"] for r in g["runs"]], "final": final}
    )
  data = {
    "groups": summary,
    "curves": {
      f"{phase}/{metric}": {g["label"]: c for g, c in curves if c is not None} for phase, metric, curves in panels
    },
  }
  json_path = os.path.join(out_dir, "compare.json")
  with open(json_path, "w") as f:
    json.dump(data, f, indent=1)
  html_path = os.path.join(out_dir, "index.html")
  with open(html_path, "w") as f:
    f.write(_page(summary, [f"{p}/{m}" for p, m, _ in panels], png))
  return {"png": png, "json": json_path, "html": html_path, "groups": summary}


def _plot(panels, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  cols = min(3, max(len(panels), 1))
  nrows = max(-(-len(panels) // cols), 1)
  fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.4 * nrows), squeeze=False)
  for ax, (phase, metric, curves) in zip(axes.flat, panels):
    for j, (g, c) in enumerate(curves):
      if c is None:
        continue
      colour = f"C{j % 10}"
      label = f"{g['label']} (n={c['runs']})"
      ax.plot(c["steps"], c["mean"], marker="." if len(c["steps"]) < 30 else None, color=colour, label=label)
      if c["runs"] > 1:
        ax.fill_between(c["steps"], c["lo"], c["hi"], color=colour, alpha=0.2)
    ax.set_title(f"{metric} ({'held-out eval' if phase == 'eval' else 'training rollouts'})")
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(panels) :]:
    ax.axis("off")
  if panels:
    axes.flat[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)


def _page(summary: list[dict], panels: list[str], png: str) -> str:
  e = html.escape
  with open(png, "rb") as f:
    image = base64.b64encode(f.read()).decode()
  head = "".join(f"<th>{e(p)}</th>" for p in panels)
  rows = ""
  for g in summary:
    cells = ""
    for p in panels:
      v: Any = g["final"].get(p)
      cells += "<td>-</td>" if v is None else f"<td>{v['mean']:.3f} [{v['lo']:.3f}, {v['hi']:.3f}] @{v['step']}</td>"
    rows += f"<tr><td>{e(g['label'])}</td><td>{len(g['seeds'])}</td>{cells}</tr>"
  return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>jaxcredit: compare</title>
<style>body{{font:14px system-ui,sans-serif;margin:16px}} td,th{{border:1px solid #ddd;padding:2px 8px}}
table{{border-collapse:collapse}}</style></head><body><h1>Runs compared</h1>
<img alt="learning curves" src="data:image/png;base64,{image}" style="max-width:100%">
<h2>Last common step: mean [lowest, highest seed]</h2>
<table><tr><th>runs</th><th>seeds</th>{head}</tr>{rows}</table></body></html>
"""
