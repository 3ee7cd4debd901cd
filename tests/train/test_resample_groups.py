"""Dynamic sampling (`rollout.resample_tied_groups`): groups whose rollouts all got the same reward are replaced, in
order, by the untied groups of fresh batches, for a bounded number of rounds (issue 38)."""

import types

import jax
import pytest

from jaxcredit.train.loop import rl_step
from jaxcredit.train.config import base_config, check_ranges


def _sampled(tag: str, rewards: list[list[float]]) -> rl_step.StepRollouts:
  results = [types.SimpleNamespace(reward=r, env=None) for group in rewards for r in group]
  tasks = [f"{tag}{k}" for k, group in enumerate(rewards) for _ in group]
  return rl_step.StepRollouts(
    tasks=tasks,
    results=results,
    unit_rewards=[[r.reward] for r in results],
    processes=[0] * len(results),
    env_metrics={"env/x": 1.0},
    sampler_stats={"sampler_extends": 1},
    seconds=2.0,
  )


@pytest.fixture
def fake_rounds(monkeypatch):
  """sample_step returns the prepared batches b, c, ... in turn (group size 2, three groups each)."""
  batches = iter(
    [
      _sampled("b", [[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]]),
      _sampled("c", [[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]]),
    ]
  )
  monkeypatch.setattr(rl_step, "sample_step", lambda run, params, ids, key: next(batches))

  def run(rounds):
    c = base_config()
    c.rollout.group_size = 2
    c.rollout.resample_tied_groups = rounds
    return types.SimpleNamespace(config=c)

  return run


def test_tied_groups_are_replaced_in_order_by_fresh_untied_groups(fake_rounds):
  first = _sampled("a", [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]])
  assert rl_step.tied_groups(first, 2) == [0, 2]
  out = rl_step.resample_tied_groups(fake_rounds(3), None, iter([[0, 1, 2]] * 5), jax.random.key(0), first)
  # round 1 (b): its one untied group (b1) replaces a0; round 2 (c): c0 replaces a2; then no tied group is left
  assert out.tasks == ["b1", "b1", "a1", "a1", "c0", "c0"]
  assert [r.reward for r in out.results] == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
  assert out.unit_rewards == [[1.0], [0.0], [0.0], [1.0], [0.0], [1.0]]
  assert out.resample_stats == {"resample_rounds": 2, "resampled_groups": 2, "tied_groups_left": 0}
  assert out.seconds == 6.0 and out.sampler_stats == {"sampler_extends": 3} and out.env_metrics == {"env/x": 1.0}


def test_the_rounds_are_bounded_and_a_mixed_batch_samples_nothing(fake_rounds):
  first = _sampled("a", [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]])
  out = rl_step.resample_tied_groups(fake_rounds(1), None, iter([[0, 1, 2]] * 5), jax.random.key(0), first)
  assert out.tasks[:2] == ["b1", "b1"] and out.tasks[4:] == ["a2", "a2"]
  assert out.resample_stats == {"resample_rounds": 1, "resampled_groups": 1, "tied_groups_left": 1}
  mixed = _sampled("m", [[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
  out = rl_step.resample_tied_groups(fake_rounds(3), None, iter([]), jax.random.key(0), mixed)
  assert out.resample_stats == {"resample_rounds": 0, "resampled_groups": 0, "tied_groups_left": 0}


def test_the_knob_is_a_non_negative_int():
  c = base_config()
  c.rollout.resample_tied_groups = -1
  with pytest.raises(ValueError, match="config.rollout.resample_tied_groups"):
    check_ranges(c)
