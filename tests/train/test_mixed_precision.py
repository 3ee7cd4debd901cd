"""Float32 master weights with bfloat16 compute (`model.param_dtype="float32"`, the trainer's default).

A pure-bfloat16 AdamW step at learning rate 1e-5 rounds most updates away (a parameter of size ~0.02 has a
bfloat16 spacing of ~1e-4); with float32 masters every parameter that has a gradient moves, while the forward
pass still runs in bfloat16 (its logits equal the pure-bfloat16 model's exactly when the masters hold the same
values).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit import sharding
from jaxcredit.models import load, save_converted
from jaxcredit.models.decoder import Decoder, default_logical_axes
from jaxcredit.sampling import Sampler
from jaxcredit.train import config as config_lib
from jaxcredit.train.loop import step as step_lib
from jaxcredit.trajectory import UpdateBatch

from tests.fixtures.tiny_model import tiny_decoder_config

CFG = tiny_decoder_config(vocab_size=96, qk_norm=True, tie_word_embeddings=False, dtype="bfloat16")


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
  """A converted checkpoint stored in bfloat16 (as a Hugging Face Qwen3 checkpoint is)."""
  folder = tmp_path_factory.mktemp("bf16") / "ckpt"
  model = Decoder(CFG, rngs=nnx.Rngs(3))
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))
  save_converted(folder, CFG, params)
  return folder


def _batch(seed=0, b=4, l=12):
  rng = np.random.default_rng(seed)
  token_mask = np.ones((b, l), bool)
  action = np.arange(l)[None, :] >= 4
  action = np.broadcast_to(action, (b, l))
  return UpdateBatch(
    tokens_NxL=rng.integers(0, CFG.vocab_size, size=(b, l)).astype(np.int32),
    token_mask_NxL=token_mask,
    action_mask_NxK=action,
    behavior_logp_NxK=np.where(action, -4.5, 0).astype(np.float32),
    adv_NxK=np.where(action, rng.normal(size=(b, 1)), 0).astype(np.float32),
  )


def _one_adamw_step(model):
  graphdef, params, rest = step_lib.split_model(model)
  mesh = sharding.make_mesh({}, jax.devices()[:1])
  p_sh = sharding.param_shardings(params, mesh, default_logical_axes)
  optimizer = step_lib.make_optimizer(1e-5, max_grad_norm=None)
  opt_sh = step_lib.opt_state_shardings(optimizer, params, p_sh, mesh)
  opt_state = jax.jit(optimizer.init, out_shardings=opt_sh)(params)
  batch = sharding.shard_batch(_batch(), mesh)
  loss_cfg = step_lib.PolicyLossConfig()
  old = jax.device_get(params)
  update = step_lib.make_update_fn(step_lib.pg_token_loss, graphdef, rest, optimizer, loss_cfg, mesh, p_sh, opt_sh)
  new, opt_state, _ = update(jax.tree.map(jnp.copy, params), opt_state, batch)
  return old, jax.device_get(new), _first_moments(opt_state, params), opt_state


def _first_moments(opt_state, params):
  """AdamW's first moment after its first step, (1 - b1) · g: nonzero exactly where the gradient is (the update
  compiles the gradient once; a second program only for the gradient took as long as the step)."""
  (mu,) = [s.mu for s in jax.tree.leaves(opt_state, is_leaf=lambda s: hasattr(s, "mu")) if hasattr(s, "mu")]
  assert jax.tree.structure(mu) == jax.tree.structure(params)
  return jax.device_get(mu)


def _changed_fraction(old, new, grads):
  """Of the parameter entries with a nonzero gradient (`grads`: the gradient or anything zero exactly where it is),
  the fraction the step changed."""
  changed = moving = 0
  for o, n, g in zip(jax.tree.leaves(old), jax.tree.leaves(new), jax.tree.leaves(grads)):
    has_grad = np.asarray(g, np.float32) != 0
    moving += int(has_grad.sum())
    changed += int((np.asarray(n, np.float32) != np.asarray(o, np.float32))[has_grad].sum())
  return changed / moving, moving


def test_float32_masters_move_every_parameter_with_a_gradient(bf16_checkpoint):
  mixed, cfg = load(bf16_checkpoint, param_dtype="float32")
  assert cfg.dtype == "bfloat16" and cfg.param_dtype == "float32"
  old, new, grads, opt_state = _one_adamw_step(mixed)
  assert all(x.dtype == np.float32 for x in jax.tree.leaves(new))
  moments = [x for x in jax.tree.leaves(opt_state) if getattr(x, "ndim", 0) > 0]
  assert moments and all(x.dtype == jnp.float32 for x in moments)  # AdamW's mu and nu follow the masters
  fraction, moving = _changed_fraction(old, new, grads)
  assert moving > 10_000 and fraction == 1.0, (fraction, moving)


def test_pure_bfloat16_rounds_the_update_away(bf16_checkpoint):
  """The failure the masters fix: the same step in pure bfloat16 leaves most parameters where they were."""
  pure, cfg = load(bf16_checkpoint, param_dtype="")
  assert cfg.param_dtype == "" and cfg.jnp_param_dtype == jnp.bfloat16
  old, new, grads, _ = _one_adamw_step(pure)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(new))
  fraction, _ = _changed_fraction(old, new, grads)
  assert fraction < 0.5, fraction


def test_the_forward_pass_computes_in_bfloat16(bf16_checkpoint):
  """Masters holding the bfloat16 values give the pure-bfloat16 model's logits bit for bit: the forward casts
  each parameter to the compute dtype where it reads it. A float32 compute dtype gives other logits."""
  mixed, _ = load(bf16_checkpoint, param_dtype="float32")
  pure, _ = load(bf16_checkpoint, param_dtype="")
  full, _ = load(bf16_checkpoint, dtype="float32")
  tokens = jnp.asarray(_batch().tokens_NxL)
  logits_mixed, logits_pure, logits_full = (np.asarray(m(tokens)[0]) for m in (mixed, pure, full))
  np.testing.assert_array_equal(logits_mixed, logits_pure)
  assert np.abs(logits_full - logits_pure).max() > 1e-4


def test_the_sampler_holds_the_compute_dtype(bf16_checkpoint):
  mixed, _ = load(bf16_checkpoint, param_dtype="float32")
  sampler = Sampler(mixed, max_len=8, pad_id=0)
  assert {x.dtype for x in jax.tree.leaves(sampler._state) if jnp.issubdtype(x.dtype, jnp.floating)} == {
    jnp.dtype(jnp.bfloat16)
  }
  sampler.update_model(mixed)  # float32 masters after an update are cast again, not refused


def test_the_trainer_defaults_to_float32_masters():
  c = config_lib.base_config()
  assert c.model.param_dtype == "float32" and c.model.compute_dtype == ""
  c.model.param_dtype = "bf16"
  with pytest.raises(ValueError, match="model.param_dtype"):
    config_lib.validate(c)


def test_a_model_config_refuses_an_unknown_param_dtype():
  with pytest.raises(ValueError, match="param_dtype"):
    dataclasses.replace(CFG, param_dtype="int8")
