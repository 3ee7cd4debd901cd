"""The packed update batch (`jaxcredit.train.loop.update.pack_update_batch`): group prompts once per row, the head on
action slots only.

The packed layout must change nothing but the cost: every loss term under every aggregation, with micro-batches,
gives the unpacked loss, metrics and gradients."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from jaxcredit.models.decoder import Decoder
from jaxcredit.train.loop import loss as loss_lib
from jaxcredit.train.loop import step as step_lib
from jaxcredit.train.loop.update import abstract_update_batch, pack_if_short, pack_update_batch, rows_batch
from tests.fixtures.tiny_model import tiny_decoder_config


def rollout_batch(seed=0, groups=3, group_size=3, length=24):
  """Right-padded rollouts: each group shares a prompt of 5-7 tokens; some rollouts share more (a common first
  action token); lengths 9..length; one rollout has no action token; actions after the prompt, with an observation
  (non-action) gap in the middle."""
  rng = np.random.default_rng(seed)
  b = groups * group_size
  tokens = np.zeros((b, length), np.int32)
  mask = np.zeros((b, length), bool)
  action = np.zeros((b, length), bool)
  for g in range(groups):
    prompt = rng.integers(1, 64, size=int(rng.integers(5, 8)))
    first = int(rng.integers(1, 64))
    for j in range(group_size):
      i = g * group_size + j
      n = int(rng.integers(len(prompt) + 4, length + 1))
      row = rng.integers(1, 64, size=n)
      row[: len(prompt)] = prompt
      if g == 0:
        row[len(prompt)] = first  # the whole group also shares its first action token
      tokens[i, :n] = row
      mask[i, :n] = True
      action[i, len(prompt) : n] = True
      action[i, len(prompt) + 2 : len(prompt) + 4] = False  # a tool observation
  action[b - 1] = False  # a rollout with nothing to score
  f = lambda: rng.normal(size=(b, length)).astype(np.float32)
  return rows_batch(
    tokens,
    mask,
    action,
    np.where(action, -2.0 + 0.3 * f(), 0.0).astype(np.float32),
    adv_BxL=np.where(action, f(), 0.0).astype(np.float32),
    ref_logp_BxL=np.where(action, -2.0 + 0.3 * f(), 0.0).astype(np.float32),
    inputs={
      "distill_weight": np.where(action, np.abs(f()), 0.0).astype(np.float32),
      "distill_target": np.where(action, -2.0 + 0.3 * f(), 0.0).astype(np.float32),
    },
    group_ids_B=np.repeat(np.arange(groups), group_size).astype(np.int32),
  )


def test_rows_hold_each_groups_prefix_once_and_slots_point_at_the_scored_tokens():
  batch = rollout_batch()
  packed = pack_update_batch(batch, length_bucket=8, max_row_len=1024, slot_bucket=8, rows_multiple=4)
  tokens, mask = batch.tokens_NxL, batch.token_mask_NxL
  rows = packed.packed
  # 3 groups, one row each (every group fits 1024 tokens), padded to 4 rows.
  assert packed.tokens_NxL.shape[0] == 4 and not packed.token_mask_NxL[3].any()
  assert packed.group_ids_N is None
  real = int(packed.token_mask_NxL.sum())
  assert real < int(mask.sum())  # each prompt once, not three times
  assert packed.tokens_NxL.shape[1] % 8 == 0 and rows.slots_NxK.shape[1] % 8 == 0
  assert rows.rollouts_N.sum() == 9 and rows.rollouts_N[0] == 9
  # Group 0 also shares its first action token: the prefix covers it.
  seg0 = rows.segment_ids_NxL[0][packed.token_mask_NxL[0]]
  prompt0 = int(np.argmax(batch.action_mask_NxK[0]))
  assert int((seg0 == 0).sum()) == prompt0 + 1
  # Every scored token lands on a slot holding the same token, at the position it had in its rollout, with its
  # advantage and its loss inputs.
  got = []
  for r in range(4):
    k = packed.action_mask_NxK[r]
    slots = rows.slots_NxK[r][k]
    got += list(
      zip(
        packed.tokens_NxL[r][slots],
        rows.positions_NxL[r][slots],
        packed.adv_NxK[r][k],
        packed.inputs_NxK["distill_target"][r][k],
      )
    )
  want = []
  for i in range(9):
    t = np.flatnonzero(batch.action_mask_NxK[i])
    want += list(zip(tokens[i, t], t, batch.adv_NxK[i, t], batch.inputs_NxK["distill_target"][i, t]))
  assert sorted(map(tuple, np.asarray(got, np.float64))) == sorted(map(tuple, np.asarray(want, np.float64)))
  # Padding slots hold zeros.
  assert (packed.adv_NxK[~packed.action_mask_NxK] == 0).all()
  # A continuation sees its group's prefix: prefix_limit is the prefix length on its tokens.
  cont = rows.segment_ids_NxL[0] >= 1
  assert (rows.prefix_limit_NxL[0][cont] == prompt0 + 1).all()


def test_a_group_longer_than_a_row_spills_onto_rows_that_repeat_its_prefix():
  batch = rollout_batch(groups=1, group_size=4)
  packed = pack_update_batch(batch, length_bucket=1, max_row_len=30, slot_bucket=1)
  assert packed.tokens_NxL.shape[0] >= 2
  prefix = int((packed.packed.segment_ids_NxL[0][packed.token_mask_NxL[0]] == 0).sum())
  for r in range(packed.tokens_NxL.shape[0]):
    np.testing.assert_array_equal(packed.tokens_NxL[r, :prefix], batch.tokens_NxL[0, :prefix])
  assert packed.token_mask_NxL.sum(1).max() <= 30


@pytest.mark.parametrize(
  "bad, message",
  [
    (lambda b: b.token_mask_NxL.__setitem__((0, 1), False) or b, "contiguously"),
    (lambda b: dataclasses.replace(b, adv_NxK=np.zeros((9, 3), np.float32)), "adv"),
    (lambda b: dataclasses.replace(b, inputs_NxK={"distill_weight": np.zeros((9,), np.float32)}), "distill_weight"),
    (lambda b: dataclasses.replace(b, group_ids_N=np.zeros((4,), np.int32)), "group_ids_N"),
    (lambda b: dataclasses.replace(b, token_mask_NxL=b.token_mask_NxL[:, :3]), "token_mask_NxL"),
    (lambda b: pack_update_batch(b), "already packed"),
  ],
)
def test_bad_batches_are_refused_naming_the_field(bad, message):
  batch = bad(rollout_batch())
  with pytest.raises(ValueError, match=message):
    pack_update_batch(batch)


def test_an_action_on_padding_is_refused():
  batch = rollout_batch()
  n = int(batch.token_mask_NxL[0].sum())
  if n == batch.tokens_NxL.shape[1]:
    batch.token_mask_NxL[0, -1] = False
    n -= 1
  batch.action_mask_NxK[0, n] = True
  with pytest.raises(ValueError, match="padding"):
    pack_update_batch(batch)


def _loss_and_grads(batch, cfg, num_micro):
  model = Decoder(tiny_decoder_config(tie_word_embeddings=False), rngs=nnx.Rngs(0))  # as the update tests' model
  graphdef, params, rest = step_lib.split_model(model)
  fn = jax.jit(lambda p, b: step_lib.loss_and_grads(step_lib.pg_token_loss, graphdef, p, rest, b, cfg, num_micro))
  return fn(params, batch.for_device())


# Every aggregation in one micro-batch and in two. Each case compiles its own packed and unpacked programs, so of the
# two-micro-batch cases the default suite keeps token-mean (normalised over the update's tokens across micro-batches)
# and seq-mean-token-sum-norm (the constant max_len); the other two run in the slow tier.
_MICRO_SLOW = ("seq-mean-token-mean", "seq-mean-token-sum")


@pytest.mark.parametrize(
  "num_micro, aggregation",
  [(1, a) for a in loss_lib.AGGREGATIONS]
  + [pytest.param(2, a, marks=[pytest.mark.slow] if a in _MICRO_SLOW else []) for a in loss_lib.AGGREGATIONS],
)
def test_packed_loss_metrics_and_gradients_equal_the_unpacked_ones(aggregation, num_micro):
  batch = rollout_batch(seed=1, groups=2, group_size=4)
  cfg = step_lib.PolicyLossConfig(
    aggregation=aggregation, kl_coef=0.1, terms=("policy", "distill"), knob_weights=(("distill_coef", 0.5),), max_len=40
  )
  packed = pack_update_batch(batch, length_bucket=8, slot_bucket=8, rows_multiple=num_micro, max_row_len=40)
  want_loss, want_grads, want_m = _loss_and_grads(batch, cfg, num_micro if num_micro == 1 else 2)
  got_loss, got_grads, got_m = _loss_and_grads(packed, cfg, num_micro)
  np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=2e-5, atol=1e-6)
  for k in ("loss_policy", "loss_kl", "loss_distill", "clip", "ratio_dev", "kl", "distill_gap"):
    np.testing.assert_allclose(float(got_m[k]), float(want_m[k]), rtol=2e-5, atol=1e-6, err_msg=k)
  flat_w = jax.tree_util.tree_leaves(want_grads)
  flat_g = jax.tree_util.tree_leaves(got_grads)
  scale = max(float(np.abs(np.asarray(w)).max()) for w in flat_w)
  assert scale > 1e-4  # the gradient is not trivially zero
  for w, g in zip(flat_w, flat_g):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5 * scale)


def test_dr_grpo_on_a_packed_batch_needs_the_constant_max_len():
  batch = pack_update_batch(rollout_batch())
  cfg = step_lib.PolicyLossConfig(aggregation="seq-mean-token-sum-norm")
  with pytest.raises(ValueError, match="max_len"):
    _loss_and_grads(batch, cfg, 1)


def test_a_batch_with_a_rollout_longer_than_the_row_cap_stays_unpacked():
  """A packed row attends through a dense [L, L] mask; long rollouts (BFCL) keep the unpacked path."""
  batch = rollout_batch()  # rollouts of up to 24 tokens
  longest = int(batch.token_mask_NxL.sum(1).max())
  kept = pack_if_short(batch, length_bucket=1, max_row_len=longest - 1)
  assert kept.packed is None and kept.group_ids_N is None
  np.testing.assert_array_equal(kept.tokens_NxL, batch.tokens_NxL)
  packed = pack_if_short(batch, length_bucket=1, max_row_len=longest)
  assert packed.packed is not None and packed.tokens_NxL.shape[1] <= max(longest, 1) * 3
  with pytest.raises(ValueError, match="max_row_len"):
    pack_if_short(batch, max_row_len=0)


def test_the_batch_jaxcredit_plan_lowers_is_the_builders_own():
  """`abstract_update_batch` (what `jaxcredit plan` lowers the update on) runs the trainer's builders under
  `jax.eval_shape`: for the loss with the KL and distillation terms it has exactly the built batch's arrays, each of
  its shape and dtype, unpacked and packed."""
  batch = rollout_batch()
  cfg = step_lib.PolicyLossConfig(terms=("policy", "distill"), knob_weights=(("distill_coef", 0.1),), kl_coef=0.1)
  packed = pack_update_batch(batch, length_bucket=8, slot_bucket=8)
  for built, slots in ((batch.for_device(), 0), (packed, packed.packed.slots_NxK.shape[1])):
    rows, length = built.tokens_NxL.shape
    abstract = abstract_update_batch(cfg, batch_size=rows, seq_len=length, hidden_size=4, packed_slots=slots)
    want = jax.tree_util.tree_flatten_with_path(built)[0]
    got = jax.tree_util.tree_flatten_with_path(abstract)[0]
    assert [p for p, _ in got] == [p for p, _ in want]
    for (path, a), (_, b) in zip(got, want):
      assert a.shape == np.shape(b) and a.dtype == np.asarray(b).dtype, jax.tree_util.keystr(path)
