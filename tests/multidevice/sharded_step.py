"""On 8 CPU devices the policy-gradient step equals the 1-device one: dense fsdp=8, fsdp=4 x tensor=2, data x fsdp,
data with micro-batches; a MoE model with expert=4 x fsdp=2 and fsdp=4 x tensor=2 for both MoE implementations.
Prints SHARDED-OK. Run by tests/train/test_sharded_step.py through tests/fixtures/multidevice.py.

Argument: `core` (one mesh per axis and the MoE model's expert mesh: the default suite's), `rest` (the other four
meshes: the slow tier's) or `all` (the default, by hand). Each mesh compiles its own programs."""

import dataclasses
import sys

import jax, jax.numpy as jnp, numpy as np, optax
from flax import nnx
from jaxcredit import sharding
from jaxcredit.models.decoder import Decoder, param_logical_axes
from jaxcredit.train.loop import step as step_lib
from jaxcredit.trajectory import UpdateBatch

from tests.fixtures.tiny_model import tiny_decoder_config

assert jax.device_count() == 8, jax.devices()
dense = tiny_decoder_config(tie_word_embeddings=False, qk_norm=True)
moe = tiny_decoder_config(
  qk_norm=True, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=False
)

rng = np.random.default_rng(0)
B, L = 8, 16
lengths = rng.integers(6, L + 1, size=B)
token_mask = np.arange(L)[None, :] < lengths[:, None]
action = token_mask & (np.arange(L)[None, :] >= 3)
batch = UpdateBatch(
  tokens_NxL=rng.integers(0, 64, size=(B, L)).astype(np.int32),
  token_mask_NxL=token_mask,
  action_mask_NxK=action,
  behavior_logp_NxK=np.where(action, rng.normal(-4.0, 0.3, size=(B, L)), 0).astype(np.float32),
  adv_NxK=np.where(action, rng.normal(size=(B, 1)), 0).astype(np.float32),
  ref_logp_NxK=np.where(action, rng.normal(-4.0, 0.3, size=(B, L)), 0).astype(np.float32),
)
loss_cfg = step_lib.PolicyLossConfig(kl_coef=0.1, eps_low=0.2, eps_high=0.28)


def rel_close(a, b, name):
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree_util.tree_leaves(b)):
    x, y = np.asarray(x), np.asarray(y)
    err = np.max(np.abs(x - y)) / max(np.max(np.abs(x)), 1e-30)
    assert err <= 1e-5, (name, jax.tree_util.keystr(path), err)


# (model, MoE implementation, mesh, micro-batches, also check an SGD update, in `core`)
VARIANTS = [
  (dense, "ragged", {"fsdp": 8}, 1, True, True),
  (dense, "ragged", {"fsdp": 4, "tensor": 2}, 1, False, True),
  (dense, "ragged", {"data": 2, "fsdp": 4}, 1, False, False),
  (dense, "ragged", {"data": 8}, 2, True, True),
  (moe, "ragged", {"expert": 4, "fsdp": 2}, 1, True, True),
  (moe, "ragged", {"fsdp": 4, "tensor": 2}, 1, False, False),
  (moe, "dense", {"expert": 4, "fsdp": 2}, 1, True, False),
  (moe, "dense", {"fsdp": 4, "tensor": 2}, 1, False, False),
]
which = sys.argv[1] if len(sys.argv) > 1 else "all"
assert which in ("core", "rest", "all"), which
chosen = [v for v in VARIANTS if which == "all" or v[5] == (which == "core")]

devs = jax.devices()
models = []  # (model config, MoE implementation) in VARIANTS' order, each once
for c, i, *_ in chosen:
  if not any(c is c2 and i == i2 for c2, i2 in models):
    models.append((c, i))
for base_cfg, impl in models:
  meshes = [(shape, micro, update) for c, i, shape, micro, update, _ in chosen if c is base_cfg and i == impl]
  cfg = dataclasses.replace(base_cfg, moe_impl=impl)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  graphdef, params, rest = step_lib.split_model(model)
  logical = param_logical_axes(cfg)

  def run(mesh_shape, devices, num_micro=1, update=False):
    mesh = sharding.make_mesh(mesh_shape, devices)
    p_sh = sharding.param_shardings(params, mesh, logical)
    p = jax.device_put(jax.tree_util.tree_map(jnp.copy, params), p_sh)
    b = sharding.shard_batch(batch, mesh)
    fn = step_lib.MeshJit(
      jax.jit(
        lambda p, b: step_lib.loss_and_grads(step_lib.pg_token_loss, graphdef, p, rest, b, loss_cfg, num_micro)[:2]
      ),
      mesh,
    )
    loss, grads = fn(p, b)
    specs = {str(s.spec) for s in jax.tree_util.tree_leaves(p_sh)}
    new_p = None
    if update:
      opt = optax.sgd(1.0)
      opt_sh = step_lib.opt_state_shardings(opt, p, p_sh, mesh)
      upd = step_lib.make_update_fn(
        step_lib.pg_token_loss, graphdef, rest, opt, loss_cfg, mesh, p_sh, opt_sh, num_micro=num_micro
      )
      new_p, _, _ = upd(p, jax.jit(opt.init, out_shardings=opt_sh)(p), b)
      new_p = jax.device_get(new_p)
    return float(loss), jax.device_get(grads), new_p, specs

  l1, g1, p1, _ = run({}, devs[:1], update=True)
  assert np.isfinite(l1) and abs(l1) > 1e-6, l1
  assert all(np.abs(np.asarray(x)).max() > 0 for x in jax.tree_util.tree_leaves(g1))
  for shape, micro, update in meshes:
    l8, g8, p8, specs = run(shape, devs, micro, update)
    assert abs(l8 - l1) <= 1e-5 * abs(l1), (cfg.moe_impl, shape, l1, l8)
    rel_close(g1, g8, f"grads {impl} {shape}")
    if update:
      rel_close(p1, p8, f"params after SGD(lr=1) {impl} {shape}")
    for axis in ("fsdp", "tensor", "expert"):
      if shape.get(axis, 1) > 1:
        assert any(axis in s for s in specs), (axis, specs)
    print("ok", impl, shape, l8)
  # SGD with lr=1 really moved the parameters by the gradient.
  moved = max(
    np.abs(np.asarray(a) - np.asarray(b)).max()
    for a, b in zip(jax.tree_util.tree_leaves(p1), jax.tree_util.tree_leaves(params))
  )
  assert moved > 1e-4, moved
print("SHARDED-OK", which, len(chosen), "meshes")
