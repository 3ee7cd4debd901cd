"""Tool-call and answer syntax on assistant text (hermes / Qwen3 style).

An assistant calls a tool with

  <tool_call>{"name": "calculator", "arguments": {"expression": "2*(3+4)"}}</tool_call>

and gets back a tool message whose content is `<tool_response>14</tool_response>`. It ends with
`<answer>14</answer>`. This module knows no model and no tokenizer: it works on text only.

Running a call (`execute_tool_call`) never raises for bad model output: every malformed call (bad JSON,
missing fields, unknown tool, arguments not an object, missing expression, calculator error, over-long
output) becomes an error observation such as `error: unknown tool 'foo'; available: calculator`, which the
model sees in place of a result. `render_tool_call` writes the exact syntax the parser reads, so
demonstrations and the parser agree.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Mapping

from jaxcredit.envs.calculator import CalculatorError, calculate

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

MAX_CALL_CHARS = 1000          # characters of JSON between the tool-call tags
MAX_OUTPUT_CHARS = 200         # characters of a tool's output


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


def render_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
  """Writes a call in the syntax `parse_tool_call` reads.

  Args:
    name: the tool's name, e.g. "calculator".
    arguments: JSON-serializable arguments, e.g. {"expression": "2*(3+4)"}.

  Returns:
    e.g. '<tool_call>{"name": "calculator", "arguments": {"expression": "2*(3+4)"}}</tool_call>'; `parse_tool_call`
    reads back exactly `name` and `arguments`, whatever strings they hold.

  Raises:
    TypeError: if `arguments` is not JSON-serializable.
  """
  payload = json.dumps({"name": name, "arguments": dict(arguments)})
  # "</" inside strings is written "<\/" (valid JSON for "</"), so a value can never close the tag early
  return TOOL_CALL_OPEN + payload.replace("</", "<\\/") + TOOL_CALL_CLOSE


def render_tool_response(content: str) -> str:
  """Wraps a tool's output (or error message) as the content of the tool message the model sees."""
  return TOOL_RESPONSE_OPEN + content + TOOL_RESPONSE_CLOSE


def render_answer(value: str) -> str:
  """`<answer>{value}</answer>`."""
  return ANSWER_OPEN + value + ANSWER_CLOSE


def parse_tool_call(text: str) -> ParsedToolCall | None:
  """Finds and parses the first `<tool_call>...</tool_call>` in assistant text.

  Without a closing tag (generation cut short) the rest of the text is taken as the payload. The payload
  must be a JSON object with a string "name" and an object "arguments". Whether the tool exists is not
  checked here (see `execute_tool_call`).

  Args:
    text: one assistant message.

  Returns:
    None when the text has no `<tool_call>`; otherwise a `ParsedToolCall` holding the call or an error.
    Never raises for any string input.
  """
  start = text.find(TOOL_CALL_OPEN)
  if start < 0:
    return None
  body_start = start + len(TOOL_CALL_OPEN)
  end = text.find(TOOL_CALL_CLOSE, body_start)
  payload = (text[body_start:] if end < 0 else text[body_start:end]).strip()

  def bad(msg: str) -> ParsedToolCall:
    return ParsedToolCall(call=None, error=msg, start=start)

  if not payload:
    return bad("empty tool call")
  if len(payload) > MAX_CALL_CHARS:
    return bad(f"tool call too long ({len(payload)} characters; max {MAX_CALL_CHARS})")
  try:
    obj = json.loads(payload)
  except json.JSONDecodeError as e:
    return bad(f"tool call is not valid JSON ({e.msg} at character {e.pos})")
  except (ValueError, RecursionError):
    return bad("tool call is not valid JSON")
  if not isinstance(obj, dict):
    return bad('tool call must be a JSON object with "name" and "arguments"')
  name = obj.get("name")
  if not isinstance(name, str) or not name:
    return bad('tool call has no "name" string')
  if "arguments" not in obj:
    return bad('tool call has no "arguments" object')
  arguments = obj["arguments"]
  if not isinstance(arguments, dict):
    return bad('"arguments" must be a JSON object, e.g. {"expression": "2*(3+4)"}')
  return ParsedToolCall(call=ToolCall(name=name, arguments=arguments), error=None, start=start)


def run_tool_call(call: ToolCall, tools: Mapping[str, Callable[[Mapping[str, Any]], str]] | None = None
                  ) -> ToolOutcome:
  """Runs a parsed call; never raises for bad arguments or tool failures.

  Args:
    call: a well-formed call.
    tools: name -> function; defaults to `TOOLS` (the calculator).

  Returns:
    `ToolOutcome(content=output, ok=True)`, or `ok=False` with "error: ..." content for an unknown tool, a
    `ToolError`, or an output longer than `MAX_OUTPUT_CHARS`.
  """
  tools = TOOLS if tools is None else tools
  fn = tools.get(call.name)
  if fn is None:
    return ToolOutcome(f"error: unknown tool {_short(call.name)!r}; available: {', '.join(sorted(tools))}",
                       ok=False)
  try:
    out = fn(call.arguments)
  except ToolError as e:
    return ToolOutcome(f"error: {e}", ok=False)
  if not isinstance(out, str):
    return ToolOutcome(f"error: tool {call.name!r} returned no text", ok=False)
  if len(out) > MAX_OUTPUT_CHARS:
    return ToolOutcome(f"error: tool output too long ({len(out)} characters; max {MAX_OUTPUT_CHARS})",
                       ok=False)
  return ToolOutcome(out, ok=True)


def execute_tool_call(text: str, tools: Mapping[str, Callable[[Mapping[str, Any]], str]] | None = None
                      ) -> ToolOutcome | None:
  """Parses the first tool call in `text` and runs it.

  Returns:
    None when `text` has no `<tool_call>`; otherwise the outcome, with malformed calls turned into error
    outcomes (`ok=False`, content "error: ..."). Never raises for any string input.
  """
  parsed = parse_tool_call(text)
  if parsed is None:
    return None
  if parsed.call is None:
    return ToolOutcome(f"error: {parsed.error}", ok=False)
  return run_tool_call(parsed.call, tools)


def extract_answer(text: str) -> str | None:
  """The stripped content of the first `<answer>...</answer>`, or None when there is no `<answer>`.

  Without a closing tag (generation cut short) the rest of the text is taken.
  """
  start = text.find(ANSWER_OPEN)
  if start < 0:
    return None
  body_start = start + len(ANSWER_OPEN)
  end = text.find(ANSWER_CLOSE, body_start)
  return (text[body_start:] if end < 0 else text[body_start:end]).strip()


def _short(s: str, n: int = 40) -> str:
  return s if len(s) <= n else s[:n] + "..."
