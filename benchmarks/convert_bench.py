"""Streaming HF -> converted-checkpoint conversion: peak resident memory against the largest input shard, and the
conversion, load and export times. Writes benchmarks/results/convert.json.

Builds a random Qwen3 checkpoint with transformers (float32, untied, sharded by save_pretrained's max_shard_size)
in a temporary folder, then runs each step in a fresh Python process so that its memory is its own:
  convert  `jaxcredit.models.hf.convert_hf` (what `jaxcredit convert --hf` runs); its peak is VmHWM above the RSS
           at the start of the streaming (after imports and the writer's setup), and the whole process's
           VmHWM above its RSS after imports is recorded too.
  load     `jaxcredit.models.load` of the converted folder (orbax restore onto the CPU device).
  export   `jaxcredit.models.hf.export_hf`, then a tensor-by-tensor bytes comparison with the source.

  python benchmarks/convert_bench.py [--layers 8] [--hidden 1024] [--intermediate 3072] [--vocab 32768]
                                     [--shard 200MB]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_info, record_load_after

ROOT = Path(__file__).resolve().parent.parent

_PRELUDE = r"""
import json, sys, time
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
import jaxcredit.models, jaxcredit.models.hf as hf
rss_after_imports = status("VmRSS")
"""

_CONVERT = (
  _PRELUDE
  + r"""
stats = hf.convert_hf(sys.argv[1], sys.argv[2])
stats.update(rss_after_imports_bytes=rss_after_imports, process_peak_rss_bytes=status("VmHWM"))
print(json.dumps(stats))
"""
)

_LOAD = (
  _PRELUDE
  + r"""
import jax
t = time.perf_counter()
model, cfg = jaxcredit.models.load(sys.argv[1])
jax.block_until_ready(model.embedding[...])
print(json.dumps({"seconds": time.perf_counter() - t, "rss_after_imports_bytes": rss_after_imports,
                  "process_peak_rss_bytes": status("VmHWM"), "params": cfg.num_params(), "dtype": cfg.dtype}))
"""
)

_EXPORT = (
  _PRELUDE
  + r"""
stats = hf.export_hf(sys.argv[1], sys.argv[2])
t = time.perf_counter()
source = dict(hf.read_inventory(sys.argv[3])[0])
exported = dict(hf.read_inventory(sys.argv[2])[0])
same = sorted(source) == sorted(exported) and all(
    source[n].dtype == exported[n].dtype and hf.read_tensor(source[n]).tobytes() == hf.read_tensor(exported[n]).tobytes()
    for n in source)
stats.update(bit_exact=same, compare_seconds=time.perf_counter() - t, process_peak_rss_bytes=status("VmHWM"),
             rss_after_imports_bytes=rss_after_imports)
print(json.dumps(stats))
"""
)


def _run(script, *args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  t = time.perf_counter()
  p = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, env=env, cwd=ROOT)
  if p.returncode != 0:
    raise SystemExit(f"subprocess failed:\n{p.stderr[-4000:]}")
  out = json.loads(p.stdout.strip().splitlines()[-1])
  out["wall_seconds_with_startup"] = time.perf_counter() - t
  return out


def _build(folder, args):
  """The random checkpoint, built in its own process so that torch's memory is gone before the measurements."""
  script = r"""
import sys, json, torch
from transformers import Qwen3Config, Qwen3ForCausalLM
layers, hidden, inter, vocab, shard, folder = sys.argv[1:]
torch.manual_seed(0)
cfg = Qwen3Config(vocab_size=int(vocab), hidden_size=int(hidden), intermediate_size=int(inter),
                  num_hidden_layers=int(layers), num_attention_heads=int(hidden) // 128, num_key_value_heads=4,
                  head_dim=128, tie_word_embeddings=False)
Qwen3ForCausalLM(cfg).save_pretrained(folder, max_shard_size=shard)
print(json.dumps({}))
"""
  _run(script, args.layers, args.hidden, args.intermediate, args.vocab, args.shard, folder)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--hidden", type=int, default=1024)
  ap.add_argument("--intermediate", type=int, default=3072)
  ap.add_argument("--vocab", type=int, default=32768)
  ap.add_argument("--shard", default="200MB")
  ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "convert.json"))
  args = ap.parse_args()

  machine = machine_info()
  with tempfile.TemporaryDirectory(prefix="convert_bench-") as tmp:
    tmp = Path(tmp)
    t = time.perf_counter()
    _build(tmp / "hf", args)
    build_s = time.perf_counter() - t
    shards = sorted(p.stat().st_size for p in (tmp / "hf").glob("*.safetensors"))
    sys.path.insert(0, str(ROOT))
    from jaxcredit.models.hf import read_inventory

    largest_tensor = max(t.end - t.start for t in read_inventory(tmp / "hf")[0].values())
    convert = _run(_CONVERT, tmp / "hf", tmp / "converted")
    load = _run(_LOAD, tmp / "converted")
    export = _run(_EXPORT, tmp / "converted", tmp / "exported", tmp / "hf")
  mib = 2**20
  peak = convert["peak_rss_above_baseline_bytes"]
  results = {
    "machine": record_load_after(machine),
    "checkpoint": {
      "model": "Qwen3 (random, float32, untied)",
      "layers": args.layers,
      "hidden": args.hidden,
      "intermediate": args.intermediate,
      "vocab": args.vocab,
      "max_shard_size": args.shard,
      "shards": len(shards),
      "shard_mib": [round(s / mib, 1) for s in shards],
      "total_mib": round(sum(shards) / mib, 1),
      "build_seconds": build_s,
    },
    "convert": convert,
    "load": load,
    "export": export,
    "summary": {
      "largest_shard_mib": round(shards[-1] / mib, 1),
      "largest_tensor_mib": round(largest_tensor / mib, 1),
      "convert_peak_above_baseline_mib": round(peak / mib, 1),
      "convert_peak_over_largest_shard": round(peak / shards[-1], 3),
      "convert_peak_over_largest_tensor": round(peak / largest_tensor, 3),
      "convert_process_peak_above_imports_mib": round(
        (convert["process_peak_rss_bytes"] - convert["rss_after_imports_bytes"]) / mib, 1
      ),
      "convert_seconds": round(convert["seconds"], 2),
      "load_seconds": round(load["seconds"], 2),
      "load_process_peak_above_imports_mib": round(
        (load["process_peak_rss_bytes"] - load["rss_after_imports_bytes"]) / mib, 1
      ),
      "export_seconds": round(export["seconds"], 2),
      "round_trip_bit_exact": export["bit_exact"],
    },
  }
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
  print(json.dumps(results["summary"], indent=2))


if __name__ == "__main__":
  main()
