"""The rollout-engine table, its config checks, and the trainer's correction for an external engine's log-probs."""

import types

import numpy as np
import pytest

from jaxcredit.trajectory import drop_invalid_behavior_logp
from jaxcredit.train import config as config_lib
from jaxcredit.train.loop import update as update_lib
from jaxcredit.train.tables.engines import ENGINES


def test_engine_table():
  assert set(ENGINES) == {"jax", "vllm"}
  assert not ENGINES["jax"].external and ENGINES["vllm"].external


@pytest.mark.parametrize(
  "overrides, message",
  [
    ({"rollout.engine": "sglang"}, "config.rollout.engine = 'sglang': must be one of \\('jax', 'vllm'\\)"),
    ({"rollout.engine": "vllm"}, "needs config.rollout.vllm.url .* or config.rollout.vllm.python"),
    ({"rollout.engine": "vllm", "rollout.vllm.url": "http://a:1,localhost:8000"}, "got 'localhost:8000'"),
    (
      {"rollout.engine": "vllm", "rollout.vllm.url": "http://h:1", "sampling.top_p": 0.9},
      "config.sampling.top_p=0.9: rollout.engine='vllm' samples with top_p=1",
    ),
    ({"rollout.max_staleness": -1}, "config.rollout.max_staleness = -1: must be an int >= 0"),
    ({"loss.engine_is_cap": 0.5}, "config.loss.engine_is_cap = 0.5: must be a finite number >= 1"),
    ({"loss.engine_is_cap": float("nan")}, "config.loss.engine_is_cap = nan: must be a finite number >= 1"),
  ],
)
def test_engine_config_is_checked_naming_the_field(overrides, message):
  c = config_lib.base_config()
  for key, value in overrides.items():
    node = c
    *parents, leaf = key.split(".")
    for part in parents:
      node = node[part]
    node[leaf] = value
  with pytest.raises(ValueError, match=message):
    config_lib.validate(c)


def test_engine_correction_weights_gap_and_behaviour():
  """The trainer's log-probs become the behaviour log-probs of the action tokens; each action token's weight is
  min(exp(trainer - engine), cap); pad rows and context tokens keep weight 1 and stay out of the metrics."""
  c = config_lib.base_config()
  c.loss.engine_is_cap = 2.0
  engine = np.array([[0.0, -1.0, -2.0, -0.5], [0.0, -1.0, -3.0, 0.0], [0.0, -4.0, -4.0, 0.0]], np.float32)
  trainer_logp = np.array([[-9.0, -0.9, -2.5, 0.5], [-9.0, -1.0, -3.0, -9.0], [-9.0, 0.0, 0.0, -9.0]], np.float32)
  traj = types.SimpleNamespace(
    tokens_BxL=np.zeros((3, 4), np.int32),
    token_mask_BxL=np.ones((3, 4), bool),
    action_mask_BxL=np.array([[0, 1, 1, 1], [0, 1, 1, 0], [0, 1, 1, 0]], bool),
    sample_mask_B=np.array([True, True, False]),  # a pad row
    behavior_logp_BxL=engine,
  )
  run = types.SimpleNamespace(
    config=c, graphdef=None, rest=None, state=types.SimpleNamespace(policy_logp=lambda p, t, m: trainer_logp)
  )
  behaviour, weight, row = update_lib.engine_correction(run, None, traj)
  act = traj.action_mask_BxL & traj.sample_mask_B[:, None]
  np.testing.assert_array_equal(behaviour[act], trainer_logp[act])
  np.testing.assert_array_equal(behaviour[~act], engine[~act])
  expected = np.minimum(np.exp(trainer_logp - engine), 2.0)
  np.testing.assert_allclose(weight[act], expected[act], rtol=1e-6)
  assert np.all(weight[~act] == 1.0)
  gaps = np.abs(trainer_logp - engine)[act]  # 0.1, 0.5, 1.0, 0, 0
  assert row["engine_logp_gap_mean"] == pytest.approx(gaps.mean(), rel=1e-6)
  assert row["engine_logp_gap_max"] == pytest.approx(1.0)
  assert row["engine_is_truncated_frac"] == pytest.approx(1 / 5)  # exp(1.0) > 2
  assert row["engine_is_weight_mean"] == pytest.approx(expected[act].mean(), rel=1e-6)


def test_one_vllm_server_per_training_process():
  from jaxcredit.train.tables.engines import vllm_urls

  c = config_lib.base_config()
  assert vllm_urls(c) == []  # launch one
  c.rollout.vllm.url = " http://a:1 "
  assert vllm_urls(c) == ["http://a:1"]
  c.rollout.vllm.url = "http://a:1,http://b:2"
  with pytest.raises(ValueError, match="lists 2 server\\(s\\) for 1 training process"):
    vllm_urls(c)


def test_flat_params_are_host_arrays_by_parameter_path():
  """`flat_params` (what a vLLM weight sync writes) names every parameter as `param_shapes` does and copies its value."""
  from flax import nnx

  from jaxcredit.models import Decoder
  from jaxcredit.models.decoder import param_shapes
  from jaxcredit.train.tables.engines import flat_params
  from tests.fixtures.tiny_model import tiny_decoder_config

  cfg = tiny_decoder_config(vocab_size=64)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  flat = flat_params(model)
  assert {name: a.shape for name, a in flat.items()} == param_shapes(cfg)
  assert all(isinstance(a, np.ndarray) for a in flat.values())
  np.testing.assert_array_equal(flat["layers/wq"], np.asarray(model.layers.wq[...]))


def _traj_with_one_missing_logp(value):
  """Two rollouts of 4 tokens, actions at 1..3; the engine gave token [0, 2] no log-prob (`value`: NaN or -inf)."""
  engine = np.array([[0.0, -1.0, value, -0.5], [0.0, -1.0, -3.0, -0.2]], np.float32)
  return types.SimpleNamespace(
    tokens_BxL=np.zeros((2, 4), np.int32),
    token_mask_BxL=np.ones((2, 4), bool),
    action_mask_BxL=np.array([[0, 1, 1, 1], [0, 1, 1, 1]], bool),
    sample_mask_B=np.array([True, True]),
    behavior_logp_BxL=engine,
    group_ids_B=np.array([0, 0], np.int32),
  )


@pytest.mark.parametrize("value", [float("nan"), -np.inf, np.inf])
def test_a_token_without_an_engine_logprob_leaves_the_loss_and_the_gap_metrics(value):
  """Issue 35 case 11: a null log-prob from the engine (read as -inf) gave a log-ratio of +inf, the token the cap's
  weight (the largest) and engine_logp_gap_mean inf. Now it leaves the loss: loss and gradient equal those of the
  batch with that token masked out; it is counted in engine_invalid_logp_tokens; the gap metrics stay finite."""
  from jaxcredit.train.loop import step as step_lib

  c = config_lib.base_config()
  traj = _traj_with_one_missing_logp(value)
  trainer_logp = np.array([[-9.0, -0.9, -2.5, -0.4], [-9.0, -1.2, -2.0, -0.3]], np.float32)
  run = types.SimpleNamespace(
    config=c, graphdef=None, rest=None, state=types.SimpleNamespace(policy_logp=lambda p, t, m: trainer_logp)
  )
  _, raw_weight, raw_row = update_lib.engine_correction(run, None, traj)  # even before the drop
  assert np.isfinite(raw_row["engine_logp_gap_mean"]) and raw_weight[0, 2] < c.loss.engine_is_cap
  kept, row = drop_invalid_behavior_logp(traj)
  assert row == {"engine_invalid_logp_tokens": 1}
  ref = _traj_with_one_missing_logp(-2.0)
  ref.action_mask_BxL[0, 2] = False
  _, weight, gap_row = update_lib.engine_correction(run, None, kept)
  assert np.isfinite(gap_row["engine_logp_gap_mean"]) and np.isfinite(gap_row["engine_logp_gap_max"])
  assert weight[0, 2] == 1.0  # not an action token any more: not the cap
  _, ref_weight, ref_row = update_lib.engine_correction(run, None, ref)
  assert gap_row == ref_row
  np.testing.assert_array_equal(weight, ref_weight)

  cfg = step_lib.PolicyLossConfig(aggregation="token-mean")
  adv_BxL = np.array([[0, 1.0, 1.0, 1.0], [0, -1.0, -1.0, -1.0]], np.float32)

  def policy_only(graphdef, params, rest, mb, cfg):
    assert mb.behavior_weight_NxK is None and mb.adv_NxK is not None
    tok_loss, _ = step_lib.policy_term(params["logp_BxL"], mb, cfg)
    return {"policy": tok_loss}, {}

  params = {"logp_BxL": np.full((2, 4), -1.1, np.float32)}
  batch = update_lib.update_batch(kept, adv_BxL=adv_BxL).for_device()
  loss, grads, _ = step_lib.loss_and_grads(policy_only, None, params, None, batch, cfg)
  ref_batch = update_lib.update_batch(ref, adv_BxL=adv_BxL).for_device()
  ref_loss, ref_grads, _ = step_lib.loss_and_grads(policy_only, None, params, None, ref_batch, cfg)
  assert np.isfinite(float(loss)) and float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
  np.testing.assert_allclose(grads["logp_BxL"], ref_grads["logp_BxL"], rtol=1e-6)
  assert float(grads["logp_BxL"][0, 2]) == 0.0


def test_finite_engine_logprobs_are_all_kept():
  traj = _traj_with_one_missing_logp(-2.0)
  kept, row = drop_invalid_behavior_logp(traj)
  assert row == {"engine_invalid_logp_tokens": 0}
  np.testing.assert_array_equal(kept.action_mask_BxL, traj.action_mask_BxL)
