"""The GPU check's first step (benchmarks/device_check.sh): the versions it runs on, then one tiny jitted step.

  python benchmarks/device_first_step.py --out OUT_DIR/first_step.json

Within seconds of start, on the image's own jax (0.11.2 on the lent GPU machine, 0.10.2 here): prints and records the
Python, jax, jaxlib, the backend's plugin, flax, optax, orbax-checkpoint, numpy, transformers and torch versions and
the devices; imports every library module the check's later steps use; builds a 2-layer decoder (`jaxcredit.models.
Decoder`, random weights, no checkpoint and no torch) and compiles and runs one policy-gradient gradient
(`train.step.loss_and_grads`, the same call as device_step.py's learner step) and one KV-cache decode step of the
sampler. An API the newer jax changed or removed fails here, in the first minute, with its traceback in the output
and `"ok": false` in the JSON, before the check spends minutes building Qwen3-0.6B.

Deprecation and future warnings raised meanwhile are recorded in the JSON (`"deprecations"`: what the next jax
will break); run with `-W error::DeprecationWarning` (tests/test_device_check.py does) they fail the step instead.

Exit code 0 when every part ran, 1 otherwise (the JSON says which part failed, with the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import sys
import time
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DISTRIBUTIONS = (
  "jax",
  "jaxlib",
  "jax-cuda13-plugin",
  "jax-cuda12-plugin",
  "flax",
  "optax",
  "orbax-checkpoint",
  "numpy",
  "transformers",
  "tokenizers",
  "torch",
  "ml-collections",
  "grain",
  "reasoning-gym",
)

MODULES = (
  # What device_step.py and async_bench.py reach: the model loader, the step, the trainer, the engines, the
  # quickstart's environment.
  "jaxcredit.models",
  "jaxcredit.sampling",
  "jaxcredit.train.loop.step",
  "jaxcredit.train.commands.trainer",
  "jaxcredit.train.loop.async_rollouts",
  "jaxcredit.envs.arithmetic",
  "jaxcredit.credit",
)


def versions() -> dict:
  out = {"python": platform.python_version()}
  for name in DISTRIBUTIONS:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def tiny_step() -> dict:
  """One jitted policy-gradient gradient and one cached decode step of a 2-layer decoder; seconds of each."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from jaxcredit.models import Decoder, ModelConfig
  from jaxcredit.models.kv_cache import init_cache
  from jaxcredit.trajectory import UpdateBatch
  from jaxcredit.train.loop import step as step_lib

  cfg = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8
  )
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  graphdef, params, rest = step_lib.split_model(model)
  b, length = 2, 16
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (b, length)).astype(np.int32)
  data = UpdateBatch(
    tokens_NxL=tokens,
    token_mask_NxL=np.ones((b, length), bool),
    action_mask_NxK=np.ones((b, length), bool),
    behavior_logp_NxK=np.full((b, length), -4.0, np.float32),
    adv_NxK=np.ones((b, length), np.float32),
    ref_logp_NxK=np.zeros((b, length), np.float32),
  )
  grad = jax.jit(
    lambda p, x: step_lib.loss_and_grads(step_lib.pg_token_loss, graphdef, p, rest, x, step_lib.PolicyLossConfig())
  )
  t0 = time.perf_counter()
  loss, grads, _ = jax.block_until_ready(grad(params, data))
  grad_s = time.perf_counter() - t0
  finite = bool(all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grads)))
  cache = init_cache(cfg, b, length + 4)

  @jax.jit
  def prefill_then_decode(p, cache, prompt_BxL):
    m = nnx.merge(graphdef, p, rest)
    _, cache = m(prompt_BxL, cache=cache, cache_is_empty=True)
    logits, cache = m(prompt_BxL[:, -1:], cache=cache)
    return logits

  t0 = time.perf_counter()
  logits = jax.block_until_ready(prefill_then_decode(params, cache, jnp.asarray(tokens)))
  decode_s = time.perf_counter() - t0
  return {
    "loss": float(np.asarray(loss)),
    "grads_finite": finite,
    "grad_first_call_s": grad_s,
    "decode_first_calls_s": decode_s,
    "decode_logits_shape": list(logits.shape),
  }


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out", required=True, help="the JSON to write")
  args = ap.parse_args(argv)
  t_start = time.perf_counter()
  result: dict = {"ok": False, "versions": versions()}
  print("[first step] versions:", json.dumps(result["versions"]), flush=True)
  part = "jax"
  caught = warnings.catch_warnings(record=True)
  seen = caught.__enter__()
  if not sys.warnoptions:  # record every deprecation; with -W error they raise instead
    warnings.simplefilter("always", DeprecationWarning)
    warnings.simplefilter("always", FutureWarning)
  try:
    import jax

    result["backend"] = jax.default_backend()
    result["devices"] = [str(d) for d in jax.devices()]
    print(f"[first step] backend {result['backend']}: {result['devices']}", flush=True)
    for name in MODULES:
      part = f"import {name}"
      importlib.import_module(name)
    part = "tiny step"
    result["tiny_step"] = tiny_step()
    result["ok"] = result["tiny_step"]["grads_finite"]
    if not result["ok"]:
      result["error"] = "tiny step: a gradient is not finite"
  except Exception:
    result["failed_part"] = part
    result["error"] = traceback.format_exc()
    print(f"[first step] FAILED at {part}:\n{result['error']}", file=sys.stderr, flush=True)
  finally:
    caught.__exit__(None, None, None)
  result["deprecations"] = sorted(
    {
      f"{w.category.__name__}: {w.message} ({os.path.relpath(w.filename, ROOT)}:{w.lineno})"
      for w in seen
      if issubclass(w.category, (DeprecationWarning, FutureWarning))
    }
  )
  for line in result["deprecations"]:
    print(f"[first step] {line}", flush=True)
  result["seconds"] = time.perf_counter() - t_start
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  print(f"[first step] {'ok' if result['ok'] else 'FAILED'} in {result['seconds']:.1f}s -> {args.out}", flush=True)
  return 0 if result["ok"] else 1


if __name__ == "__main__":
  sys.exit(main())
