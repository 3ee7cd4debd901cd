"""Qwen3 forward+backward: jaxcredit against Tunix's Qwen3 on the same random Hugging Face checkpoint.

  python benchmarks/qwen3_step_bench.py --tunix-python /path/to/tunix-venv/bin/python [--repeats 3]

The checkpoint: a random `Qwen3ForCausalLM` from transformers + torch with Qwen3-0.6B's shapes (hidden 1024,
MLP 3072, 16 query heads and 8 key/value heads of 128, qk-norm, vocabulary 151,936, tied embeddings) cut to
`--layers` layers (default 4), float32, saved as safetensors.

Both sides compute the gradient of the mean next-token log-prob of the same [batch, length] random tokens with
respect to every parameter, jitted, float32:
  - jaxcredit: `load_model` on the folder, `sequence_logprobs` (chunked over the vocabulary; the [B, L, V] logits
    never exist), as the trainer's loss uses it;
  - Tunix (`google-tunix`, installed in its own virtual environment and kept out of this project's
    dependencies): `tunix.models.qwen3.params.create_model_from_safe_tensors`, the model's full [B, L, V] logits,
    log-softmax, gather.
Tunix runs in a worker subprocess started from `--tunix-python`; rounds alternate between the two processes (one
jaxcredit step, then one Tunix step), median of `--repeats` rounds, compile excluded. The loss values of both sides
are recorded: they must agree (same weights, same tokens).

Writes benchmarks/results/qwen3_step_bench.json.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from machine import machine_info, record_load_after

# The Tunix side, run by --tunix-python with the checkpoint folder, batch and length as arguments. It answers each
# line "run" on stdin with one JSON line {"seconds", "loss"}.
TUNIX_WORKER = r'''
import json, sys, time
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from tunix.models.qwen3 import model as qwen3_model, params as qwen3_params
folder, b, length, layers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cfg_json = json.load(open(folder + "/config.json"))
ROPE_THETA = int(sys.argv[5])  # transformers 5 writes it under "rope_parameters"
cfg = qwen3_model.ModelConfig(
    num_layers=layers, vocab_size=cfg_json["vocab_size"], embed_dim=cfg_json["hidden_size"],
    hidden_dim=cfg_json["intermediate_size"], num_heads=cfg_json["num_attention_heads"],
    head_dim=cfg_json["head_dim"], num_kv_heads=cfg_json["num_key_value_heads"],
    rope_theta=ROPE_THETA, norm_eps=cfg_json["rms_norm_eps"],
    use_tied_embedding=cfg_json["tie_word_embeddings"], dtype=jnp.float32, param_dtype=jnp.float32)
model = qwen3_params.create_model_from_safe_tensors(folder, cfg, dtype=jnp.float32)
graphdef, params, rest = nnx.split(model, nnx.Param, ...)
tokens = jnp.asarray(np.load(folder + "/bench_tokens.npy"))
positions = jnp.broadcast_to(jnp.arange(length)[None], (b, length))
mask = jnp.broadcast_to(jnp.tril(jnp.ones((length, length), jnp.bool_))[None], (b, length, length))

def loss_fn(p):
  m = nnx.merge(graphdef, p, rest)
  logits, _ = m(tokens, positions, None, mask)
  logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

step = jax.jit(jax.value_and_grad(loss_fn))
jax.block_until_ready(step(params))
print(json.dumps({"ready": True, "jax": jax.__version__}), flush=True)
for line in sys.stdin:
  if line.strip() != "run":
    break
  t = time.perf_counter()
  loss, grads = jax.block_until_ready(step(params))
  print(json.dumps({"seconds": time.perf_counter() - t, "loss": float(loss)}), flush=True)
'''


ROPE_THETA = 1_000_000


def make_checkpoint(folder: str, layers: int) -> int:
  import torch
  from transformers import Qwen3Config, Qwen3ForCausalLM

  torch.manual_seed(0)
  cfg = Qwen3Config(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=layers,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=ROPE_THETA,
    tie_word_embeddings=True,
    max_position_embeddings=4096,
    torch_dtype="float32",
  )
  model = Qwen3ForCausalLM(cfg)
  model.save_pretrained(folder, safe_serialization=True)
  return sum(p.numel() for p in model.parameters())


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--tunix-python", required=True, help="a Python with google-tunix installed (its own venv)")
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--length", type=int, default=512)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--out", default="benchmarks/results/qwen3_step_bench.json")
  args = ap.parse_args()
  b, length = args.batch, args.length

  folder = tempfile.mkdtemp(prefix="qwen3_step_bench_")
  try:
    num_params = make_checkpoint(folder, args.layers)
    tokens = np.random.default_rng(0).integers(0, 151936, (b, length)).astype(np.int32)
    np.save(os.path.join(folder, "bench_tokens.npy"), tokens)

    worker = subprocess.Popen(
      [args.tunix_python, "-c", TUNIX_WORKER, folder, str(b), str(length), str(args.layers), str(ROPE_THETA)],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      text=True,
    )

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxcredit.models import load_model
    from jaxcredit.sampling import sequence_logprobs

    model, cfg = load_model(folder, cache_dir=os.path.join(folder, "converted"))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens_j, mask_j = jnp.asarray(tokens), jnp.ones((b, length), jnp.bool_)

    def loss_fn(p):
      logp = sequence_logprobs(nnx.merge(graphdef, p, rest), tokens_j, mask_j, 1.0)
      return -jnp.mean(logp[:, 1:])

    step = jax.jit(jax.value_and_grad(loss_fn))
    t = time.perf_counter()
    jax.block_until_ready(step(params))
    first_call = time.perf_counter() - t

    line = worker.stdout.readline()
    ready = json.loads(line) if line.strip() else {}
    if not ready.get("ready"):
      raise RuntimeError(f"the Tunix worker did not start: {ready}")
    machine = machine_info(tunix_jax=ready.get("jax"))
    runs = {"jaxcredit": [], "tunix": []}
    losses = {}
    for _ in range(args.repeats):
      t = time.perf_counter()
      loss, _ = jax.block_until_ready(step(params))
      runs["jaxcredit"].append(time.perf_counter() - t)
      losses["jaxcredit"] = float(loss)
      worker.stdin.write("run\n")
      worker.stdin.flush()
      reply = json.loads(worker.stdout.readline())
      runs["tunix"].append(reply["seconds"])
      losses["tunix"] = reply["loss"]
    worker.stdin.close()
    worker.wait(timeout=60)
  finally:
    shutil.rmtree(folder, ignore_errors=True)

  med = {k: float(np.median(v)) for k, v in runs.items()}
  results = {
    "machine": record_load_after(machine),
    "checkpoint": {
      "layers": args.layers,
      "params": int(num_params),
      "hidden": 1024,
      "intermediate": 3072,
      "heads": 16,
      "kv_heads": 8,
      "head_dim": 128,
      "vocab": 151936,
      "tied": True,
    },
    "batch": b,
    "length": length,
    "jaxcredit_first_call_s": first_call,
    **{f"{k}_s": v for k, v in med.items()},
    "runs_s": runs,
    "loss": losses,
    "speedup": med["tunix"] / med["jaxcredit"],
  }
  print(
    f"Qwen3 {args.layers} layers fwd+bwd [{b}, {length}]: jaxcredit {med['jaxcredit']:.2f} s, Tunix "
    f"{med['tunix']:.2f} s ({results['speedup']:.2f}x); loss {losses['jaxcredit']:.5f} vs {losses['tunix']:.5f}"
  )
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)


if __name__ == "__main__":
  main()
