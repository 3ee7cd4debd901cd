"""benchmarks/chain_credit.py: the labels of a chain rollout's turns and the within-rollout contrast."""

import json

import chain_credit
import pytest

QUESTION = "Start with 20 and apply each step in order: *3, -16, +4."  # values 20, 60, 44, 48


def _call(expression: str) -> dict:
  arguments = json.dumps({"expression": expression})
  return {
    "role": "assistant",
    "content": f'<tool_call>{{"name": "calculator", "arguments": {arguments}}}</tool_call>',
    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "calculator", "arguments": arguments}}],
  }


def _record(calls: list[str], answer: str, reward: float, turn_advantages: list[float]) -> dict:
  messages = [{"role": "system", "content": "s"}, {"role": "user", "content": QUESTION}]
  for expression in calls:
    messages += [_call(expression), {"role": "tool", "content": "<tool_response>0</tool_response>"}]
  messages.append({"role": "assistant", "content": f"<answer>{answer}</answer>"})
  return {"rollout_id": "r", "messages": messages, "reward": reward, "turn_advantages": turn_advantages}


def test_chain_of_parses_steps_and_values():
  assert chain_credit.chain_of(QUESTION) == ([("*", 3), ("-", 16), ("+", 4)], [20, 60, 44, 48])
  with pytest.raises(ValueError, match="not a chain question"):
    chain_credit.chain_of("What is 2+2?")


def test_labels_right_calls_then_the_first_wrong_one():
  # 20*3 right; 60-61 a miscopied operand: the first wrong call; 44+4 is step 3 from the right value but comes after
  # the chain broke, so it is `after_wrong`, as is every later turn's call
  record = _record(["20*3", "60-61", "44+4"], "48", 0.0, [0.0] * 4)
  assert chain_credit.turn_labels(record) == ["right", "first_wrong", "after_wrong", "answer"]
  # a miscopied first value: no right call at all
  assert chain_credit.turn_labels(_record(["10*3"], "30", 0.0, [0.0] * 2)) == ["first_wrong", "answer"]
  # every call right
  assert chain_credit.turn_labels(_record(["20*3", "60-16", "44+4"], "48", 1.0, [0.0] * 4)) == [
    "right",
    "right",
    "right",
    "answer",
  ]


def test_landing_contrast_cancels_the_outcome_advantage():
  failed = _record(["20*3", "60-16", "44+5"], "49", 0.0, [-0.5, -0.3, -0.9, -0.6])  # right, right, first_wrong, answer
  grpo_like = _record(["20*3", "60-61"], "0", 0.0, [-0.7, -0.7, -0.7])  # one advantage for every turn
  succeeded = _record(["20*3", "60-16", "44+4"], "48", 1.0, [1.0, 1.2, 1.4, 1.1])
  out = chain_credit.landing([failed, grpo_like, succeeded])
  assert out["failed"] == 2 and out["failed_with_right_then_wrong"] == 2
  # contrasts: mean(-0.5, -0.3) - (-0.9) = 0.5, and 0 for the flat one
  assert out["contrast_right_minus_first_wrong_mean"] == pytest.approx(0.25)
  assert out["contrast_positive_frac"] == pytest.approx(0.5)
  assert out["turn_adv_mean"]["failed"]["right"] == pytest.approx((-0.5 - 0.3 - 0.7) / 3)
  assert out["turn_adv_mean"]["succeeded"]["right"] == pytest.approx(1.2)
  assert out["turns"]["succeeded"] == {"right": 3, "answer": 1}
  assert out["within_rollout_range_mean"] == pytest.approx((0.6 + 0.0 + 0.4) / 3)
  assert out["rollout_level_abs_mean"] == pytest.approx((0.575 + 0.7 + 1.175) / 3)


def test_landing_refuses_rollouts_without_credit_or_with_mismatched_turns():
  record = _record(["20*3"], "60", 0.0, [0.0, 0.0])
  del record["turn_advantages"]
  with pytest.raises(ValueError, match="no turn_advantages"):
    chain_credit.landing([record])
  with pytest.raises(ValueError, match="2 assistant turns but 3 advantages"):
    chain_credit.landing([_record(["20*3"], "60", 0.0, [0.0, 0.0, 0.0])])


def test_all_fail_groups_show_the_credit_where_grpo_is_silent():
  def rec(group, calls, answer, reward, adv):
    return {**_record(calls, answer, reward, adv), "group_id": group}

  silent = [
    rec(0, ["20*3", "60-61", "1+1"], "2", 0.0, [0.1, 0.2, 0.6, 0.0]),  # right, first_wrong, after_wrong, answer
    rec(0, ["10*3"], "30", 0.0, [-0.2, 0.4]),  # first_wrong, answer
  ]
  mixed = [rec(1, ["20*3"], "60", 0.0, [0.5, 0.5]), rec(1, ["20*3", "60-16", "44+4"], "48", 1.0, [1.0] * 4)]
  groups = chain_credit.all_fail_groups(silent + mixed)
  assert [[r["turn_advantages"] for r in g] for g in groups] == [[[0.1, 0.2, 0.6, 0.0], [-0.2, 0.4]]]
  out = chain_credit.where_grpo_is_silent(groups)
  assert out["groups"] == 1 and out["rollouts"] == 2
  assert out["turn_adv_mean"] == pytest.approx({"right": 0.1, "first_wrong": 0.0, "after_wrong": 0.6, "answer": 0.2})
  assert out["turns"] == {"right": 1, "first_wrong": 2, "after_wrong": 1, "answer": 2}
  # turn 0: 0.1 and -0.2; turn 1: 0.2 and 0.4; turns 2-3 of the longer rollout only
  assert out["turn_adv_mean_by_index"] == pytest.approx([-0.05, 0.3, 0.6, 0.0])
  assert out["turns_by_index"] == [2, 2, 1, 1]
  with pytest.raises(ValueError, match="no group_id"):
    chain_credit.all_fail_groups([_record(["20*3"], "60", 0.0, [0.0, 0.0])])


def _session_record(answers_right: list[bool], turn_advantages: list[float]) -> dict:
  """A session played through the real environment: each request's steps called right, then its answer (the true
  value, or one more where `answers_right` says wrong); messages as the trainer exports them."""
  from jaxcredit.envs import session, tool_calls

  task = session.make_tasks("train", 1, seed=3, min_requests=3, max_requests=3)[0]
  env = session.SessionEnv(task)
  messages = session.initial_messages(task)
  for u, right in enumerate(answers_right):
    for (op, n), a in zip(task.steps[u], task.values[u]):
      text = tool_calls.render_tool_call("calculator", {"expression": f"{a}{op}{n}"})
      messages.append({"role": "assistant", "content": text, "tool_calls": [{"function": {"name": "calculator"}}]})
      result = env.step(text)
      messages.append({"role": result.role, "content": result.observation})
    answer = task.values[u][-1] + (0 if right else 1)
    result = env.step(tool_calls.render_answer(str(answer)))
    messages.append({"role": "assistant", "content": tool_calls.render_answer(str(answer))})
    if not result.done:
      messages.append({"role": result.role, "content": result.observation})
  assert env.done
  turns = sum(m["role"] == "assistant" for m in messages)
  assert len(turn_advantages) == turns, turns
  return {
    "rollout_id": "s",
    "task_id": task.task_id,
    "messages": messages,
    "reward": env.reward(),
    "unit_rewards": env.unit_rewards(),
    "turn_advantages": turn_advantages,
  }


def test_session_turns_are_labelled_by_their_requests_verdicts():
  from jaxcredit.envs import session

  task = session.make_tasks("train", 1, seed=3, min_requests=3, max_requests=3)[0]
  n = [len(steps) + 1 for steps in task.steps]  # a request's turns: one call a step, then its answer
  # request 1 right, request 2 answered wrong (it broke the session), request 3 built on it
  adv = [0.3] * n[0] + [-0.4] * n[1] + [0.1] * n[2]
  record = _session_record([True, False, False], adv)
  assert record["unit_rewards"] == [1.0, 0.0, 0.0] and record["reward"] == 0.0
  assert chain_credit.is_session(record)
  labels = chain_credit.turn_labels(record)
  assert labels == ["right"] * n[0] + ["first_wrong"] * n[1] + ["after_wrong"] * n[2]
  out = chain_credit.landing([record])
  assert out["failed"] == 1 and out["contrast_right_minus_first_wrong_mean"] == pytest.approx(0.7)
  # every request right: the session succeeded, every turn `right`
  whole = _session_record([True, True, True], [1.0] * sum(n))
  assert chain_credit.landing([whole])["turns"]["succeeded"] == {"right": sum(n)}
  # a partial reward (the session control's share of requests right) is not a success
  partial = {**record, "reward": 1 / 3}
  assert not chain_credit.succeeded(partial) and chain_credit.all_fail_groups([{**partial, "group_id": 0}])
  # a turn in a request with no verdict is refused, naming the field
  with pytest.raises(ValueError, match="unit_rewards holds 1 verdicts"):
    chain_credit.turn_labels({**record, "unit_rewards": [1.0]})
