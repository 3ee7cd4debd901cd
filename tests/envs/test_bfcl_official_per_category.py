"""BFCL multi-turn's official accuracy per category (`bfcl_official_accuracy/<category>`) equals what bfcl-eval's own
evaluation reports on the same model outputs: its `multi_turn_checker`, called as its eval runner calls it (the decoded
calls of each step of each turn, empty steps left out), on the ground truth replayed, the ground truth with the last
call of each request dropped, empty outputs and the ground truth's calls in reverse order, category by category, on
all 800 sessions."""

import json
import uuid

import pytest

pytest.importorskip("bfcl_eval")

from jaxcredit.envs import bfcl_multi_turn as bm

PER_CATEGORY = 200
"""Sessions per category: all of BFCL's."""

SCENARIOS = {
  "ground_truth": lambda calls: list(calls),
  "one_call_dropped": lambda calls: list(calls)[:-1],
  "empty": lambda calls: [],
  # Not in the list: each request's calls in reverse order, which some sessions pass (calls that commute)
  # and others fail, so that the categories' accuracies are neither 0 nor 1.
  "calls_reversed": lambda calls: list(calls)[::-1],
}
"""What the model outputs in a request, from that request's ground-truth calls."""


@pytest.fixture(scope="module")
def tasks():
  every = bm.load_tasks()
  return [t for c in bm.CATEGORIES for t in [t for t in every if t.category == c][:PER_CATEGORY]]


def _ours(task, outputs) -> bm.BfclSession:
  """The session fed, per request, one message with `outputs(ground-truth calls)` (when any), then a message without
  a call."""
  session = bm.BfclSession(task, max_steps_per_unit=2)
  for unit in range(task.num_units):
    calls = outputs(bm.ground_truth_calls(task, unit))
    if calls:
      assert not session.step(bm.render_calls(calls)).done
    session.step(bm.DONE_TEXT if calls else bm.REFUSAL_TEXT)
  assert session.done
  return session


def _bfcl(task, outputs, model_name: str) -> bool:
  """bfcl-eval's verdict on the same outputs (`eval_runner`'s multi-turn path: one decoded step per request with
  calls; a request without calls has no step)."""
  from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

  decoded = []
  for unit in range(task.num_units):
    strings = outputs(task.ground_truth[unit])
    decoded.append([list(strings)] if strings else [])
  entry = {
    "id": task.task_id,
    "initial_config": json.loads(task.initial_config),
    "involved_classes": list(task.involved_classes),
  }
  ground_truth = [list(g) for g in task.ground_truth]
  return bool(multi_turn_checker(decoded, ground_truth, entry, f"multi_turn_{task.category}", model_name)["valid"])


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_official_accuracy_per_category_equals_bfcl_evals(tasks, scenario):
  outputs = SCENARIOS[scenario]
  model_name = f"jaxcredit_test_{scenario}_{uuid.uuid4().hex[:8]}"  # bfcl-eval caches backends by model name
  sessions = [_ours(t, outputs) for t in tasks]
  theirs = [_bfcl(t, outputs, model_name) for t in tasks]
  assert [bm.official_valid(s) for s in sessions] == theirs  # session by session, not only on average
  ours = bm.env_metrics(sessions)
  for category in bm.CATEGORIES:
    verdicts = [v for t, v in zip(tasks, theirs) if t.category == category]
    assert len(verdicts) == PER_CATEGORY
    assert ours[f"bfcl_official_accuracy/{category}"] == sum(verdicts) / len(verdicts), (scenario, category)
  expected = {"ground_truth": 1.0, "one_call_dropped": 0.0, "empty": 0.0}.get(scenario)
  if expected is not None:
    assert all(ours[f"bfcl_official_accuracy/{c}"] == expected for c in bm.CATEGORIES)
  else:
    assert 0.0 < ours["bfcl_official_accuracy"] < 1.0
