"""On an 8-device CPU mesh the policy-gradient step equals the 1-device one.

Runs in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 so the device count of the rest
of the suite is untouched.
"""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(r"""
    import jax, jax.numpy as jnp, numpy as np, optax
    from flax import nnx
    from jaxcredit import sharding
    from jaxcredit.models.config import ModelConfig
    from jaxcredit.models.decoder import Decoder
    from jaxcredit.train import step as step_lib

    assert jax.device_count() == 8, jax.devices()
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, rope_theta=10000.0, tie_word_embeddings=False)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    graphdef, params, rest = step_lib.split_model(model)
    rng = np.random.default_rng(0)
    B, L = 8, 16
    lengths = rng.integers(6, L + 1, size=B)
    token_mask = np.arange(L)[None, :] < lengths[:, None]
    action = token_mask & (np.arange(L)[None, :] >= 3)
    batch = {
        "tokens_BxL": rng.integers(0, 64, size=(B, L)).astype(np.int32),
        "token_mask_BxL": token_mask,
        "action_mask_BxL": action,
        "behavior_logp_BxL": np.where(action, rng.normal(-4.0, 0.3, size=(B, L)), 0).astype(np.float32),
        "adv_BxL": np.where(action, rng.normal(size=(B, 1)), 0).astype(np.float32),
        "ref_logp_BxL": np.where(action, rng.normal(-4.0, 0.3, size=(B, L)), 0).astype(np.float32),
    }
    loss_cfg = step_lib.PolicyLossConfig(kl_coef=0.1, eps_low=0.2, eps_high=0.28)

    def run(mesh_shape, devices, num_micro=1):
        mesh = sharding.make_mesh(mesh_shape, devices)
        p_sh = sharding.param_shardings(params, mesh)
        p = jax.device_put(jax.tree_util.tree_map(jnp.copy, params), p_sh)
        b = sharding.shard_batch(batch, mesh)
        fn = jax.jit(lambda p, b: step_lib.loss_and_grads(step_lib.pg_token_loss, graphdef, p, rest, b, loss_cfg,
                                                          num_micro)[:2])
        loss, grads = fn(p, b)
        opt = optax.sgd(1.0)
        opt_sh = step_lib.opt_state_shardings(opt, p, p_sh, mesh)
        upd = step_lib.make_update_fn(step_lib.pg_token_loss, graphdef, rest, opt, loss_cfg, mesh, p_sh, opt_sh,
                                      num_micro=num_micro)
        new_p, _, _ = upd(p, jax.jit(opt.init, out_shardings=opt_sh)(p), b)
        shardings = {str(s.spec) for s in jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x: x.sharding, new_p))}
        return float(loss), jax.device_get(grads), jax.device_get(new_p), shardings

    def rel_close(a, b, name):
        for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree_util.tree_leaves(b)):
            x, y = np.asarray(x), np.asarray(y)
            err = np.max(np.abs(x - y)) / max(np.max(np.abs(x)), 1e-30)
            assert err <= 1e-5, (name, jax.tree_util.keystr(path), err)

    devs = jax.devices()
    l1, g1, p1, _ = run({"data": 1, "fsdp": 1, "tensor": 1}, devs[:1])
    assert np.isfinite(l1) and abs(l1) > 1e-6, l1
    assert any(np.abs(np.asarray(x)).max() > 0 for x in jax.tree_util.tree_leaves(g1))
    for shape, micro in (({"data": 2, "fsdp": 4, "tensor": 1}, 1), ({"data": 8, "fsdp": 1, "tensor": 1}, 2)):
        l8, g8, p8, specs = run(shape, devs, micro)
        assert abs(l8 - l1) <= 1e-5 * abs(l1), (shape, l1, l8)
        rel_close(g1, g8, f"grads {shape}")
        rel_close(p1, p8, f"params after SGD(lr=1) {shape}")
        if shape["fsdp"] > 1:
            assert any("fsdp" in s for s in specs), specs
    # SGD with lr=1 really moved the parameters by the gradient.
    moved = max(np.abs(np.asarray(a) - np.asarray(b)).max()
                for a, b in zip(jax.tree_util.tree_leaves(p1), jax.tree_util.tree_leaves(params)))
    assert moved > 1e-4, moved
    print("SHARDED-OK", l1)
""")


def test_eight_device_step_equals_one_device():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=root, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
  assert "SHARDED-OK" in proc.stdout
