"""Where the trunk's time goes against torch: one SmolLM2-135M block's parts, forward+backward, float32, on CPU.

  python benchmarks/layer_parts_bench.py [--repeats 20] [--layers 8]

Each part is jitted in JAX (the library's own functions) and run eagerly in transformers + torch (the same shapes,
random weights; torch at its default threads), both at [4, 256] tokens; the time is the minimum over `--repeats`
calls, the two sides alternating call by call:
  - `attention_core`: grouped-query causal attention of q [4, 256, 9, 64] on k, v [4, 256, 3, 64]
    (`models.attention.attention` against `scaled_dot_product_attention(is_causal=True, enable_gqa=True)`);
  - `attention_block`: RMSNorm, q/k/v projections, RoPE, attention, output projection, residual
    (`decoder._qkv` + `attention` + `_dense` against `LlamaRMSNorm` + `LlamaAttention` with sdpa);
  - `mlp_block`: RMSNorm, SwiGLU MLP, residual (`decoder.rms_norm` + the dense MLP against `LlamaMLP`);
  - `trunk`: `--layers` blocks (`Decoder.hidden_states`, the layers scanned as the library runs them, and the same
    with the scan fully unrolled) against `LlamaModel`, gradient of the mean square of the final hidden states.

Writes benchmarks/results/layer_parts_bench.json (milliseconds).
"""

import argparse
import json
import os
import time

import numpy as np
from machine import machine_info, record_load_after

B, L, D, F, H, K, DH = 4, 256, 576, 1536, 9, 3, 64


def _min_ms(fns: dict, repeats: int) -> dict:
  """Minimum wall milliseconds of each zero-argument callable, the callables alternating call by call."""
  for fn in fns.values():
    fn()
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      t = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - t)
  return {name: 1e3 * min(v) for name, v in times.items()}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--repeats", type=int, default=20)
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--out", default="benchmarks/results/layer_parts_bench.json")
  args = ap.parse_args()

  import jax
  import jax.numpy as jnp
  import torch
  import torch.nn.functional as torch_f
  from flax import nnx
  from transformers import LlamaConfig
  from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaMLP,
    LlamaModel,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
  )

  from jaxcredit.models import decoder as dec
  from jaxcredit.models.attention import attention
  from jaxcredit.models.config import ModelConfig
  from jaxcredit.models.hf_config import hf_config_from_model_config

  cfg = ModelConfig(
    vocab_size=64,
    hidden_size=D,
    intermediate_size=F,
    num_layers=args.layers,
    num_heads=H,
    num_kv_heads=K,
    head_dim=DH,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=True,
  )
  tcfg = LlamaConfig(**hf_config_from_model_config(cfg), attn_implementation="sdpa")  # the same shapes for torch
  keys = jax.random.split(jax.random.key(0), 12)
  normal = lambda i, shape, scale=1.0: scale * jax.random.normal(keys[i], shape)  # noqa: E731
  as_torch = lambda a, grad=False: torch.from_numpy(np.array(a)).requires_grad_(grad)  # noqa: E731
  results = {
    "machine": machine_info(),
    "shapes": {"batch": B, "length": L, "hidden": D, "mlp": F, "heads": H, "kv_heads": K, "head_dim": DH},
    "ms": {},
  }
  mask = jnp.broadcast_to(jnp.tril(jnp.ones((L, L), bool))[None], (B, L, L))

  # attention core
  q, k, v, dout = normal(0, (B, L, H, DH)), normal(1, (B, L, K, DH)), normal(2, (B, L, K, DH)), normal(3, (B, L, H, DH))
  core = jax.jit(lambda q, k, v: jax.vjp(lambda *a: attention(*a, mask), q, k, v)[1](dout))
  tq, tk, tv = (as_torch(jnp.swapaxes(a, 1, 2), grad=True) for a in (q, k, v))
  tdout = as_torch(jnp.swapaxes(dout, 1, 2))

  def torch_core():
    torch_f.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True).backward(tdout)

  # attention block and MLP block
  x, dy = normal(4, (B, L, D)), normal(5, (B, L, D))
  p = {
    "attn_norm": jnp.ones(D),
    "wq": normal(6, (D, H, DH), 0.02),
    "wk": normal(7, (D, K, DH), 0.02),
    "wv": normal(8, (D, K, DH), 0.02),
    "wo": normal(9, (H, DH, D), 0.02),
    "mlp_norm": jnp.ones(D),
    "w_gate": normal(10, (D, F), 0.02),
    "w_up": normal(11, (D, F), 0.02),
    "w_down": normal(0, (F, D), 0.02),
  }
  cos, sin = dec.rope_cos_sin(jnp.broadcast_to(jnp.arange(L)[None], (B, L)), DH, 10000.0, cfg)

  def attention_block(x, p):
    q, k, v = dec._qkv(cfg, x, p, cos, sin)
    return x + dec._dense(attention(q, k, v, mask).reshape(B, L, H * DH), p["wo"].reshape(H * DH, D))

  def mlp_block(x, p):
    h = dec.rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
    return x + dec._dense(jax.nn.silu(dec._dense(h, p["w_gate"])) * dec._dense(h, p["w_up"]), p["w_down"])

  attn_grad = jax.jit(lambda x, p: jax.vjp(attention_block, x, p)[1](dy))
  mlp_grad = jax.jit(lambda x, p: jax.vjp(mlp_block, x, p)[1](dy))
  tx, tdy = as_torch(x, grad=True), as_torch(dy)
  t_attn, t_norm, t_mlp, t_rope = (
    LlamaAttention(tcfg, 0),
    LlamaRMSNorm(D, 1e-5),
    LlamaMLP(tcfg),
    LlamaRotaryEmbedding(tcfg),
  )
  t_pos = torch.arange(L)[None].expand(B, L)

  def torch_attention_block():
    (tx + t_attn(t_norm(tx), t_rope(tx, t_pos), None)[0]).backward(tdy)

  def torch_mlp_block():
    (tx + t_mlp(t_norm(tx))).backward(tdy)

  # the trunk: scanned (as the library runs it) and unrolled
  model = dec.Decoder(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (B, L)), jnp.int32)

  def trunk_loss(p):
    return jnp.mean(jnp.square(nnx.merge(graphdef, p).hidden_states(tokens)[0]))

  trunk_scanned = jax.jit(jax.grad(trunk_loss))
  t = time.perf_counter()
  jax.block_until_ready(trunk_scanned(params))
  compile_scanned = time.perf_counter() - t
  scan = jax.lax.scan
  jax.lax.scan = lambda *a, **kw: scan(*a, **{**kw, "unroll": True})
  try:
    trunk_unrolled = jax.jit(jax.grad(trunk_loss))
    t = time.perf_counter()
    jax.block_until_ready(trunk_unrolled(params))
    compile_unrolled = time.perf_counter() - t
  finally:
    jax.lax.scan = scan
  t_model = LlamaModel(tcfg).train()
  t_tokens = torch.tensor(np.asarray(tokens), dtype=torch.long)

  def torch_trunk():
    (t_model(t_tokens).last_hidden_state ** 2).mean().backward()
    t_model.zero_grad(set_to_none=True)

  done = lambda f: lambda: jax.block_until_ready(f())  # noqa: E731
  parts = {
    "attention_core": (done(lambda: core(q, k, v)), torch_core, args.repeats),
    "attention_block": (done(lambda: attn_grad(x, p)), torch_attention_block, args.repeats),
    "mlp_block": (done(lambda: mlp_grad(x, p)), torch_mlp_block, args.repeats),
  }
  for name, (jax_fn, torch_fn, repeats) in parts.items():
    ms = _min_ms({"jaxcredit": jax_fn, "torch": torch_fn}, repeats)
    results["ms"][name] = ms
    print(f"{name:16s} jaxcredit {ms['jaxcredit']:7.1f} ms  torch {ms['torch']:7.1f} ms")
  trunk_repeats = max(3, args.repeats // 4)
  ms = _min_ms(
    {
      "jaxcredit_scanned": done(lambda: trunk_scanned(params)),
      "jaxcredit_unrolled": done(lambda: trunk_unrolled(params)),
      "torch": torch_trunk,
    },
    trunk_repeats,
  )
  results["ms"][f"trunk_{args.layers}_layers"] = ms
  results["compile_s"] = {"trunk_scanned": compile_scanned, "trunk_unrolled": compile_unrolled}
  print(
    f"trunk, {args.layers} layers: scanned {ms['jaxcredit_scanned']:.0f} ms (compile {compile_scanned:.1f} s), "
    f"unrolled {ms['jaxcredit_unrolled']:.0f} ms (compile {compile_unrolled:.1f} s), torch {ms['torch']:.0f} ms"
  )
  record_load_after(results["machine"])
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=1)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
