"""The chain environment (issue 34's long-horizon testbed): tasks, the one-operation calculator, rollouts played
through it, the demonstrations' habits at their rates, progress, and the config row's refusals."""

import random

import pytest

from jaxcredit.envs import ENVS, chain, tool_calls
from jaxcredit.train.config import base_config


def _call(expression: str) -> str:
  return tool_calls.render_tool_call("calculator", {"expression": expression})


def _apply(value: int, op: str, operand: int) -> int:
  return {"+": value + operand, "-": value - operand, "*": value * operand}[op]


@pytest.fixture(scope="module")
def train_tasks():
  return chain.make_tasks("train", 300, 0)


def test_tasks_hold_their_own_values_in_range(train_tasks):
  """Every task's values are its steps applied left to right from the start, all in [1, MAX_VALUE]; 4-8 steps,
  "+"/"-" operands in [2, max_operand], "*" in MULTIPLIERS; the question lists the steps; the answer is the last
  value; all three operators occur."""
  ops = set()
  for t in train_tasks:
    assert 4 <= len(t.steps) <= 8 and len(t.values) == len(t.steps) + 1 and t.values[0] == t.start
    value = t.start
    for (op, operand), after in zip(t.steps, t.values[1:]):
      lo, hi = chain.MULTIPLIERS if op == "*" else (2, 20)
      assert lo <= operand <= hi, (t.task_id, op, operand)
      value = _apply(value, op, operand)
      assert value == after and 1 <= value <= chain.MAX_VALUE, t.task_id
      ops.add(op)
    assert t.answer == str(value)
    assert t.question.endswith(", ".join(f"{op}{n}" for op, n in t.steps) + ".")
  assert ops == {"+", "-", "*"}


def test_splits_are_deterministic_prefixes_and_apart(train_tasks):
  """The eval split is a prefix of one fixed sequence; a train seed gives the same tasks again; train holds no
  question of the eval reserve; no split repeats a question; other sizes refuse by key."""
  ev = chain.make_tasks("eval", 20)
  assert chain.make_tasks("eval", 10) == ev[:10]
  assert chain.make_tasks("train", 300, 0) == train_tasks
  assert chain.make_tasks("train", 50, 1) != train_tasks[:50]
  reserve = {t.question for t in chain.make_tasks("eval", chain.EVAL_RESERVE)}
  assert not reserve & {t.question for t in train_tasks}
  assert len({t.question for t in train_tasks}) == len(train_tasks)
  short = chain.make_tasks("eval", 30, min_steps=2, max_steps=3, max_operand=9)
  assert all(2 <= len(t.steps) <= 3 for t in short)
  for kwargs, key in (
    ({"min_steps": 0}, "min_steps"),
    ({"min_steps": 5, "max_steps": 4}, "max_steps"),
    ({"max_operand": 1}, "max_operand"),
  ):
    with pytest.raises(ValueError, match=f"config.env.chain.{key}"):
      chain.make_tasks("eval", 4, **kwargs)


@pytest.mark.parametrize(
  "expression,result",
  [("17+8", "25"), (" 40 - 2 ", "38"), ("123*4", "492"), ("0*9", "0")],
)
def test_one_operation_computes_one_operation(expression, result):
  assert chain.one_operation({"expression": expression}) == result


@pytest.mark.parametrize("expression", ["2+3+4", "2*(3)", "-2+3", "2/1", "2.5+1", "twelve+1", "", "12345678+1"])
def test_one_operation_refuses_anything_else_with_what_it_takes(expression):
  with pytest.raises(tool_calls.ToolError, match="one operation"):
    chain.one_operation({"expression": expression})
  with pytest.raises(tool_calls.ToolError, match="unexpected argument"):
    chain.one_operation({"expression": "1+2", "x": 1})


def test_a_faithful_rollout_pays_and_reaches_the_end(train_tasks):
  """One call per step copying each result, then the answer: reward 1, progress 1, one call per step; each result
  names the next step, the last says none is left; without show_next_step the result is the number alone."""
  task = train_tasks[0]
  env = chain.ChainEnv(task, max_tool_calls=len(task.steps) + 2)
  value = task.start
  for i, (op, operand) in enumerate(task.steps):
    r = env.step(_call(f"{value}{op}{operand}"))
    value = _apply(value, op, operand)
    cue = f"next: {chain.list_steps(task.steps[i + 1 : i + 2])}" if i + 1 < len(task.steps) else "no steps left"
    assert not r.done and r.observation == tool_calls.render_tool_response(f"{value}; {cue}")
  plain = chain.ChainEnv(task, max_tool_calls=2, show_next_step=False)
  op, operand = task.steps[0]
  r = plain.step(_call(f"{task.start}{op}{operand}"))
  assert r.observation == tool_calls.render_tool_response(str(task.values[1]))
  r = env.step(tool_calls.render_answer(task.answer))
  assert r.done and r.info["answered"] and env.reward() == 1.0
  assert env.progress() == 1.0
  assert chain.metrics([env]) == {"chain_progress": 1.0, "chain_calls_per_step": 1.0}


def test_a_broken_chain_fails_with_the_steps_before_the_break_counted(train_tasks):
  """A result copied wrongly at step 3: the calls after it compute from the wrong value, the answer is wrong
  (reward 0), and progress counts the two right steps before it."""
  task = next(t for t in train_tasks if len(t.steps) >= 5)
  env = chain.ChainEnv(task, max_tool_calls=len(task.steps) + 2)
  value = task.start
  for i, (op, operand) in enumerate(task.steps):
    if i == 2:
      value += 1  # copied wrongly
    env.step(_call(f"{value}{op}{operand}"))
    value = _apply(value, op, operand)
  env.step(tool_calls.render_answer(str(value)))
  assert env.reward() == 0.0
  assert env.progress() == pytest.approx(2 / len(task.steps))
  # The shaped control (reward "progress"): the two steps reached of n, plus the answer: 2 / (n + 1); success no.
  shaped = chain.ChainEnv(task, max_tool_calls=len(task.steps) + 2, reward="progress")
  value = task.start
  for i, (op, operand) in enumerate(task.steps):
    value += 1 if i == 2 else 0
    shaped.step(_call(f"{value}{op}{operand}"))
    value = _apply(value, op, operand)
  assert shaped.reward() == 0.0  # not before the end
  shaped.step(tool_calls.render_answer(str(value)))
  assert shaped.reward() == pytest.approx(2 / (len(task.steps) + 1))
  spec = ENVS["chain"].make_spec(base_config().env.chain)
  assert not spec.is_success(shaped.reward()) and spec.is_success(1.0)
  right = chain.ChainEnv(task, max_tool_calls=2, reward="progress")  # the right answer from the head: 1, as outcome
  right.step(tool_calls.render_answer(task.answer))
  assert right.reward() == 1.0
  budget = chain.ChainEnv(task, max_tool_calls=1)  # a call past the budget ends the rollout
  budget.step(_call(f"{task.start}{task.steps[0][0]}{task.steps[0][1]}"))
  r = budget.step(_call("1+1"))
  assert r.done and r.info["budget_exhausted"] and budget.reward() == 0.0


def test_the_next_step_follows_the_calls_not_their_count(train_tasks):
  """The pointer moves to the step after the one a call's operator and operand match (skipping ahead over a step
  done in the head); a call that matches no step leaves it; a wrong left number still reaches its step."""
  task = next(t for t in train_tasks if len(t.steps) >= 4 and len(set(t.steps)) == len(t.steps))
  env = chain.ChainEnv(task, max_tool_calls=10)
  (_, _), (op1, n1), (op2, n2), (op3, n3) = task.steps[:4]
  env.step(_call(f"{task.values[1]}{op1}{n1}"))  # step 0 done in the head, the call on step 1
  assert env.next_step == 2
  r = env.step(_call("1+999"))  # no step
  assert env.next_step == 2 and r.observation.endswith(f"; next: {op2}{n2}</tool_response>")
  env.step(_call(f"{task.values[2] + 1}{op2}{n2}"))  # a wrong left number: the step is still reached
  assert env.next_step == 3


def test_demonstrations_replay_and_take_their_habits_at_their_rates(train_tasks):
  """Played through a fresh environment, a clean demonstration pays with one call per step; with skip_prob=1 every
  second step is done in the head (about half the calls) and it still pays; with slip_prob=1 every call copies
  wrongly and none pays; at skip 0.25 the share of steps skipped is about 0.25 of those that can be."""
  rng = random.Random(0)

  def replay(task, demo):
    env = chain.ChainEnv(task, max_tool_calls=len(task.steps))
    for m, nxt in zip(demo, demo[1:] + [None]):
      if m["role"] == "assistant":
        r = env.step(m["content"])
        if nxt is not None:
          assert r.observation == nxt["content"]
    return env

  for task in train_tasks[:50]:
    env = replay(task, chain.demonstration(task, rng))
    assert env.reward() == 1.0 and env.info["tool_calls"] == len(task.steps)
    env = replay(task, chain.demonstration(task, rng, skip_prob=1.0))
    assert env.reward() == 1.0 and env.info["tool_calls"] == (len(task.steps) + 1) // 2
    assert replay(task, chain.demonstration(task, rng, slip_prob=1.0)).reward() == 0.0
  calls = steps = 0
  for task in train_tasks:
    calls += replay(task, chain.demonstration(task, rng, skip_prob=0.25)).info["tool_calls"]
    steps += len(task.steps)
  assert 0.75 < calls / steps < 0.85  # a skip removes one call; the last step is never skipped
  with pytest.raises(ValueError, match="config.env.chain.slip_prob"):
    chain.demonstration(train_tasks[0], rng, slip_prob=1.5)


def test_the_env_row_builds_from_its_config_node_and_refuses_by_key():
  node = base_config().env.chain
  node.update({"max_steps": 5, "extra_calls": 1, "skip_prob": 1.0})
  spec = ENVS["chain"].make_spec(node)
  assert spec.max_turns == 5 + 1 + 1
  task = spec.make_tasks("train", 4, 0)[0]
  assert len(task.steps) <= 5 and spec.gold_answer_text(task) == f"<answer>{task.answer}</answer>"
  assert spec.privileged_info(task).endswith(f"so the final answer is <answer>{task.answer}</answer>")
  demo = spec.demonstration(task, random.Random(0))
  assert sum(m["role"] == "tool" for m in demo) == (len(task.steps) + 1) // 2  # skip_prob reaches the demonstrations
  for key, bad in (("extra_calls", -1), ("skip_prob", 2.0), ("min_steps", 0), ("reward", "shaped")):
    bad_node = base_config().env.chain
    bad_node[key] = bad
    with pytest.raises(ValueError, match=f"config.env.chain.{key}"):
      ENVS["chain"].make_spec(bad_node)
