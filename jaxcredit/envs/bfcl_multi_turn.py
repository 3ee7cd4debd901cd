"""BFCL V3 multi-turn: sessions of several user requests against stateful tool backends, each request verified.

The 800 tasks of `bfcl-eval`'s multi-turn categories (base, miss_func, miss_param, long_context; 200 each) run
against BFCL's own backends (GorillaFileSystem, MathAPI, MessageAPI, TwitterAPI, TicketAPI, TradingBot, TravelAPI,
VehicleControlAPI) and are checked with BFCL's own state and response checkers.

A session (one rollout):
  * The prompt is a system message listing the tools (`tool_calls.render_tools_prompt`) and the first request.
  * Each assistant message may hold several `<tool_call>\\n{json}\\n</tool_call>` blocks (outside `<think>` blocks). They
    are parsed to a function name and keyword arguments, checked against the function's schema and dispatched to
    the backend method directly (`getattr(instance, name)(**arguments)`): model text is never `eval`ed. Their
    results come back in one tool message.
  * A message without a tool call ends the current request (a unit). The unit is verified at once: BFCL's
    ground-truth calls for that request run on a second set of backends, then BFCL's `state_checker` (public
    attributes of every backend equal) and `response_checker` (every ground-truth result appears among the results
    of the model's calls so far) decide. A request whose ground truth is empty (miss_func / miss_param: the
    function or a parameter is missing) passes when the model attempted no call in it (BFCL's
    `multi_turn_irrelevance_checker` rule; a malformed call, an unknown function or bad arguments are attempts too)
    and ended it with a message without a call (a request the step limit ended was not declined). The next request then arrives as a user message (role "user"); in
    miss_func it brings the docs of the held-out functions, as BFCL's prompt does.
  * A request also ends after `max_steps_per_unit` messages with calls (BFCL's step limit, smaller here). A message
    with an unclosed `<think>` block is one of them: an error observation, and none of its calls run.
  * The outcome reward is 1.0 when every request passed ("all_units"), or the fraction that passed
    ("unit_fraction"). `unit_rewards` gives each reached request's 0/1 verdict (CrEST's verified units).
    `info["official_valid"]` is BFCL's own verdict, which skips the empty-ground-truth requests; the trainer logs its
    mean as `env/bfcl_official_accuracy`, and per category as `env/bfcl_official_accuracy/<category>`.

Each rollout owns fresh backend instances (`BfclSession`): nothing lives in module globals across rollouts, unlike
`bfcl-eval`'s executor, which caches instances in `globals()` keyed by model name and task id and builds calls as
strings it `eval`s.

Install: `pip install --no-deps bfcl-eval mpmath` (its declared dependencies pin numpy 1.26 and pull API clients;
the backends and checkers need none of them).
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import importlib.util
import inspect
import json
import re
from typing import Any, Sequence

from jaxcredit.envs import bfcl_decoder, episode, spec, tool_calls
from jaxcredit.envs.bfcl_tasks import (  # noqa: F401 - the task data, re-exported (this module's API before the split)
  BACKENDS,
  CATEGORIES,
  CREST_SEED,
  CREST_TRAIN,
  EVAL_EVERY,
  PROTOCOLS,
  BfclTask,
  _crest_pool,
  _is_eval_task,
  is_eval,
  load_tasks,
  make_tasks,
  package_dir,
  read_jsonl,
  session_index,
  split_groups,
  crest_split,
)

REWARDS = ("all_units", "unit_fraction")
DECODERS = ("training", "official")
"""How a session reads assistant text (`BfclSession`'s `decoder`): "training", the strict parser
(`tool_calls.parse_message`: malformed calls become error observations, think blocks hide calls, the step limit is
`max_steps_per_unit`); "official", bfcl-eval's own Qwen decoder and protocol (`bfcl_decoder.decode_execute`; a message
it cannot decode or that decodes to no call ends the request; past `official_step_limit()` steps in one request the
session is force-quit)."""
FORBIDDEN_CALLS = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")
"""Function names bfcl-eval's executor refuses before running a call ("Function call X is not allowed.")."""

SYSTEM_PROMPT = (
  "You are an assistant that completes the user's requests by calling functions. At each turn, call the "
  "functions needed for the current request (several calls may go in one message); their results come back in "
  "<tool_response> tags. When the request is done, or cannot be done with the functions you have, reply in "
  "plain text without a tool call.\n\n"
)
ADDITIONAL_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"
"""BFCL's user message for the turn where held-out functions arrive (`DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC`),
after the new functions' schemas."""
DONE_TEXT = "Done."
"""What a demonstration says to end a request."""
REFUSAL_TEXT = "I cannot do that with the functions and information I have."
"""What a demonstration says for a request whose ground truth is empty."""


# ---------------------------------------------------------------------------------------------------------------
# Function docs and backends.


@functools.lru_cache(maxsize=None)
def _class_docs(class_name: str) -> tuple[dict, ...]:
  from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

  return tuple(
    read_jsonl(package_dir() / "data" / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name])
  )


_TYPE_NAMES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


def json_schema(bfcl_parameters: Any) -> Any:
  """BFCL's parameter docs as standard JSON schema: "dict" -> "object", "float" -> "number", "tuple" -> "array",
  "any" -> no type; applied recursively."""
  if isinstance(bfcl_parameters, dict):
    out = {}
    for k, v in bfcl_parameters.items():
      if k == "type" and isinstance(v, str) and v in _TYPE_NAMES:
        if _TYPE_NAMES[v] is not None:
          out[k] = _TYPE_NAMES[v]
      else:
        out[k] = json_schema(v)
    return out
  if isinstance(bfcl_parameters, list):
    return [json_schema(v) for v in bfcl_parameters]
  return bfcl_parameters


def function_docs(task: BfclTask, unit: int, *, compact: bool = False) -> list[dict]:
  """The docs of the functions available at request `unit` (BFCL's order): the involved classes' functions, without
  excluded ones and without held-out ones whose request has not come yet.

  With `compact`, each description keeps only its "Tool description:" part (BFCL repeats a paragraph about the
  class before it in every function: about 30% of the prompt), for small models and short contexts.
  """
  held = {name: k for k, names in task.held_out for name in names}
  docs = []
  for c in task.involved_classes:
    for d in _class_docs(c):
      if d["name"] in task.excluded or held.get(d["name"], -1) > unit:
        continue
      if compact and "Tool description:" in d.get("description", ""):
        d = dict(d, description=d["description"].split("Tool description:", 1)[1].strip())
      docs.append(d)
  return docs


def schemas(docs: Sequence[dict]) -> list[dict]:
  """Function schemas in the OpenAI/Qwen3 layout, parameters as standard JSON schema."""
  return [
    {
      "type": "function",
      "function": {
        "name": d["name"],
        "description": d.get("description", ""),
        "parameters": json_schema(d.get("parameters", {})),
      },
    }
    for d in docs
  ]


def make_backends(task: BfclTask) -> dict[str, Any]:
  """Fresh backend instances of the task's classes, loaded with its initial state (never shared)."""
  from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

  config = json.loads(task.initial_config)
  out = {}
  for name in task.involved_classes:
    cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)
    instance = cls()
    if name not in STATELESS_CLASSES:
      instance._load_scenario(copy.deepcopy(config.get(name, {})), long_context=task.long_context)
    out[name] = instance
  return out


def _methods(backends: dict[str, Any]) -> dict[str, Any]:
  """Public method name -> bound method over the backends (BFCL's mapping: a later class wins a name clash)."""
  out = {}
  for instance in backends.values():
    for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
      if not name.startswith("_"):
        out[name] = method
  return out


def official_turn_cap() -> int:
  """The most assistant messages bfcl-eval's protocol lets a session take: per request, `official_step_limit()` call
  messages and the one that ends it, times the most requests of any session."""
  return (official_step_limit() + 1) * max(t.num_units for t in load_tasks())


@functools.lru_cache(maxsize=None)
def official_step_limit() -> int:
  """bfcl-eval's `MAXIMUM_STEP_LIMIT` (20 in 2026.3.23): its multi-turn loop force-quits (and its runner fails the
  whole session) when one request's step count exceeds it."""
  from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT

  return int(MAXIMUM_STEP_LIMIT)


def parse_python_call(text: str) -> tuple[str, tuple, dict]:
  """A ground-truth call string such as "mv(source='a.txt', destination='tmp')" as (name, args, kwargs).

  Arguments must be Python literals (`ast.literal_eval`); nothing is evaluated.

  Raises:
    ValueError: when the text is not one call of a plain name with literal arguments.
  """
  try:
    node = ast.parse(text.strip(), mode="eval").body
  except SyntaxError as e:
    raise ValueError(f"not a call: {text!r} ({e.msg})") from None
  if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
    raise ValueError(f"not a call of a plain function name: {text!r}")
  try:
    args = tuple(ast.literal_eval(a) for a in node.args)
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
  except ValueError:
    raise ValueError(f"call arguments are not literals: {text!r}") from None
  if any(k.arg is None for k in node.keywords):
    raise ValueError(f"**kwargs in a call: {text!r}")
  if len(kwargs) != len(node.keywords):  # Python's compiler refuses f(a=1, a=2); its parser does not
    raise ValueError(f"keyword argument repeated: {text!r}")
  return node.func.id, args, kwargs


_BFCL_CALL_NAME = re.compile(r"[ \t]*([a-zA-Z_]\w*)\s*")
"""How bfcl-eval's executor finds a call's method name (`_process_method_calls`' pattern `[a-zA-Z_]\\w*` before "("),
with the spaces and tabs Python's `eval` skips before an expression."""


def read_decoded_call(text: str) -> tuple[str, tuple, dict]:
  """One of `bfcl_decoder.decode_execute`'s call strings as (name, args, kwargs), read as bfcl-eval's executor reads
  it wherever that does not need `eval`: the name is the text before the first "(" exactly as its pattern finds it (no
  Unicode normalisation, no other whitespace), arguments are literals, a keyword given twice is an error.

  Raises:
    ValueError: for a string bfcl-eval would fail to run as a method call (and a few it would run through `eval`'s
      reach beyond method calls: a builtin's name, code in a keyword; docs/environments.md lists them).
  """
  head, paren, _ = text.partition("(")
  match = _BFCL_CALL_NAME.fullmatch(head) if paren else None
  if match is None:
    raise ValueError(f"not a method call: {text!r}")
  name, args, kwargs = parse_python_call(text)
  if name != match.group(1):  # the parser normalised the name (NFKC): bfcl-eval's mapping does not
    raise ValueError(f"name {match.group(1)!r} is not defined")
  return name, args, kwargs


@functools.lru_cache(maxsize=None)
def _class_methods(class_name: str) -> dict[str, Any]:
  """Public method name -> the (unbound) function of a backend class."""
  from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

  cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)
  return {n: f for n, f in inspect.getmembers(cls, predicate=inspect.isfunction) if not n.startswith("_")}


def keyword_arguments(function, args: tuple, kwargs: dict) -> dict:
  """Positional arguments of a ground-truth call named by the function's signature (`self` skipped; tuples become
  lists, as JSON has them)."""
  params = list(inspect.signature(function).parameters.values())
  names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"]
  if len(args) > len(names):
    raise ValueError(f"{function.__name__} takes {len(names)} positional arguments, got {len(args)}")
  out = dict(zip(names, args))
  out.update(kwargs)
  return _lists(out)


def _lists(x):
  if isinstance(x, tuple):
    return [_lists(v) for v in x]
  if isinstance(x, list):
    return [_lists(v) for v in x]
  if isinstance(x, dict):
    return {k: _lists(v) for k, v in x.items()}
  return x


def execution_error(e: Exception) -> str:
  """BFCL's executor's text for a call that raised."""
  return f"Error during execution: {e}"


def ground_truth_calls(task: BfclTask, unit: int) -> list[tuple[str, dict]]:
  """Request `unit`'s ground-truth calls as (name, keyword arguments), positional arguments named.

  Raises:
    ValueError: for a call string that does not parse or names no method of the task's backends.
  """
  methods = {}
  for c in task.involved_classes:
    methods.update(_class_methods(c))
  out = []
  for text in task.ground_truth[unit]:
    name, args, kwargs = parse_python_call(text)
    if name not in methods:
      raise ValueError(f"{task.task_id}: ground-truth call {text!r} names no method of {task.involved_classes}")
    out.append((name, keyword_arguments(methods[name], args, kwargs)))
  return out


def render_calls(calls: Sequence[tuple[str, dict]]) -> str:
  """Calls as one assistant message of `<tool_call>` blocks in Qwen3's chat-template syntax (`tool_calls`'s "qwen3":
  the text bfcl-eval's Qwen decoder reads), one per line."""
  return tool_calls.render_tool_calls(calls, syntax="qwen3")


# ---------------------------------------------------------------------------------------------------------------
# The session.


class BfclSession(episode.ToolEpisode):
  """One rollout of a multi-turn task (`step` / `reward`, as `jaxcredit.rollout.multiturn.EnvLike`).

  Which functions run: the prompt lists the functions available at the current request (held-out ones appear at
  their request, excluded ones never), but, as in BFCL's own executor, any public method of the task's backends runs
  when called; argument names are checked against its doc, values are not type-checked (BFCL's ground truth passes
  strings where docs say integer, e.g. close_ticket(ticket_id='ticket_001')). BFCL's data needs this: in
  multi_turn_miss_func_49 the ground truth of request 2 calls `tail`, which is held out until request 4.

  `info` keys: "tool_calls" (well-formed calls dispatched), "tool_errors" (calls that gave an error observation:
  malformed, unknown function, bad arguments, the backend raised or returned {"error": ...}), "answered" (every request
  reached and verified), "budget_exhausted", "turns", "finish", "unit" (the current request), "unit_rewards",
  "official_valid" (BFCL's verdict once the session ended, else None).
  """

  episode_kind = "session"

  def __init__(
    self,
    task: BfclTask,
    *,
    max_steps_per_unit: int = 4,
    max_output_chars: int = 2000,
    reward: str = "all_units",
    max_calls_per_message: int = 64,
    compact_tools: bool = False,
    decoder: str = "training",
  ):
    """Raises: ValueError for a limit < 1, an unknown reward or decoder (naming the config.env.bfcl_multi_turn key)."""
    if decoder not in DECODERS:
      raise ValueError(f"config.env.bfcl_multi_turn.decoder must be one of {DECODERS}, got {decoder!r}")
    if max_calls_per_message < 1:
      raise ValueError(f"config.env.bfcl_multi_turn.max_calls_per_message must be >= 1, got {max_calls_per_message}")
    if max_steps_per_unit < 1:
      raise ValueError(f"config.env.bfcl_multi_turn.max_steps_per_unit must be >= 1, got {max_steps_per_unit}")
    if max_output_chars < 1:
      raise ValueError(f"config.env.bfcl_multi_turn.max_output_chars must be >= 1, got {max_output_chars}")
    if reward not in REWARDS:
      raise ValueError(f"config.env.bfcl_multi_turn.reward must be one of {REWARDS}, got {reward!r}")
    super().__init__(task, unit=0, unit_rewards=[], official_valid=None)
    self.max_steps_per_unit = int(max_steps_per_unit)
    self.max_output_chars = int(max_output_chars)
    self.reward_kind = reward
    self.model_backends = make_backends(task)
    self.truth_backends = make_backends(task)
    self._model_methods = _methods(self.model_backends)
    self._tools: dict[str, tool_calls.Tool] | None = None
    self.max_calls_per_message = int(max_calls_per_message)
    self.compact_tools = bool(compact_tools)
    self.unit = 0
    self.steps_in_unit = 0
    self.calls_in_unit = 0  # attempted calls in the current request: malformed, unknown or dispatched
    self.ended_by_model = False  # whether the current request was ended by a message without a call
    self.model_results: list[str] = []  # results of every dispatched call so far (BFCL's response list)
    self.unit_passed: list[bool] = []
    self.official: list[bool] = []
    self.decoder = decoder
    self.force_quit = False  # "official": a request took more than `official_step_limit()` steps

  def callable_tools(self) -> dict[str, tool_calls.Tool]:
    """Every public method of the task's backends, with its doc's schema (see `BfclSession` on availability)."""
    if self._tools is None:
      docs = {d["name"]: d for c in self.task.involved_classes for d in _class_docs(c)}
      self._tools = {}
      for name, method in self._model_methods.items():
        d = docs.get(name, {})
        params = (
          json_schema(d.get("parameters"))
          if d
          else {"type": "object", "properties": {p: {} for p in inspect.signature(method).parameters}}
        )
        self._tools[name] = tool_calls.Tool(name, d.get("description", ""), params, method)
    return self._tools

  def step(self, assistant_text: str) -> spec.StepResult:
    """Consumes one assistant message: runs its calls, or ends the current request.

    Returns:
      role "tool" with the calls' results; role "user" with the next request after a request ended; or done.

    Raises:
      RuntimeError: if the session is already done.
    """
    info = self.begin_step()
    if self.decoder == "official":
      return self._step_official(assistant_text, info)
    msg = tool_calls.parse_message(assistant_text, max_calls=self.max_calls_per_message)
    # Every attempted call counts, malformed or not: were only well-formed calls counted, a broken call followed by
    # a refusal would pass an empty-ground-truth request, paying the policy to emit broken calls when unsure.
    self.calls_in_unit += len(msg.calls)
    if msg.error is not None:  # an unclosed think block: the message is no action (its visible calls do not run)
      result = self._think_error(msg.error)
      self.steps_in_unit += 1
      return self._end_unit() if self.steps_in_unit >= self.max_steps_per_unit else result
    if not msg.calls:
      self.ended_by_model = True
      return self._end_unit()
    outcomes = tool_calls.run_calls(
      msg.calls,
      self.callable_tools(),
      max_output_chars=self.max_output_chars,
      errors_as_results=execution_error,
      check_types=False,
    )
    for o in outcomes:
      if o.dispatched:
        info["tool_calls"] += 1
        self.model_results.append(o.result)
      if not o.ok or o.result.startswith(("Error during execution", '{"error"')):
        info["tool_errors"] += 1
    self.steps_in_unit += 1
    observation = "\n".join(tool_calls.render_tool_response(o.content) for o in outcomes)
    if self.steps_in_unit >= self.max_steps_per_unit:
      return self._end_unit()
    return self._observe(observation)

  def _step_official(self, assistant_text: str, info: dict) -> spec.StepResult:
    """bfcl-eval's multi-turn loop for one message (`base_handler.inference_multi_turn_prompting`): decode it with
    its Qwen decoder; no call (or a decoder error) ends the request; else run every decoded call, results in one tool
    message; the request's step count past `OFFICIAL_STEP_LIMIT` force-quits the session (BFCL fails it)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import is_empty_execute_response

    try:
      decoded = bfcl_decoder.decode_execute(assistant_text)
    except ImportError:
      raise
    except Exception:  # noqa: BLE001 - bfcl-eval: "Failed to decode the model response. Proceed to next turn."
      decoded = []
    if is_empty_execute_response(decoded):
      self.ended_by_model = True
      return self._end_unit()
    self.calls_in_unit += len(decoded)
    results = [self._run_decoded_call(call, info) for call in decoded]
    self.steps_in_unit += 1
    if self.steps_in_unit > official_step_limit():
      # bfcl-eval records the request's messages, then quits the session; its runner fails the session only through
      # the missing requests (`_evaluate_single_multi_turn_entry`'s length check), so a force-quit in the last request
      # is scored as usual
      self.force_quit = True
      result = self._end_unit()
      if result.done:
        return result
      self.info["official_valid"] = False
      return self._finish("force_quit")
    trimmed = (tool_calls.truncate(r, self.max_output_chars) for r in results)
    return self._observe("\n".join(tool_calls.render_tool_response(r) for r in trimmed))

  def _run_decoded_call(self, call: str, info: dict) -> str:
    """One of `bfcl_decoder.decode_execute`'s call strings run as bfcl-eval's executor runs it, read by
    `read_decoded_call` (never evaluated): its result text, or "Error during execution: ..." (both go into the response
    checker's list)."""
    info["tool_calls"] += 1
    try:
      name, args, kwargs = read_decoded_call(call)
      if name in FORBIDDEN_CALLS:
        raise ValueError(f"Function call {name} is not allowed.")
      method = self._model_methods.get(name)
      if method is None:
        raise NameError(f"name {name!r} is not defined")
      result = tool_calls.format_result(method(*args, **kwargs))
    except Exception as e:  # noqa: BLE001 - BFCL records the error text as the result
      result = execution_error(e)
    if result.startswith(("Error during execution", '{"error"')):
      info["tool_errors"] += 1
    self.model_results.append(result)
    return result

  def _end_unit(self) -> spec.StepResult:
    passed, official = self._verify(self.unit)
    self.unit_passed.append(passed)
    self.official.append(official)
    self.info["unit_rewards"] = [float(p) for p in self.unit_passed]
    self.unit += 1
    self.steps_in_unit = 0
    self.calls_in_unit = 0
    self.ended_by_model = False
    self.info["unit"] = self.unit
    if self.unit >= self.task.num_units:
      self.info["answered"] = True
      self.info["official_valid"] = all(self.official)
      return self._finish("answer")
    return self._observe(self.request_text(self.unit), "user")

  def _verify(self, unit: int) -> tuple[bool, bool]:
    """(training verdict, BFCL's official verdict) of request `unit`, running its ground truth."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker

    truth_methods = _methods(self.truth_backends)
    truth_results = []
    for name, kwargs in ground_truth_calls(self.task, unit):
      try:
        truth_results.append(tool_calls.format_result(truth_methods[name](**kwargs)))
      except Exception as e:  # noqa: BLE001 - BFCL records the error text as the result
        truth_results.append(execution_error(e))
    if not self.task.ground_truth[unit]:
      # an abstention: the model ended the request itself and attempted no call in it (a request the step limit
      # ended was never declined); BFCL's official checker does not check these requests
      return self.calls_in_unit == 0 and self.ended_by_model, True
    if self.calls_in_unit == 0:
      return False, False
    ok = (
      state_checker(self.model_backends, self.truth_backends)["valid"]
      and response_checker(self.model_results, truth_results, unit)["valid"]
    )
    return ok, ok

  def request_text(self, unit: int) -> str:
    """The user message of request `unit` (for a held-out-function request: the new functions, then BFCL's line)."""
    held = dict(self.task.held_out)
    if unit in held:
      new = [d for d in function_docs(self.task, unit, compact=self.compact_tools) if d["name"] in held[unit]]
      return "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas(new)) + "\n" + ADDITIONAL_FUNCTIONS_PROMPT
    return "\n".join(m["content"] for m in self.task.requests[unit] if m.get("role") == "user")

  def unit_rewards(self) -> list[float]:
    """0/1 per request the policy acted in: the verified ones, then 0 for a request it had started (made at least
    one call message in) when the rollout stopped. A request shown with no turn left to act is not a unit of the
    rollout (no token of it would carry its credit); the outcome reward still counts it as not passed."""
    out = [float(p) for p in self.unit_passed]
    if not self.done and self.unit < self.task.num_units and self.steps_in_unit > 0:
      out.append(0.0)
    return out

  def reward(self) -> float:
    """1.0 when every request passed ("all_units"), or the fraction of the task's requests that passed."""
    passed = sum(self.unit_passed)
    if self.reward_kind == "unit_fraction":
      return passed / self.task.num_units
    return float(self.done and passed == self.task.num_units)


def initial_messages(task: BfclTask, *, compact_tools: bool = False) -> list[dict]:
  """[system (instructions + tools of request 0), user (request 0)]."""
  system = SYSTEM_PROMPT + tool_calls.render_tools_prompt(schemas(function_docs(task, 0, compact=compact_tools)))
  first = [m for m in task.requests[0] if m.get("role") == "user"]
  extra_system = [m["content"] for m in task.requests[0] if m.get("role") == "system"]
  if extra_system:
    system = "\n\n".join(extra_system) + "\n\n" + system
  return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(m["content"] for m in first)}]


def demonstration(task: BfclTask, rng=None, *, max_calls_per_message: int = 64, **session_kwargs) -> list[dict]:
  """The ground-truth session as a chat: per request, assistant messages holding its calls (at most
  `max_calls_per_message` each; their results come back in one tool message each), then "Done."; a request with an
  empty ground truth gets `REFUSAL_TEXT`. It is replayed through `BfclSession` (our parser and executor).

  Raises:
    RuntimeError: when the replay does not pass every request (a data or backend problem).
  """
  del rng
  chunks = [
    [c[i : i + max_calls_per_message] for i in range(0, len(c), max_calls_per_message)]
    for c in (ground_truth_calls(task, u) for u in range(task.num_units))
  ]
  steps = max(len(c) for c in chunks) + 1
  session = BfclSession(
    task, **{**session_kwargs, "max_steps_per_unit": steps, "max_calls_per_message": max_calls_per_message}
  )
  messages = initial_messages(task, compact_tools=session.compact_tools)
  for unit in range(task.num_units):
    for calls in chunks[unit]:
      text = render_calls(calls)
      messages.append({"role": "assistant", "content": text})
      r = session.step(text)
      if r.role != "tool" or r.done:
        raise RuntimeError(f"{task.task_id}: request {unit}'s calls ended the request early")
      messages.append({"role": "tool", "content": r.observation})
    text = DONE_TEXT if chunks[unit] else REFUSAL_TEXT
    messages.append({"role": "assistant", "content": text})
    r = session.step(text)
    if not r.done:
      messages.append({"role": "user", "content": r.observation})
  if session.reward() < 1.0:
    raise RuntimeError(f"{task.task_id}: the ground-truth replay passed {session.unit_passed}")
  return messages


def privileged_info(task: BfclTask) -> str:
  """The ground-truth calls of every request, in the tool-call syntax (what CrEST's / GEAR's teacher sees)."""
  lines = []
  for unit in range(task.num_units):
    calls = ground_truth_calls(task, unit)
    lines.append(f"Request {unit + 1}: " + (render_calls(calls) if calls else "(no call: it cannot be done)"))
  return "\n".join(lines)


_UNIT_GROUND_TRUTH: dict = {}


def unit_ground_truth(task: BfclTask, **session_kwargs) -> tuple[str, ...]:
  """Per request (verified unit), its ground truth executed: the ground-truth calls, in the tool-call syntax, each
  message's calls followed by their results as the backends return them (BFCL's ground truth replayed through
  `demonstration`, on fresh backends); a request whose ground truth is empty says so. CrEST's per-unit teacher shows
  request u the texts of the requests before it (Wang et al., "Teach the Magnitude, Not the Direction:
  Verifier-Bounded Credit Assignment for Multi-Turn Multi-step LLM Agents", arXiv 2608.13179, App. C.1: the
  "ground-truth tool-call results" of the preceding turns).

  Args:
    task: the session.
    **session_kwargs: `BfclSession`'s keywords (max_output_chars, compact_tools, ...), as the environment's.

  Returns:
    One text per request, `task.num_units` of them (cached per task id and keywords). When the replay fails (a
    data or backend problem), the calls without their results, as `privileged_info` writes them.
  """
  key = (task.task_id, tuple(sorted(session_kwargs.items())))
  if key not in _UNIT_GROUND_TRUTH:
    _UNIT_GROUND_TRUTH[key] = _unit_ground_truth(task, session_kwargs)
  return _UNIT_GROUND_TRUTH[key]


def _unit_ground_truth(task: BfclTask, session_kwargs: dict) -> tuple[str, ...]:
  try:
    messages = demonstration(task, **session_kwargs)
  except RuntimeError:
    return tuple(privileged_info(task).split("\n"))
  parts: list[list[str]] = [[] for _ in range(task.num_units)]
  unit = 0
  for m in messages[2:]:
    if m["role"] == "user":
      unit += 1
    elif m["role"] == "assistant" and m["content"] not in (DONE_TEXT, REFUSAL_TEXT):
      parts[unit].append(m["content"])
    elif m["role"] == "tool":
      parts[unit].append("Results: " + m["content"])
  return tuple(
    f"Request {u + 1}: " + ("\n".join(p) if p else "(no call: it cannot be done)") for u, p in enumerate(parts)
  )


def gold_answer_text(task: BfclTask) -> str:
  """The first request's ground-truth calls as the next assistant message (what TRACE scores)."""
  calls = ground_truth_calls(task, 0)
  return render_calls(calls) if calls else REFUSAL_TEXT


def unwinnable(
  task: BfclTask, *, max_turns: int, max_steps_per_unit: int, max_calls_per_message: int, decoder: str
) -> str | None:
  """Why ground-truth play (`demonstration`'s messages: each request's calls, at most `max_calls_per_message` a
  message, then a closing message) cannot finish `task` under these caps, or None when it can.

  Under the "training" decoder a request ends after `max_steps_per_unit` call messages (verified then, without the
  closing message); under "official" bfcl-eval allows `official_step_limit()` of them. Either way the session must fit
  `max_turns` assistant messages.

  Returns:
    e.g. "base: more assistant turns than max_turns=12" (the category first, so counts group by it), or None.
  """
  turns = 0
  for unit in range(task.num_units):
    n = len(ground_truth_calls(task, unit))
    messages = -(-n // max_calls_per_message)
    if decoder == "official":
      if messages > official_step_limit():
        return f"{task.category}: a request needs more call messages than bfcl-eval's {official_step_limit()} steps"
      turns += messages + 1
    else:
      if messages > max_steps_per_unit:
        return f"{task.category}: a request needs more call messages than max_steps_per_unit={max_steps_per_unit}"
      turns += messages + 1 if messages < max_steps_per_unit else messages
  if turns > max_turns:
    return f"{task.category}: more assistant turns than max_turns={max_turns}"
  return None


def official_valid(env: BfclSession) -> bool:
  """BFCL's checkers' verdict of a session: every request was reached and passed BFCL's checkers (a session that
  stopped early fails, as bfcl-eval's force-terminated ones do). bfcl-eval's own verdict when the session read its
  text with the "official" decoder."""
  return bool(env.done and len(env.official) == env.task.num_units and all(env.official))


ACCURACY_KEYS = {"official": "bfcl_official_accuracy", "training": "bfcl_checker_accuracy"}
"""The metric a session's verdict goes into, by its decoder: "bfcl_official_accuracy" is bfcl-eval's number (its
decoder, protocol and checkers); "bfcl_checker_accuracy" is BFCL's checkers on what the strict training parser ran
(where the two read text differently, see docs/environments.md)."""


def env_metrics(envs: Sequence[BfclSession]) -> dict[str, float]:
  """Accuracy and the fraction of requests passed, over finished and unfinished sessions.

  Returns:
    "bfcl_unit_pass_rate" (training verdicts of the requests reached); per decoder among the sessions (held-out
    sessions read with "official", training ones with "training": `ACCURACY_KEYS`) its accuracy, and the same per
    category, e.g. "bfcl_official_accuracy/base" (BFCL's table reports one column per category: base, miss_func,
    miss_param, long_context).
  """
  units = [p for e in envs for p in e.unit_rewards()]
  out = {"bfcl_unit_pass_rate": sum(units) / max(1, len(units))}
  for decoder, key in ACCURACY_KEYS.items():
    read = [e for e in envs if e.decoder == decoder]
    if not read:
      continue
    out[key] = sum(official_valid(e) for e in read) / len(read)
    for category in sorted({e.task.category for e in read}):
      group = [e for e in read if e.task.category == category]
      out[f"{key}/{category}"] = sum(official_valid(e) for e in group) / len(group)
  return out


def env_spec(
  *,
  categories: Sequence[str] = CATEGORIES,
  train_categories: Sequence[str] = (),
  max_turns: int = 16,
  max_steps_per_unit: int = 4,
  max_output_chars: int = 2000,
  reward: str = "all_units",
  max_calls_per_message: int = 64,
  compact_tools: bool = False,
  classes: Sequence[str] = (),
  protocol: str = "",
  decoder: str = "training",
  eval_decoder: str = "official",
  eval_max_turns: int = 0,
) -> spec.EnvSpec:
  """The BFCL multi-turn `EnvSpec` (config keys: config.env.bfcl_multi_turn.*).

  `categories` are the held-out evals' categories, and the training tasks' too unless `train_categories` names
  others (CrEST, arXiv 2608.13179 App. C.1, trains on Base sessions and evaluates on all four categories). Either
  way a task's split is its session's hash (`is_eval`), so no training session, nor a variant of one, is ever
  evaluated. `protocol="crest"` takes
  `crest_split`'s split instead, for comparing with CrEST's table: 100 Base sessions to train on, 100 each of the
  four categories to evaluate (config.eval.num_tasks=400), none a variant of a training session.

  Training rollouts read text with `decoder` ("training": the strict parser), held-out sessions with `eval_decoder`
  ("official": bfcl-eval's Qwen decoder and its step limit, so `bfcl_official_accuracy` is bfcl-eval's number; see
  `DECODERS`). A session's split is its task id's (`is_eval`, or the crest protocol's eval pool). bfcl-eval has no
  session cap: held-out rollouts take `eval_max_turns` turns (0: `official_turn_cap()`, the most its protocol
  allows), training ones `max_turns`; `unwinnable` reports the tasks ground-truth play cannot finish under either.

  Raises:
    ValueError: for an unknown category, reward, protocol or decoder, a limit < 1, or the crest protocol with
      categories, train_categories or classes set (naming the config key).
  """
  for key, value in (("decoder", decoder), ("eval_decoder", eval_decoder)):
    if value not in DECODERS:
      raise ValueError(f"config.env.bfcl_multi_turn.{key} must be one of {DECODERS}, got {value!r}")
  protocol = str(protocol).strip()
  if protocol not in PROTOCOLS:
    raise ValueError(f"config.env.bfcl_multi_turn.protocol: unknown protocol {protocol!r}; known: '', 'crest'")
  if protocol == "crest":
    given = {
      "categories": tuple(c.strip() for c in categories if c.strip()) not in ((), CATEGORIES),
      "train_categories": tuple(c.strip() for c in train_categories if c.strip()) not in ((), ("base",)),
      "classes": bool(tuple(c.strip() for c in classes if c.strip())),
    }
    for key, bad in given.items():
      if bad:
        raise ValueError(
          f"config.env.bfcl_multi_turn.{key} is set, but protocol='crest' fixes the split (train: 100 Base "
          "sessions; eval: 100 each of base, miss_func, miss_param, long_context): leave "
          f"config.env.bfcl_multi_turn.{key} at its default, or set protocol=''"
        )
  categories = tuple(c.strip() for c in categories if c.strip())
  train_categories = tuple(c.strip() for c in train_categories if c.strip()) or categories
  for key, names in (("categories", categories), ("train_categories", train_categories)):
    for c in names:
      if c not in CATEGORIES:
        raise ValueError(f"config.env.bfcl_multi_turn.{key}: unknown category {c!r}; known: {', '.join(CATEGORIES)}")
  if not categories:
    raise ValueError("config.env.bfcl_multi_turn.categories is empty")
  if max_turns < 1:
    raise ValueError(f"config.env.bfcl_multi_turn.max_turns must be >= 1, got {max_turns}")
  if eval_max_turns < 0:
    raise ValueError(
      f"config.env.bfcl_multi_turn.eval_max_turns must be >= 0 (0: no cap below bfcl-eval's), got {eval_max_turns}"
    )
  classes = tuple(c.strip() for c in classes if c.strip())
  make_tasks("eval", 0, None, categories=categories, classes=classes)  # refuses unknown classes by name
  session_kwargs = {
    "max_steps_per_unit": max_steps_per_unit,
    "max_output_chars": max_output_chars,
    "reward": reward,
    "max_calls_per_message": max_calls_per_message,
    "compact_tools": compact_tools,
  }
  if reward not in REWARDS or min(max_steps_per_unit, max_output_chars, max_calls_per_message) < 1:
    BfclSession(load_tasks(("base",))[0], **session_kwargs)  # raises the named error
  return spec.EnvSpec(
    make_tasks=lambda split, num, seed: make_tasks(
      split,
      num,
      seed,
      categories=train_categories if split == "train" else categories,
      classes=classes,
      protocol=protocol,
    ),
    make_env=lambda task: BfclSession(
      task, **session_kwargs, decoder=eval_decoder if _is_eval_task(task.task_id, protocol) else decoder
    ),
    initial_messages=lambda task: initial_messages(task, compact_tools=compact_tools),
    stop_strings=(),
    max_turns=int(max_turns),
    is_success=lambda r: r >= 1.0,
    demonstration=lambda task, rng: demonstration(
      task,
      rng,
      max_output_chars=max_output_chars,
      max_calls_per_message=max_calls_per_message,
      compact_tools=compact_tools,
    ),
    gold_answer_text=gold_answer_text,
    privileged_info=privileged_info,
    unit_rewards=lambda env: env.unit_rewards(),
    unit_privileged_info=lambda task: unit_ground_truth(
      task,
      max_output_chars=max_output_chars,
      max_calls_per_message=max_calls_per_message,
      compact_tools=compact_tools,
    ),
    tools=lambda task: schemas(function_docs(task, task.num_units)),
    metrics=env_metrics,
    eval_max_turns=int(eval_max_turns) or official_turn_cap(),
    unwinnable=lambda task, split: unwinnable(
      task,
      max_turns=(int(eval_max_turns) or official_turn_cap()) if split == "eval" else int(max_turns),
      max_steps_per_unit=max_steps_per_unit,
      max_calls_per_message=max_calls_per_message,
      decoder=eval_decoder if split == "eval" else decoder,
    ),
  )
