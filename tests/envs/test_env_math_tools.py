"""Math with a calculator: reasoning-gym generators and file tasks, per-task verifiers, demonstrations, EnvSpec."""

import json
import random

import grain
import ml_collections
import numpy as np
import pytest

from jaxcredit.envs import math_tools as mt
from jaxcredit.envs import sources
from jaxcredit.envs import tool_calls as tc


def _call(expr):
  return tc.render_tool_call("calculator", {"expression": expr})


def _reward(task, text):
  env = mt.MathEnv(task, max_tool_calls=2)
  result = env.step(text)
  assert result.done
  return env.reward()


def _wrong(answer: str) -> str:
  """A different number that contains the gold (reasoning-gym's default scorer gives such answers partial credit)."""
  return "1" + answer.lstrip("-") if not answer.startswith("-") else answer + "1"


@pytest.fixture(scope="module")
def eval_tasks():
  return mt.make_gym_tasks("eval", 24, generators=mt.DEFAULT_GENERATORS)


# --- generator tasks ------------------------------------------------------------------------------------------------


def test_gym_tasks_are_deterministic_per_seed(eval_tasks):
  train0 = mt.make_gym_tasks("train", 24, seed=0, eval_reserve=64)
  assert mt.make_gym_tasks("train", 24, seed=0, eval_reserve=64) == train0
  assert mt.make_gym_tasks("train", 12, seed=0, eval_reserve=64) == train0[:12]
  train1 = mt.make_gym_tasks("train", 24, seed=1, eval_reserve=64)
  assert {t.question for t in train1} != {t.question for t in train0}
  assert mt.make_gym_tasks("eval", 8) == eval_tasks[:8]  # eval: a prefix of one fixed sequence
  assert [t.source for t in eval_tasks] == list(mt.DEFAULT_GENERATORS) * 3  # one per generator in turn
  assert len({t.task_id for t in eval_tasks}) == len(eval_tasks)


def test_train_is_disjoint_from_eval():
  reserve = mt.make_gym_tasks("eval", 128)
  stats = {}
  train = mt.make_gym_tasks("train", 200, seed=0, eval_reserve=128, stats=stats)
  assert not {mt._key(t) for t in reserve} & {mt._key(t) for t in train}
  assert not {t.question for t in reserve} & {t.question for t in train}
  assert len({mt._key(t) for t in train}) == len(train) == stats["kept"] == 200


@pytest.mark.parametrize("name", list(mt.GENERATORS))
def test_each_generator_gold_gets_1_and_a_wrong_number_0(name):
  tasks = mt.make_gym_tasks("eval", 6, generators=(name,))
  for t in tasks:
    assert t.source == name and t.verifier == "reasoning_gym"
    assert _reward(t, tc.render_answer(t.answer)) == 1.0, t
    assert _reward(t, mt.gold_answer_text(t)) == 1.0
    assert _reward(t, tc.render_answer(_wrong(t.answer))) == 0.0, t  # no partial credit
    assert _reward(t, tc.render_answer(str(float(t.answer) + 1))) == 0.0
    assert _reward(t, tc.render_answer(f"{t.answer} apples")) == 0.0  # not a plain number
    assert _reward(t, "I do not know.") == 0.0
    assert t.answer in mt.privileged_info(t)
    assert (t.expression is not None) == mt.GENERATORS[name].expression


def test_equivalent_number_forms_score_1():
  [t] = [t for t in mt.make_gym_tasks("eval", 40, generators=("products",)) if len(t.answer) >= 5][:1]
  with_commas = f"{int(t.answer):,}"
  for form in (with_commas, t.answer + ".0", f"\\boxed{{{t.answer}}}", f"${t.answer}$", f" +{t.answer} "):
    assert mt.score_answer(t, form) == 1.0, form
  [d] = mt.make_gym_tasks("eval", 1, generators=("decimal_chain_sum",))
  assert mt.score_answer(d, d.answer + "00") == 1.0
  assert mt.score_answer(d, "9" * 100) == 0.0  # over-long answers are never parsed


def test_expression_generators_have_demonstrations_that_replay_to_reward_1(eval_tasks):
  rng = random.Random(0)
  tasks = mt.make_gym_tasks("eval", 16, generators=mt.EXPRESSION_GENERATORS)
  for t in tasks:
    chat = mt.demonstration(t, rng)
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "assistant"]
    env = mt.MathEnv(t, max_tool_calls=2)
    assert env.step(chat[2]["content"]).observation == chat[3]["content"]
    assert env.step(chat[4]["content"]).done and env.reward() == 1.0
  gsm = next(t for t in eval_tasks if t.source == "gsm_symbolic")
  assert gsm.solution and gsm.solution in mt.privileged_info(gsm)
  with pytest.raises(ValueError, match="no calculator expression"):
    mt.demonstration(gsm, rng)


def test_generator_kwargs_and_errors():
  tasks = mt.make_gym_tasks("eval", 10, generators=("products",), generator_kwargs={"products": {"max_digits": 2}})
  assert all(max(len(x.strip()) for x in t.expression.split("*")) <= 2 for t in tasks)
  with pytest.raises(ValueError, match="unknown generator 'word_ladder'"):
    mt.make_gym_tasks("eval", 4, generators=("word_ladder",))
  with pytest.raises(ValueError, match="refuses the arguments"):
    mt.make_gym_tasks("eval", 4, generators=("products",), generator_kwargs={"products": {"bogus": 1}})
  with pytest.raises(ValueError, match="fixed seed"):
    mt.make_gym_tasks("eval", 4, seed=0)
  with pytest.raises(ValueError, match="train num"):
    mt.make_gym_tasks("train", None)


# --- the environment: calculator calls, think blocks ----------------------------------------------------------------


def test_calls_run_and_think_block_calls_do_not(eval_tasks):
  t = next(t for t in eval_tasks if t.source == "leg_counting")
  env = mt.MathEnv(t, max_tool_calls=1)
  r = env.step("<think>" + _call("1+1") + "</think>" + _call("2*(3+4)"))
  assert r.observation == tc.render_tool_response("14") and env.info["tool_calls"] == 1
  r = env.step(_call("5+5"))  # past the budget
  assert r.done and env.info["budget_exhausted"] and env.reward() == 0.0

  env = mt.MathEnv(t, max_tool_calls=2)
  r = env.step("<think>let me check " + _call("2+2") + "</think>")  # only a call in thinking: nothing runs
  assert r.done and env.info["tool_calls"] == 0 and env.info["finish"] == "no_answer" and env.reward() == 0.0

  env = mt.MathEnv(t, max_tool_calls=2)
  r = env.step("<think>" + tc.render_answer("0") + "</think>" + tc.render_answer(t.answer))
  assert r.done and env.info["answer"] == t.answer and env.reward() == 1.0


# --- file tasks -----------------------------------------------------------------------------------------------------


def _math_jsonl(path, n=30, dup=False):
  rows = []
  for i in range(n):
    gold = f"\\frac{{{2 * i + 1}}}{{2}}" if i % 3 == 0 else (str(i * 7) if i % 3 == 1 else f"${i}.25$")
    rows.append(
      {
        "uid": f"p{i}",
        "question": f"Problem {i}: compute it.",
        "answer": gold,
        "solution": f"worked solution {i}",
        "expr": f"{2 * i + 1} / 2" if i % 3 == 0 else None,
      }
    )
  if dup:
    rows.append(dict(rows[0], uid="dup"))
  with open(path, "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  return rows


def test_file_tasks_are_rewarded_by_math_verify(tmp_path):
  _math_jsonl(tmp_path / "m.jsonl")
  fields = mt.FileFields(info_field="solution", id_field="uid")
  tasks = mt.make_file_tasks("train", None, 0, source=f"jsonl:{tmp_path / 'm.jsonl'}", eval_holdout=6, fields=fields)
  assert len(tasks) == 24
  by_id = {t.task_id: t for t in tasks}
  half = by_id.get("p3") or by_id.get("p6") or next(t for t in tasks if "frac" in t.answer)
  k = int(half.task_id[1:])
  assert half.verifier == "math_verify" and half.solution == f"worked solution {k}"
  assert _reward(half, tc.render_answer(str(k + 0.5))) == 1.0  # 0.5 * (2k + 1) as a decimal
  assert _reward(half, tc.render_answer(f"$ {k + 0.5} $")) == 1.0
  assert _reward(half, tc.render_answer(str(k + 1.5))) == 0.0
  assert _reward(half, tc.render_answer(f"{2 * k + 1}/2")) == 0.0  # plain numbers only
  assert mt.gold_answer_text(half) == tc.render_answer(str(k + 0.5)) and _reward(half, mt.gold_answer_text(half)) == 1
  assert half.answer in mt.privileged_info(half) and "worked solution" in mt.privileged_info(half)
  for t in tasks:
    assert _reward(t, mt.gold_answer_text(t)) == 1.0, t
    assert _reward(t, tc.render_answer("123456789")) == 0.0


def test_file_splits_are_disjoint_deterministic_and_list_like(tmp_path):
  _math_jsonl(tmp_path / "m.jsonl", dup=True)
  kw = dict(source=f"jsonl:{tmp_path / 'm.jsonl'}", eval_holdout=5, fields=mt.FileFields(id_field="uid"))
  ev = mt.make_file_tasks("eval", None, None, **kw)
  assert list(mt.make_file_tasks("eval", 3, None, **kw)) == list(ev)[:3]
  train = mt.make_file_tasks("train", None, 0, **kw)
  assert not {t.question for t in ev} & {t.question for t in train}
  assert len({t.question for t in train}) == len(train) == 31 - 5 - 1  # the duplicate prompt is read once
  sub0 = mt.make_file_tasks("train", 10, 0, **kw)
  assert list(mt.make_file_tasks("train", 10, 0, **kw)) == list(sub0)
  assert [t.task_id for t in mt.make_file_tasks("train", 10, 1, **kw)] != [t.task_id for t in sub0]
  assert sub0[np.int64(2)] == sub0[2] and sub0[-1] == list(sub0)[-1] and sub0[1:3] == list(sub0)[1:3]
  # the trainer's pipeline over indices, with a checkpointed position
  ds = grain.MapDataset.range(len(sub0)).shuffle(seed=0).repeat().batch(4, drop_remainder=True)
  it = iter(ds.to_iter_dataset())
  next(it)
  state = it.get_state()
  expected = [[sub0[i].task_id for i in next(it)] for _ in range(3)]
  it.set_state(state)
  assert [[sub0[i].task_id for i in next(it)] for _ in range(3)] == expected
  with pytest.raises(ValueError, match="asked for 6 eval tasks"):
    mt.make_file_tasks("eval", 6, None, **kw)
  with pytest.raises(ValueError, match="leaves none for training"):
    mt.make_file_tasks("train", 4, 0, **dict(kw, eval_holdout=31))


def test_file_expressions_give_demonstrations_and_are_checked(tmp_path):
  rows = [{"question": f"What is {i} / 4?", "answer": str(i / 4), "expr": f"{i} / 4"} for i in range(1, 13)]
  path = tmp_path / "e.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  spec = mt.env_spec(
    ml_collections.ConfigDict(
      {"source": f"jsonl:{path}", "expression_field": "expr", "eval_holdout": 3, "max_tool_calls": 1}
    )
  )
  assert spec.demonstration is not None and spec.max_turns == 2
  train = spec.make_tasks("train", 100, 0)
  ev = spec.make_tasks("eval", 3, None)
  assert len(train) == 9 and len(ev) == 3
  rng = random.Random(1)
  for t in list(train):
    chat = spec.demonstration(t, rng)
    env = spec.make_env(t)
    env.step(chat[2]["content"])
    env.step(chat[4]["content"])
    assert env.reward() == 1.0
  rows[4]["expr"] = "4 / 5"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  with pytest.raises(sources.SourceError, match=r"expression '4 / 5' evaluates to 0.8"):
    mt.make_file_tasks(
      "train",
      None,
      0,
      source=f"jsonl:{path}",
      eval_source=f"jsonl:{path}",
      eval_holdout=1,
      fields=mt.FileFields(expression_field="expr"),
    )


def test_file_errors_are_named(tmp_path):
  _math_jsonl(tmp_path / "m.jsonl")
  with pytest.raises(sources.SourceError, match=r"no field 'problem' \(fields present: 'uid', 'question'"):
    mt.make_file_tasks("train", 4, 0, source=f"jsonl:{tmp_path / 'm.jsonl'}", fields=mt.FileFields("problem"))
  with pytest.raises(FileNotFoundError, match="missing.jsonl"):
    mt.make_file_tasks("eval", 4, None, source=f"jsonl:{tmp_path / 'missing.jsonl'}")


# --- EnvSpec --------------------------------------------------------------------------------------------------------


def test_env_spec_keys_and_defaults():
  spec = mt.env_spec(ml_collections.ConfigDict({"name": "math_tools", "max_tool_calls": 3}))
  assert spec.demonstration is None  # the default generators include word problems without expressions
  assert spec.max_turns == 4 and spec.stop_strings == (tc.TOOL_CALL_CLOSE, tc.ANSWER_CLOSE)
  assert spec.is_success(1.0) and not spec.is_success(0.0)
  tasks = spec.make_tasks("eval", 8, None)
  assert [t.source for t in tasks] == list(mt.DEFAULT_GENERATORS)
  assert spec.initial_messages(tasks[0])[0]["content"] == mt.SYSTEM_PROMPT
  assert set(mt.CONFIG_DEFAULTS) >= {
    "generators",
    "source",
    "max_tool_calls",
    "prompt_field",
    "answer_field",
    "info_field",
    "expression_field",
  }
  only_expr = mt.env_spec({"generators": "chain_sum, products", "generator_kwargs": '{"products": {"max_digits": 2}}'})
  assert only_expr.demonstration is mt.demonstration
  assert [t.source for t in only_expr.make_tasks("train", 4, 0)] == ["chain_sum", "products"] * 2
  for bad, match in (
    ({"generators": "chain_sum,nope"}, "unknown generator 'nope'"),
    ({"generators": " , "}, "empty"),
    ({"generator_kwargs": "{oops"}, "not JSON"),
    ({"generator_kwargs": "[1]"}, "JSON object"),
    ({"source": "csv:/x"}, "must be '' or start with"),
    ({"max_tool_calls": -1}, ">= 0"),
    ({"eval_holdout": -1}, r"config.env.math_tools.eval_holdout must be >= 1, got -1"),  # was accepted (issue 35 kind)
    ({"eval_holdout": 0}, r"eval_holdout must be >= 1, got 0"),
  ):
    with pytest.raises(ValueError, match=match):
      mt.env_spec(bad)


def test_math_verify_accuracy_beside_the_verifiers_reward():
  """The EnvSpec's metrics are arithmetic's: math-verify's parse and verify of the <answer> against the file's gold."""
  from math_verify import parse, verify

  task = mt.MathTask(
    task_id="f/0", question="Half of 1?", answer="\\frac{1}{2}", source="jsonl:f", verifier="math_verify"
  )
  envs = []
  for answer in ("0.5", "1/2", "0.25"):
    env = mt.MathEnv(task, max_tool_calls=1)
    env.step(tc.render_answer(answer))
    envs.append(env)
  assert [e.reward() for e in envs] == [1.0, 0.0, 0.0]  # the reward takes plain numbers only
  official = [bool(verify(parse(task.answer), parse(a))) for a in ("0.5", "1/2", "0.25")]
  assert [e.math_verify_correct() for e in envs] == official == [True, True, False]
  assert mt.env_spec().metrics(envs) == {"math_verify_accuracy": pytest.approx(2 / 3)}
