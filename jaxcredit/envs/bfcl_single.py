"""BFCL single-turn function calling as a training reward: one assistant message, scored by BFCL's own AST checker.

Tasks are the Python single-turn categories of `bfcl-eval` (BFCL v4 files): "simple" (`simple_python`, 400),
"multiple" (200: one call, several functions offered), "parallel" (200: several calls of one function),
"parallel_multiple" (200: several calls of several functions) and, optionally, "irrelevance" (240: none of the
offered functions fits, so the right answer is no call).

A rollout is one assistant message:
  * The prompt is a system message listing the task's functions (`tool_calls.render_tools_prompt`, parameters as
    standard JSON schema: BFCL's "dict" -> "object", "float" -> "number", "tuple" -> "array", "any" -> "string", as
    BFCL's own `GORILLA_TO_OPENAPI`), one line of instructions (`INSTRUCTION`), then the task's user message.
  * The message may hold several `<tool_call>{json}</tool_call>` blocks (`tool_calls.parse_message`; calls inside
    `<think>` blocks are never read). `BfclSingleEnv.step` ends the episode at once (done, observation None).
  * Reward 1.0 when every call parsed and the calls, as BFCL's `[{function_name: {argument: value}}]`, pass BFCL's
    `ast_checker` for the task's category, with BFCL's original function docs and possible answers; else 0.0. On
    irrelevance tasks the reward is 1.0 only when the visible message has no `<tool_call>` at all.
  * `info["official_valid"]` is what BFCL's own metric says for the same text (see `official_valid`): it differs
    from the reward where BFCL's decoder drops what it cannot parse. BFCL counts a malformed call (bad JSON,
    arguments as a JSON string, no "arguments") as a correct refusal on irrelevance tasks; as a training reward
    that would pay the policy for broken calls, so the reward never does. `metrics` reports its mean as
    `bfcl_official_accuracy` beside the reward, and both per category (`metrics`).

The checker is imported from `bfcl_eval/eval_checker/ast_eval/ast_checker.py`. It imports
`bfcl_eval.constants.model_config`, which imports every API client bfcl-eval knows (anthropic, openai, ...); when that
module cannot be imported, `_ast_checker` puts a stand-in module holding `MODEL_CONFIG_MAPPING` in `sys.modules`
(one entry, `CHECKER_MODEL_NAME`, with `underscore_to_dot=False`: function names keep their dots, as the prompt
writes them). Nothing else global is changed.

bfcl-eval data notes (2026.3.23), all handled by `ground_truth_calls`:
  * possible answers list the accepted values of each argument; "" means "may be omitted". simple_python_200 lists
    "" first for a required argument (fuel_efficiency: ["", 25.0]), so a required argument takes its first value
    that is not "".
  * parallel_multiple_12 (permeability) and parallel_multiple_26 (type) list an argument the function does not
    have, with "" among its values: the checker refuses it when given, so it is left out.
  * dict-typed arguments (and arrays of dicts) hold one possible answer per key, resolved the same way.

Install: `pip install --no-deps bfcl-eval mpmath` (its declared dependencies pull API clients; the data and the
AST checker need none of them).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import random
import sys
import types
from typing import Any, Sequence

from jaxcredit.envs import bfcl_decoder, episode, spec, tool_calls
from jaxcredit.envs.bfcl_multi_turn import EVAL_EVERY, package_dir, read_jsonl  # noqa: F401 - re-exported

CATEGORIES = ("simple", "multiple", "parallel", "parallel_multiple", "irrelevance")
DEFAULT_CATEGORIES = ("simple", "multiple", "parallel", "parallel_multiple")
BFCL_CATEGORY = {
  "simple": "simple_python",
  "multiple": "multiple",
  "parallel": "parallel",
  "parallel_multiple": "parallel_multiple",
  "irrelevance": "irrelevance",
}
"""Our category name -> BFCL's test category (its data file `BFCL_v4_{name}.json` and the checker's category)."""
CHECKER_MODEL_NAME = "jaxcredit"
"""The model name given to BFCL's checker (the stand-in `MODEL_CONFIG_MAPPING`'s one key)."""

INSTRUCTION = (
  "Answer with tool calls only, all of them in this one message; if none of the functions fits the "
  "request, reply in plain text without any tool call."
)
REFUSAL_TEXT = "None of the available functions can do this."
"""What a demonstration says on an irrelevance task."""

_TYPE_NAMES = {
  "dict": "object",
  "float": "number",
  "tuple": "array",
  "any": "string",
  "bool": "boolean",
  "list": "array",
}


@dataclasses.dataclass(frozen=True)
class BfclSingleTask:
  """One single-turn BFCL task. Equal and hashed by id and category; the rest is read-only data (never mutate it).

  Attributes:
    task_id: BFCL's id, e.g. "simple_python_0".
    category: one of `CATEGORIES`.
    question: the task's messages (BFCL's single turn: one user message).
    functions: BFCL's function docs, unchanged (the checker reads these).
    ground_truth: BFCL's possible answers, `[{function_name: {argument: [accepted values]}}]`; empty for
      irrelevance tasks.
  """

  task_id: str
  category: str
  question: tuple[dict, ...] = dataclasses.field(compare=False, hash=False)
  functions: tuple[dict, ...] = dataclasses.field(compare=False, hash=False)
  ground_truth: tuple[dict, ...] = dataclasses.field(compare=False, hash=False, default=())

  @property
  def bfcl_category(self) -> str:
    """BFCL's test category ("simple_python", ...)."""
    return BFCL_CATEGORY[self.category]


def _check_categories(categories: Sequence[str], key: str = "categories") -> tuple[str, ...]:
  categories = tuple(categories)
  for c in categories:
    if c not in CATEGORIES:
      raise ValueError(f"{key}: unknown BFCL single-turn category {c!r}; known: {', '.join(CATEGORIES)}")
  if not categories:
    raise ValueError(f"{key} is empty; known categories: {', '.join(CATEGORIES)}")
  if len(set(categories)) != len(categories):
    raise ValueError(f"{key} repeats a category: {list(categories)}")
  return categories


@functools.lru_cache(maxsize=None)
def load_tasks(categories: tuple[str, ...] = DEFAULT_CATEGORIES) -> tuple[BfclSingleTask, ...]:
  """All tasks of the given categories, in BFCL's order.

  Raises:
    ValueError: for an unknown category, or a data file whose questions and answers disagree.
    ImportError: when bfcl-eval is not installed.
  """
  categories = _check_categories(categories)
  data = package_dir() / "data"
  tasks = []
  for c in categories:
    name = BFCL_CATEGORY[c]
    questions = read_jsonl(data / f"BFCL_v4_{name}.json")
    answers = {}
    if c != "irrelevance":
      answers = {a["id"]: a["ground_truth"] for a in read_jsonl(data / "possible_answer" / f"BFCL_v4_{name}.json")}
    for q in questions:
      if len(q["question"]) != 1:
        raise ValueError(f"bfcl-eval data: single-turn task {q['id']} has {len(q['question'])} turns")
      gt = answers.get(q["id"], [])
      if c != "irrelevance" and not gt:
        raise ValueError(f"bfcl-eval data: task {q['id']} has no ground truth")
      tasks.append(
        BfclSingleTask(
          task_id=q["id"],
          category=c,
          question=tuple(q["question"][0]),
          functions=tuple(q["function"]),
          ground_truth=tuple(gt),
        )
      )
  return tuple(tasks)


def _hash(task_id: str) -> int:
  return int(hashlib.sha256(task_id.encode()).hexdigest(), 16)


def is_eval(task: BfclSingleTask) -> bool:
  """Whether a task is in the eval split: every `EVAL_EVERY`-th *question* by a stable hash (sha256) of its user
  messages, so tasks that ask the same (BFCL repeats questions across categories with other functions beside them)
  are on the same side. Hashed by task id (before 2026-12-06), 19 of the first 95 eval tasks asked a question a
  train task asked (issue 54)."""
  text = "\x00".join(str(m.get("content", "")) for m in task.question if m.get("role") == "user")
  return _hash(f"question:{text}") % EVAL_EVERY == 0


def make_tasks(
  split: str, num: int | None = None, seed: int | None = None, *, categories: Sequence[str] = DEFAULT_CATEGORIES
) -> list[BfclSingleTask]:
  """Tasks of one split: eval is a fixed tenth of the questions (`is_eval`), train the rest.

  Eval tasks come in one fixed order (by the hash of their id, which mixes the categories), so any eval size is a
  prefix of a larger one; train tasks are shuffled by `seed`. Both are deterministic.

  Args:
    split: "train" or "eval".
    num: how many; None for the whole split.
    seed: the train shuffle's seed (None: 0); ignored for eval.
    categories: any of `CATEGORIES`.

  Raises:
    ValueError: unknown split or category, or `num` < 0 or larger than the split (naming
      config.env.num_train_tasks or config.eval.num_tasks).
  """
  if split not in ("train", "eval"):
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
  pool = [t for t in load_tasks(_check_categories(categories)) if is_eval(t) == (split == "eval")]
  if split == "train":
    random.Random(0 if seed is None else int(seed)).shuffle(pool)
  else:
    pool.sort(key=lambda t: _hash(t.task_id))
  num = len(pool) if num is None else int(num)
  if not 0 <= num <= len(pool):
    key = "config.env.num_train_tasks" if split == "train" else "config.eval.num_tasks"
    raise ValueError(
      f"{key}={num}, but the BFCL single-turn {split} split of {list(categories)} has only {len(pool)} tasks"
    )
  return pool[:num]


# ---------------------------------------------------------------------------------------------------------------
# Prompt and ground truth.


def json_schema(bfcl_parameters: Any) -> Any:
  """BFCL's parameter docs as standard JSON schema, applied recursively: "dict" -> "object", "float" -> "number",
  "tuple" -> "array", "any" -> "string" (BFCL's `GORILLA_TO_OPENAPI`; its checker wants a string for "any")."""
  if isinstance(bfcl_parameters, dict):
    out = {}
    for k, v in bfcl_parameters.items():
      out[k] = _TYPE_NAMES.get(v, v) if k == "type" and isinstance(v, str) else json_schema(v)
    return out
  if isinstance(bfcl_parameters, list):
    return [json_schema(v) for v in bfcl_parameters]
  return bfcl_parameters


def schemas(task: BfclSingleTask) -> list[dict]:
  """The task's functions as OpenAI/Qwen3 function schemas, parameters as standard JSON schema."""
  return [
    {
      "type": "function",
      "function": {
        "name": f["name"],
        "description": f.get("description", ""),
        "parameters": json_schema(f.get("parameters", {})),
      },
    }
    for f in task.functions
  ]


def initial_messages(task: BfclSingleTask) -> list[dict]:
  """[system (the tools and `INSTRUCTION`), the task's user message(s)]; a system message of the task comes first."""
  system = tool_calls.render_tools_prompt(schemas(task)) + "\n\n" + INSTRUCTION
  extra = [m["content"] for m in task.question if m.get("role") == "system"]
  if extra:
    system = "\n\n".join(extra) + "\n\n" + system
  return [{"role": "system", "content": system}] + [
    {"role": m["role"], "content": m["content"]} for m in task.question if m.get("role") != "system"
  ]


def _first(values: list, allow_omit: bool) -> tuple[bool, Any]:
  """(keep, value): the first accepted value, or (False, None) when the argument may be omitted and "" comes
  first; a required argument takes its first value that is not ""."""
  if allow_omit and (not values or values[0] == ""):
    return False, None
  for v in values:
    if v != "":
      return True, v
  return False, None


def _resolve(value: Any, schema: dict | None) -> Any:
  """A possible-answer value written out: dicts (and arrays of dicts) hold per-key possible answers."""
  schema = schema if isinstance(schema, dict) else {}
  kind = schema.get("type")
  if kind == "dict" and isinstance(value, dict) and all(isinstance(v, list) for v in value.values()):
    return _resolve_args(value, schema.get("properties") or {}, required=())
  items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
  if (
    kind in ("array", "tuple")
    and items.get("type") == "dict"
    and isinstance(value, list)
    and all(isinstance(v, dict) for v in value)
  ):
    return [_resolve(v, items) for v in value]
  return value


def _resolve_args(possible: dict, properties: dict, required: Sequence[str]) -> dict:
  out = {}
  for name, values in possible.items():
    known = name in properties or not properties
    keep, value = _first(values, allow_omit=(name not in required) or not known)
    if keep and (known or "" not in values):
      out[name] = _resolve(value, properties.get(name))
  return out


def ground_truth_calls(task: BfclSingleTask) -> list[tuple[str, dict]]:
  """The task's ground truth as (function name, arguments) calls: the first accepted value of each argument; an
  optional argument whose first value is "" is left out (see the module notes). [] for irrelevance tasks."""
  docs = {f["name"]: f for f in task.functions}
  calls = []
  for entry in task.ground_truth:
    ((name, possible),) = entry.items()
    params = (docs.get(name) or {}).get("parameters") or {}
    calls.append((name, _resolve_args(possible, params.get("properties") or {}, params.get("required") or ())))
  return calls


def render_calls(calls: Sequence[tuple[str, dict]]) -> str:
  """Calls as one assistant message in Qwen3's chat-template syntax (`tool_calls`'s "qwen3": the text bfcl-eval's
  Qwen decoder reads), one per line."""
  return tool_calls.render_tool_calls(calls, syntax="qwen3")


def gold_answer_text(task: BfclSingleTask) -> str:
  """The ground-truth calls as the assistant message (`REFUSAL_TEXT` for irrelevance tasks): what TRACE scores."""
  calls = ground_truth_calls(task)
  return render_calls(calls) if calls else REFUSAL_TEXT


def privileged_info(task: BfclSingleTask) -> str:
  """The verified ground truth a teacher may see: the ground-truth calls in the tool-call syntax."""
  calls = ground_truth_calls(task)
  if not calls:
    return "The correct answer makes no tool call: none of the functions fits the request."
  return "The correct answer makes these tool calls (in any order):\n" + render_calls(calls)


def demonstration(task: BfclSingleTask, rng=None) -> list[dict]:
  """The prompt and the gold answer as a chat for the supervised warm start: [system, user, assistant].

  Raises:
    RuntimeError: when the gold answer does not earn reward 1 (a data problem; none in bfcl-eval 2026.3.23).
  """
  del rng
  text = gold_answer_text(task)
  env = BfclSingleEnv(task)
  env.step(text)
  if env.reward() < 1.0:
    raise RuntimeError(f"{task.task_id}: the ground-truth answer fails the checker: {env.info['error']}")
  return initial_messages(task) + [{"role": "assistant", "content": text}]


# ---------------------------------------------------------------------------------------------------------------
# BFCL's checker and decoder.


@dataclasses.dataclass(frozen=True)
class _StandInModelConfig:
  """What BFCL's AST checker reads from a `MODEL_CONFIG_MAPPING` entry (`convert_func_name`)."""

  model_name: str = CHECKER_MODEL_NAME
  underscore_to_dot: bool = False


@functools.lru_cache(maxsize=None)
def _ast_checker():
  """(BFCL's `ast_checker`, `Language.PYTHON`, the model name to pass); imports the checker as the module notes say.

  Raises:
    ImportError: when bfcl-eval is not installed.
    RuntimeError: when the checker's `MODEL_CONFIG_MAPPING` has no entry that keeps dotted names.
  """
  package_dir()
  name = "bfcl_eval.constants.model_config"
  if name not in sys.modules:
    try:
      importlib.import_module(name)
    except ImportError:  # its API clients are not installed: a stand-in with what the checker reads
      stand_in = types.ModuleType(name, "Stand-in for bfcl-eval's model_config (jaxcredit.envs.bfcl_single).")
      stand_in.MODEL_CONFIG_MAPPING = {CHECKER_MODEL_NAME: _StandInModelConfig()}
      sys.modules[name] = stand_in
  from bfcl_eval.constants.enums import Language
  from bfcl_eval.eval_checker.ast_eval import ast_checker as module

  mapping = module.MODEL_CONFIG_MAPPING
  model = None
  if CHECKER_MODEL_NAME in mapping:
    model = CHECKER_MODEL_NAME
  else:  # the real mapping: a model whose checker keeps dots (the name goes in with "/" written "_")
    for key, config in mapping.items():
      if not getattr(config, "underscore_to_dot", True) and key.replace("/", "_").replace("_", "/") == key:
        model = key.replace("/", "_")
        break
  if model is None:
    raise RuntimeError(
      "bfcl_eval's MODEL_CONFIG_MAPPING has no model with underscore_to_dot=False; the AST checker "
      "cannot check dotted function names"
    )
  return module.ast_checker, Language.PYTHON, model


def ast_check(task: BfclSingleTask, calls: Sequence[tuple[str, dict]]) -> dict:
  """BFCL's `ast_checker` on calls, with the task's original docs, possible answers and category.

  Args:
    task: a relevant (not irrelevance) task.
    calls: (function name, arguments) pairs, in the message's order.

  Returns:
    BFCL's result dict: "valid" (bool), "error" (list), "error_type". A checker exception (it assumes well-typed
    values in places) is returned as invalid with error_type "checker_exception".
  """
  checker, language, model = _ast_checker()
  output = [{name: copy.deepcopy(dict(args))} for name, args in calls]
  try:
    result = checker(
      copy.deepcopy(list(task.functions)),
      output,
      copy.deepcopy(list(task.ground_truth)),
      language,
      task.bfcl_category,
      model,
    )
  except Exception as e:  # noqa: BLE001 - model-controlled values reach code that assumes types
    return {"valid": False, "error": [f"{type(e).__name__}: {e}"], "error_type": "checker_exception"}
  return {"valid": bool(result.get("valid")), "error": result.get("error", []), "error_type": result.get("error_type")}


def official_decode(text: str) -> list[dict] | None:
  """The message as bfcl-eval's Qwen function-calling handler decodes it (`bfcl_decoder.decode_ast`: its own code,
  compiled from its source), or None when that decoder raises.

  Only the text after the last `</think>` is read; only `<tool_call>\\n(.*?)\\n</tool_call>` blocks (Qwen3's chat-template
  syntax, which `render_calls` writes) are calls; a block whose content is not JSON is dropped silently; any other JSON
  that is not an object with "name" and an "arguments" object makes the decoder raise.

  Returns:
    `[{name: arguments}, ...]` (BFCL's decoded form), [] for no decoded call, None for a decoder error.
  """
  try:
    return bfcl_decoder.decode_ast(text)
  except ImportError:
    raise
  except Exception:  # noqa: BLE001 - bfcl-eval's runners read any decoder exception as "no call"
    return None


def official_valid(task: BfclSingleTask, text: str) -> bool:
  """BFCL's own verdict on the message (its eval runner's rules after `official_decode`).

  Irrelevance: valid when decoding fails or finds no call (`is_empty_output`), so a malformed call counts as a
  refusal. Other categories: valid when decoding succeeds and `ast_checker` accepts the decoded calls.
  """
  decoded = official_decode(text)
  if task.category == "irrelevance":
    return decoded is None or len(decoded) == 0
  if decoded is None:
    return False
  calls = []
  for item in decoded:
    ((name, args),) = item.items()
    calls.append((name, args))
  return ast_check(task, calls)["valid"]


# ---------------------------------------------------------------------------------------------------------------
# The environment.


class BfclSingleEnv(episode.ToolEpisode):
  """One rollout: one assistant message, scored by BFCL's AST checker (see the module notes).

  `info` keys: "tool_calls" (`<tool_call>` blocks in the visible text, malformed included), "tool_errors" (blocks
  that did not parse, name no offered function or have arguments off the function's schema, plus 1 for an
  unclosed `<think>`), "answered" (the message has the form the task asks for: at least one call and none
  malformed, or no call on irrelevance tasks), "budget_exhausted" (more calls than `max_calls`), "turns",
  "finish" (None, then "calls", "no_calls" or "malformed"), "official_valid" (BFCL's verdict, `official_valid`),
  "error" (why the reward is 0: BFCL's error type or a parse error; None when it is 1).
  """

  def __init__(self, task: BfclSingleTask, *, max_calls: int = 16):
    """Args:
      task: the task.
      max_calls: the most calls one message may make; more are malformed.

    Raises:
      ValueError: if `max_calls` < 1.
    """
    if max_calls < 1:
      raise ValueError(f"max_calls must be >= 1, got {max_calls}")
    super().__init__(task, official_valid=None, error=None)
    self.max_calls = int(max_calls)
    self._reward = 0.0

  def step(self, assistant_text: str) -> spec.StepResult:
    """Consumes the one assistant message and ends the episode.

    Raises:
      RuntimeError: if the episode is already done.
    """
    info = self.begin_step()
    parsed = tool_calls.parse_message(assistant_text, max_calls=self.max_calls)
    docs = {s["function"]["name"]: s["function"]["parameters"] for s in schemas(self.task)}
    malformed = [p for p in parsed.calls if p.call is None]
    calls = [(p.call.name, p.call.arguments) for p in parsed.calls if p.call is not None]
    info["tool_calls"] = len(parsed.calls)
    info["budget_exhausted"] = len(parsed.calls) > self.max_calls
    info["tool_errors"] = (
      len(malformed)
      + (parsed.error is not None)
      + sum(name not in docs or tool_calls.check_arguments(docs[name], args) is not None for name, args in calls)
    )
    info["finish"] = "malformed" if (malformed or parsed.error) else ("calls" if calls else "no_calls")
    if parsed.error is not None:
      error = parsed.error
    elif malformed:
      error = f"malformed tool call: {malformed[0].error}"
    elif self.task.category == "irrelevance":
      error = None if not parsed.calls else "tool call on an irrelevance task"
    elif not calls:
      error = "no tool call"
    else:
      result = ast_check(self.task, calls)
      error = None if result["valid"] else f"{result['error_type']}: {result['error']}"
    info["answered"] = (
      parsed.error is None
      and not malformed
      and (not parsed.calls if self.task.category == "irrelevance" else bool(calls))
    )
    info["error"] = error
    info["official_valid"] = official_valid(self.task, assistant_text)
    self._reward = 1.0 if error is None else 0.0
    return self._finish(info["finish"])

  def reward(self) -> float:
    """1.0 when the message passed (see the module notes), else 0.0 (also before `step`)."""
    return self._reward


def metrics(envs: Sequence[BfclSingleEnv]) -> dict[str, float]:
  """BFCL's AST accuracy, official and strict, overall and per category, over the finished envs.

  - "bfcl_official_accuracy": the mean of `info["official_valid"]`, BFCL's own verdict (`official_valid`: its Qwen
    decoder, then `ast_checker` for the task's category; on irrelevance, valid when the decoder finds no call or
    fails, so a malformed call counts as a refusal). "bfcl_official_accuracy/<category>" is the same over the
    category's tasks: the number in BFCL's leaderboard column for that category (bfcl-eval's `ast_file_runner` and
    `relevance_file_runner`, which our category names map to by `BFCL_CATEGORY`).
  - "bfcl_strict_accuracy/<category>": the mean reward over the category's tasks (`BfclSingleEnv.step`): the same
    checker, but every `<tool_call>` must parse and name its arguments as an object, and an irrelevance task passes
    only when the message holds no `<tool_call>` at all (the irrelevance rule). Over all tasks it is the trainer's
    `success_rate`, so there is no overall strict key.

  {} when none finished. Categories are ours ("simple", "multiple", "parallel", "parallel_multiple", "irrelevance").
  """
  done = [e for e in envs if e.done]
  if not done:
    return {}
  out = {"bfcl_official_accuracy": sum(bool(e.info["official_valid"]) for e in done) / len(done)}
  for category in sorted({e.task.category for e in done}):
    group = [e for e in done if e.task.category == category]
    out[f"bfcl_official_accuracy/{category}"] = sum(bool(e.info["official_valid"]) for e in group) / len(group)
    out[f"bfcl_strict_accuracy/{category}"] = sum(e.reward() >= 1.0 for e in group) / len(group)
  return out


def env_spec(env_config=None) -> spec.EnvSpec:
  """The BFCL single-turn `EnvSpec` (the `ENVS` row).

  Args:
    env_config: the `config.env` node; reads `categories` (a comma-separated string or a sequence of names;
      default "simple,multiple,parallel,parallel_multiple").

  Raises:
    ValueError: for an unknown or repeated category (naming config.env.bfcl_single.categories).
    ImportError: when bfcl-eval is not installed.
  """
  raw = getattr(env_config, "categories", None) if env_config is not None else None
  if raw is None:
    raw = ",".join(DEFAULT_CATEGORIES)
  names = raw.split(",") if isinstance(raw, str) else list(raw)
  categories = _check_categories(
    [str(c).strip() for c in names if str(c).strip()], key="config.env.bfcl_single.categories"
  )
  package_dir()
  return spec.EnvSpec(
    make_tasks=lambda split, num, seed: make_tasks(split, num, seed, categories=categories),
    make_env=BfclSingleEnv,
    initial_messages=initial_messages,
    stop_strings=(),
    max_turns=1,
    is_success=lambda r: r >= 1.0,
    demonstration=demonstration,
    gold_answer_text=gold_answer_text,
    privileged_info=privileged_info,
    tools=schemas,
    metrics=metrics,
  )
