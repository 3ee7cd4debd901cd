"""Compile time of the training step's forward+backward against depth: 4 and 36 layers of the same width.

The decoder scans its layers over stacked parameters, so the compiled program holds one layer body whatever the
depth; this measures that claim. Each (layers, remat) point is lowered on abstract arrays (no weights) and
compiled in a fresh subprocess (no in-process or persistent cache), on this machine's CPU backend.

  python benchmarks/compile_bench.py [--hidden 2560 --heads 32 --kv-heads 8 --intermediate 9728]

Writes benchmarks/results/compile_bench.json.
"""

import argparse
import json
import os
import subprocess
import sys

from machine import machine_info, record_load_after

CHILD = r"""
import json, sys, time
import jax, jax.numpy as jnp
from flax import nnx
from jaxcredit.models import Decoder, ModelConfig
from jaxcredit.models.logprobs import sequence_logprobs

a = json.loads(sys.argv[1])
cfg = ModelConfig(vocab_size=a["vocab"], hidden_size=a["hidden"], intermediate_size=a["intermediate"],
                  num_layers=a["layers"], num_heads=a["heads"], num_kv_heads=a["kv_heads"], head_dim=a["head_dim"],
                  qk_norm=True, dtype="bfloat16", remat=a["remat"], attention_impl="chunked",
                  attention_chunk=a["chunk"])
model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
graphdef, params, rest = nnx.split(model, nnx.Param, ...)

def loss(p, tokens, mask):
  return -jnp.sum(sequence_logprobs(nnx.merge(graphdef, p, rest), tokens, mask, 1.0))

tokens = jax.ShapeDtypeStruct((a["batch"], a["length"]), jnp.int32)
mask = jax.ShapeDtypeStruct((a["batch"], a["length"]), jnp.bool_)
t0 = time.perf_counter()
lowered = jax.jit(jax.value_and_grad(loss)).lower(params, tokens, mask)
t1 = time.perf_counter()
lowered.compile()
t2 = time.perf_counter()
print("RESULT", json.dumps({"lower_s": t1 - t0, "compile_s": t2 - t1, "total_s": t2 - t0}))
"""


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--hidden", type=int, default=2560)
  ap.add_argument("--intermediate", type=int, default=9728)
  ap.add_argument("--heads", type=int, default=32)
  ap.add_argument("--kv-heads", type=int, default=8)
  ap.add_argument("--head-dim", type=int, default=128)
  ap.add_argument("--vocab", type=int, default=151936)
  ap.add_argument("--batch", type=int, default=1)
  ap.add_argument("--length", type=int, default=4096)
  ap.add_argument("--chunk", type=int, default=1024)
  ap.add_argument("--layers", type=int, nargs="+", default=[4, 36])
  ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "compile_bench.json"))
  args = ap.parse_args()
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_COMPILATION_CACHE="false")
  machine = machine_info()
  rows = []
  for remat in (False, True):
    for layers in args.layers:
      spec = dict(
        vocab=args.vocab,
        hidden=args.hidden,
        intermediate=args.intermediate,
        layers=layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        batch=args.batch,
        length=args.length,
        chunk=args.chunk,
        remat=remat,
      )
      proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)], env=env, capture_output=True, text=True, check=False
      )
      line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
      if proc.returncode or not line:
        raise SystemExit(f"child failed for {spec}:\n{proc.stderr[-3000:]}")
      row = dict(spec, **json.loads(line[0][len("RESULT ") :]))
      rows.append(row)
      print(f"layers={layers:3d} remat={remat!s:5s} lower {row['lower_s']:.1f}s compile {row['compile_s']:.1f}s")
  by = {(r["remat"], r["layers"]): r["total_s"] for r in rows}
  ratios = {f"remat={remat}": by[(remat, max(args.layers))] / by[(remat, min(args.layers))] for remat in (False, True)}
  print("ratio deepest/shallowest (lower+compile):", ratios)
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(
      {
        "rows": rows,
        "ratio_deep_over_shallow": ratios,
        "machine": record_load_after(machine),
      },
      f,
      indent=1,
    )


if __name__ == "__main__":
  main()
