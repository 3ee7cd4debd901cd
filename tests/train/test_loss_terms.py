"""LOSS_TERMS: each term's value and gradient, exact micro-batch accumulation with several terms, and the shared
case io-kl-reference-temperature (the reference is scored at the sampling temperature, so KL = 0 when reference
== policy)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit.models.decoder import Decoder
from jaxcredit.train.loop import loss as loss_lib
from jaxcredit.train.loop import step as step_lib
from jaxcredit.train.loop.update import abstract_update_batch, rows_batch

from tests.fixtures.tiny_model import tiny_decoder_config

CFG = tiny_decoder_config()
B, L = 4, 16


@pytest.fixture(scope="module")
def setup():
  graphdef, params, rest = step_lib.split_model(Decoder(CFG, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(0)
  lengths = np.asarray([16, 9, 12, 6])
  token_mask = np.arange(L)[None, :] < lengths[:, None]
  action = token_mask & (np.arange(L)[None, :] >= 3)
  tokens = rng.integers(0, 64, size=(B, L)).astype(np.int32)
  behavior_logp = np.where(action, rng.normal(-4.0, 0.3, size=(B, L)), 0).astype(np.float32)
  batch = rows_batch(
    tokens,
    token_mask,
    action,
    behavior_logp,
    adv_BxL=np.where(action, rng.normal(size=(B, 1)), 0).astype(np.float32),
    inputs={
      "distill_weight": np.where(action, rng.uniform(0, 2, size=(B, L)), 0).astype(np.float32),
      "distill_target": np.where(action, rng.normal(-4.0, 0.5, size=(B, L)), 0).astype(np.float32),
    },
  )
  return graphdef, params, rest, batch


def _loss(setup, cfg, num_micro=1, batch=None):
  graphdef, params, rest, b = setup
  return jax.jit(lambda p, bt: step_lib.loss_and_grads(step_lib.pg_token_loss, graphdef, p, rest, bt, cfg, num_micro))(
    params, b if batch is None else batch
  )


def test_distill_term_value_and_gradient(setup):
  graphdef, params, rest, batch = setup
  cfg = step_lib.PolicyLossConfig(terms=("distill",), knob_weights=(("distill_coef", 0.3),), temperature=0.8)
  loss, grads, m = _loss(setup, cfg)
  logp_fn = step_lib.make_logp_fn(graphdef, rest, 0.8)
  logp = np.asarray(logp_fn(params, batch.tokens_NxL, batch.token_mask_NxL))
  act = batch.action_mask_NxK
  w, tgt = batch.inputs_NxK["distill_weight"], batch.inputs_NxK["distill_target"]
  expect = np.sum((w * (logp - tgt) * logp)[act]) / act.sum()
  assert float(m["loss_distill"]) == pytest.approx(expect, rel=1e-5)
  assert float(loss) == pytest.approx(0.3 * expect, rel=1e-5)
  # d/dθ = coef · Σ w (logp - target) ∇logp / N: the same as a surrogate with the gap held fixed.
  gap = jnp.asarray(w * (logp - tgt))

  def surrogate(p):
    lp = step_lib._logp(graphdef, p, rest, batch.tokens_NxL, batch.token_mask_NxL, 0.8)
    return 0.3 * jnp.sum(jnp.where(act, gap * lp, 0.0)) / act.sum()

  g2 = jax.grad(surrogate)(params)
  for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(g2)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def _norm(tree):
  return float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree_util.tree_leaves(tree))))


@pytest.mark.parametrize("num_micro", [1, 2])
def test_a_capped_term_contributes_at_most_its_ratio_of_the_other_terms_gradient(setup, num_micro):
  """PolicyLossConfig.grad_caps (ToolOPD's distill_max_grad_ratio): g = g_rest + min(1, r |g_rest| / |g_d|) g_d, where
  g_rest and g_d are the gradients of the policy term and of the weighted distillation term alone; the loss and the
  per-term losses are the uncapped ones; micro-batches accumulate each part exactly."""
  graphdef, params, rest, batch = setup
  policy_only = step_lib.PolicyLossConfig(terms=("policy",))
  distill_only = step_lib.PolicyLossConfig(terms=("distill",), knob_weights=(("distill_coef", 5.0),))
  _, g_rest, _ = _loss(setup, policy_only)
  _, g_d, _ = _loss(setup, distill_only)
  n_rest, n_d = _norm(g_rest), _norm(g_d)
  assert n_d > 0.5 * n_rest  # a strong distillation: the cap binds at r = 0.5
  both = dict(terms=("policy", "distill"), knob_weights=(("distill_coef", 5.0),))
  loss, grads, m = _loss(setup, step_lib.PolicyLossConfig(**both, grad_caps=(("distill", 0.5),)), num_micro)
  scale = 0.5 * n_rest / n_d
  for got, a, b in zip(*(jax.tree_util.tree_leaves(t) for t in (grads, g_rest, g_d))):
    np.testing.assert_allclose(got, np.asarray(a) + scale * np.asarray(b), rtol=1e-4, atol=1e-7)
  assert float(m["grad_scale_distill"]) == pytest.approx(scale, rel=1e-4)
  assert float(m["grad_norm_distill"]) == pytest.approx(n_d, rel=1e-4)
  assert float(m["grad_norm_rest"]) == pytest.approx(n_rest, rel=1e-4)
  assert float(m["grad_share_distill"]) == pytest.approx(0.5 * n_rest / (n_rest + 0.5 * n_rest), rel=1e-4)
  uncapped_loss, uncapped, m0 = _loss(setup, step_lib.PolicyLossConfig(**both))
  assert float(loss) == pytest.approx(float(uncapped_loss), rel=1e-5)
  assert "grad_share_distill" not in m0
  # A cap that does not bind changes nothing (and inf is no cap at all).
  _, loose, _ = _loss(setup, step_lib.PolicyLossConfig(**both, grad_caps=(("distill", 1e6),)), num_micro)
  for a, b in zip(jax.tree_util.tree_leaves(loose), jax.tree_util.tree_leaves(uncapped)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("caps", [(("distill", 0.0),), (("distill", -1.0),), (("nope", 1.0),), (("distill",),)])
def test_grad_caps_refuse_a_bad_pair(caps):
  with pytest.raises(ValueError, match="grad_caps|gradient cap"):
    step_lib.PolicyLossConfig(terms=("policy", "distill"), grad_caps=caps)


def test_terms_sum_and_micro_batches_are_exact(setup):
  cfg = step_lib.PolicyLossConfig(
    terms=("policy", "distill"), knob_weights=(("distill_coef", 0.5),), aggregation="seq-mean-token-mean"
  )
  loss1, g1, m1 = _loss(setup, cfg, 1)
  loss2, g2, m2 = _loss(setup, cfg, 2)
  assert float(loss1) == pytest.approx(float(m1["loss_policy"]) + 0.5 * float(m1["loss_distill"]), rel=1e-6)
  assert float(loss2) == pytest.approx(float(loss1), rel=1e-5)
  for k in ("loss_policy", "loss_distill"):
    assert float(m2[k]) == pytest.approx(float(m1[k]), rel=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g2)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_unknown_term_is_refused():
  with pytest.raises(ValueError, match="unknown loss terms"):
    step_lib.PolicyLossConfig(terms=("policy", "nope"))


def test_kl_to_a_reference_equal_to_the_policy_is_zero_at_the_sampling_temperature(setup):
  """Shared case io-kl-reference-temperature: temperature 0.8, kl_coef 0.1, reference == policy."""
  graphdef, params, rest, batch = setup
  ref = step_lib.make_logp_fn(graphdef, rest, 0.8)(params, batch.tokens_NxL, batch.token_mask_NxL)
  cfg = step_lib.PolicyLossConfig(terms=("kl",), kl_coef=0.1, temperature=0.8)
  loss, grads, m = _loss(setup, cfg, batch=dataclasses.replace(batch, ref_logp_NxK=np.asarray(ref)))
  assert abs(float(m["loss_kl"])) < 1e-6
  assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(grads)) < 1e-6
  # The fault this guards against: a reference scored at temperature 1 is not the policy (KL > 0 at step 0).
  ref1 = step_lib.make_logp_fn(graphdef, rest, 1.0)(params, batch.tokens_NxL, batch.token_mask_NxL)
  _, _, m1 = _loss(setup, cfg, batch=dataclasses.replace(batch, ref_logp_NxK=np.asarray(ref1)))
  assert float(m1["loss_kl"]) > 1e-4


def test_a_term_whose_array_the_batch_lacks_is_refused_naming_both(setup):
  """kl_coef > 0 with no reference log-probs in the batch: a ValueError naming the term and the array, not a crash."""
  cfg = step_lib.PolicyLossConfig(terms=("policy", "kl"), kl_coef=0.1)
  assert setup[3].ref_logp_NxK is None
  with pytest.raises(ValueError, match=r"loss term 'kl' reads \['ref_logp'\]"):
    _loss(setup, cfg)


def test_the_batch_keys_of_the_shipped_terms_are_their_trainer_arrays_and_their_input_fields():
  """What `abstract_update_batch` and `jaxcredit plan` read: the trainer's arrays first, then the method's input."""
  assert step_lib.LOSS_TERMS["distill"].batch_keys == ("distill_weight", "distill_target")
  assert step_lib.LOSS_TERMS["vocab_kl"].batch_keys == ("teacher_hidden", "vocab_kl_weight")
  assert step_lib.LOSS_TERMS["kl"].batch_keys == ("ref_logp",)
  cfg = step_lib.PolicyLossConfig(terms=("policy", "distill"), knob_weights=(("distill_coef", 0.1),), kl_coef=0.1)
  abstract = abstract_update_batch(cfg, batch_size=B, seq_len=L, hidden_size=CFG.hidden_size)
  assert abstract.adv_NxK is not None and abstract.ref_logp_NxK is not None
  assert set(abstract.inputs_NxK) == {"distill_weight", "distill_target"}
  for x in (abstract.adv_NxK, abstract.ref_logp_NxK, *abstract.inputs_NxK.values()):
    assert x.shape == (B, L) and x.dtype == np.float32
  assert step_lib.term_inputs(("policy", "kl", "distill")) == {"distill": step_lib.DistillInput}


def test_policy_term_is_weighted_per_token_by_the_engine_importance_weight(setup):
  """Rollouts from another engine: each token's PPO loss times its truncated importance weight."""
  graphdef, params, rest, batch = setup
  cfg = step_lib.PolicyLossConfig(terms=("policy",), temperature=1.0)
  act = batch.action_mask_NxK
  weight = np.where(act, np.random.default_rng(1).uniform(0.2, 2.0, size=act.shape), 1.0).astype(np.float32)
  loss_plain, _, _ = _loss(setup, cfg)
  loss_weighted, _, _ = _loss(setup, cfg, batch=dataclasses.replace(batch, behavior_weight_NxK=weight))
  logp = np.asarray(step_lib.make_logp_fn(graphdef, rest, 1.0)(params, batch.tokens_NxL, batch.token_mask_NxL))
  tok, _ = loss_lib.ppo_clip_token_loss(
    jnp.asarray(logp), batch.behavior_logp_NxK, batch.adv_NxK, eps_low=cfg.eps_low, eps_high=cfg.eps_high
  )
  tok = np.asarray(tok)
  assert float(loss_plain) == pytest.approx(np.sum(tok[act]) / act.sum(), rel=1e-5)
  assert float(loss_weighted) == pytest.approx(np.sum((weight * tok)[act]) / act.sum(), rel=1e-5)
  assert float(loss_weighted) != pytest.approx(float(loss_plain), rel=1e-3)
