"""PPO epochs and mini-batches (`update_lib.ppo_updates`): one epoch of one mini-batch is the plain update; more updates
per batch move the ratio away from 1 so that the clip acts; the order is reproducible from the seed."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxcredit import sharding
from jaxcredit.models.decoder import Decoder, param_logical_axes
from jaxcredit.train.loop import step as step_lib
from jaxcredit.train.loop.update import ppo_updates
from jaxcredit.trajectory import UpdateBatch
from tests.fixtures.tiny_model import tiny_decoder_config

CFG = tiny_decoder_config(tie_word_embeddings=False)
B, L = 8, 16


def setup(learning_rate):
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  graphdef, params, rest = step_lib.split_model(model)
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  p_sh = sharding.param_shardings(params, mesh, param_logical_axes(CFG))
  opt = optax.adam(learning_rate)
  opt_sh = step_lib.opt_state_shardings(opt, params, p_sh, mesh)
  update = step_lib.make_update_fn(
    step_lib.pg_token_loss, graphdef, rest, opt, step_lib.PolicyLossConfig(), mesh, p_sh, opt_sh
  )
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 64, size=(B, L)).astype(np.int32)
  token_mask = np.ones((B, L), bool)
  action = np.arange(L)[None, :] >= 4
  action = np.broadcast_to(action, (B, L)).copy()
  # The behaviour log-probs are the policy's own (as the sampler's are): the first update sees ratio 1.
  logp = np.asarray(jax.jit(step_lib.make_logp_fn(graphdef, rest, 1.0))(params, tokens, token_mask))
  batch = UpdateBatch(
    tokens_NxL=tokens,
    token_mask_NxL=token_mask,
    action_mask_NxK=action,
    behavior_logp_NxK=np.where(action, logp, 0).astype(np.float32),
    adv_NxK=np.where(action, rng.normal(size=(B, 1)), 0).astype(np.float32),
  )

  def fresh():
    p = jax.device_put(jax.tree_util.tree_map(jnp.copy, params), p_sh)
    return p, jax.jit(opt.init, out_shardings=opt_sh)(p)

  return update, fresh, batch, mesh


def leaves(tree):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(tree))]


def test_one_epoch_of_one_mini_batch_is_the_plain_update():
  update, fresh, batch, mesh = setup(1e-2)
  p, o = fresh()
  want, _, want_m = update(p, o, sharding.shard_batch(batch, mesh))
  want = leaves(want)
  p, o = fresh()
  got, _, m = ppo_updates(update, p, o, batch, mesh, epochs=1, mini_batch_size=0, seed=(0, 1))
  for a, b in zip(leaves(got), want):
    np.testing.assert_array_equal(a, b)
  assert m["updates"] == 1 and m["clip"] == 0.0 and m["ratio_dev"] < 1e-5
  assert m["loss"] == float(want_m["loss"])


def test_several_updates_per_batch_make_the_clip_act():
  update, fresh, batch, mesh = setup(3e-2)
  p, o = fresh()
  _, _, m = ppo_updates(update, p, o, batch, mesh, epochs=2, mini_batch_size=B // 2, seed=(0, 1))
  assert m["updates"] == 4
  # After three updates on these rollouts the policy has moved: ratios depart from 1 and some tokens are clipped.
  assert m["ratio_dev_last"] > 0.05 and m["clip_last"] > 0.0, m
  assert m["clip_max"] >= m["clip_last"] >= m["clip"]  # the first update, at ratio 1, clips nothing


def test_the_order_is_reproducible_from_the_seed():
  update, fresh, batch, mesh = setup(1e-2)
  runs = []
  for seed in ((0, 1), (0, 1), (0, 2)):
    p, o = fresh()
    got, _, _ = ppo_updates(update, p, o, batch, mesh, epochs=1, mini_batch_size=2, seed=seed)
    runs.append(leaves(got))
  for a, b in zip(runs[0], runs[1]):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in zip(runs[0], runs[2]))
