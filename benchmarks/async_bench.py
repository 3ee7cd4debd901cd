"""Synchronous RL steps against rollouts sampled one step ahead (`rollout.async_depth=1`), per engine.

  python benchmarks/async_bench.py [--engines jax,vllm] [--steps 6] [--set KEY=VALUE ...]

Each engine's two runs train `configs/quickstart.py` from the policy as loaded (no warm start, no evals: the RL steps
alone) for `--steps` RL steps, each in its own `jaxcredit train` process, one after the other. From each run's
metrics rows, over the steps after the first (which compiles):

  step_s            the RL step, learner's view (waiting for rollouts included)
  rollout_s         sampling the step's rollouts (on the thread with async_depth=1)
  learner_wait_s    the learner idle, waiting for the step's rollouts (the whole rollout_s when synchronous)
  sampler_idle_s    the rollout thread idle, waiting for weights or work (async only)
  overlap           1 - learner_wait_s / rollout_s: the share of sampling hidden behind learning
  speedup           synchronous step_s / async step_s

On one 2-core CPU the sampler thread and the learner compete for the same cores, so the overlap shows whether the
pipeline hides sampling, and the speedup what that is worth here; on an accelerator the learner's chips are free
while a vLLM server or the sampler samples. The machine's load average is recorded before and after.

Writes benchmarks/results/async_bench.json (and each run's workdir under --workdir).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
from machine import machine_info, record_load_after

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_rows(workdir: str) -> list[dict]:
  """The RL rows of a run's metrics.jsonl."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["phase"] == "rl"]


def summarize(rows: list[dict]) -> dict:
  """Means over the RL steps after the first (the first compiles) of the step's, sampling's and idle times, and the
  overlap 1 - learner_wait_s / rollout_s (the synchronous loop waits for all of rollout_s: overlap 0).

  Raises:
    ValueError: fewer than 2 RL rows (nothing after the compiling step).
  """
  if len(rows) < 2:
    raise ValueError(f"need at least 2 RL steps to leave out the first (compiling) one, got {len(rows)}")
  steady = rows[1:]

  def mean(key, default=None):
    values = [r.get(key, default) for r in steady]
    return float(np.mean(values))

  out = {
    "steps": len(steady),
    "step_s": mean("step_s"),
    "rollout_s": mean("rollout_s"),
    "learner_wait_s": float(np.mean([r.get("learner_wait_s", r["rollout_s"]) for r in steady])),
    "sampler_idle_s": mean("sampler_idle_s", 0.0),
    "update_s": mean("update_s"),
    "score_s": mean("score_s"),
    "policy_staleness_max": int(max(r.get("policy_staleness", 0) for r in steady)),
    "rl_seconds": float(sum(r["step_s"] for r in steady)),
  }
  out["overlap"] = 1.0 - out["learner_wait_s"] / out["rollout_s"] if out["rollout_s"] > 0 else 0.0
  return out


def train(workdir: str, engine: str, depth: int, steps: int, extra: list[str]) -> float:
  """One `jaxcredit train` of the quickstart config; its wall seconds."""
  shutil.rmtree(workdir, ignore_errors=True)
  cmd = [
    sys.executable,
    "-m",
    "jaxcredit.cli",
    "train",
    "--config",
    os.path.join(ROOT, "configs", "quickstart.py"),
    f"--config.workdir={workdir}",
    "--config.progress=False",
    f"--config.total_steps={steps}",
    "--config.sft.steps=0",
    "--config.eval.before_sft=False",
    "--config.eval.after_sft=False",
    "--config.eval.at_end=False",
    "--config.eval.every=0",
    f"--config.rollout.engine={engine}",
    f"--config.rollout.async_depth={depth}",
    *extra,
  ]
  t0 = time.time()
  subprocess.run(cmd, check=True, cwd=ROOT)
  return time.time() - t0


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--engines", default="jax", help="comma-separated: jax, vllm")
  ap.add_argument("--steps", type=int, default=6, help="RL steps per run (the first is left out)")
  ap.add_argument("--workdir", default="/tmp/async_bench")
  ap.add_argument("--vllm-python", default=os.path.join(ROOT, ".vllm-venv", "bin", "python"))
  ap.add_argument("--set", action="append", default=[], help="KEY=VALUE: a --config.KEY=VALUE for every run")
  ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "async_bench.json"))
  args = ap.parse_args(argv)
  if args.steps < 2:
    ap.error("--steps must be >= 2 (the first RL step compiles and is left out)")
  extra = [f"--config.{kv}" for kv in args.set]
  results = {
    "machine": machine_info(),
    "settings": {"steps": args.steps, "set": args.set, "config": "configs/quickstart.py"},
    "engines": {},
  }
  for engine in [e.strip() for e in args.engines.split(",") if e.strip()]:
    engine_extra = list(extra)
    if engine == "vllm":
      engine_extra += [f"--config.rollout.vllm.python={args.vllm_python}"]
    runs = {}
    for depth in (0, 1):
      workdir = os.path.join(args.workdir, f"{engine}_depth{depth}")
      wall = train(workdir, engine, depth, args.steps, engine_extra)
      runs[f"async_depth_{depth}"] = {**summarize(run_rows(workdir)), "wall_s": wall}
    runs["speedup"] = runs["async_depth_0"]["step_s"] / runs["async_depth_1"]["step_s"]
    results["engines"][engine] = runs
    s, a = runs["async_depth_0"], runs["async_depth_1"]
    print(
      f"[async_bench] {engine}: step {s['step_s']:.1f} s -> {a['step_s']:.1f} s ({runs['speedup']:.2f}x); "
      f"rollouts {s['rollout_s']:.1f} / {a['rollout_s']:.1f} s; learner waits {s['learner_wait_s']:.1f} -> "
      f"{a['learner_wait_s']:.1f} s (overlap {a['overlap']:.2f}); sampler idle {a['sampler_idle_s']:.1f} s"
    )
  record_load_after(results["machine"])
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=1)
  print(f"[async_bench] {args.out}")


if __name__ == "__main__":
  main()
