"""The update's forward+backward on packed rows (`jaxcredit.train.loop.update.pack_update_batch`) against right-padded rollout rows.

Synthetic rollout batches shaped like the two CPU workloads, a random model of each shape, float32:
  quickstart  SmolLM2-135M's shape (30 layers, 576 wide, 49,152 vocabulary), 2 prompts x 4 rollouts, a shared
              prompt of 100 tokens and continuations of 55-75 tokens, 30% of them action tokens;
  testbed     the CPU testbed's policy shape (4 layers, 256 wide, 4,096 vocabulary), 4 prompts x 8 rollouts, a
              shared prompt of 150 tokens and continuations of 30-350 tokens, 30% action tokens.
For each: the jitted `loss_and_grads` (PPO-clip, token-mean) on the unpacked [B, L] batch, then packed with each
`--row-lens` cap (0: the longest rollout's row). Compile excluded (one call first), the minimum of `--repeats`
calls. Results to `--out` (JSON) and `docs/benchmarks.md` ("Packing the update").

  python benchmarks/packing_bench.py
  python benchmarks/packing_bench.py --workloads testbed --row-lens 0,512,1024 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from machine import machine_info, record_load_after

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

WORKLOADS = {
  # name -> (model shape, prompts, group, prompt tokens, continuation tokens [lo, hi))
  "quickstart": (
    dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3),
    2,
    4,
    100,
    (55, 75),
  ),
  "testbed": (
    dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4, num_kv_heads=2),
    4,
    8,
    150,
    (30, 350),
  ),
}


def rollout_batch(vocab: int, prompts: int, group: int, prompt: int, cont: tuple[int, int], seed: int = 0):
  """A right-padded update batch (`jaxcredit.trajectory.UpdateBatch`, one rollout per row, as
  `jaxcredit.train.loop.update.update_batch` builds it) of synthetic rollouts."""
  from jaxcredit.train.loop.update import rows_batch
  from jaxcredit.trajectory import pad_length

  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(prompts):
    shared = rng.integers(1, vocab, prompt)
    rows += [np.concatenate([shared, rng.integers(1, vocab, int(rng.integers(*cont)))]) for _ in range(group)]
  b, length = len(rows), pad_length(max(len(r) for r in rows), 128)
  tokens, mask, action = np.zeros((b, length), np.int32), np.zeros((b, length), bool), np.zeros((b, length), bool)
  for i, r in enumerate(rows):
    tokens[i, : len(r)], mask[i, : len(r)] = r, True
    action[i, prompt : len(r)] = rng.random(len(r) - prompt) < 0.3
  return rows_batch(
    tokens,
    mask,
    action,
    np.where(action, -1.0, 0.0).astype(np.float32),
    adv_BxL=np.where(action, rng.normal(size=(b, 1)), 0.0).astype(np.float32),
    group_ids_B=np.repeat(np.arange(prompts), group).astype(np.int32),
  )


def run_workload(name: str, row_lens: list[int], repeats: int) -> dict:
  import jax
  from flax import nnx

  from jaxcredit.models.config import ModelConfig
  from jaxcredit.models.decoder import Decoder
  from jaxcredit.train.loop import step as step_lib
  from jaxcredit.train.loop.update import pack_update_batch

  shape, prompts, group, prompt, cont = WORKLOADS[name]
  cfg = ModelConfig(head_dim=64, rope_theta=10000.0, tie_word_embeddings=True, **shape)
  batch = rollout_batch(cfg.vocab_size, prompts, group, prompt, cont)
  graphdef, params, rest = step_lib.split_model(Decoder(cfg, rngs=nnx.Rngs(0)))
  loss_cfg = step_lib.PolicyLossConfig(max_len=1024)
  fn = jax.jit(lambda p, b: step_lib.loss_and_grads(step_lib.pg_token_loss, graphdef, p, rest, b, loss_cfg)[:2])

  def seconds(b):
    jax.block_until_ready(fn(params, b))
    times = []
    for _ in range(repeats):
      t = time.perf_counter()
      jax.block_until_ready(fn(params, b))
      times.append(time.perf_counter() - t)
    return min(times)

  unpacked = batch.for_device()
  rows = [{"layout": "unpacked", "shape": list(unpacked.tokens_NxL.shape), "seconds": seconds(unpacked)}]
  for cap in row_lens:
    packed = pack_update_batch(batch, length_bucket=128, max_row_len=cap, slot_bucket=64)
    rows.append(
      {
        "layout": f"packed, max_row_len={cap}",
        "shape": list(packed.tokens_NxL.shape),
        "scored_slots": list(packed.packed.slots_NxK.shape),
        "seconds": seconds(packed),
      }
    )
  for r in rows:
    r["speedup"] = rows[0]["seconds"] / r["seconds"]
    print(f"[packing] {name}: {r['layout']:<26} rows {r['shape']}  {r['seconds']:.2f} s  ({r['speedup']:.2f}x)")
  return {
    "model": shape,
    "rollouts": f"{prompts} x {group}",
    "real_tokens": int(batch.token_mask_NxL.sum()),
    "action_tokens": int(batch.action_mask_NxK.sum()),
    "rows": rows,
  }


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--workloads", default="quickstart,testbed")
  ap.add_argument("--row-lens", default="0,512,1024", help="packed row caps to time (0: the longest rollout's row)")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "packing_bench.json"))
  args = ap.parse_args(argv)
  names = [w for w in args.workloads.split(",") if w]
  unknown = [w for w in names if w not in WORKLOADS]
  if unknown:
    raise SystemExit(f"unknown workloads {unknown}; known: {sorted(WORKLOADS)}")
  if args.repeats < 1:
    raise SystemExit(f"--repeats must be >= 1, got {args.repeats}")
  row_lens = [int(x) for x in args.row_lens.split(",") if x]
  machine = machine_info()
  result = {
    "machine": machine,
    "repeats": args.repeats,
    "workloads": {name: run_workload(name, row_lens, args.repeats) for name in names},
  }
  record_load_after(machine)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  print(f"[packing] wrote {args.out}")
  return result


if __name__ == "__main__":
  main()
