"""Arithmetic tasks (reasoning-gym), the step/turn-limit logic, math-verify rewards, demonstrations."""

import random
import time

import numpy as np
import pytest

from jaxcredit.envs import arithmetic as ar
from jaxcredit.envs import tool_calls as tc
from jaxcredit.envs.calculator import calculate


def _task(answer="14", expression="2*(3+4)", question="Calculate 2*(3+4)."):
  return ar.ArithmeticTask(
    task_id="t/0", question=question, answer=answer, source="basic_arithmetic", expression=expression
  )


def _call(expr):
  return tc.render_tool_call("calculator", {"expression": expr})


@pytest.fixture(scope="module")
def eval_tasks():
  return ar.make_tasks("eval")


@pytest.fixture(scope="module")
def train_tasks():
  return ar.make_tasks("train", 1000, seed=0)


# --- tasks -----------------------------------------------------------------------------------------------


def test_eval_split_pinned_values(eval_tasks):
  assert len(eval_tasks) == ar.EVAL_SIZE == 64
  first = [(t.task_id, t.question, t.answer, t.expression) for t in eval_tasks[:4]]
  assert first == [
    ("eval/basic_arithmetic/0", "Calculate -70 * -53.", "3710", "-70 * -53"),
    ("eval/chain_sum/0", "State the final answer to the following arithmetic problem: 58 - 59 =", "-1", "58 - 59"),
    ("eval/basic_arithmetic/1", "Calculate ( -58 + -34 * -90 ).", "3002", "( -58 + -34 * -90 )"),
    (
      "eval/chain_sum/1",
      "State the final answer to the following arithmetic problem: 87 - 77 - 41 =",
      "-31",
      "87 - 77 - 41",
    ),
  ]
  assert [t.source for t in eval_tasks] == ["basic_arithmetic", "chain_sum"] * 32


def test_eval_split_is_deterministic_and_prefix_stable(eval_tasks):
  again = ar.make_tasks("eval", 64)
  assert again == eval_tasks
  assert ar.make_tasks("eval", 10) == eval_tasks[:10]


def test_train_is_disjoint_from_eval(eval_tasks, train_tasks):
  reserved = ar.make_tasks("eval", ar.EVAL_RESERVE)
  eval_exprs = {"".join(t.expression.split()) for t in reserved}
  eval_questions = {t.question for t in reserved}
  for seed, tasks in ((0, train_tasks), (1, ar.make_tasks("train", 500, seed=1))):
    assert not eval_exprs & {"".join(t.expression.split()) for t in tasks}, seed
    assert not eval_questions & {t.question for t in tasks}, seed
  # chain_sum with 1-digit terms has few distinct problems (4200 with <= 3 terms): overlap is dropped
  stats = {}
  small = dict(datasets=("chain_sum",), max_terms=3, max_digits=1)
  tasks = ar.make_tasks("train", 1000, seed=0, stats=stats, **small)
  assert stats["dropped_eval_overlap"] > 50
  reserved_small = {t.expression for t in ar.make_tasks("eval", ar.EVAL_RESERVE, **small)}
  assert not reserved_small & {t.expression for t in tasks}


def test_tiny_problem_spaces():
  # 2-term 1-digit chain_sum has only 200 distinct problems: eval takes them all, train has none left
  tiny = dict(datasets=("chain_sum",), max_terms=2, max_digits=1)
  assert len(ar.make_tasks("eval", 200, **tiny)) == 200
  with pytest.raises(ValueError, match="only 200 distinct eval tasks"):
    ar.make_tasks("eval", 201, **tiny)
  with pytest.raises(ValueError, match="only 0 distinct train tasks"):
    ar.make_tasks("train", 1, **tiny)


def test_tasks_are_distinct_integers_and_the_expression_is_in_the_question(train_tasks, eval_tasks):
  for tasks in (train_tasks, eval_tasks):
    assert len({"".join(t.expression.split()) for t in tasks}) == len(tasks)
    assert len({t.task_id for t in tasks}) == len(tasks)
    for t in tasks:
      assert t.answer.lstrip("-").isdigit(), t
      assert t.expression in t.question, t
      assert calculate(t.expression) == t.answer, t
  assert {t.source for t in train_tasks} == {"basic_arithmetic", "chain_sum"}
  assert sum(t.source == "chain_sum" for t in train_tasks) == 500


def test_small_operands(train_tasks):
  for t in train_tasks:
    assert t.metadata["num_terms"] in (2, 3) and t.metadata["num_digits"] in (1, 2), t
    nums = [int(x) for x in t.expression.replace("(", " ").replace(")", " ").replace("-", " ").split() if x.isdigit()]
    assert nums and max(nums) <= 99, t


def test_train_seeds_differ_and_are_reproducible(train_tasks):
  assert ar.make_tasks("train", 50, seed=0) == train_tasks[:50]
  other = ar.make_tasks("train", 50, seed=1)
  assert len({t.question for t in other} & {t.question for t in train_tasks[:50]}) < 10


def test_inexact_floor_division_tasks_are_dropped():
  # with 4 terms reasoning-gym's `//`-computed gold sometimes differs from the true value
  # (e.g. "8 / -( 5 * -8 + -39 )" has gold 0); those tasks are dropped
  stats = {}
  tasks = ar.make_tasks("train", 600, seed=0, datasets=("basic_arithmetic",), max_terms=4, stats=stats)
  assert stats["dropped_inexact"] > 0
  assert stats["kept"] == len(tasks) == 600
  assert all(calculate(t.expression) == t.answer for t in tasks)


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (dict(split="test", num=3), "split must be"),
    (dict(split="train"), "train num"),
    (dict(split="train", num=-1), "train num"),
    (dict(split="eval", seed=3), "fixed seed"),
    (dict(split="eval", num=ar.EVAL_RESERVE + 1), "eval num"),
    (dict(split="train", num=5, datasets=("leg_counting",)), "unknown dataset"),
    (dict(split="train", num=5, max_terms=1), "invalid difficulty"),
    (
      dict(split="train", num=5, datasets=("chain_sum",), min_terms=1, max_terms=1, max_digits=1),
      "only 0 distinct train tasks",
    ),
  ],
)
def test_make_tasks_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    ar.make_tasks(**kwargs)


# --- prompt ----------------------------------------------------------------------------------------------


def test_initial_messages_and_system_prompt(eval_tasks):
  msgs = ar.initial_messages(eval_tasks[0])
  assert msgs == [{"role": "system", "content": ar.SYSTEM_PROMPT}, {"role": "user", "content": "Calculate -70 * -53."}]
  assert _call("2*(3+4)") in ar.SYSTEM_PROMPT
  assert "<answer>14</answer>" in ar.SYSTEM_PROMPT and "<tool_response>" in ar.SYSTEM_PROMPT
  assert len(ar.SYSTEM_PROMPT.split()) <= 40


def test_gold_answer_text(eval_tasks):
  assert ar.gold_answer_text(eval_tasks[0]) == "<answer>3710</answer>"


# --- stepping --------------------------------------------------------------------------------------------


def test_call_then_answer():
  env = ar.ArithmeticEnv(_task(), max_tool_calls=2)
  r = env.step("I will use the tool. " + _call("2*(3+4)"))
  assert r.observation == "<tool_response>14</tool_response>" and not r.done
  assert r.info["tool_calls"] == 1 and r.info["tool_errors"] == 0 and not r.info["answered"]
  r = env.step("<answer>14</answer>")
  assert r.observation is None and r.done
  assert r.info == {
    "tool_calls": 1,
    "tool_errors": 0,
    "answered": True,
    "budget_exhausted": False,
    "turns": 2,
    "finish": "answer",
    "answer": "14",
  }
  assert env.reward() == 1.0


def test_malformed_call_is_an_error_observation_and_counts():
  env = ar.ArithmeticEnv(_task(), max_tool_calls=2)
  r = env.step('<tool_call>{"name": "calc", "arguments": {"expression": "1"}}</tool_call>')
  assert r.observation == "<tool_response>error: unknown tool 'calc'; available: calculator</tool_response>"
  assert not r.done and r.info["tool_calls"] == 1 and r.info["tool_errors"] == 1
  r = env.step("<tool_call>{not json}</tool_call>")
  assert r.observation.startswith("<tool_response>error: tool call is not valid JSON")
  assert r.info["tool_calls"] == 2 and r.info["tool_errors"] == 2
  r = env.step(_call("2*(3+4)"))  # budget of 2 spent
  assert r.done and r.observation is None
  assert r.info["budget_exhausted"] and not r.info["answered"] and r.info["finish"] == "tool_budget"
  assert env.reward() == 0.0


def test_budget_exhausted_after_max_calls():
  env = ar.ArithmeticEnv(_task(), max_tool_calls=2)
  assert env.step(_call("2*3")).observation == "<tool_response>6</tool_response>"
  assert env.step(_call("6+8")).observation == "<tool_response>14</tool_response>"
  r = env.step(_call("14"))
  assert r.done and r.info["budget_exhausted"] and r.info["tool_calls"] == 2 and r.info["turns"] == 3
  assert env.reward() == 0.0


def test_zero_budget():
  env = ar.ArithmeticEnv(_task(), max_tool_calls=0)
  r = env.step(_call("2*(3+4)"))
  assert r.done and r.info["budget_exhausted"] and r.info["tool_calls"] == 0


def test_answer_without_tool():
  env = ar.ArithmeticEnv(_task())
  r = env.step("Easy: <answer>14</answer>")
  assert r.done and r.info["answered"] and r.info["tool_calls"] == 0
  assert env.reward() == 1.0


def test_neither_call_nor_answer_ends_the_episode():
  env = ar.ArithmeticEnv(_task())
  r = env.step("The result is 14.")
  assert r.done and r.observation is None
  assert r.info["finish"] == "no_answer" and not r.info["answered"] and not r.info["budget_exhausted"]
  assert env.reward() == 0.0


def test_whichever_comes_first_decides():
  env = ar.ArithmeticEnv(_task())
  r = env.step("<answer>14</answer> " + _call("1+1"))
  assert r.done and r.info["answered"] and r.info["tool_calls"] == 0
  env = ar.ArithmeticEnv(_task())
  r = env.step(_call("1+1") + " <answer>2</answer>")
  assert not r.done and r.observation == "<tool_response>2</tool_response>"


def test_step_after_done_raises_and_bad_budget():
  env = ar.ArithmeticEnv(_task())
  env.step("<answer>14</answer>")
  with pytest.raises(RuntimeError, match="finished"):
    env.step("<answer>14</answer>")
  with pytest.raises(ValueError, match="max_tool_calls"):
    ar.ArithmeticEnv(_task(), max_tool_calls=-1)


def test_step_info_is_a_snapshot():
  env = ar.ArithmeticEnv(_task())
  r1 = env.step(_call("1+1"))
  env.step("<answer>14</answer>")
  assert r1.info["answered"] is False and env.info["answered"] is True


# --- rewards ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "gold, answer, expected",
  [
    ("14", "14", 1.0),
    ("14", " 14 ", 1.0),
    ("14", "14.0", 1.0),
    ("14", "+14", 1.0),
    ("14", "$14$", 1.0),
    ("14", "\\boxed{14}", 1.0),
    ("-28", "-28", 1.0),
    ("-28", "\u221228", 1.0),  # unicode minus
    ("1000", "1,000", 1.0),
    ("3710", "3710.00", 1.0),
    ("14", "15", 0.0),
    ("14", "-14", 0.0),
    ("14", "14.5", 0.0),
    ("-28", "28", 0.0),
    ("14", "", 0.0),
    ("14", "fourteen", 0.0),
    ("14", "2*(3+4)", 0.0),  # an unevaluated expression does not earn the reward
    ("14", "7+7", 0.0),
    ("14", "14 apples", 0.0),
    ("14", "1,4", 0.0),
    ("14", "1" * 80, 0.0),
  ],
)
def test_reward(gold, answer, expected):
  env = ar.ArithmeticEnv(_task(answer=gold))
  env.step(f"<answer>{answer}</answer>")
  assert env.reward() == expected


def test_hostile_answers_score_zero_quickly():
  # math-verify alone spends minutes on "10^10^10^10" (sympy); such answers never reach it
  start = time.perf_counter()
  for answer in (
    "10^10^10^10",
    "9**9**9**9",
    "\\frac{1}{" * 20,
    "(" * 30 + "1" + ")" * 30,
    "10!!!!",
    "9" * 5000,
    "$10^{10^{10^{10}}}$",
  ):
    env = ar.ArithmeticEnv(_task())
    env.step(f"<answer>{answer}</answer>")
    assert env.reward() == 0.0
  assert time.perf_counter() - start < 1.0  # generous


def test_reward_before_answer_is_zero():
  env = ar.ArithmeticEnv(_task())
  assert env.reward() == 0.0
  env.step(_call("2*(3+4)"))
  assert env.reward() == 0.0


def test_gold_answer_text_earns_the_reward(eval_tasks):
  for t in eval_tasks[:16]:
    env = ar.ArithmeticEnv(t)
    env.step(ar.gold_answer_text(t))
    assert env.reward() == 1.0, t


# --- demonstrations --------------------------------------------------------------------------------------


def test_demonstration_structure(eval_tasks):
  t = eval_tasks[2]  # ( -58 + -34 * -90 ) = 3002
  demos = {tuple(m["content"] for m in ar.demonstration(t, random.Random(s))) for s in range(20)}
  assert demos == {
    (
      ar.SYSTEM_PROMPT,
      "Calculate ( -58 + -34 * -90 ).",
      _call("( -58 + -34 * -90 )"),
      "<tool_response>3002</tool_response>",
      "<answer>3002</answer>",
    ),
    (
      ar.SYSTEM_PROMPT,
      "Calculate ( -58 + -34 * -90 ).",
      _call("(-58+-34*-90)"),
      "<tool_response>3002</tool_response>",
      "<answer>3002</answer>",
    ),
  }
  roles = [m["role"] for m in ar.demonstration(t, np.random.default_rng(0))]
  assert roles == ["system", "user", "assistant", "tool", "assistant"]


def test_direct_answer_demonstrations_skip_the_calculator_at_their_rate(train_tasks):
  """direct_answer_prob=0.3: about 30% of 2,000 demonstrations are [system, user, <answer>gold</answer>]; the rest
  are the calculator chat; 0 and 1 give none and all; a rate outside [0, 1] names the config key."""
  from jaxcredit.envs import ENVS
  from jaxcredit.train.config import base_config

  rng = random.Random(0)
  tasks = train_tasks[:200] * 10
  demos = [ar.demonstration(t, rng, direct_answer_prob=0.3) for t in tasks]
  direct = [(t, d) for t, d in zip(tasks, demos) if len(d) == 3]
  assert 0.26 < len(direct) / len(demos) < 0.34
  for t, d in direct:
    assert [m["role"] for m in d] == ["system", "user", "assistant"]
    assert d[2]["content"] == f"<answer>{t.answer}</answer>"
    env = ar.ArithmeticEnv(t)
    env.step(d[2]["content"])
    assert env.reward() == 1.0
  assert all(len(d) == 5 for d in demos if len(d) != 3)
  assert all(len(ar.demonstration(t, rng, direct_answer_prob=1.0)) == 3 for t in tasks[:20])
  assert all(len(ar.demonstration(t, rng, direct_answer_prob=0.0)) == 5 for t in tasks[:20])
  # Through the config row: the spec's demonstrations follow config.env.arithmetic.direct_answer_prob.
  node = base_config().env.arithmetic
  node.direct_answer_prob = 1.0
  spec = ENVS["arithmetic"].make_spec(node)
  assert len(spec.demonstration(tasks[0], rng)) == 3
  node.direct_answer_prob = 1.5
  with pytest.raises(ValueError, match="direct_answer_prob"):
    ENVS["arithmetic"].make_spec(node)
  with pytest.raises(ValueError, match="direct_answer_prob"):
    ar.demonstration(tasks[0], rng, direct_answer_prob=-0.1)


def test_demonstration_rejects_a_wrong_gold():
  with pytest.raises(ValueError, match="gold"):
    ar.demonstration(_task(answer="15"), random.Random(0))


def test_demonstrations_verify_when_replayed(train_tasks):
  """200 train tasks of each dataset: the demo replayed through a fresh env earns reward 1."""
  rng = np.random.default_rng(0)
  by_source = {"basic_arithmetic": [], "chain_sum": []}
  for t in train_tasks:
    by_source[t.source].append(t)
  for source, tasks in by_source.items():
    assert len(tasks) >= 200, source
    for t in tasks[:200]:
      msgs = ar.demonstration(t, rng)
      env = ar.ArithmeticEnv(t, max_tool_calls=2)
      r = env.step(msgs[2]["content"])
      assert r.observation == msgs[3]["content"], t
      value = r.observation[len("<tool_response>") : -len("</tool_response>")]
      assert ar.answer_is_correct(value, t.answer), t  # the calculator result verifies (math-verify)
      assert env.step(msgs[4]["content"]).done
      assert env.reward() == 1.0, t


# --- math-verify accuracy (EnvSpec.metrics) ---------------------------------------------------------------------

MATH_VERIFY_CASES = [  # gold, the <answer> text (None: the rollout never answers), math-verify's verdict by hand
  ("14", "14", True),
  ("14", "15", False),
  ("14", "$\\frac{28}{2}$", True),  # the reward refuses it (not a plain number); math-verify reads the fraction
  ("-28", "-28.0", True),
  ("14", "fourteen", False),
  ("14", None, False),
]


def _answered(gold, answer):
  env = ar.ArithmeticEnv(_task(answer=gold))
  env.step("I give up." if answer is None else f"<answer>{answer}</answer>")
  assert env.done
  return env


def test_math_verify_accuracy_is_the_math_verify_packages_verdict():
  from math_verify import parse, verify

  envs = [_answered(gold, answer) for gold, answer, _ in MATH_VERIFY_CASES]
  by_hand = [want for _, _, want in MATH_VERIFY_CASES]
  official = [answer is not None and bool(verify(parse(gold), parse(answer))) for gold, answer, _ in MATH_VERIFY_CASES]
  assert [e.math_verify_correct() for e in envs] == official == by_hand
  assert [e.reward() for e in envs] == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]  # the reward beside it: plain numbers only
  spec = ar.env_spec()
  assert spec.metrics(envs) == {"math_verify_accuracy": pytest.approx(3 / 6)}
  assert spec.metrics([]) == {}
  assert ar.ArithmeticEnv(_task()).math_verify_correct() is False  # not finished


def test_math_verify_accuracy_never_hands_powers_or_factorials_to_sympy():
  start = time.perf_counter()
  for answer in ("10^10^10^10", "9**9**9**9", "$10^{10^{10^{10}}}$", "10!!!!", "\\binom{10^9}{5}", "9" * 80):
    assert ar.math_verify_correct(answer, "14") is False, answer
  assert time.perf_counter() - start < 1.0  # generous
