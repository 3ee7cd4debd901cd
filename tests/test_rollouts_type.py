"""`jaxcredit.trajectory.Rollouts`: the step's rollouts as one typed value, built from sampled results or from JSONL
records, refusing a per-rollout field of the wrong length by name."""

import types

import numpy as np
import pytest

from jaxcredit.rollout import jsonl as jsonl_lib
from jaxcredit.trajectory import RolloutBuilder, Rollouts


def _result(reward: float, finish: str, calls: int, turns: int = 1):
  b = RolloutBuilder.from_prompt([1, 2, 3])
  for t in range(turns):
    b.append_action([4 + t, 5], [-0.5, -0.25])
    b.append_context([9])
  messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
  return types.SimpleNamespace(
    builder=b, reward=reward, finish=finish, tool_calls=calls, tool_errors=calls // 2, messages=messages
  )


def test_from_results_groups_masks_failed_environments_and_keeps_host_fields():
  results = [_result(1.0, "answer", 2), _result(0.25, "env_error", 3, turns=2), _result(0.0, "length", 0)]
  results.append(_result(0.5, "answer", 1))
  r = Rollouts.from_results(
    results, ["t0", "t0", "t1", "t1"], group_size=2, max_turns=3, pad_id=0, length_bucket=8, processes=[0, 0, 1, 1]
  )
  assert r.batch_size == 4
  np.testing.assert_array_equal(r.traj.group_ids_B, [0, 0, 1, 1])
  np.testing.assert_array_equal(r.traj.sample_mask_B, [True, False, True, True])  # the env_error rollout is out
  assert r.rewards == (1.0, 0.25, 0.0, 0.5) and r.finish[1] == "env_error"
  np.testing.assert_array_equal(r.tool_calls_B, [2, 3, 0, 1])
  np.testing.assert_array_equal(r.tool_errors_B, [1, 1, 0, 0])
  np.testing.assert_array_equal(r.num_turns_B, [1, 2, 1, 1])
  np.testing.assert_array_equal(r.process_B, [0, 0, 1, 1])
  assert r.tasks == ("t0", "t0", "t1", "t1")


def test_a_field_of_the_wrong_length_is_refused_by_name():
  r = Rollouts.from_results(
    [_result(1.0, "answer", 0)] * 2, ["a", "b"], group_size=2, max_turns=1, pad_id=0, length_bucket=8
  )
  with pytest.raises(ValueError, match=r"Rollouts.tasks has 1 entries for the trajectory's 2 rollouts"):
    Rollouts(**{**r.__dict__, "tasks": ("a",)})
  with pytest.raises(ValueError, match=r"Rollouts.tool_calls_B has 3 entries"):
    Rollouts(**{**r.__dict__, "tool_calls_B": np.zeros(3, np.int32)})


def test_from_records_reads_what_the_export_wrote():
  results = [_result(1.0, "answer", 2), _result(0.0, "length", 1, turns=2)]
  records = [
    jsonl_lib.rollout_to_record(res, rollout_id=f"r{i}", group_id="g", metadata={"process": i})
    for i, res in enumerate(results)
  ]
  traj, _ = jsonl_lib.records_to_trajectory(records, pad_id=0, length_bucket=8)
  builders = [jsonl_lib.record_to_builder(rec) for rec in records]
  r = Rollouts.from_records(records, traj, builders)
  assert r.rewards == (1.0, 0.0) and r.finish == ("answer", "length") and r.tasks == (None, None)
  np.testing.assert_array_equal(r.tool_calls_B, [2, 1])
  np.testing.assert_array_equal(r.tool_errors_B, [1, 0])
  np.testing.assert_array_equal(r.process_B, [0, 1])
  assert [m[-1]["content"] for m in r.messages] == ["a", "a"]
  np.testing.assert_array_equal(r.num_turns_B, [1, 2])
