"""BFCL V3 multi-turn: the ground truth of all 800 tasks replayed through our parser and executor passes every
request; without one request's calls that request fails; sessions are isolated; errors become observations."""

import json

import pytest

pytest.importorskip("bfcl_eval")

from ml_collections import ConfigDict

from jaxcredit.envs import ENVS
from jaxcredit.envs import bfcl_multi_turn as bm
from jaxcredit.envs import tool_calls as tc

TASKS = bm.load_tasks()


def _replay(task, drop=None, **kwargs):
  """Each request's ground-truth calls in one message (all of them; none for request `drop`), then "Done."."""
  s = bm.BfclSession(task, **{"max_steps_per_unit": 2, **kwargs})
  for u in range(task.num_units):
    calls = bm.ground_truth_calls(task, u)
    if calls and u != drop:
      r = s.step(bm.render_calls(calls))
      assert r.role == "tool" and not r.done
    r = s.step(bm.DONE_TEXT if calls else bm.REFUSAL_TEXT)
    assert r.done == (u == task.num_units - 1)
    if not r.done:
      assert r.role == "user" and r.observation == s.request_text(u + 1)
  return s


def test_the_data_has_800_tasks_in_four_categories():
  assert len(TASKS) == 800
  assert {c: sum(t.category == c for t in TASKS) for c in bm.CATEGORIES} == {c: 200 for c in bm.CATEGORIES}
  train, eval_ = bm.make_tasks("train"), bm.make_tasks("eval")
  assert len(train) + len(eval_) == 800 and not {t.task_id for t in train} & {t.task_id for t in eval_}


def test_ground_truth_replay_passes_every_request_of_every_task():
  failed = [(t.task_id, s.unit_passed) for t in TASKS for s in [_replay(t)] if s.reward() != 1.0]
  assert failed == []


def test_dropping_one_requests_calls_fails_that_request_on_every_task():
  checked = 0
  for t in TASKS:
    drop = next(u for u in range(t.num_units) if t.ground_truth[u])
    s = _replay(t, drop=drop)
    assert s.unit_passed[drop] is False, t.task_id
    assert s.reward() == 0.0 and s.info["official_valid"] is False
    checked += 1
  assert checked == 800


def test_dropping_the_last_call_of_a_request_is_caught_by_the_state_or_response_check():
  """A stricter mutation than dropping every call: the request still made calls, so BFCL's state or response
  checker has to notice the missing one."""
  caught = total = 0
  for t in TASKS[:200]:
    u = next((u for u in range(t.num_units) if len(t.ground_truth[u]) >= 2), None)
    if u is None:
      continue
    s = bm.BfclSession(t, max_steps_per_unit=2)
    for k in range(t.num_units):
      calls = bm.ground_truth_calls(t, k)
      if k == u:
        calls = calls[:-1]
      if calls:
        s.step(bm.render_calls(calls))
      s.step(bm.DONE_TEXT if bm.ground_truth_calls(t, k) else bm.REFUSAL_TEXT)
    total += 1
    caught += not s.unit_passed[u]
  assert total > 100 and caught / total > 0.9


def test_empty_ground_truth_requests_pass_only_without_a_call():
  task = next(t for t in TASKS if t.category == "miss_param" and any(not g for g in t.ground_truth))
  u = next(u for u in range(task.num_units) if not task.ground_truth[u])
  s = bm.BfclSession(task, max_steps_per_unit=3)
  for k in range(task.num_units):
    calls = bm.ground_truth_calls(task, k)
    if k == u:
      s.step(
        tc.render_tool_call("ls", {})
        if "GorillaFileSystem" in task.involved_classes
        else bm.render_calls(bm.ground_truth_calls(task, u + 1))
      )
    elif calls:
      s.step(bm.render_calls(calls))
    s.step("ok")
  assert s.unit_passed[u] is False
  assert s.official[u] is True  # BFCL's official checker does not check these requests
  assert s.reward() == 0.0


BROKEN_CALL = '<tool_call>{"name": "cd", "arguments": {"folder": '  # cut short: not JSON


def _at_empty_request(max_steps_per_unit=4):
  """A miss_param session advanced (by its ground truth) to its first request whose ground truth is empty."""
  task = next(t for t in TASKS if t.category == "miss_param" and any(not g for g in t.ground_truth))
  u = next(u for u in range(task.num_units) if not task.ground_truth[u])
  s = bm.BfclSession(task, max_steps_per_unit=max_steps_per_unit)
  for k in range(u):
    s.step(bm.render_calls(bm.ground_truth_calls(task, k)))
    s.step(bm.DONE_TEXT)
  assert s.unit == u
  return s, u


@pytest.mark.parametrize(
  "messages, passed",
  [
    ([bm.REFUSAL_TEXT], True),  # the abstention BFCL asks for
    ([BROKEN_CALL, bm.REFUSAL_TEXT], False),  # issue 35 case 1: a broken call, then a refusal
    ([BROKEN_CALL] * 4, False),  # issue 35 case 1: four broken calls that hit the step limit
    (['<tool_call>{"name": "cd", "name": "ls", "arguments": {}}</tool_call>', bm.REFUSAL_TEXT], False),
    (['<tool_call>{"name": "no_such_function", "arguments": {}}</tool_call>', bm.REFUSAL_TEXT], False),
    (["<think>unclosed"] * 4, False),  # never ended the request: the step limit did, not an abstention
    (["<think>" + tc.render_tool_call("ls", {}) + "</think>" + bm.REFUSAL_TEXT], True),  # thinking is no call
  ],
)
def test_issue35_case1_a_broken_call_is_not_an_abstention(messages, passed):
  s, u = _at_empty_request()
  for m in messages:
    s.step(m)
  assert s.unit == u + 1 and s.unit_passed[u] is passed


def test_miss_func_request_brings_the_held_out_functions():
  task = next(t for t in TASKS if t.held_out)
  unit, names = task.held_out[0]
  before = {d["name"] for d in bm.function_docs(task, unit - 1)}
  after = {d["name"] for d in bm.function_docs(task, unit)}
  assert set(names) <= after and not set(names) & before
  text = bm.BfclSession(task).request_text(unit)
  assert text.endswith(bm.ADDITIONAL_FUNCTIONS_PROMPT)
  shown = [json.loads(line)["function"]["name"] for line in text.splitlines()[:-1]]
  assert sorted(shown) == sorted(names)
  assert not any(n in bm.initial_messages(task)[0]["content"] for n in [f'"name": "{x}"' for x in names])


def test_sessions_of_one_task_do_not_share_state():
  task = next(t for t in TASKS if t.task_id == "multi_turn_base_0")
  a, b = bm.BfclSession(task), bm.BfclSession(task)
  calls = bm.ground_truth_calls(task, 0)
  a.step(bm.render_calls(calls))
  fs_a, fs_b = a.model_backends["GorillaFileSystem"], b.model_backends["GorillaFileSystem"]
  assert fs_a is not fs_b
  assert vars(fs_a) != vars(fs_b)  # a changed its file system ...
  fresh = bm.make_backends(task)["GorillaFileSystem"]
  assert str(vars(fs_b)) == str(vars(fresh))  # ... b's is still the initial one


@pytest.mark.parametrize(
  "text, needle",
  [
    ('<tool_call>{"name": "cd", "arguments": {"folder": ', "not valid JSON"),
    ('<tool_call>{"name": "no_such_function", "arguments": {}}</tool_call>', "unknown tool 'no_such_function'"),
    ('<tool_call>{"name": "cd", "arguments": {"folder": "x", "extra": 1}}</tool_call>', "unexpected argument"),
    ('<tool_call>{"name": "cd", "arguments": {}}</tool_call>', "missing required argument(s): 'folder'"),
    ('<tool_call>{"name": "cd", "arguments": {"folder": "no_such_dir"}}</tool_call>', "No such file or directory"),
    ("<think>I will call <tool_call>", "unclosed <think> block"),
  ],
)
def test_bad_calls_become_error_observations(text, needle):
  task = next(t for t in TASKS if t.task_id == "multi_turn_base_0")
  s = bm.BfclSession(task)
  r = s.step(text)
  assert r.role == "tool" and not r.done and needle in r.observation
  assert s.info["tool_errors"] == 1 and s.unit == 0


def test_calls_inside_think_blocks_do_not_run_and_several_calls_run_in_order():
  task = next(t for t in TASKS if t.task_id == "multi_turn_base_0")
  s = bm.BfclSession(task)
  hidden = "<think>" + tc.render_tool_call("mkdir", {"dir_name": "hidden"}) + "</think>"
  r = s.step(
    hidden
    + tc.render_tool_call("pwd", {})
    + tc.render_tool_call("mkdir", {"dir_name": "shown"})
    + tc.render_tool_call("ls", {})
  )
  results = r.observation.split("\n")
  assert len(results) == 3 and "shown" in results[2] and "hidden" not in r.observation
  assert s.info["tool_calls"] == 3


def test_long_output_is_truncated_not_an_error():
  task = next(t for t in TASKS if t.category == "long_context" and "GorillaFileSystem" in t.involved_classes)
  s = bm.BfclSession(task, max_output_chars=50)
  r = s.step(tc.render_tool_call("ls", {"a": True}))
  assert "[truncated" in r.observation and "error" not in r.observation
  assert s.model_results[-1].startswith("{") and len(s.model_results[-1]) > 50  # the checker sees all of it


def test_step_limit_ends_a_request_and_unfinished_requests_score_zero():
  task = next(t for t in TASKS if t.task_id == "multi_turn_base_0")
  s = bm.BfclSession(task, max_steps_per_unit=1, reward="unit_fraction")
  r = s.step(bm.render_calls(bm.ground_truth_calls(task, 0)))
  assert r.role == "user" and s.unit == 1 and s.unit_passed == [True]
  assert s.unit_rewards() == [1.0]  # request 1 shown, not acted in: not a unit of the rollout
  s.step("<think>unclosed")  # a message in request 1 (an error: ends it, 1 step)
  assert s.unit_passed == [True, False]
  s2 = bm.BfclSession(task, max_steps_per_unit=3)
  s2.step(bm.render_calls(bm.ground_truth_calls(task, 0)))
  assert s2.unit_rewards() == [0.0]  # acted in, unfinished when the rollout stopped
  assert s.reward() == pytest.approx(1 / task.num_units)  # unit_fraction: 1 of the task's requests passed


@pytest.mark.parametrize(
  "kwargs, key",
  [
    ({"max_steps_per_unit": 0}, "max_steps_per_unit"),
    ({"max_output_chars": 0}, "max_output_chars"),
    ({"reward": "sum"}, "reward"),
    ({"categories": ["base", "nope"]}, "categories"),
    ({"train_categories": ["miss_params"]}, "train_categories"),
    ({"max_turns": 0}, "max_turns"),
  ],
)
def test_env_spec_refuses_bad_keys_by_name(kwargs, key):
  with pytest.raises(ValueError, match=f"config.env.bfcl_multi_turn.{key}"):
    bm.env_spec(**kwargs)


def test_train_categories_train_on_base_and_evaluate_on_all_four():
  """CrEST's split (arXiv 2608.13179 App. C.1): training sessions from Base only, evals from every category; the
  hash split keeps them apart."""
  spec = bm.env_spec(train_categories=["base"])
  train, held_out = spec.make_tasks("train", 100, 0), spec.make_tasks("eval", None, None)
  assert len(train) == 100 and {t.task_id.split("_")[-2] for t in train} == {"base"}
  assert {c for c in bm.CATEGORIES if any(c in t.task_id for t in held_out)} == set(bm.CATEGORIES)
  assert not {t.task_id for t in train} & {t.task_id for t in held_out}


def test_crest_protocol_splits_100_base_to_train_and_100_of_each_category_to_evaluate():
  """protocol="crest" (arXiv 2608.13179 App. C.1's sizes): 100 Base sessions to train on, drawn with a fixed seed;
  100 each of the four categories to evaluate, in rounds of the four, none a training session or a variant of one."""
  spec = bm.env_spec(protocol="crest")
  train, held_out = spec.make_tasks("train", None, 0), spec.make_tasks("eval", None, None)
  assert len(train) == 100 and {t.category for t in train} == {"base"}
  assert len(held_out) == 400 and [t.category for t in held_out[:4]] == list(bm.CATEGORIES)
  assert {c: sum(t.category == c for t in held_out) for c in bm.CATEGORIES} == dict.fromkeys(bm.CATEGORIES, 100)
  train_ids = {t.task_id for t in train}
  assert len(train_ids) == 100 and not train_ids & {t.task_id for t in held_out}
  # disjoint by session too: index i of every category is a variant of base session i
  assert not {bm.session_index(t) for t in train_ids} & {bm.session_index(t.task_id) for t in held_out}
  # deterministic: the same split from a fresh draw, in the same order; the training order shuffled by the seed
  assert bm.crest_split.__wrapped__() == bm.crest_split()
  assert [t.task_id for t in bm.env_spec(protocol="crest").make_tasks("eval", None, None)] == [
    t.task_id for t in held_out
  ]
  assert [t.task_id for t in spec.make_tasks("train", None, 0)] == [t.task_id for t in train]
  assert {t.category for t in spec.make_tasks("eval", 8, None)} == set(bm.CATEGORIES)  # a prefix holds all four
  with pytest.raises(ValueError, match="config.eval.num_tasks=401.*protocol crest"):
    spec.make_tasks("eval", 401, None)
  with pytest.raises(ValueError, match="config.env.num_train_tasks=101"):
    spec.make_tasks("train", 101, 0)
  assert len(bm.env_spec(protocol="crest", train_categories=["base"]).make_tasks("train", None, 0)) == 100
  # the env row: the config node's key
  row = ENVS["bfcl_multi_turn"]
  assert len(row.make_spec(ConfigDict(dict(row.defaults, protocol="crest"))).make_tasks("eval", None, None)) == 400
  with pytest.raises(ValueError, match="config.env.bfcl_multi_turn.protocol: unknown protocol 'CrEST'"):
    row.make_spec(ConfigDict(dict(row.defaults, protocol="CrEST")))


@pytest.mark.parametrize(
  "kwargs, key",
  [
    ({"protocol": "paper"}, "protocol"),
    ({"protocol": "crest", "categories": ["base"]}, "categories"),
    ({"protocol": "crest", "train_categories": ["miss_func"]}, "train_categories"),
    ({"protocol": "crest", "classes": ["TradingBot"]}, "classes"),
  ],
)
def test_crest_protocol_refuses_keys_it_fixes_by_name(kwargs, key):
  with pytest.raises(ValueError, match=f"config.env.bfcl_multi_turn.{key}"):
    bm.env_spec(**kwargs)


def test_ground_truth_calls_are_parsed_without_eval():
  assert bm.parse_python_call("mv(source='a.txt', destination='tmp')") == (
    "mv",
    (),
    {"source": "a.txt", "destination": "tmp"},
  )
  assert bm.parse_python_call("sort('final_report.pdf')") == ("sort", ("final_report.pdf",), {})
  for bad in ("__import__('os').system('ls')", "f(x=open('a'))", "a.b(1)", "1 + 2"):
    with pytest.raises(ValueError):
      bm.parse_python_call(bad)


def test_env_spec_fields():
  spec = bm.env_spec(categories=["base"], compact_tools=True)
  task = spec.make_tasks("eval", 2, None)[0]
  system = spec.initial_messages(task)[0]["content"]
  assert "<tools>" in system and "This tool belongs to" not in system
  assert "Request 1:" in spec.privileged_info(task) and "<tool_call>" in spec.privileged_info(task)
  demo = spec.demonstration(task, None)
  roles = [m["role"] for m in demo]
  assert roles[:3] == ["system", "user", "assistant"] and roles.count("user") == task.num_units
  with pytest.raises(ValueError, match="config.env.num_train_tasks"):
    spec.make_tasks("train", 10_000, 0)


def test_unit_ground_truth_is_each_requests_calls_and_their_results():
  """CrEST's per-unit teacher context (arXiv 2608.13179, App. C.1): request u's ground-truth calls, executed."""
  spec = bm.env_spec(categories=["base"], compact_tools=True, max_output_chars=400)
  task = next(t for t in TASKS if t.task_id == "multi_turn_base_0")
  texts = spec.unit_privileged_info(task)
  assert len(texts) == task.num_units == 4
  assert [t.split(":")[0] for t in texts] == ["Request 1", "Request 2", "Request 3", "Request 4"]
  first = bm.render_calls(bm.ground_truth_calls(task, 0))
  assert texts[0].startswith("Request 1: " + first + "\nResults: <tool_response>")
  assert '"current_working_directory": "document"' in texts[0]  # cd's result, as the backend returns it
  assert "grep" in texts[1] and "grep" not in texts[0]
  assert spec.unit_privileged_info(task) is texts  # replayed once per task


def test_decoder_knobs_are_checked_by_name():
  task = bm.load_tasks(("base",))[0]
  with pytest.raises(ValueError, match="config.env.bfcl_multi_turn.decoder must be one of"):
    bm.BfclSession(task, decoder="bfcl")
  with pytest.raises(ValueError, match="config.env.bfcl_multi_turn.eval_decoder must be one of"):
    bm.env_spec(eval_decoder="qwen")
  with pytest.raises(ValueError, match="config.env.bfcl_multi_turn.eval_max_turns must be >= 0"):
    bm.env_spec(eval_max_turns=-1)


def test_held_out_sessions_read_text_as_bfcl_eval_and_training_ones_strictly():
  """The same compact-syntax ground truth: the training decoder runs it (the request passes), the official one finds
  no call (the request fails, as in bfcl-eval); `env_metrics` files each verdict under its decoder's key."""
  env = bm.env_spec(categories=("base",))
  train_task = env.make_tasks("train", 1, 0)[0]
  eval_task = env.make_tasks("eval", 1, None)[0]
  sessions = []
  for task in (train_task, eval_task):
    session = env.make_env(task)
    calls = bm.ground_truth_calls(task, 0)
    session.step("\n".join(tc.render_tool_call(n, a) for n, a in calls))
    sessions.append(session)
  assert [s.decoder for s in sessions] == ["training", "official"]
  assert sessions[0].steps_in_unit == 1 and sessions[0].unit == 0  # ran, the request goes on
  assert sessions[1].unit == 1 and sessions[1].unit_passed == [False]  # nothing decoded: the request ended, failed
  keys = set(bm.env_metrics(sessions))
  assert {"bfcl_checker_accuracy", "bfcl_checker_accuracy/base", "bfcl_official_accuracy/base"} <= keys
