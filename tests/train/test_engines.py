"""The rollout-engine table, its config checks, and the trainer's correction for an external engine's log-probs."""

import types

import numpy as np
import pytest

from jaxcredit.train import config as config_lib
from jaxcredit.train import trainer
from jaxcredit.train.engines import ENGINES


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
  run = types.SimpleNamespace(config=c, graphdef=None, rest=None, policy_logp=lambda p, t, m: trainer_logp)
  behaviour, weight, row = trainer._engine_correction(run, None, traj)
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
  from jaxcredit.train.engines import vllm_urls

  c = config_lib.base_config()
  assert vllm_urls(c) == []  # launch one
  c.rollout.vllm.url = " http://a:1 "
  assert vllm_urls(c) == ["http://a:1"]
  c.rollout.vllm.url = "http://a:1,http://b:2"
  with pytest.raises(ValueError, match="lists 2 server\\(s\\) for 1 training process"):
    vllm_urls(c)
