"""The trainer's per-method dispatch: group-major batches give the credit functions' values on action tokens."""

import ml_collections
import numpy as np
import pytest

from jaxcredit.trajectory import RolloutBuilder, pack
from jaxcredit.train import advantages
from jaxcredit.train.config import base_config


def _traj():
  rollouts = []
  for g in range(4):
    b = RolloutBuilder.from_prompt([1, 2, 3])
    b.append_action([10 + g, 11], [-0.5, -0.5])   # turn 0: tool call
    b.append_context([4, 5])
    b.mark_boundary()
    b.append_action([12, 13, 14], [-0.1] * 3)     # turn 1: answer
    rollouts.append(b)
  return pack(rollouts, [1.0, 0.0, 0.0, 0.0, ], [0, 0, 0, 0], max_turns=3, pad_id=0, length_bucket=16)


def _cfg(method):
  c = base_config().credit
  c.method = method
  return c


def test_grpo_broadcasts_group_advantage_on_action_tokens_only():
  traj = _traj()
  adv, _, _ = advantages.compute(traj, None, None, _cfg("grpo"), group_size=4)
  expect = np.asarray([1.5, -0.5, -0.5, -0.5])
  for b in range(4):
    np.testing.assert_allclose(adv[b][traj.action_mask_BxL[b]], expect[b], atol=1e-5)
    assert np.all(adv[b][~traj.action_mask_BxL[b]] == 0.0)


def test_trace_adds_td_rewards_per_turn():
  traj = _traj()
  gold = np.tile(np.asarray([[-5.0, -3.0, 0.0, 0.0]], np.float32), (4, 1))
  gold[1, 1] = -5.0   # rollout 1's tool call did not help: TD reward 0
  mask = traj.boundary_mask_BxT1.copy()
  adv, turn_adv, td = advantages.compute(traj, gold, mask, _cfg("trace"), group_size=4)
  np.testing.assert_allclose(td[:, 0], [2.0, 0.0, 2.0, 2.0], atol=1e-6)
  np.testing.assert_allclose(td[:, 1], 0.0, atol=1e-6)   # the answer turn has no next boundary
  # turn 0 of rollout 0 = outcome 1.5 + beta * 2 / rms(2, 0, 2, 2 over dense turns)
  rms = np.sqrt(np.mean(np.asarray([2.0, 0.0, 2.0, 2.0]) ** 2))
  assert turn_adv[0, 0] == pytest.approx(1.5 + 2.0 / (rms + 1e-6), abs=1e-5)
  assert turn_adv[1, 0] == pytest.approx(-0.5, abs=1e-5)
  np.testing.assert_allclose(adv[0][traj.turn_ids_BxL[0] == 0], turn_adv[0, 0], atol=1e-6)


def test_methods_without_a_teacher_pass_are_refused_by_name():
  for method in ("crest", "toolopd", "hsd", "gear", "opd"):
    with pytest.raises(NotImplementedError, match=method):
      advantages.compute(_traj(), None, None, _cfg(method), group_size=4)
