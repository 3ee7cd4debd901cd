"""BFCL multi-turn episodes and host memory: does anything accumulate across rollouts?

Runs episodes back to back through `BfclSession` (fresh backends per episode, the ground truth replayed through our
parser, executor and BFCL's checkers, cycling over all 800 tasks, long_context included) and records the process's
resident memory after 100, 200, 500 and 1,000 episodes (after a garbage collection). bfcl-eval's own executor keeps
backend instances in module globals per model and task id, so its memory grows with every task; ours must not.
Writes benchmarks/results/bfcl_memory_bench.json.

  python benchmarks/bfcl_memory_bench.py [--episodes 1000]
"""

import argparse
import gc
import json
import os
import platform
import resource
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_mib() -> float:
  """Current resident set size (MiB), from /proc/self/statm."""
  with open("/proc/self/statm") as f:
    pages = int(f.read().split()[1])
  return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--episodes", type=int, default=1000)
  args = ap.parse_args()
  from jaxcredit.envs import bfcl_multi_turn as bm

  tasks = bm.load_tasks()
  checkpoints = sorted({100, 200, 500, args.episodes} & set(range(1, args.episodes + 1)))
  rows, passed, t0 = [], 0, time.time()
  for k in range(1, args.episodes + 1):
    task = tasks[(k - 1) % len(tasks)]
    bm.demonstration(task, max_output_chars=2000)  # steps a BfclSession through every request; raises unless all pass
    passed += 1
    if k in checkpoints:
      gc.collect()
      rows.append({"episodes": k, "rss_mib": round(rss_mib(), 1), "seconds": round(time.time() - t0, 1)})
      print(rows[-1], flush=True)
  base = next(r["rss_mib"] for r in rows if r["episodes"] == 100)
  last = rows[-1]["rss_mib"]
  # The contrast: bfcl-eval's own executor (its code on its own ground truth), one rollout id per episode, as a
  # trainer would call it. It keeps every episode's backends in its module globals.
  from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

  theirs, t1 = [], time.time()
  for k in range(1, args.episodes + 1):
    task = tasks[(k - 1) % len(tasks)]
    for turn in task.ground_truth:
      multi_turn_utils.execute_multi_turn_func_call(
        list(turn),
        json.loads(task.initial_config),
        list(task.involved_classes),
        "bench",
        f"{task.task_id}_{k}",
        long_context=task.long_context,
      )
    if k in checkpoints:
      gc.collect()
      theirs.append({"episodes": k, "rss_mib": round(rss_mib(), 1), "seconds": round(time.time() - t1, 1)})
      print("bfcl-eval executor", theirs[-1], flush=True)
  out = {
    "bench": "bfcl_memory",
    "host": platform.node(),
    "cpus": os.cpu_count(),
    "episodes": args.episodes,
    "episodes_passed": passed,
    "rows": rows,
    "growth_100_to_last": round((last - base) / base, 4),
    "bfcl_eval_executor_rows": theirs,
    "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
  }
  os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
  with open(os.path.join(ROOT, "benchmarks", "results", "bfcl_memory_bench.json"), "w") as f:
    json.dump(out, f, indent=2)
  print(json.dumps(out, indent=2))


if __name__ == "__main__":
  main()
