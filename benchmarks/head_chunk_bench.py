"""The log-prob head's forward+backward at each sequence and vocabulary chunking.

`chunked_logprobs_and_entropies` at SmolLM2-135M's head shape ([4, 256] hidden states of width 576 against a
49,152-column head, float32, random values): the jitted gradient, with respect to the hidden states and the head, of
mean log-prob + 0.01 · mean entropy, for each `--chunks` pair seq_chunk x vocab_chunk (0: the default). Compile
excluded; the chunkings alternate within each of `--repeats` rounds; the minimum and median per chunking. Results
to `--out` (JSON) and `docs/benchmarks.md` ("The training forward+backward").

  python benchmarks/head_chunk_bench.py
  python benchmarks/head_chunk_bench.py --chunks 0x0,256x49152 --repeats 5
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

DEFAULT_CHUNKS = "0x0,256x16384,256x49152,1024x49152,1024x8192"


def parse_chunks(text: str) -> list[tuple[int, int]]:
  """'SxV,...' -> [(S, V), ...]; 0 keeps the function's default. Raises SystemExit naming a malformed pair."""
  out = []
  for item in (x for x in text.split(",") if x):
    parts = item.split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
      raise SystemExit(f"--chunks: {item!r} is not SEQxVOCAB (two non-negative ints)")
    out.append((int(parts[0]), int(parts[1])))
  if not out:
    raise SystemExit("--chunks is empty")
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--chunks", default=DEFAULT_CHUNKS, help="seq_chunk x vocab_chunk pairs (0: the default)")
  ap.add_argument("--shape", default="4,256,576,49152", help="B,L,D,V")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "head_chunk_bench.json"))
  args = ap.parse_args(argv)
  if args.repeats < 1:
    raise SystemExit(f"--repeats must be >= 1, got {args.repeats}")
  chunks = parse_chunks(args.chunks)
  b, l, d, v = (int(x) for x in args.shape.split(","))

  import jax

  from jaxcredit.models.logprobs import chunked_logprobs_and_entropies

  k = jax.random.split(jax.random.key(0), 3)
  h = jax.random.normal(k[0], (b, l, d)) * 0.5
  head = jax.random.normal(k[1], (d, v)) * 0.05
  targets = jax.random.randint(k[2], (b, l), 0, v)

  def grad_fn(seq_chunk, vocab_chunk):
    def loss(h, head):
      logp, entropy = chunked_logprobs_and_entropies(
        h, head, targets, 1.0, seq_chunk=seq_chunk or None, vocab_chunk=vocab_chunk or None
      )
      return logp.mean() + 0.01 * entropy.mean()

    return jax.jit(jax.grad(loss, argnums=(0, 1)))

  machine = machine_info()
  fns = [grad_fn(*c) for c in chunks]
  for f in fns:
    jax.block_until_ready(f(h, head))
  seconds = [[] for _ in chunks]
  for _ in range(args.repeats):
    for i, f in enumerate(fns):
      t0 = time.perf_counter()
      jax.block_until_ready(f(h, head))
      seconds[i].append(time.perf_counter() - t0)
  gflop = 4 * 2 * b * l * d * v / 1e9  # forward logits, their recomputation, dh, dhead
  rows = [
    {
      "seq_chunk": s or "default",
      "vocab_chunk": vc or "default",
      "seconds_min": min(t),
      "seconds_median": float(np.median(t)),
      "gflop_per_s": gflop / min(t),
    }
    for (s, vc), t in zip(chunks, seconds)
  ]
  result = {
    "machine": record_load_after(machine),
    "shape": {"B": b, "L": l, "D": d, "V": v},
    "products_gflop": gflop,
    "repeats": args.repeats,
    "rows": rows,
  }
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  for r in rows:
    print(f"[head] {r['seq_chunk']} x {r['vocab_chunk']}: {r['seconds_min']:.2f} s")
  print(f"[head] wrote {args.out}")
  return result


if __name__ == "__main__":
  main()
