"""Every environment's verdict on a broken tool call (issue 35 case 1, swept): an attempted call is a call.

A `<tool_call>` that does not parse (cut short, not JSON, not strict JSON, no name), names no tool or holds bad
arguments is answered with an error observation and counts as a call. It is never read as the message's answer or
as an abstention: the answer environments (arithmetic, math_tools, search) take no answer from a message whose first
action is a broken call, and the BFCL environments fail a request that asks for no call (single-turn irrelevance,
multi-turn empty ground truth) once a broken call was made. The calculator is no environment: it is the tool of
arithmetic and math_tools, covered through them.
"""

import pytest

from jaxcredit.envs import arithmetic as ar
from jaxcredit.envs import chain as ch
from jaxcredit.envs import math_tools as mt
from jaxcredit.envs import search as se

BROKEN = {
  "cut_short": '<tool_call>{"name": "calculator", "arguments": {"expression": ',
  "not_json": "<tool_call>{calculator: 2+3}</tool_call>",
  "empty": "<tool_call></tool_call>",
  "duplicate_key": '<tool_call>{"name": "calculator", "name": "search", "arguments": {}}</tool_call>',
  "non_finite": '<tool_call>{"name": "calculator", "arguments": {"expression": NaN}}</tool_call>',
  "not_an_object": '<tool_call>["calculator", "2+3"]</tool_call>',
  "no_name": '<tool_call>{"arguments": {"expression": "2+3"}}</tool_call>',
  "unknown_tool": '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
  "bad_arguments": '<tool_call>{"name": "calculator", "arguments": "not an object"}</tool_call>',
}


def _arithmetic():
  task = ar.ArithmeticTask(
    task_id="t", question="What is 2+3?", answer="5", source="basic_arithmetic", expression="2+3"
  )
  return ar.ArithmeticEnv(task, max_tool_calls=2), "<answer>5</answer>"


def _math_tools():
  task = mt.MathTask(task_id="t", question="What is 2+3?", answer="5", source="t", verifier="math_verify")
  return mt.MathEnv(task, max_tool_calls=2), "<answer>5</answer>"


def _search():
  docs = [se.Document("d1", "Kelmarsh", "Kelmarsh is a river town on the Velsa.")]
  task = se.SearchTask("q1", "What river flows through Kelmarsh?", "Velsa", evidence_docids=("d1",))
  return se.SearchEnv(task, se.SearchIndex(docs)), "<answer>Velsa</answer>"


def _chain():
  task = ch.ChainTask("t", "Start with 2 and apply each step in order: +3.", "5", 2, (("+", 3),), (2, 5))
  return ch.ChainEnv(task, max_tool_calls=2), "<answer>5</answer>"


ANSWER_ENVS = {"arithmetic": _arithmetic, "chain": _chain, "math_tools": _math_tools, "search": _search}


@pytest.mark.parametrize("broken", BROKEN)
@pytest.mark.parametrize("env_name", ANSWER_ENVS)
def test_answer_environments_count_a_broken_call_and_take_no_answer_from_its_message(env_name, broken):
  env, answer = ANSWER_ENVS[env_name]()
  r = env.step(BROKEN[broken] + "\n" + answer)
  assert not r.done and r.observation.startswith("<tool_response>error: "), r.observation
  assert r.info["tool_calls"] == 1 and r.info["tool_errors"] >= 1 and not r.info["answered"]
  assert env.reward() == 0.0
  r = env.step(answer)  # the broken call is a call, not a forfeit: the right answer after it still pays
  assert r.done and r.info["answered"] and env.reward() == 1.0


@pytest.mark.parametrize("env_name", ANSWER_ENVS)
def test_answer_environments_control_the_answer_alone_pays(env_name):
  env, answer = ANSWER_ENVS[env_name]()
  r = env.step(answer)
  assert r.done and r.info["tool_calls"] == 0 and env.reward() == 1.0


@pytest.fixture(scope="module")
def bfcl():
  pytest.importorskip("bfcl_eval")
  from jaxcredit.envs import bfcl_multi_turn as bm
  from jaxcredit.envs import bfcl_single as bs

  irrelevance = bs.load_tasks(("irrelevance",))[0]
  multi = next(t for t in bm.load_tasks() if t.category == "miss_param" and any(not g for g in t.ground_truth))
  return bs, bm, irrelevance, multi


def _multi_turn_at_empty_request(bm, task):
  u = next(u for u in range(task.num_units) if not task.ground_truth[u])
  s = bm.BfclSession(task, max_steps_per_unit=4)
  for k in range(u):
    s.step(bm.render_calls(bm.ground_truth_calls(task, k)))
    s.step(bm.DONE_TEXT)
  return s, u


@pytest.mark.parametrize("broken", [*BROKEN, None])
def test_bfcl_single_irrelevance_a_broken_call_is_not_a_refusal(bfcl, broken):
  bs, _, task, _ = bfcl
  env = bs.BfclSingleEnv(task)
  r = env.step(("" if broken is None else BROKEN[broken] + "\n") + bs.REFUSAL_TEXT)
  assert r.done and r.info["tool_calls"] == (0 if broken is None else 1)
  assert env.reward() == (1.0 if broken is None else 0.0), r.info["error"]


@pytest.mark.parametrize("broken", [*BROKEN, None])
def test_bfcl_multi_turn_empty_ground_truth_a_broken_call_is_not_an_abstention(bfcl, broken):
  _, bm, _, task = bfcl
  s, u = _multi_turn_at_empty_request(bm, task)
  if broken is not None:
    r = s.step(BROKEN[broken] + "\n" + bm.REFUSAL_TEXT)
    assert r.role == "tool" and "error: " in r.observation and s.unit == u  # a call: the request goes on
  s.step(bm.REFUSAL_TEXT)
  assert s.unit == u + 1 and s.unit_passed[u] is (broken is None)


@pytest.mark.parametrize("env_name", ANSWER_ENVS)
def test_a_reward_asked_mid_episode_does_not_freeze_the_episodes_reward(env_name):
  """reward() before the end is 0.0; it used to be cached, so a right answer after it was paid 0.0."""
  env, answer = ANSWER_ENVS[env_name]()
  env.step(BROKEN["unknown_tool"])
  assert env.reward() == 0.0
  env.step(answer)
  assert env.reward() == 1.0
