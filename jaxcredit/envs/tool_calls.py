"""Tool-call and answer syntax on assistant text (hermes / Qwen3 style).

An assistant calls a tool with

  <tool_call>{"name": "calculator", "arguments": {"expression": "2*(3+4)"}}</tool_call>

and gets back a tool message whose content is `<tool_response>14</tool_response>`. It ends with
`<answer>14</answer>`. This module knows no model and no tokenizer: it works on text only.

Running a call (`execute_tool_call`) never raises for bad model output: every malformed call (bad JSON, JSON that
is not strict (a duplicate key, a non-finite number such as NaN or 1e999: `loads_strict`), missing fields, unknown tool, arguments not an object, missing expression, calculator error, over-long
output) becomes an error observation such as `error: unknown tool 'foo'; available: calculator`, which the
model sees in place of a result. `render_tool_call` writes the exact syntax the parser reads, so
demonstrations and the parser agree.

Environments with several tools per message (BFCL, search) use `parse_message`: it drops `<think>...</think>`
blocks first (text inside a think block is never an action: Qwen3's thinking mode), then finds every
`<tool_call>` in the visible text and the `<answer>`. `Tool` + `run_calls` validate arguments against each tool's
JSON schema and dispatch to a Python callable with keyword arguments: model text is never `eval`ed.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable, Mapping, Sequence

from jaxcredit.envs.calculator import CalculatorError, calculate

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

MAX_CALL_CHARS = 1000  # characters of JSON between the tool-call tags (calculator syntax)
MAX_OUTPUT_CHARS = 200  # characters of a tool's output kept in the observation (the rest is cut)
TRUNCATION_MARKER = "...[truncated {n} characters]"


class ToolError(ValueError):
  """Raised by a tool for bad arguments; `str(e)` is shown to the model after "error: "."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """A well-formed call: a tool name and its arguments (a JSON object)."""

  name: str
  arguments: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ParsedToolCall:
  """The first tool call found in a text.

  Attributes:
    call: the call, or None when it is malformed.
    error: why it is malformed (a short message without the "error: " prefix), or None.
    start: index of `<tool_call>` in the text.
  """

  call: ToolCall | None
  error: str | None
  start: int


@dataclasses.dataclass(frozen=True)
class ToolOutcome:
  """What running a call produced.

  Attributes:
    content: the tool's output, or "error: ..." (never wrapped in tags).
    ok: False when `content` is an error message.
  """

  content: str
  ok: bool


def _calculator(arguments: Mapping[str, Any]) -> str:
  extra = sorted(k for k in arguments if k != "expression")
  if extra:
    raise ToolError("calculator got unexpected argument(s): " + ", ".join(repr(_short(k)) for k in extra))
  expression = arguments.get("expression")
  if not isinstance(expression, str):
    raise ToolError('calculator needs an "expression" string argument, e.g. {"expression": "2*(3+4)"}')
  try:
    return calculate(expression)
  except CalculatorError as e:
    raise ToolError(str(e)) from None


TOOLS: dict[str, Callable[[Mapping[str, Any]], str]] = {"calculator": _calculator}
"""Tool name -> function(arguments) -> output text; raises `ToolError` for bad arguments."""


TOOL_CALL_SYNTAXES = ("compact", "qwen3")
"""How `render_tool_call` writes a call (every syntax is read by `parse_message`, which strips the payload).

- "compact": `<tool_call>{json}</tool_call>`, ASCII JSON with "<" written "\\u003c" (so a value can never close the
  tag or open a think block). The calculator, chain, session and search environments write it: their committed
  results were trained on it, and SmolLM2's chat template, which those runs use, has no tool-call syntax of its own.
- "qwen3": byte for byte what Qwen3's chat template writes for an assistant message's `tool_calls`:
  `<tool_call>\\n{"name": "<name>", "arguments": <arguments | tojson>}\\n</tool_call>` (non-ASCII kept, ", " and
  ": " separators), calls joined by a newline. It is the syntax bfcl-eval's Qwen decoder reads
  (`<tool_call>\\n(.*?)\\n</tool_call>`), so the BFCL environments write it (issue 53). Two departures, both where the
  template's text could not be read back: a payload that would hold a tag (`<tool_call>`, `</tool_call>`, `<think>`,
  `</think>`) gets its "<" written "\\u003c", and the name is JSON-escaped (the template writes it raw, which a name
  holding a quote, a backslash or a control character turns into invalid JSON). No BFCL ground truth has either.
"""

_TAGS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, THINK_OPEN, THINK_CLOSE)


def render_tool_call(name: str, arguments: Mapping[str, Any], syntax: str = "compact") -> str:
  """Writes a call in one of `TOOL_CALL_SYNTAXES`, which `parse_tool_call` / `parse_message` read back.

  Args:
    name: the tool's name, e.g. "calculator".
    arguments: JSON-serializable arguments, e.g. {"expression": "2*(3+4)"}.
    syntax: "compact" (default) or "qwen3" (see `TOOL_CALL_SYNTAXES`).

  Returns:
    e.g. '<tool_call>{"name": "calculator", "arguments": {"expression": "2*(3+4)"}}</tool_call>' ("compact") or
    '<tool_call>\\n{"name": "cd", "arguments": {"folder": "déjà"}}\\n</tool_call>' ("qwen3"); the parser reads back
    exactly `name` and `arguments`, whatever strings they hold.

  Raises:
    TypeError: if `arguments` is not JSON-serializable.
    ValueError: if `arguments` hold a non-finite float (`loads_strict` refuses NaN and infinities), or for an unknown
      `syntax`.
  """
  if syntax not in TOOL_CALL_SYNTAXES:
    raise ValueError(f"unknown tool-call syntax {syntax!r}; known: {', '.join(TOOL_CALL_SYNTAXES)}")
  qwen3 = syntax == "qwen3"
  try:
    if qwen3:
      args = json.dumps(dict(arguments), allow_nan=False, ensure_ascii=False)
      payload = '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ' + args + "}"
    else:
      payload = json.dumps({"name": name, "arguments": dict(arguments)}, allow_nan=False)
  except ValueError as e:
    if "float" not in str(e):  # e.g. an int past Python's 4,300-digit string conversion limit
      raise ValueError(f"tool call {name!r}: arguments cannot be written as JSON ({e})") from None
    raise ValueError(
      f"tool call {name!r}: arguments hold a non-finite number (nan or inf), which the parser refuses"
    ) from None
  if qwen3:
    if any(tag in payload for tag in _TAGS):
      payload = payload.replace("<", "\\u003c")
    return TOOL_CALL_OPEN + "\n" + payload + "\n" + TOOL_CALL_CLOSE
  # "<" inside strings is written "\u003c" (valid JSON for "<"), so a value can never close the tag early or open
  # a think block
  return TOOL_CALL_OPEN + payload.replace("<", "\\u003c") + TOOL_CALL_CLOSE


def render_tool_calls(calls: Sequence[tuple[str, Mapping[str, Any]]], syntax: str = "compact") -> str:
  """Several calls as one assistant message: `render_tool_call` of each, joined by a newline (as Qwen3's chat template
  joins them). Raises as `render_tool_call`."""
  return "\n".join(render_tool_call(name, arguments, syntax) for name, arguments in calls)


def render_tool_response(content: str) -> str:
  """Wraps a tool's output (or error message) as the content of the tool message the model sees."""
  return TOOL_RESPONSE_OPEN + content + TOOL_RESPONSE_CLOSE


def calculator_prompt(how_to_call: str, example: str, how_to_answer: str) -> str:
  """A calculator environment's system prompt: `how_to_call` (ending in "write:"), an example call on the expression
  `example` on its own line, then "Its result comes back in <tool_response>. " and `how_to_answer`."""
  return (
    f"{how_to_call}\n{render_tool_call('calculator', {'expression': example})}\n"
    f"Its result comes back in {TOOL_RESPONSE_OPEN}. {how_to_answer}"
  )


def render_answer(value: str) -> str:
  """`<answer>{value}</answer>`."""
  return ANSWER_OPEN + value + ANSWER_CLOSE


def parse_tool_call(text: str) -> ParsedToolCall | None:
  """Finds and parses the first `<tool_call>...</tool_call>` in assistant text, outside `<think>` blocks.

  Read as the environments read a message (`parse_message`, with the calculator's `MAX_CALL_CHARS`): think blocks
  are dropped first, so a call written while thinking is not a call. Without a closing tag (generation cut short)
  the rest of the text is taken as the payload. The payload must be strict JSON (`loads_strict`) holding an object
  with a string "name" and an object "arguments". Whether the tool exists is not checked here (see
  `execute_tool_call`).

  Args:
    text: one assistant message.

  Returns:
    None when the visible text has no `<tool_call>`; otherwise a `ParsedToolCall` holding the call or an error
    (`start` is its index in the visible text). An unclosed `<think>` block is an error (`start` is its index in
    `text`): the whole message is then no action, as in every environment. Never raises for any string input.
  """
  msg = parse_message(text, max_calls=1, max_call_chars=MAX_CALL_CHARS)
  if msg.error is not None:
    return ParsedToolCall(call=None, error=msg.error, start=max(0, text.rfind(THINK_OPEN)))
  return msg.calls[0] if msg.calls else None


def _arguments(obj: dict) -> tuple[dict | None, str | None]:
  """The call's arguments: an object, a JSON string holding an object, or absent ({}); "parameters" is read
  when "arguments" is absent (a spelling small models use)."""
  if "arguments" in obj and "parameters" in obj:
    return None, 'duplicate key: "arguments" and its alias "parameters" are both given; give one'
  key = "arguments" if "arguments" in obj else ("parameters" if "parameters" in obj else None)
  if key is None:
    return {}, None
  arguments = obj[key]
  if isinstance(arguments, str):
    try:
      arguments = loads_strict(arguments) if arguments.strip() else {}
    except StrictJSONError as e:
      return None, f'"arguments" string is not strict JSON ({e})'
    except (ValueError, RecursionError):
      return None, '"arguments" is a string that is not a JSON object'
  if not isinstance(arguments, dict):
    return None, '"arguments" must be a JSON object, e.g. {"expression": "2*(3+4)"}'
  return arguments, None


def run_tool_call(
  call: ToolCall,
  tools: Mapping[str, Callable[[Mapping[str, Any]], str]] | None = None,
  max_output_chars: int = MAX_OUTPUT_CHARS,
) -> ToolOutcome:
  """Runs a parsed call; never raises for bad arguments or tool failures.

  Args:
    call: a well-formed call.
    tools: name -> function; defaults to `TOOLS` (the calculator).
    max_output_chars: output beyond this many characters is cut and `TRUNCATION_MARKER` appended (`truncate`).

  Returns:
    `ToolOutcome(content=output, ok=True)`, or `ok=False` with "error: ..." content for an unknown tool or a
    `ToolError`.
  """
  tools = TOOLS if tools is None else tools
  fn = tools.get(call.name)
  if fn is None:
    return ToolOutcome(f"error: unknown tool {_short(call.name)!r}; available: {', '.join(sorted(tools))}", ok=False)
  try:
    out = fn(call.arguments)
  except ToolError as e:
    return ToolOutcome(f"error: {e}", ok=False)
  if not isinstance(out, str):
    return ToolOutcome(f"error: tool {call.name!r} returned no text", ok=False)
  return ToolOutcome(truncate(out, max_output_chars), ok=True)


def run_parsed_call(
  parsed: ParsedToolCall,
  tools: Mapping[str, Callable[[Mapping[str, Any]], str]] | None = None,
  max_output_chars: int = MAX_OUTPUT_CHARS,
) -> ToolOutcome:
  """`run_tool_call` on a parsed call, or its parse error as an error outcome (`ok=False`, "error: ...")."""
  if parsed.call is None:
    return ToolOutcome(f"error: {parsed.error}", ok=False)
  return run_tool_call(parsed.call, tools, max_output_chars)


def execute_tool_call(
  text: str,
  tools: Mapping[str, Callable[[Mapping[str, Any]], str]] | None = None,
  max_output_chars: int = MAX_OUTPUT_CHARS,
) -> ToolOutcome | None:
  """Parses the first tool call in `text` outside `<think>` blocks (`parse_tool_call`) and runs it.

  Returns:
    None when the visible text has no `<tool_call>`; otherwise the outcome, with malformed calls (and a message
    with an unclosed `<think>` block) turned into error outcomes (`ok=False`, content "error: ..."). Never raises for
    any string input.
  """
  parsed = parse_tool_call(text)
  return None if parsed is None else run_parsed_call(parsed, tools, max_output_chars)


def extract_answer(text: str) -> str | None:
  """The stripped content of the first `<answer>...</answer>` outside `<think>` blocks, or None when there is none
  (or the message has an unclosed `<think>` block, which hides the rest of the message).

  Without a closing tag (generation cut short) the rest of the text is taken.
  """
  visible, error = strip_thinking(text)
  return None if error is not None else _answer_in(visible)


def _answer_in(visible: str) -> str | None:
  """`extract_answer` on text whose think blocks are already dropped (stripping twice is not the identity: a stray
  `</think>` left in visible text would hide what precedes it)."""
  start = visible.find(ANSWER_OPEN)
  if start < 0:
    return None
  body_start = start + len(ANSWER_OPEN)
  end = visible.find(ANSWER_CLOSE, body_start)
  return (visible[body_start:] if end < 0 else visible[body_start:end]).strip()


def _short(s: str, n: int = 40) -> str:
  return s if len(s) <= n else s[:n] + "..."


def truncate(text: str, max_chars: int) -> str:
  """`text` cut to `max_chars` characters with `TRUNCATION_MARKER` appended (naming how many were cut); text that
  fits is returned unchanged. Long tool output (search results, file contents) is cut, never turned into an error.

  Raises:
    ValueError: for `max_chars` < 1.
  """
  if max_chars < 1:
    raise ValueError(f"max_chars (the tool-output limit) must be >= 1, got {max_chars}")
  if len(text) <= max_chars:
    return text
  return text[:max_chars] + TRUNCATION_MARKER.format(n=len(text) - max_chars)


def strip_thinking(text: str) -> tuple[str, str | None]:
  """The visible part of an assistant message: `<think>...</think>` blocks removed.

  Text before a `</think>` with no `<think>` before it is thinking too (the generation prompt opened the block,
  as Qwen3's template does). An unclosed `<think>` hides everything after it and is reported.

  Returns:
    (visible text, error): error is "unclosed <think> block" when a `<think>` has no `</think>`, else None.
  """
  close = text.find(THINK_CLOSE)
  open_ = text.find(THINK_OPEN)
  if close >= 0 and (open_ < 0 or close < open_):
    text = text[close + len(THINK_CLOSE) :]
  parts, pos = [], 0
  while True:
    open_ = text.find(THINK_OPEN, pos)
    if open_ < 0:
      parts.append(text[pos:])
      return "".join(parts), None
    parts.append(text[pos:open_])
    close = text.find(THINK_CLOSE, open_ + len(THINK_OPEN))
    if close < 0:
      return "".join(parts), "unclosed <think> block: its text is not read; close it with </think>"
    pos = close + len(THINK_CLOSE)


@dataclasses.dataclass(frozen=True)
class ParsedMessage:
  """What an assistant message asks for, read outside its think blocks.

  Attributes:
    calls: every `<tool_call>` in the visible text, in order, each a `ParsedToolCall` holding a call or an error.
    answer: the stripped `<answer>` content of the visible text, or None.
    error: a problem with the whole message ("unclosed <think> block ..."), or None.
    visible: the text outside think blocks.
  """

  calls: tuple[ParsedToolCall, ...]
  answer: str | None
  error: str | None
  visible: str


def parse_message(text: str, *, max_calls: int = 16, max_call_chars: int = 20_000) -> ParsedMessage:
  """Reads an assistant message: think blocks dropped (`strip_thinking`), then all tool calls and the answer.

  Each `<tool_call>...</tool_call>` (the last may be unclosed: generation cut short) holds a JSON object with a
  "name" string and "arguments" (an object, a JSON string holding one, or absent). Calls past `max_calls` are
  reported as one error, never run.

  Args:
    text: one decoded assistant message.
    max_calls: the most calls one message may run.
    max_call_chars: the longest payload read as JSON (longer ones are errors).

  Returns:
    A `ParsedMessage`. Never raises for any string input.
  """
  visible, error = strip_thinking(text)
  calls: list[ParsedToolCall] = []
  pos = 0
  while True:
    start = visible.find(TOOL_CALL_OPEN, pos)
    if start < 0:
      break
    body = start + len(TOOL_CALL_OPEN)
    end = visible.find(TOOL_CALL_CLOSE, body)
    stop = len(visible) if end < 0 else end
    if len(calls) >= max_calls:
      rest = visible.count(TOOL_CALL_OPEN, start)
      calls.append(
        ParsedToolCall(
          None, f"too many tool calls in one message: {rest} past the first {max_calls} were not run", start
        )
      )
      break
    calls.append(_parse_payload(visible[body:stop].strip(), start, max_call_chars))
    pos = len(visible) if end < 0 else end + len(TOOL_CALL_CLOSE)
  return ParsedMessage(calls=tuple(calls), answer=_answer_in(visible), error=error, visible=visible)


class StrictJSONError(ValueError):
  """JSON that `json.loads` reads but a tool call may not hold: a duplicate key or a non-finite number."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
  out = {}
  for k, v in pairs:
    if k in out:
      raise StrictJSONError(f"duplicate key {_short(k)!r}")
    out[k] = v
  return out


def _finite_float(text: str) -> float:
  value = float(text)
  if not math.isfinite(value):
    raise StrictJSONError(f"non-finite number {_short(text)}")
  return value


def _no_constant(name: str) -> float:
  raise StrictJSONError(f"non-finite number {name}")


def loads_strict(text: str) -> Any:
  """`json.loads` for tool-call JSON, stricter than Python's: the one parser behind every tool-call entry point.

  Python's `json` keeps the last of two equal keys (a call with two "name" keys would run the last-named tool) and
  reads `NaN`, `Infinity`, `-Infinity` and overflowing literals such as `1e999` as nan / inf. Both are refused here,
  at every depth, as RFC 8259 advises against them and no tool argument means them.

  Raises:
    StrictJSONError: naming the duplicate key or the non-finite literal.
    json.JSONDecodeError / ValueError / RecursionError: for text that is not JSON (as `json.loads`).
  """
  return json.loads(text, object_pairs_hook=_no_duplicates, parse_float=_finite_float, parse_constant=_no_constant)


def _parse_payload(payload: str, start: int, max_chars: int) -> ParsedToolCall:
  def bad(msg: str) -> ParsedToolCall:
    return ParsedToolCall(call=None, error=msg, start=start)

  if not payload:
    return bad("empty tool call")
  if len(payload) > max_chars:
    return bad(f"tool call too long ({len(payload)} characters; max {max_chars})")
  try:
    obj = loads_strict(payload)
  except StrictJSONError as e:
    return bad(f"tool call is not strict JSON ({e})")
  except json.JSONDecodeError as e:
    return bad(f"tool call is not valid JSON ({e.msg} at character {e.pos})")
  except (ValueError, RecursionError):
    return bad("tool call is not valid JSON")
  if not isinstance(obj, dict):
    return bad('tool call must be a JSON object with "name" and "arguments"')
  name = obj.get("name")
  if not isinstance(name, str) or not name:
    return bad('tool call has no "name" string')
  arguments, error = _arguments(obj)
  if error is not None:
    return bad(error)
  return ParsedToolCall(call=ToolCall(name=name, arguments=arguments), error=None, start=start)


@dataclasses.dataclass(frozen=True)
class Tool:
  """A tool the model may call: its JSON schema and the Python callable it dispatches to.

  Attributes:
    name: the function name the model writes.
    description: one paragraph shown to the model.
    parameters: JSON schema of the arguments ({"type": "object", "properties": {...}, "required": [...]}).
    fn: called as `fn(**arguments)` after `check_arguments`; its return value becomes the observation (strings as
      they are, anything else through `format_result`). A `ToolError` (or, with `errors_as_results`, any exception)
      becomes an error observation.
  """

  name: str
  description: str
  parameters: dict
  fn: Callable[..., Any]

  def schema(self) -> dict:
    """The OpenAI/Qwen3 function schema: {"type": "function", "function": {name, description, parameters}}."""
    return {
      "type": "function",
      "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
    }


_JSON_TYPES = {
  "string": (str,),
  "integer": (int,),
  "number": (int, float),
  "float": (int, float),
  "boolean": (bool,),
  "array": (list,),
  "tuple": (list,),
  "object": (dict,),
  "dict": (dict,),
  "any": (object,),
}


def check_arguments(
  parameters: Mapping[str, Any], arguments: Mapping[str, Any], *, check_types: bool = True
) -> str | None:
  """Checks call arguments against a JSON schema's top level: required names present, no unknown names, and (with
  `check_types`) each value of its declared type (JSON "string", "integer", "number"/"float", "boolean", "array",
  "object"/"dict").

  Returns:
    None when they fit, else a short error message naming the argument.
  """
  props = dict(parameters.get("properties") or {})
  required = [r for r in (parameters.get("required") or []) if r in props or not props]
  missing = [r for r in required if r not in arguments]
  if missing:
    return "missing required argument(s): " + ", ".join(repr(_short(m)) for m in missing)
  unknown = [k for k in arguments if k not in props]
  if unknown:
    known = ", ".join(sorted(props)) or "none"
    return "unexpected argument(s): " + ", ".join(repr(_short(k)) for k in unknown) + f" (known: {known})"
  if not check_types:
    return None
  for k, v in arguments.items():
    t = props[k].get("type") if isinstance(props[k], Mapping) else None
    types = _JSON_TYPES.get(t) if isinstance(t, str) else None
    if types is None or types == (object,):
      continue
    if isinstance(v, bool) and bool not in types:
      return f"argument {k!r} must be of type {t}, got a boolean"
    if not isinstance(v, types):
      return f"argument {k!r} must be of type {t}, got {type(v).__name__ if v is not None else 'null'}"
  return None


def format_result(value: Any) -> str:
  """A tool's return value as observation text: a string as is, a dict as JSON (str() if not serialisable),
  anything else through str() (BFCL's executor does the same, so its response checker compares equal strings)."""
  if isinstance(value, str):
    return value
  if isinstance(value, dict):
    try:
      return json.dumps(value)
    except (TypeError, ValueError):
      return str(value)
  return str(value)


@dataclasses.dataclass(frozen=True)
class CallOutcome:
  """One call of a message after it ran (or failed to).

  Attributes:
    call: the parsed call, or None when the text did not parse.
    content: the observation for this call ("error: ..." for parse and argument errors), truncated.
    ok: False for parse errors, unknown tools, bad arguments and `ToolError`s.
    dispatched: whether the callable ran (BFCL's checker reads the results of dispatched calls only).
    result: the full, untruncated result text of a dispatched call ("" otherwise).
  """

  call: ToolCall | None
  content: str
  ok: bool
  dispatched: bool
  result: str = ""


def run_calls(
  parsed: Sequence[ParsedToolCall],
  tools: Mapping[str, Tool],
  *,
  max_output_chars: int = MAX_OUTPUT_CHARS,
  errors_as_results: Callable[[Exception], str] | None = None,
  check_types: bool = True,
) -> list[CallOutcome]:
  """Runs the parsed calls of one message in order; never raises for bad model output.

  Args:
    parsed: `ParsedMessage.calls`.
    tools: the tools available now, by name.
    max_output_chars: each observation is cut to this (`truncate`).
    errors_as_results: when given, an exception other than `ToolError` raised by a tool is turned into a result
      string by it (BFCL: "Error during execution: ..."); otherwise it propagates (a bug in the tool).
    check_types: whether argument values are checked against their declared types (`check_arguments`); names are
      always checked.

  Returns:
    One `CallOutcome` per parsed call.
  """
  out = []
  for p in parsed:
    if p.call is None:
      out.append(CallOutcome(None, f"error: {p.error}", ok=False, dispatched=False))
      continue
    tool = tools.get(p.call.name)
    if tool is None:
      names = ", ".join(sorted(tools)) or "none"
      out.append(
        CallOutcome(
          p.call, _short_error(f"unknown tool {_short(p.call.name)!r}; available: {names}"), ok=False, dispatched=False
        )
      )
      continue
    problem = check_arguments(tool.parameters, p.call.arguments, check_types=check_types)
    if problem is not None:
      out.append(CallOutcome(p.call, f"error: {tool.name}: {problem}", ok=False, dispatched=False))
      continue
    try:
      result = format_result(tool.fn(**p.call.arguments))
      ok = True
    except ToolError as e:
      out.append(CallOutcome(p.call, f"error: {e}", ok=False, dispatched=True, result=f"error: {e}"))
      continue
    except Exception as e:  # noqa: BLE001 - the tool's own failure, shown to the model when asked to
      if errors_as_results is None:
        raise
      result, ok = errors_as_results(e), True
    out.append(CallOutcome(p.call, truncate(result, max_output_chars), ok=ok, dispatched=True, result=result))
  return out


def _short_error(msg: str, n: int = 2000) -> str:
  return "error: " + (msg if len(msg) <= n else msg[:n] + "...")


TOOLS_PROMPT = (
  "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
  "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
  "XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
)
"""Qwen3's tool prompt (the text its chat template writes for `tools=`), used for every template alike."""


def render_tools_prompt(schemas: Sequence[Mapping[str, Any]]) -> str:
  """The system-prompt text that lists the tools (one JSON schema per line, as Qwen3's template writes them).

  The tools go in as plain text in the system message, so a template without tool support renders them too and the
  prompt stays token-in/token-out.
  """
  return TOOLS_PROMPT.format(tools="\n".join(json.dumps(dict(s), ensure_ascii=False) for s in schemas))
