"""BFCL single-turn environment: BFCL's AST checker as the reward, the irrelevance trap, the task splits."""

import json
import random
import sys
import types

import pytest

pytest.importorskip("bfcl_eval", reason="pip install --no-deps bfcl-eval mpmath")

from jaxcredit.envs import bfcl_decoder  # noqa: E402
from jaxcredit.envs import bfcl_single as b  # noqa: E402
from jaxcredit.envs import tool_calls  # noqa: E402

RELEVANT = ("simple", "multiple", "parallel", "parallel_multiple")


@pytest.fixture(scope="module")
def tasks():
  return b.load_tasks(RELEVANT)


@pytest.fixture(scope="module")
def irrelevance():
  return b.load_tasks(("irrelevance",))


def _task(task_id):
  return next(t for t in b.load_tasks(b.CATEGORIES) if t.task_id == task_id)


def _step(task, text):
  env = b.BfclSingleEnv(task)
  result = env.step(text)
  return env.reward(), result


# --- BFCL's own decoding and runner rules, executed from bfcl-eval's source (its modules import API clients) -----


@pytest.fixture(scope="module")
def bfcl():
  """BFCL's Qwen FC handler decoder and its eval runner's relevance / AST entry rules, from bfcl-eval's source."""
  from bfcl_eval.constants.enums import Language, ReturnFormat
  from bfcl_eval.utils import is_empty_output, is_function_calling_format_output

  checker, language, model = b._ast_checker()
  qwen = bfcl_decoder.compile_functions(
    "model_handler/local_inference/qwen_fc.py",
    ["QwenFCHandler.decode_ast", "QwenFCHandler._extract_tool_calls"],
    {"json": json, "re": __import__("re"), "Any": object},
  )
  handler = type(
    "QwenDecoder",
    (),
    {
      "decode_ast": qwen["QwenFCHandler.decode_ast"],
      "_extract_tool_calls": staticmethod(qwen["QwenFCHandler._extract_tool_calls"]),
    },
  )()
  runner = bfcl_decoder.compile_functions(
    "eval_checker/eval_runner.py",
    ["_evaluate_single_relevance_entry", "_evaluate_single_ast_entry"],
    {
      "ReturnFormat": ReturnFormat,
      "Language": Language,
      "is_empty_output": is_empty_output,
      "is_function_calling_format_output": is_function_calling_format_output,
      "ast_checker": checker,
    },
  )

  def verdict(task, text):
    """BFCL's `valid` for an entry whose model response is `text` (what the handler keeps after `</think>`)."""
    text = text.split("</think>")[-1].lstrip("\n")
    if task.category == "irrelevance":
      return runner["_evaluate_single_relevance_entry"](handler, task.task_id, text, {}, model, "irrelevance")["valid"]
    return runner["_evaluate_single_ast_entry"](
      handler,
      task.task_id,
      text,
      list(task.ground_truth),
      {"function": list(task.functions)},
      model,
      task.bfcl_category,
      language,
      ReturnFormat.PYTHON,
    )["valid"]

  return types.SimpleNamespace(verdict=verdict, decode=handler.decode_ast)


def _qwen_text(calls):
  """Calls as the library writes them (`render_calls`: Qwen3's chat-template syntax, what BFCL's Qwen decoder reads;
  tests/envs/test_bfcl_rendering.py compares it with the template byte for byte)."""
  return b.render_calls(calls)


# --- every task ---------------------------------------------------------------------------------------------------


def test_ground_truth_passes_every_task_through_our_parser_and_bfcls_checker(tasks):
  assert len(tasks) == 1000 and {t.category for t in tasks} == set(RELEVANT)
  failed = []
  for task in tasks:
    text = b.gold_answer_text(task)
    parsed = tool_calls.parse_message(text)
    assert len(parsed.calls) == len(task.ground_truth) and all(p.call for p in parsed.calls), task.task_id
    reward, result = _step(task, text)
    if reward != 1.0 or not result.info["official_valid"] or not result.info["answered"]:
      failed.append((task.task_id, result.info["error"]))
  assert failed == []


def test_wrong_function_name_fails_every_task(tasks):
  for task in tasks:
    calls = b.ground_truth_calls(task)
    name, args = calls[0]
    text = b.render_calls([(name + "_v2", args)] + calls[1:])
    reward, result = _step(task, text)
    assert reward == 0.0 and not result.info["official_valid"], task.task_id
    assert result.info["tool_errors"] >= 1  # a function the task does not offer


def test_wrong_argument_value_fails(tasks):
  rng = random.Random(0)
  checked = 0
  for task in rng.sample(list(tasks), 200):
    calls = b.ground_truth_calls(task)
    name, args = calls[-1]
    ints = [k for k, v in args.items() if type(v) is int]
    if not ints:
      continue
    wrong = dict(args, **{ints[0]: args[ints[0]] + 7919})
    reward, _ = _step(task, b.render_calls(calls[:-1] + [(name, wrong)]))
    assert reward == 0.0, task.task_id
    checked += 1
  assert checked > 50


def test_ground_truth_rendering_fixes_the_data_quirks():
  # simple_python_200: a required argument whose first possible answer is "" (omitted would fail the checker)
  ((_, args),) = b.ground_truth_calls(_task("simple_python_200"))
  assert args["fuel_efficiency"] == 25.0
  # parallel_multiple_26: the possible answer names an argument the function does not have ("type", may be omitted)
  calls = dict(b.ground_truth_calls(_task("parallel_multiple_26")))
  assert "type" not in calls["bank.calculate_balance"]
  # a dict argument holds one possible answer per key
  ((_, args),) = b.ground_truth_calls(_task("simple_python_94"))
  assert all(not isinstance(v, list) for v in args["update_info"].values())
  naive = [(n, {k: v[0] for k, v in a.items()}) for g in _task("simple_python_94").ground_truth for n, a in g.items()]
  assert not b.ast_check(_task("simple_python_94"), naive)["valid"]


def test_dotted_names_are_checked_as_written(tasks):
  task = next(t for t in tasks if t.category == "simple" and "." in t.functions[0]["name"])
  ((name, args),) = b.ground_truth_calls(task)
  assert _step(task, tool_calls.render_tool_call(name, args))[0] == 1.0
  assert _step(task, tool_calls.render_tool_call(name.replace(".", "_"), args))[0] == 0.0


# --- irrelevance: the trap ----------------------------------------------------------------------------------------


def test_irrelevance_no_call_earns_reward_and_official(irrelevance, bfcl):
  task = irrelevance[0]
  reward, result = _step(task, b.REFUSAL_TEXT)
  assert reward == 1.0 and result.info["official_valid"] is True and result.info["answered"]
  assert bfcl.verdict(task, b.REFUSAL_TEXT) is True
  assert b.demonstration(task)[-1] == {"role": "assistant", "content": b.REFUSAL_TEXT}


@pytest.mark.parametrize(
  "text",
  [
    "<tool_call>{bad json</tool_call>",
    "<tool_call>\n{bad json\n</tool_call>",  # BFCL's regex matches this one
    '<tool_call>\n{"name": "determine_body_mass_index", "arguments": "{\\"weight\\": 70}"}\n</tool_call>',
    '<tool_call>\n{"name": "determine_body_mass_index"}\n</tool_call>',
  ],
)
def test_irrelevance_malformed_call_never_earns_reward_but_bfcl_counts_it(irrelevance, bfcl, text):
  task = irrelevance[0]
  reward, result = _step(task, text)
  assert reward == 0.0 and not result.info["answered"]
  official = bfcl.verdict(task, text)
  assert result.info["official_valid"] is official
  assert official is True  # BFCL's metric: a call that does not decode is a correct refusal


def test_irrelevance_well_formed_call_fails_both(irrelevance, bfcl):
  task = irrelevance[0]
  text = _qwen_text([(task.functions[0]["name"], {"weight": 70.0, "height": 1.8})])
  reward, result = _step(task, text)
  assert reward == 0.0
  assert result.info["official_valid"] is bfcl.verdict(task, text) is False


# --- the official verdict agrees with BFCL's runner on relevant tasks ---------------------------------------------


def test_official_valid_matches_bfcls_runner(tasks, bfcl):
  rng = random.Random(1)
  for task in rng.sample(list(tasks), 40):
    calls = b.ground_truth_calls(task)
    variants = {
      "gold": (_qwen_text(calls), 1.0),
      "wrong name": (_qwen_text([(calls[0][0] + "_v2", calls[0][1])] + calls[1:]), 0.0),
      "one malformed extra": (_qwen_text(calls) + "\n<tool_call>\n{oops\n</tool_call>", 0.0),
      "thinking first": ("<think>\nI will call it.\n</think>\n\n" + _qwen_text(calls), 1.0),
    }
    for what, (text, want_reward) in variants.items():
      reward, result = _step(task, text)
      assert reward == want_reward, (task.task_id, what)
      assert result.info["official_valid"] is bfcl.verdict(task, text), (task.task_id, what)
    # BFCL's decoder drops a call it cannot parse; the training reward does not
    assert bfcl.verdict(task, variants["one malformed extra"][0]) is True


# --- per-category accuracy, official and strict, beside BFCL's runner -------------------------------------------

CATEGORY_SIZES = {"simple": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200, "irrelevance": 240}
"""Every task of each category is compared (bfcl-eval 2026.3.23's files)."""

SCENARIOS = (
  "ground_truth",
  "wrong_argument",
  "empty",
  "call_on_irrelevance",
  "malformed",
  "reordered",
  "extra_call",
  "unknown_function",
  "unclosed_think",
  "parameters_key",
  "compact_syntax",
)
"""What the model outputs on every task (`_output`); the last six are compared with BFCL's runner only (issue 53)."""


def _wrong_argument(calls):
  """The calls with the first int, float or str argument of the last call changed to a value no possible answer
  holds (+ 7919, + 7919.5, " (wrong)" appended); None when that call has no such argument."""
  name, args = calls[-1]
  for key, value in args.items():
    if type(value) in (int, float, str):
      wrong = value + " (wrong)" if type(value) is str else value + (7919 if type(value) is int else 7919.5)
      return calls[:-1] + [(name, dict(args, **{key: wrong}))]
  return None


def _output(scenario, task):
  """The model's message on `task`: the ground truth (a refusal on irrelevance tasks), the ground truth with a wrong
  argument, nothing, a call on irrelevance tasks (the ground truth elsewhere), or a call that is not JSON."""
  calls = b.ground_truth_calls(task)
  relevant = task.category != "irrelevance"
  if scenario == "ground_truth":
    return _qwen_text(calls) if relevant else b.REFUSAL_TEXT
  if scenario == "wrong_argument":
    return _qwen_text(_wrong_argument(calls) or calls) if relevant else b.REFUSAL_TEXT
  if scenario == "empty":
    return ""
  if scenario == "call_on_irrelevance":
    return _qwen_text(calls) if relevant else _qwen_text([(task.functions[0]["name"], {})])
  if scenario == "malformed":
    return "<tool_call>\n{bad json\n</tool_call>"
  if not relevant:  # the kinds below write the ground truth's calls some other way; irrelevance tasks get a call
    calls = [(task.functions[0]["name"], {})]
  if scenario == "reordered":
    return _qwen_text(calls[::-1])
  if scenario == "extra_call":
    return _qwen_text(calls + calls[:1])
  if scenario == "unknown_function":
    return _qwen_text(calls + [("no_such_function", {})])
  if scenario == "unclosed_think":
    return "<think>\nI will call:\n" + _qwen_text(calls)
  if scenario == "parameters_key":
    return "\n".join("<tool_call>\n" + json.dumps({"name": n, "parameters": a}) + "\n</tool_call>" for n, a in calls)
  assert scenario == "compact_syntax"  # the library's syntax before issue 53: BFCL's decoder finds no call
  return "\n".join(tool_calls.render_tool_call(n, a) for n, a in calls)


def _by_hand(scenario, category, tasks):
  """(official, strict) accuracy of a category under a scenario, by the rules: BFCL's decoder drops a call that is
  not JSON (a refusal on irrelevance, a missing call elsewhere); the strict rule fails any malformed call."""
  if scenario not in SCENARIOS[:5]:
    return None
  if category == "irrelevance":
    return {"call_on_irrelevance": (0.0, 0.0), "malformed": (1.0, 0.0)}.get(scenario, (1.0, 1.0))
  if scenario == "wrong_argument":
    passed = sum(_wrong_argument(b.ground_truth_calls(t)) is None for t in tasks) / len(tasks)
    return passed, passed
  return (0.0, 0.0) if scenario in ("empty", "malformed") else (1.0, 1.0)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_per_category_official_accuracy_equals_bfcls_runner(bfcl, scenario):
  """bfcl_official_accuracy/<category> equals the accuracy BFCL's eval runner (its Qwen decoder, relevance and AST
  entry rules, `ast_checker`) gives the same messages, task by task; official and strict match the rules by hand."""
  tasks = b.load_tasks(b.CATEGORIES)
  texts = [_output(scenario, t) for t in tasks]
  envs = [b.BfclSingleEnv(t) for t in tasks]
  for env, text in zip(envs, texts):
    env.step(text)
  theirs = [bfcl.verdict(t, text) for t, text in zip(tasks, texts)]
  assert [e.info["official_valid"] for e in envs] == theirs  # task by task, not only on average
  ours = b.metrics(envs)
  for category in b.CATEGORIES:
    group = [t for t in tasks if t.category == category]
    verdicts = [v for t, v in zip(tasks, theirs) if t.category == category]
    assert len(verdicts) == CATEGORY_SIZES[category]
    assert ours[f"bfcl_official_accuracy/{category}"] == sum(verdicts) / len(verdicts), category
    by_hand = _by_hand(scenario, category, group)
    if by_hand is not None:
      official, strict = by_hand
      assert ours[f"bfcl_official_accuracy/{category}"] == pytest.approx(official), category
      assert ours[f"bfcl_strict_accuracy/{category}"] == pytest.approx(strict), category
  if scenario in ("parameters_key", "compact_syntax"):  # nothing decodes: relevant tasks fail, irrelevance passes
    assert ours["bfcl_official_accuracy/simple"] == 0.0 and ours["bfcl_official_accuracy/irrelevance"] == 1.0
  if scenario == "wrong_argument":  # most tasks do get a wrong argument
    relevant = [t for t in tasks if t.category != "irrelevance"]
    assert sum(_wrong_argument(b.ground_truth_calls(t)) is not None for t in relevant) > 0.75 * len(relevant)


# --- parsing: think blocks, several calls, arguments as a JSON string --------------------------------------------


def test_calls_inside_think_do_not_count(tasks, irrelevance):
  task = next(t for t in tasks if t.category == "simple")
  gold = b.gold_answer_text(task)
  assert _step(task, "<think>" + gold + "</think>")[0] == 0.0
  wrong = tool_calls.render_tool_call("nope", {})
  reward, result = _step(task, "<think>" + wrong + "</think>\n" + gold)
  assert reward == 1.0 and result.info["tool_calls"] == 1
  reward, result = _step(irrelevance[0], "<think>" + wrong + "</think>\n" + b.REFUSAL_TEXT)
  assert reward == 1.0 and result.info["tool_calls"] == 0
  assert _step(task, "<think>unfinished " + gold)[0] == 0.0  # an unclosed think block hides everything after it


def test_several_calls_in_one_message(tasks):
  task = next(t for t in tasks if t.category == "parallel" and len(t.ground_truth) >= 3)
  calls = b.ground_truth_calls(task)
  reward, result = _step(task, b.render_calls(calls[::-1]))  # any order
  assert reward == 1.0 and result.info["tool_calls"] == len(calls)
  assert _step(task, b.render_calls(calls[:-1]))[0] == 0.0  # one missing
  assert _step(task, b.render_calls(calls + calls[:1]))[0] == 0.0  # one repeated
  assert _step(task, " ".join(b.render_calls([c]) for c in calls))[0] == 1.0  # on one line
  multiple = next(t for t in tasks if t.category == "multiple")
  assert _step(multiple, b.render_calls(b.ground_truth_calls(multiple) * 2))[0] == 0.0  # "multiple" wants one call


def test_arguments_as_a_json_string(tasks, bfcl):
  task = next(t for t in tasks if t.category == "simple")
  ((name, args),) = b.ground_truth_calls(task)
  text = "<tool_call>\n" + json.dumps({"name": name, "arguments": json.dumps(args)}) + "\n</tool_call>"
  reward, result = _step(task, text)
  assert reward == 1.0
  assert result.info["official_valid"] is bfcl.verdict(task, text) is False  # BFCL's Qwen decoder wants an object


# --- environment state --------------------------------------------------------------------------------------------


def test_two_envs_of_one_task_are_independent(tasks):
  task = tasks[0]
  first, second = b.BfclSingleEnv(task), b.BfclSingleEnv(task)
  assert first.reward() == 0.0 and first.info["finish"] is None
  r1 = first.step(b.gold_answer_text(task))
  info_before = dict(first.info)
  r2 = second.step("I would rather not.")
  assert (first.reward(), second.reward()) == (1.0, 0.0)
  assert first.info == info_before == r1.info and r2.info["finish"] == "no_calls"
  assert r1.done and r1.observation is None and r1.info["turns"] == 1
  r1.info["tool_calls"] = 99  # the returned info is a copy
  assert first.info["tool_calls"] == 1
  with pytest.raises(RuntimeError):
    first.step(b.gold_answer_text(task))
  assert task.functions[0]["parameters"]["type"] == "dict"  # the checker and the prompt left the docs unchanged


def test_info_keys_and_metrics(tasks, irrelevance):
  envs = [b.BfclSingleEnv(t) for t in (tasks[0], tasks[1], irrelevance[0], tasks[2])]
  envs[0].step(b.gold_answer_text(tasks[0]))
  envs[1].step("<tool_call>{bad</tool_call>")
  envs[2].step("<tool_call>{bad</tool_call>")
  info = envs[1].info
  assert {"tool_calls", "tool_errors", "answered", "budget_exhausted", "turns", "finish", "official_valid"} <= set(info)
  assert info["finish"] == "malformed" and info["tool_errors"] == 1 and not info["answered"]
  # envs[3] never stepped: left out; the malformed call is a refusal to BFCL on the irrelevance task, not to us
  assert b.metrics(envs) == {
    "bfcl_official_accuracy": pytest.approx(2 / 3),
    "bfcl_official_accuracy/simple": 0.5,
    "bfcl_strict_accuracy/simple": 0.5,
    "bfcl_official_accuracy/irrelevance": 1.0,
    "bfcl_strict_accuracy/irrelevance": 0.0,
  }
  assert [e.reward() for e in envs] == [1.0, 0.0, 0.0, 0.0]
  assert b.metrics([]) == {}
  many = b.BfclSingleEnv(tasks[0], max_calls=2)
  assert many.step(b.render_calls(b.ground_truth_calls(tasks[0]) * 3)).info["budget_exhausted"] is True


# --- tasks and prompt ---------------------------------------------------------------------------------------------


def test_splits_are_deterministic_disjoint_and_refuse_too_many():
  train = b.make_tasks("train", None, 3)
  evals = b.make_tasks("eval", None, None)
  assert len(train) + len(evals) == 1000 and not {t.task_id for t in train} & {t.task_id for t in evals}
  assert 60 < len(evals) < 140 and len({t.category for t in evals[:20]}) >= 3  # mixed, not one category first
  assert b.make_tasks("train", 50, 3) == train[:50] and b.make_tasks("train", 50, 4) != train[:50]
  assert b.make_tasks("eval", 10, None) == evals[:10]
  with pytest.raises(ValueError, match="config.env.num_train_tasks"):
    b.make_tasks("train", len(train) + 1, 0)
  with pytest.raises(ValueError, match="config.eval.num_tasks"):
    b.make_tasks("eval", len(evals) + 1, None)
  with pytest.raises(ValueError, match="split"):
    b.make_tasks("test", 1, 0)
  with_irrelevance = b.make_tasks("eval", None, None, categories=b.CATEGORIES)
  assert set(evals) < set(with_irrelevance)


def test_initial_messages_list_tools_as_json_schema():
  task = _task("simple_python_83")  # tuple of floats
  system, user = b.initial_messages(task)
  assert system["role"] == "system" and user == {"role": "user", "content": task.question[0]["content"]}
  assert system["content"].startswith(tool_calls.render_tools_prompt(b.schemas(task)))
  assert system["content"].endswith(b.INSTRUCTION)
  listed = [json.loads(line) for line in system["content"].split("<tools>\n")[1].split("\n</tools>")[0].splitlines()]
  assert listed == b.schemas(task)
  params = listed[0]["function"]["parameters"]
  assert params["type"] == "object"
  assert params["properties"]["coord1"] == {
    "type": "array",
    "description": task.functions[0]["parameters"]["properties"]["coord1"]["description"],
    "items": {"type": "number"},
  }
  types_used = set()

  def walk(x):
    if isinstance(x, dict):
      if isinstance(x.get("type"), str):
        types_used.add(x["type"])
      for v in x.values():
        walk(v)
    elif isinstance(x, list):
      for v in x:
        walk(v)

  for t in b.load_tasks(b.CATEGORIES):
    walk([s["function"]["parameters"] for s in b.schemas(t)])
  assert types_used <= {"object", "number", "integer", "string", "boolean", "array"}


def test_env_spec():
  es = b.env_spec(types.SimpleNamespace(categories="simple, irrelevance"))
  assert {t.category for t in es.make_tasks("train", None, 0)} == {"simple", "irrelevance"}
  assert es.stop_strings == () and es.max_turns == 1
  assert es.is_success(1.0) and not es.is_success(0.0)
  task = _task("parallel_0")
  chat = es.demonstration(task, random.Random(0))
  assert chat[:-1] == es.initial_messages(task) and chat[-1]["role"] == "assistant"
  assert chat[-1]["content"] == es.gold_answer_text(task)
  env = es.make_env(task)
  env.step(chat[-1]["content"])
  assert env.reward() == 1.0
  assert es.metrics([env]) == {
    "bfcl_official_accuracy": 1.0,
    "bfcl_official_accuracy/parallel": 1.0,
    "bfcl_strict_accuracy/parallel": 1.0,
  }
  assert "Maroon 5" in es.privileged_info(task) and "Taylor Swift" in es.privileged_info(task)
  assert es.tools(task) == b.schemas(task)
  default = b.env_spec(types.SimpleNamespace())
  assert {t.category for t in default.make_tasks("eval", None, None)} == set(RELEVANT)
  with pytest.raises(ValueError, match="config.env.bfcl_single.categories"):
    b.env_spec(types.SimpleNamespace(categories="simple,live_simple"))


def test_missing_bfcl_eval_names_the_install_command(monkeypatch):
  import importlib.util

  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bfcl_eval" else real(name, *a))
  with pytest.raises(ImportError, match=r"pip install --no-deps bfcl-eval mpmath"):
    b.env_spec(None)


def test_checker_import_uses_a_stand_in_only_when_needed():
  b._ast_checker()
  module = sys.modules["bfcl_eval.constants.model_config"]
  try:
    import anthropic  # noqa: F401  (the real model_config imports every API client, this one first)

    real_importable = True
  except ImportError:
    real_importable = False
  is_stand_in = getattr(module, "__file__", None) is None
  assert is_stand_in is not real_importable
  if is_stand_in:
    assert set(module.MODEL_CONFIG_MAPPING) == {b.CHECKER_MODEL_NAME}
    assert module.MODEL_CONFIG_MAPPING[b.CHECKER_MODEL_NAME].underscore_to_dot is False
