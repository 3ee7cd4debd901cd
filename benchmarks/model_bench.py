"""SmolLM2-135M-Instruct on this machine: fwd+bwd tokens/s of the policy-gradient step and sampler decode
ms/step, the two numbers that size the quickstart. Writes benchmarks/results/model_bench.json.

  python benchmarks/model_bench.py [--batch 8] [--length 256]
"""

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from machine import machine_info, record_load_after


def _median_time(fn, repeats):
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--length", type=int, default=256)
  ap.add_argument("--decode-batches", default="8,32")
  ap.add_argument("--repeats", type=int, default=3)
  args = ap.parse_args()

  from jaxcredit import sharding
  from jaxcredit.models import load_model, smollm2_gguf_path
  from jaxcredit.models.decoder import param_logical_axes
  from jaxcredit.sampling import Sampler, SamplingParams
  from jaxcredit.trajectory import UpdateBatch
  from jaxcredit.train.loop import step as step_lib

  model, cfg = load_model(smollm2_gguf_path())
  graphdef, params, rest = step_lib.split_model(model)
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
  p_sh = sharding.param_shardings(params, mesh, param_logical_axes(cfg))
  opt = step_lib.make_optimizer(1e-5)
  o_sh = step_lib.opt_state_shardings(opt, params, p_sh, mesh)
  b, length = args.batch, args.length
  rng = np.random.default_rng(0)
  batch = UpdateBatch(
    tokens_NxL=rng.integers(0, cfg.vocab_size, (b, length)).astype(np.int32),
    token_mask_NxL=np.ones((b, length), bool),
    action_mask_NxK=np.ones((b, length), bool),
    behavior_logp_NxK=np.full((b, length), -5.0, np.float32),
    adv_NxK=np.ones((b, length), np.float32),
    ref_logp_NxK=np.zeros((b, length), np.float32),
  )
  grad = jax.jit(
    lambda p, bt: step_lib.loss_and_grads(step_lib.pg_token_loss, graphdef, p, rest, bt, step_lib.PolicyLossConfig())[1]
  )
  machine = machine_info()
  t0 = time.perf_counter()
  jax.block_until_ready(grad(params, batch))
  compile_s = time.perf_counter() - t0
  step_s = _median_time(lambda: grad(params, batch), args.repeats)
  results = {
    "machine": record_load_after(machine),
    "fwd_bwd": {
      "batch": b,
      "length": length,
      "first_call_s": compile_s,
      "step_s": step_s,
      "tokens_per_s": b * length / step_s,
    },
  }
  print(f"fwd+bwd B={b} L={length}: {step_s:.2f} s/step, {b * length / step_s:.0f} tokens/s")

  sampler = Sampler(model, max_len=320, pad_id=2, chunk_size=8, prompt_bucket=32, batch_buckets=())
  results["decode"] = []
  for nb in [int(x) for x in args.decode_batches.split(",")]:
    prompts = [list(rng.integers(0, 1000, 120)) for _ in range(nb)]
    sp = SamplingParams(temperature=1.0, max_new_tokens=48)
    sampler.generate(prompts, sp, jax.random.key(0))  # compile
    short = SamplingParams(temperature=1.0, max_new_tokens=8)
    t_short = _median_time(lambda: sampler.generate(prompts, short, jax.random.key(1)).tokens, args.repeats)
    t_long = _median_time(lambda: sampler.generate(prompts, sp, jax.random.key(2)).tokens, args.repeats)
    ms = (t_long - t_short) / 40 * 1000  # the prefill cancels out
    results["decode"].append({"batch": nb, "prompt_tokens": 120, "ms_per_step": ms, "prefill_plus_8_s": t_short})
    print(f"decode B={nb}: {ms:.0f} ms/step (prefill of {nb}x120 tokens + 8 steps: {t_short:.1f} s)")
  os.makedirs("benchmarks/results", exist_ok=True)
  with open("benchmarks/results/model_bench.json", "w") as f:
    json.dump(results, f, indent=2)


if __name__ == "__main__":
  main()
