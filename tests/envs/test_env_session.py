"""The session environment (issue 34's long-horizon testbed, CrEST's regime): tasks, requests verified one by one
against their true values, the next request as a user message, the all-requests reward and per-request verdicts,
demonstrations played through it, and the config row."""

import random

import pytest

from jaxcredit.envs import ENVS, chain, session, tool_calls
from jaxcredit.train.config import base_config


def _call(expression: str) -> str:
  return tool_calls.render_tool_call("calculator", {"expression": expression})


@pytest.fixture(scope="module")
def train_tasks():
  return session.make_tasks("train", 200, 0)


def _play(env, task, wrong_unit=None):
  """Follows the session faithfully (one call per step), answering request `wrong_unit` one too high and carrying
  that wrong value on, as a policy would."""
  value = task.start
  results = []
  for u, steps in enumerate(task.steps):
    for op, n in steps:
      r = env.step(_call(f"{value}{op}{n}"))
      value = chain.apply_step(value, op, n)
      assert r.observation == tool_calls.render_tool_response(str(value)) and r.role == "tool"
    if u == wrong_unit:
      value += 1
    results.append(env.step(tool_calls.render_answer(str(value))))
  return results


def test_tasks_continue_each_request_from_the_one_before(train_tasks):
  for t in train_tasks:
    assert 3 <= len(t.requests) <= 4 and len(t.steps) == len(t.values) == len(t.requests)
    assert t.values[0][0] == t.start and t.answer == str(t.values[-1][-1])
    for u, (steps, values) in enumerate(zip(t.steps, t.values)):
      assert 1 <= len(steps) <= 2 and len(values) == len(steps) + 1
      assert [chain.apply_step(a, op, n) for (op, n), a in zip(steps, values)] == list(values[1:])
      assert all(1 <= v <= chain.MAX_VALUE for v in values)
      if u:
        assert values[0] == t.values[u - 1][-1] and t.requests[u].startswith("Take that result")
  assert session.make_tasks("eval", 5) == session.make_tasks("eval", 10)[:5]
  reserve = {"\n".join(t.requests) for t in session.make_tasks("eval", session.EVAL_RESERVE)}
  assert not reserve & {"\n".join(t.requests) for t in train_tasks}


def test_a_right_session_pays_with_each_request_verified(train_tasks):
  task = train_tasks[0]
  env = session.SessionEnv(task)
  results = _play(env, task)
  for u, r in enumerate(results[:-1]):
    assert not r.done and r.role == "user" and r.observation == task.requests[u + 1]
    assert r.info["unit_rewards"] == [1.0] * (u + 1)
  assert results[-1].done and results[-1].info["answered"] and results[-1].info["finish"] == "answer"
  assert env.reward() == 1.0 and env.unit_rewards() == [1.0] * len(task.requests)
  assert session.metrics([env]) == {
    "session_unit_success": 1.0,
    "session_units_before_first_failure": 1.0,
    "session_request_success_given_right_input": 1.0,
  }


def test_a_wrong_request_fails_it_and_the_ones_built_on_it(train_tasks):
  """Request 2 answered one too high, the rest computed from it: requests 2.. fail (their true values come from the
  true value before them), request 1 passes; the all-requests reward is 0, the share 1/len."""
  task = train_tasks[1]
  env = session.SessionEnv(task)
  _play(env, task, wrong_unit=1)
  n = len(task.requests)
  assert env.unit_rewards() == [1.0] + [0.0] * (n - 1) and env.reward() == 0.0
  assert session.metrics([env])["session_units_before_first_failure"] == pytest.approx(1 / n)
  # requests 1 and 2 had right inputs (the start, request 1's right answer), request 2 failed: 1 of 2; the rest
  # were built on a wrong answer and do not count
  assert session.metrics([env])["session_request_success_given_right_input"] == pytest.approx(1 / 2)
  env = session.SessionEnv(task, reward="unit_fraction")
  _play(env, task, wrong_unit=n - 1)
  assert env.reward() == pytest.approx((n - 1) / n)


def test_a_request_ends_unanswered_past_its_budget_or_without_an_action(train_tasks):
  task = train_tasks[2]
  env = session.SessionEnv(task, extra_calls=0)
  for _ in task.steps[0]:
    env.step(_call("1+1"))
  r = env.step(_call("1+1"))  # past request 1's budget: the request ends unanswered, the next arrives
  assert r.role == "user" and r.info["budget_exhausted"] and env.unit_rewards() == [0.0]
  r = env.step("I am not sure.")  # neither call nor answer: request 2 ends unanswered
  assert env.unit_rewards() == [0.0, 0.0] and r.observation == task.requests[2]
  env.step(_call("2+2"))  # a started request counts as a unit of the rollout when it stops there
  assert env.unit_rewards() == [0.0, 0.0, 0.0]


def test_demonstrations_replay_and_fail_after_a_slip(train_tasks):
  rng = random.Random(0)
  for task in train_tasks[:40]:
    for kwargs, paid in (({}, 1.0), ({"skip_prob": 1.0}, 1.0), ({"slip_prob": 1.0}, 0.0)):
      demo = session.demonstration(task, rng, **kwargs)
      env = session.SessionEnv(task, extra_calls=0)
      for m, nxt in zip(demo, demo[1:] + [None]):
        if m["role"] == "assistant":
          r = env.step(m["content"])
          if nxt is not None:
            assert r.observation == nxt["content"] and r.role == nxt["role"]
      assert env.done and env.reward() == paid, (task.task_id, kwargs)


def test_the_env_row_builds_from_its_config_node_and_refuses_by_key():
  node = base_config().env.session
  node.update({"max_requests": 3, "max_steps_per_request": 1, "extra_calls": 0})
  spec = ENVS["session"].make_spec(node)
  assert spec.max_turns == 3 * (1 + 0 + 1)
  task = spec.make_tasks("train", 3, 0)[0]
  texts = spec.unit_privileged_info(task)
  assert len(texts) == len(task.requests) and texts[-1].endswith(f"<answer>{task.answer}</answer>")
  assert spec.unit_rewards(spec.make_env(task)) == []
  for key, bad in (("reward", "mean"), ("max_requests", 1), ("slip_prob", -0.5), ("max_steps_per_request", 0)):
    bad_node = base_config().env.session
    bad_node[key] = bad
    with pytest.raises(ValueError, match=f"config.env.session.{key}"):
      ENVS["session"].make_spec(bad_node)
