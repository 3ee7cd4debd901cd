"""Every method's RL step on the real quickstart task (SmolLM2-135M-Instruct, arithmetic with a calculator):
seconds per step and per pass, side by side with GRPO's. Writes benchmarks/results/methods_bench.json.

One warm start (`jaxcredit sft` on configs/quickstart.py, 10 steps) is shared: each method's workdir starts as a
copy of it, with that method's config written as its config.json, so `trainer.train` resumes at RL step 0 from
the same warm-started policy and reference, then runs `--steps` RL steps through the method's own config.
Step 1 includes whatever the persistent XLA cache did not hold; the last step is the steady state.

  python benchmarks/methods_bench.py [--steps 2] [--methods grpo,trace,...] [--root /tmp/methods_bench]
"""

import argparse
import importlib.util
import json
import os
import platform
import shutil
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(name, workdir, steps):
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", os.path.join(ROOT, "configs", f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  c.workdir = workdir
  c.total_steps = steps
  c.progress = False
  c.tensorboard = False
  c.eval.before_sft = c.eval.after_sft = c.eval.at_end = False
  return c


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--steps", type=int, default=2)
  ap.add_argument("--methods", default="grpo,drgrpo,rloo,gigpo,trace,crest,toolopd,hsd,gear,sgcd,opd")
  ap.add_argument("--root", default="/tmp/methods_bench")
  ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "methods_bench.json"))
  args = ap.parse_args()

  import jax
  from jaxcredit.train.commands import trainer
  from jaxcredit.train.tables.methods import METHODS

  shutil.rmtree(args.root, ignore_errors=True)
  warm = os.path.join(args.root, "warm_start")
  c = _config("quickstart", warm, args.steps)
  t0 = time.time()
  trainer.train(c, sft_only=True)
  warm_s = time.time() - t0

  results = {}
  for name in args.methods.split(","):
    workdir = os.path.join(args.root, name)
    shutil.copytree(warm, workdir)
    c = _config(name, workdir, args.steps)
    with open(os.path.join(workdir, "config.json"), "w") as f:
      json.dump(c.to_dict(), f, indent=2, sort_keys=True)
    t0 = time.time()
    trainer.train(c)
    wall = time.time() - t0
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows = [r for r in map(json.loads, f) if r["phase"] == "rl"]
    results[name] = {"passes": list(METHODS[name].passes), "wall_s": wall, "steps": rows}
    last = rows[-1]
    passes = ", ".join(f"{p} {last[f'pass/{p}/seconds']:.1f}s" for p in METHODS[name].passes)
    print(
      f"{name}: step {last['step_s']:.1f}s (rollouts {last['rollout_s']:.1f}, passes+credit "
      f"{last['score_s']:.1f}, update {last['update_s']:.1f}){'; ' + passes if passes else ''}",
      flush=True,
    )

  for r in results.values():
    r.update(load_avg_at_end=os.getloadavg(), warm_start_s=warm_s, date=time.strftime("%Y-%m-%d %H:%M"))
  previous = {}
  if os.path.exists(args.out):  # a run of some methods updates their rows and keeps the others
    with open(args.out) as f:
      previous = json.load(f).get("methods", {})
  out = {
    "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    "jax": jax.__version__,
    "steps": args.steps,
    "config": "configs/<method>.py as shipped (quickstart task: 2 prompts x 4 rollouts, <= 3 turns of 48 "
    "tokens); evals off; one shared 10-step warm start per run",
    "methods": {**previous, **results},
  }
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(out, f, indent=2)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
