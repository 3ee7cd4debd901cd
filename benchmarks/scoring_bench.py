"""TRACE gold scoring on SmolLM2-135M-Instruct: one row per (rollout, boundary) against one packed row per rollout.

`score_gold_answers` (T+1 forwards of growing prefixes per rollout, padded to the longest) against
`score_gold_answers_packed` (the rollout up to its last boundary plus one copy of the gold answer per boundary,
under a segment mask), on synthetic rollouts of realistic shape: a ~100-token prompt, T tool turns of ~30
action + ~15 observation tokens (a boundary after each observation, so T+1 boundaries s_0..s_T), a ~8-token gold
answer. Both jitted as the trainer builds them (`make_logp_fn`, `make_packed_gold_fn`); compile time is measured
apart (ahead-of-time `lower().compile()` on the first call of each shape) and excluded; median of the warm runs.
Also checks that both give the same scores. Writes benchmarks/results/scoring_bench.json.

  python benchmarks/scoring_bench.py [--ts 8,16,32] [--batch 1] [--repeats 3] [--budget-s 60]
"""

import argparse
import json
import os
import time

import jax
import numpy as np
from machine import machine_info, record_load_after


class AotFn:
  """A jitted fn(params, *arrays) called as fn(*arrays) -> numpy; each new shape is compiled ahead of time and
  its compile time added to `compile_s`, so a timed call minus the compile time growth is a warm run."""

  def __init__(self, jitted, params):
    self.jitted, self.params, self.cache, self.compile_s = jitted, params, {}, 0.0

  def __call__(self, *arrays):
    key = tuple((a.shape, str(a.dtype)) for a in arrays)
    if key not in self.cache:
      t = time.perf_counter()
      self.cache[key] = self.jitted.lower(self.params, *arrays).compile()
      self.compile_s += time.perf_counter() - t
    return np.asarray(self.cache[key](self.params, *arrays))


def _timed(score, fn: AotFn, repeats: int, budget_s: float):
  """(median warm seconds, runs, compile seconds, last result): at least one run, then more while under budget."""
  times, out, compile_s = [], None, 0.0
  start = time.perf_counter()
  while len(times) < repeats and (not times or time.perf_counter() - start < budget_s):
    before = fn.compile_s
    t = time.perf_counter()
    out = score()
    elapsed = time.perf_counter() - t
    compile_s += fn.compile_s - before
    times.append(elapsed - (fn.compile_s - before))
  return float(np.median(times)), len(times), compile_s, out


def synthetic_trajectory(rng, vocab: int, batch: int, turns: int, prompt: int, action: int, obs: int, pad_id: int):
  from jaxcredit.trajectory import RolloutBuilder, pack

  def ids(n):
    return rng.integers(100, vocab, n).tolist()

  rollouts = []
  for _ in range(batch):
    # +-10% jitter around the nominal sizes, so rows differ in length as real rollouts do.
    def jit(n):
      return max(1, int(round(n * rng.uniform(0.9, 1.1))))

    r = RolloutBuilder.from_prompt(ids(jit(prompt)))
    for _ in range(turns):
      r.append_action(ids(jit(action)))
      r.append_context(ids(jit(obs)))
      r.mark_boundary()
    rollouts.append(r)
  return pack(rollouts, [0.0] * batch, list(range(batch)), max_turns=turns + 1, pad_id=pad_id, length_bucket=64)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--ts", default="8,16,32", help="tool turns per rollout (T; T+1 boundaries)")
  ap.add_argument("--batch", type=int, default=1, help="rollouts per batch")
  ap.add_argument("--prompt", type=int, default=100)
  ap.add_argument("--action", type=int, default=30)
  ap.add_argument("--obs", type=int, default=15)
  ap.add_argument("--gold", type=int, default=8)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--budget-s", type=float, default=60.0, help="stop repeating a case after this many seconds")
  ap.add_argument("--out", default="benchmarks/results/scoring_bench.json")
  args = ap.parse_args()

  from jaxcredit.models import load_model, smollm2_gguf_path
  from jaxcredit.scoring.gold import score_gold_answers, score_gold_answers_packed
  from jaxcredit.train.loop import step as step_lib

  machine = machine_info(backend=jax.default_backend())
  model, cfg = load_model(smollm2_gguf_path())
  graphdef, params, rest = step_lib.split_model(model)
  separate_fn = AotFn(step_lib.make_logp_fn(graphdef, rest, 1.0), params)
  packed_fn = AotFn(step_lib.make_packed_gold_fn(graphdef, rest), params)
  pad_id = 2
  rng = np.random.default_rng(0)
  results = {
    "machine": machine,
    "settings": {k: v for k, v in vars(args).items() if k != "out"},
    "cases": [],
  }
  for turns in [int(x) for x in args.ts.split(",")]:
    traj = synthetic_trajectory(rng, cfg.vocab_size, args.batch, turns, args.prompt, args.action, args.obs, pad_id)
    gold_ids = [rng.integers(100, cfg.vocab_size, args.gold).tolist() for _ in range(args.batch)]
    common = dict(pad_id=pad_id, reduce="sum", length_bucket=64, rows_bucket=1)
    sep_s, sep_n, sep_c, (sep, sep_mask) = _timed(
      lambda: score_gold_answers(separate_fn, traj, gold_ids, **common), separate_fn, args.repeats, args.budget_s
    )
    pkd_s, pkd_n, pkd_c, (pkd, pkd_mask) = _timed(
      lambda: score_gold_answers_packed(packed_fn, traj, gold_ids, **common), packed_fn, args.repeats, args.budget_s
    )
    assert (sep_mask == pkd_mask).all()
    max_diff = float(np.abs(sep - pkd)[sep_mask].max())
    lengths = traj.token_mask_BxL.sum(axis=1)
    n_bound = int(traj.boundary_mask_BxT1.sum())
    separate_tokens = n_bound * (int(traj.boundary_pos_BxT1.max()) + args.gold)  # rows x (padded) length, roughly
    packed_tokens = int(lengths.sum()) + n_bound * args.gold
    case = {
      "turns": turns,
      "boundaries_per_rollout": turns + 1,
      "batch": args.batch,
      "rollout_tokens": [int(x) for x in lengths],
      "separate_s": sep_s,
      "separate_runs": sep_n,
      "separate_compile_s": sep_c,
      "packed_s": pkd_s,
      "packed_runs": pkd_n,
      "packed_compile_s": pkd_c,
      "speedup": sep_s / pkd_s,
      "target_speedup": turns / 2,
      "target_met": sep_s / pkd_s >= turns / 2,
      "approx_tokens_separate": separate_tokens,
      "approx_tokens_packed": packed_tokens,
      "max_abs_diff": max_diff,
    }
    results["cases"].append(case)
    print(
      f"T={turns:2d} ({turns + 1} boundaries, B={args.batch}, rollout ~{int(lengths.mean())} tokens): "
      f"separate {sep_s:.2f} s ({sep_n} runs), packed {pkd_s:.2f} s ({pkd_n} runs), "
      f"speedup {sep_s / pkd_s:.1f}x (target >= {turns / 2:.0f}x: {'met' if case['target_met'] else 'NOT met'}), "
      f"max |diff| {max_diff:.1e}",
      flush=True,
    )
  record_load_after(results["machine"])
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)


if __name__ == "__main__":
  main()
