"""The training forward+backward of SmolLM2-135M-Instruct (float32) against transformers + torch eager, same weights.

  python benchmarks/step_bench.py [--batch 4] [--length 256] [--repeats 3]
  python benchmarks/step_bench.py --remat-policies none,dots_no_batch,dots --repeats 5 --out benchmarks/results/step_bench_remat.json

Measured alternately in one process (median of `--repeats` rounds each):
  - jaxcredit: the jitted gradient of the policy-gradient loss (`train.step.loss_and_grads` with PPO-clip on token
    advantages; chunked log-probs over the vocabulary), at [batch, length];
  - transformers: `AutoModelForCausalLM` on the exported weights, train mode, log-softmax of the logits gathered at
    the next tokens, mean, `backward()`;
  - the floor: 6 · N · tokens FLOPs at the best 2048^3 float32 matmul rate measured here (XLA's and torch's);
  - where the jitted step's time goes: `--profile` adds the top XLA:CPU ops of one traced step (`jax.profiler`);
  - `--parts` adds, alternating in the same rounds, the gradient of the mean next-token log-prob with full [B, L, V]
    logits and a log-softmax (the head torch runs), the same through the chunked head (`sequence_logprobs`), and
    the trunk alone (the mean square of the final hidden states: no output head), so the head's share shows, and
    the same trunk-only gradient in torch (`transformers_trunk_only`), so the trunks compare without their heads;
  - each call's minor page faults (`minor_page_faults_median`): XLA:CPU allocates a call's temporaries as one buffer
    (hundreds of MB here), which glibc maps fresh and unmaps after every call, so each page is faulted in and
    zero-filled again on every step; `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (glibc >= 2.35: transparent huge pages
    for malloc's mappings) cuts the faults for both sides (docs/benchmarks.md, "Page faults").

Writes benchmarks/results/step_bench.json.
"""

import argparse
import collections
import dataclasses
import glob
import gzip
import json
import os
import resource
import shutil
import tempfile
import time

import numpy as np
from machine import machine_info, record_load_after


def _timed(fn, repeats, faults=None):
  """Wall seconds of `repeats` calls of `fn`; with a list `faults`, each call's minor page faults are appended to it
  (the process's `ru_minflt` before and after: pages the kernel mapped, and zero-filled, on first touch)."""
  out = []
  for _ in range(repeats):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.perf_counter()
    fn()
    out.append(time.perf_counter() - t)
    if faults is not None:
      faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
  return out


def matmul_rates():
  import jax
  import jax.numpy as jnp
  import torch

  a = jax.random.normal(jax.random.key(0), (2048, 2048))
  mm = jax.jit(lambda x: x @ x)
  mm(a).block_until_ready()
  xla = min(_timed(lambda: mm(a).block_until_ready(), 10))
  at = torch.randn(2048, 2048)
  at @ at
  tt = min(_timed(lambda: at @ at, 10))
  flops = 2 * 2048**3
  return {"xla_GFLOPs": flops / xla / 1e9, "torch_GFLOPs": flops / tt / 1e9}


def _parts(graphdef, params, rest, tokens) -> dict:
  """Jitted gradients (compiled here) of the mean next-token log-prob through full logits (`ce_full_logits`) and
  through the chunked head (`ce_chunked_head`), and of the trunk alone (`trunk_only`)."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from jaxcredit.models.logprobs import sequence_logprobs

  ids = jnp.asarray(tokens)
  mask = jnp.ones(ids.shape, bool)

  def hidden(p):
    model = nnx.merge(graphdef, p, rest)
    return model, model.hidden_states(ids, token_mask_BxL=mask)[0]

  def ce_full(p):
    model, h = hidden(p)
    logp = jax.nn.log_softmax((h @ model.output_head_DxV()).astype(jnp.float32)[:, :-1], -1)
    return -jnp.take_along_axis(logp, ids[:, 1:, None], -1).mean()

  def ce_chunked(p):
    return -sequence_logprobs(nnx.merge(graphdef, p, rest), ids, mask, 1.0).mean()

  def trunk(p):
    return jnp.mean(hidden(p)[1] ** 2)

  out = {}
  for name, loss in (("ce_full_logits", ce_full), ("ce_chunked_head", ce_chunked), ("trunk_only", trunk)):
    fn = jax.jit(jax.grad(loss))
    jax.block_until_ready(fn(params))
    out[name] = lambda fn=fn: jax.block_until_ready(fn(params))
  return out


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--length", type=int, default=256)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--profile", action="store_true")
  ap.add_argument("--parts", action="store_true", help="also time full-logits CE, chunked CE and the trunk alone")
  ap.add_argument(
    "--remat-policies",
    default="none",
    help="comma list of the policy-gradient steps to time: none (ModelConfig.remat=False, the default) or a "
    "ModelConfig.remat_policy with remat=True (nothing, dots, dots_no_batch); the first is `jaxcredit`, the others "
    "`jaxcredit_remat_<policy>`",
  )
  ap.add_argument("--out", default="benchmarks/results/step_bench.json")
  args = ap.parse_args()

  import jax
  import torch
  from transformers import AutoModelForCausalLM

  from jaxcredit.models import converted_cache_dir, load_model, smollm2_gguf_path
  from jaxcredit.models.hf import export_hf
  from jaxcredit.trajectory import UpdateBatch
  from jaxcredit.train.loop import step as step_lib

  results = {
    "machine": machine_info(),
  }
  results["machine"].update(matmul_rates())
  b, length = args.batch, args.length
  model, cfg = load_model(smollm2_gguf_path())
  num_params = sum(x.size for x in jax.tree.leaves(model))
  graphdef, params, rest = step_lib.split_model(model)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, cfg.vocab_size, (b, length)).astype(np.int32)
  batch = UpdateBatch(
    tokens_NxL=tokens,
    token_mask_NxL=np.ones((b, length), bool),
    action_mask_NxK=np.ones((b, length), bool),
    behavior_logp_NxK=np.full((b, length), -5.0, np.float32),
    adv_NxK=np.ones((b, length), np.float32),
    ref_logp_NxK=np.zeros((b, length), np.float32),
  )

  def policy_gradient(policy):
    """The jitted gradient of the policy-gradient loss with the model's layers rematerialised as `policy` says."""
    remat = {"remat": policy != "none", "remat_policy": "nothing" if policy == "none" else policy}
    model.cfg = dataclasses.replace(cfg, **remat)  # a static field: the graph definition carries it
    g = step_lib.split_model(model)[0]
    model.cfg = cfg
    return jax.jit(
      lambda p, bt: step_lib.loss_and_grads(step_lib.pg_token_loss, g, p, rest, bt, step_lib.PolicyLossConfig())[1]
    )

  policies = [p.strip() for p in args.remat_policies.split(",") if p.strip()]
  grads = {}
  for k, policy in enumerate(policies):
    name = "jaxcredit" if k == 0 else f"jaxcredit_remat_{policy}"
    grads[name] = policy_gradient(policy)
    t = time.perf_counter()
    jax.block_until_ready(grads[name](params, batch))
    results[f"{name}_first_call_s"] = time.perf_counter() - t
  results["remat_policies"] = policies
  grad = grads["jaxcredit"]

  hf_dir = tempfile.mkdtemp(prefix="step_bench_hf_")
  shutil.rmtree(hf_dir)
  export_hf(converted_cache_dir(smollm2_gguf_path()), hf_dir)
  hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).train()
  shutil.rmtree(hf_dir, ignore_errors=True)
  ids = torch.tensor(tokens.astype(np.int64))

  def torch_step():
    logits = hf(ids).logits
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    (-logp.mean()).backward()
    hf.zero_grad(set_to_none=True)

  def torch_trunk():  # the trunk alone, as `trunk_only`: no output head
    (hf.model(ids).last_hidden_state ** 2).mean().backward()
    hf.zero_grad(set_to_none=True)

  torch_step()
  steps = {name: lambda g=g: jax.block_until_ready(g(params, batch)) for name, g in grads.items()}
  steps["transformers"] = torch_step
  if args.parts:
    steps.update(_parts(graphdef, params, rest, tokens))
    torch_trunk()
    steps["transformers_trunk_only"] = torch_trunk
  runs = {name: [] for name in steps}
  faults = {name: [] for name in steps}
  for _ in range(args.repeats):
    for name, fn in steps.items():
      runs[name] += _timed(fn, 1, faults[name])
  flops = 6 * num_params * b * length
  best = max(results["machine"]["xla_GFLOPs"], results["machine"]["torch_GFLOPs"])
  results["fwd_bwd"] = {
    "batch": b,
    "length": length,
    "params": int(num_params),
    "flops": flops,
    "floor_s": flops / best / 1e9,
    **{f"{k}_s": float(np.median(v)) for k, v in runs.items()},
    "runs_s": runs,
    "minor_page_faults_median": {k: int(np.median(v)) for k, v in faults.items()},
  }
  r = results["fwd_bwd"]
  print(
    f"fwd+bwd [{b}, {length}]: jaxcredit {r['jaxcredit_s']:.2f} s, transformers {r['transformers_s']:.2f} s "
    f"({r['transformers_s'] / r['jaxcredit_s']:.2f}x), floor {r['floor_s']:.2f} s at {best:.0f} GFLOP/s "
    f"(XLA {results['machine']['xla_GFLOPs']:.0f}, torch {results['machine']['torch_GFLOPs']:.0f})"
  )
  for name in [*list(grads)[1:], "ce_full_logits", "ce_chunked_head", "trunk_only", "transformers_trunk_only"]:
    if f"{name}_s" in r:
      print(f"  {name}: {r[f'{name}_s']:.2f} s")
  print(
    "  minor page faults a call (median): " + ", ".join(f"{k} {v}" for k, v in r["minor_page_faults_median"].items())
  )

  if args.profile:
    trace_dir = tempfile.mkdtemp(prefix="step_bench_trace_")
    jax.profiler.start_trace(trace_dir)
    jax.block_until_ready(grad(params, batch))
    jax.profiler.stop_trace()
    trace = json.load(gzip.open(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)[0]))
    by_kind = collections.Counter()
    for e in trace["traceEvents"]:
      if e.get("ph") == "X" and "dur" in e and not e["name"].startswith(("ThunkExecutor", "$", "Slinky")):
        by_kind[e["name"].split(".")[0]] += e["dur"]
    total = sum(by_kind.values())
    results["profile_share"] = {k: v / total for k, v in by_kind.most_common(12)}
    for k, v in by_kind.most_common(8):
      print(f"  {100 * v / total:5.1f}%  {k}")
    shutil.rmtree(trace_dir, ignore_errors=True)
  record_load_after(results["machine"])
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)


if __name__ == "__main__":
  main()
