"""HSD's objective in the update (loss terms "vocab_kl" and "reference_kl"): the full-vocabulary KL(teacher ‖ student)
against a float64 reference on random hidden states, zero (value and gradient) when the teacher's context changes
nothing, the same packed and unpacked and over micro-batches, and the library form `credit.hsd_token_kl`."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit import credit
from jaxcredit.models.decoder import Decoder
from jaxcredit.models.logprobs import predictor_hidden_states, sequence_logprobs
from jaxcredit.train.loop import step as step_lib
from jaxcredit.train.loop.update import pack_update_batch, rows_batch

from tests.fixtures.tiny_model import tiny_decoder_config

CFG = tiny_decoder_config()
B, L = 4, 16
T = 0.8
HSD = step_lib.PolicyLossConfig(terms=("policy", "vocab_kl"), temperature=T)  # as `loss_config_of` builds it


def _softmax64(z):
  z = np.asarray(z, np.float64)
  z = z - z.max(axis=-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def setup():
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  graphdef, params, rest = step_lib.split_model(model)
  rng = np.random.default_rng(0)
  lengths = np.asarray([16, 9, 12, 6])
  token_mask = np.arange(L)[None, :] < lengths[:, None]
  action = token_mask & (np.arange(L)[None, :] >= 3)
  # Two groups of two with a shared 3-token prompt, so packing shares it.
  tokens = rng.integers(0, 64, size=(B, L)).astype(np.int32)
  tokens[1, :3], tokens[3, :3] = tokens[0, :3], tokens[2, :3]
  weight = (action & np.asarray([True, True, False, True])[:, None]).astype(np.float32)  # rollout 2: pass invalid
  batch = rows_batch(
    tokens,
    token_mask,
    action,
    np.zeros((B, L), np.float32),
    adv_BxL=np.zeros((B, L), np.float32),
    inputs={
      "teacher_hidden": rng.normal(0, 10.0, size=(B, L, CFG.hidden_size)).astype(np.float32),
      "vocab_kl_weight": weight,
    },
    group_ids_B=np.asarray([0, 0, 1, 1]),
  )
  return model, graphdef, params, rest, batch


def _loss(setup, cfg, batch, num_micro=1):
  _, graphdef, params, rest, _ = setup
  fn = jax.jit(lambda p, b: step_lib.loss_and_grads(step_lib.pg_token_loss, graphdef, p, rest, b, cfg, num_micro))
  return fn(params, batch.for_device())


def _reference(model, batch):
  """Σ over rollouts with action tokens of (Σ_t w_t KL_t / their action tokens), / those rollouts: float64."""
  logits = np.asarray(model(jnp.asarray(batch.tokens_NxL), token_mask_BxL=jnp.asarray(batch.token_mask_NxL))[0])
  head = np.asarray(model.output_head_DxV(), np.float64)
  q = _softmax64(np.asarray(batch.inputs_NxK["teacher_hidden"], np.float64) @ head / T)
  # The student's distribution that predicts token t sits at t - 1.
  p = _softmax64(np.pad(logits[:, :-1], ((0, 0), (1, 0), (0, 0))) / T)
  kl = np.sum(q * (np.log(q) - np.log(p)), axis=-1)
  act, w = batch.action_mask_NxK, batch.inputs_NxK["vocab_kl_weight"]
  per_rollout = [np.sum((w * kl)[i][act[i]]) / act[i].sum() for i in range(B) if act[i].any()]
  return float(np.mean(per_rollout))


def test_vocab_kl_equals_a_float64_full_vocabulary_reference(setup):
  model, *_, batch = setup
  loss, _, m = _loss(setup, HSD, batch)
  expect = _reference(model, batch)
  assert expect > 0.1
  assert float(m["loss_vocab_kl"]) == pytest.approx(expect, rel=1e-5)
  assert float(loss) == pytest.approx(expect, rel=1e-5)  # PPO-clip on zero advantages adds nothing
  assert float(m["loss_policy"]) == 0.0


def test_packed_and_micro_batched_equal_unpacked(setup):
  *_, batch = setup
  loss, grads, m = _loss(setup, HSD, batch)
  packed = pack_update_batch(batch, length_bucket=8, max_row_len=64, rows_multiple=2, slot_bucket=8)
  assert packed.packed is not None
  assert packed.inputs_NxK["teacher_hidden"].shape == packed.action_mask_NxK.shape + (CFG.hidden_size,)
  assert packed.tokens_NxL.shape[1] < 2 * L  # the prompts are shared
  loss_p, grads_p, _ = _loss(setup, HSD, packed)
  loss_m, grads_m, _ = _loss(setup, HSD, batch, num_micro=2)
  assert float(loss_p) == pytest.approx(float(loss), rel=1e-5)
  assert float(loss_m) == pytest.approx(float(loss), rel=1e-5)
  for other in (grads_p, grads_m):
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(other)):
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-4, atol=1e-7)


def test_zero_when_the_teacher_context_changes_nothing(setup):
  """The teacher's hidden states are the student's own (a context the policy ignores): the KL and its gradient
  vanish, though the rollouts and weights are as before."""
  model, graphdef, params, rest, batch = setup
  h, _, _ = predictor_hidden_states(model, jnp.asarray(batch.tokens_NxL), jnp.asarray(batch.token_mask_NxL))
  same = dataclasses.replace(batch, inputs_NxK={**batch.inputs_NxK, "teacher_hidden": np.asarray(h, np.float32)})
  loss, grads, m = _loss(setup, HSD, same)
  assert abs(float(m["loss_vocab_kl"])) < 1e-6
  assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads)) < 1e-5
  # ... while the random teacher's gradient is not small.
  _, grads_random, _ = _loss(setup, HSD, batch)
  assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads_random)) > 1e-3


def test_predictor_hidden_states_score_as_sequence_logprobs(setup):
  """The student's states the term reads give the trainer's own log-probs of the sampled tokens."""
  model, *_, batch = setup
  tokens, mask = jnp.asarray(batch.tokens_NxL), jnp.asarray(batch.token_mask_NxL)
  h, targets, valid = predictor_hidden_states(model, tokens, mask)
  z = np.asarray(model.logits(h), np.float64) / T
  logp = np.take_along_axis(z, np.asarray(targets)[..., None], -1)[..., 0] - np.log(np.exp(z).sum(-1))
  want = np.asarray(sequence_logprobs(model, tokens, mask, T))
  np.testing.assert_allclose(np.where(valid, logp, 0.0), want, rtol=1e-5, atol=1e-5)
  assert not bool(valid[:, 0].any()) and bool(valid[0, 1])


def test_reference_kl_is_weighted_by_beta_and_zero_at_the_reference(setup):
  _, graphdef, params, rest, batch = setup
  logp = np.asarray(step_lib.make_logp_fn(graphdef, rest, T)(params, batch.tokens_NxL, batch.token_mask_NxL))
  cfg = step_lib.PolicyLossConfig(terms=("reference_kl",), temperature=T, knob_weights=(("beta", 0.5),))
  at_ref = dataclasses.replace(batch, ref_logp_NxK=logp)
  loss, _, m = _loss(setup, cfg, at_ref)
  assert abs(float(m["loss_reference_kl"])) < 1e-7
  shifted = dataclasses.replace(batch, ref_logp_NxK=(logp - 0.3).astype(np.float32))
  loss, _, m = _loss(setup, cfg, shifted)
  k3 = np.exp(-0.3) + 0.3 - 1.0  # exp(ref - logp) - (ref - logp) - 1 on every action token
  assert float(m["loss_reference_kl"]) == pytest.approx(k3, rel=1e-4)
  assert float(loss) == pytest.approx(0.5 * k3, rel=1e-4)


def test_library_form_matches_the_trainer_and_its_gradient_is_p_minus_q():
  rng = np.random.default_rng(1)
  teacher = rng.normal(0, 2.0, size=(6, 50)).astype(np.float32)
  student = rng.normal(0, 2.0, size=(6, 50)).astype(np.float32)
  action = np.asarray([True, True, False, True, True, True])
  kl = np.asarray(credit.hsd_token_kl(teacher, student, action, temperature=T))
  q, p = _softmax64(teacher / T), _softmax64(student / T)
  want = np.sum(q * (np.log(q) - np.log(p)), axis=-1)
  np.testing.assert_allclose(kl, np.where(action, want, 0.0), rtol=1e-5, atol=1e-6)
  assert kl[2] == 0.0
  np.testing.assert_array_equal(np.asarray(credit.hsd_token_kl(teacher, teacher, action)), np.zeros(6))
  # d kl / d z_student = (p - q) / T; nothing reaches the teacher.
  g_t, g_s = jax.grad(lambda t, s: jnp.sum(credit.hsd_token_kl(t, s, action, temperature=T)), argnums=(0, 1))(
    teacher, student
  )
  np.testing.assert_allclose(np.asarray(g_s), np.where(action[:, None], (p - q) / T, 0.0), atol=1e-5)
  assert not np.asarray(g_t).any()
  # The chunked trainer form on one-hot "hidden states" with the logits as the head: the same numbers.
  from jaxcredit.models.logprobs import chunked_reverse_kl

  eye = np.eye(6, dtype=np.float32)[None]
  chunked = chunked_reverse_kl(eye, teacher, eye, student, T, vocab_chunk=16)  # eye @ head = the logits
  np.testing.assert_allclose(np.asarray(chunked)[0][action], kl[action], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
  "call, needle",
  [
    (lambda: credit.hsd_token_kl(np.zeros((2, 3)), np.zeros((2, 4)), np.ones(2, bool)), "student_logits"),
    (lambda: credit.hsd_token_kl(np.zeros((2, 3)), np.zeros((2, 3)), np.ones(3, bool)), "action_mask"),
    (lambda: credit.hsd_token_kl(np.zeros((2, 3)), np.zeros((2, 3)), np.ones(2, bool), temperature=0.0), "temperature"),
  ],
)
def test_library_form_refuses_bad_input_by_name(call, needle):
  with pytest.raises(ValueError, match=needle):
    call()


@pytest.mark.parametrize(
  "key, value, needle",
  [("credit.hsd.beta", -0.1, "config.credit.hsd.beta"), ("optim.b2", 1.0, "config.optim.b2")],
)
def test_config_refuses_bad_beta_and_moment_decay_by_name(key, value, needle):
  from jaxcredit.train import config as config_lib

  c = config_lib.base_config()
  c.credit.method = "hsd"
  config_lib.validate(c)  # the defaults validate
  node, leaf = key.rsplit(".", 1)
  target = c
  for part in node.split("."):
    target = target[part]
  target[leaf] = value
  with pytest.raises(ValueError, match=needle):
    config_lib.validate(c)


def test_library_form_with_masked_vocabulary_and_garbage_off_the_mask():
  """-inf logits (a padded vocabulary, in the teacher or in both) add nothing; a row off the action mask holding -inf
  or NaN reaches neither the value nor the gradient (found by trying the library form as a new user)."""
  rng = np.random.default_rng(2)
  teacher = rng.normal(size=(4, 7)).astype(np.float32)
  student = rng.normal(size=(4, 7)).astype(np.float32)
  teacher[0, 2] = -np.inf  # the teacher gives one entry no mass
  teacher[1, 5:] = student[1, 5:] = -np.inf  # padded columns in both
  teacher[3] = np.nan  # off the mask
  student[3, 0] = -np.inf
  action = np.asarray([True, True, True, False])
  kl = np.asarray(credit.hsd_token_kl(teacher, student, action))
  for i in range(3):
    q = _softmax64(np.where(np.isfinite(teacher[i]), teacher[i], -1e300))
    p = _softmax64(np.where(np.isfinite(student[i]), student[i], -1e300))
    keep = q > 0
    assert kl[i] == pytest.approx(np.sum(q[keep] * (np.log(q[keep]) - np.log(p[keep]))), rel=1e-5)
  assert kl[3] == 0.0
  g = jax.grad(lambda s: jnp.sum(credit.hsd_token_kl(teacher, s, action)))(student)
  assert np.isfinite(np.asarray(g)).all() and not np.asarray(g)[3].any()


def test_hsd_refuses_another_teacher_and_a_second_reference_kl():
  from jaxcredit.train import config as config_lib

  for key, value, needle in (
    ("teacher.source", "reference", "config.teacher.source = 'reference': HSD's teacher is the policy"),
    ("loss.kl_coef", 0.1, "config.loss.kl_coef = 0.1: HSD has its own KL"),
  ):
    c = config_lib.base_config()
    c.credit.method = "hsd"
    node, leaf = key.split(".")
    c[node][leaf] = value
    with pytest.raises(ValueError, match=needle):
      config_lib.validate(c)
