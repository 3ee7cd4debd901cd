"""Tool-call parsing, execution and error observations; answer extraction."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxcredit.envs import tool_calls as tc


def call_text(payload: str, close: bool = True) -> str:
  return "Let me compute. " + tc.TOOL_CALL_OPEN + payload + (tc.TOOL_CALL_CLOSE if close else "")


def test_render_tool_call_exact_text():
  assert tc.render_tool_call("calculator", {"expression": "2*(3+4)"}) == (
      '<tool_call>{"name": "calculator", "arguments": {"expression": "2*(3+4)"}}</tool_call>')


def test_render_then_parse_roundtrip():
  text = "ok " + tc.render_tool_call("calculator", {"expression": "-( 20 + 67 + -59 )"}) + " trailing"
  parsed = tc.parse_tool_call(text)
  assert parsed.error is None
  assert parsed.call == tc.ToolCall("calculator", {"expression": "-( 20 + 67 + -59 )"})
  assert parsed.start == 3
  assert tc.execute_tool_call(text) == tc.ToolOutcome("-28", ok=True)


def test_closing_tag_inside_a_value_roundtrips():
  text = tc.render_tool_call("calculator", {"expression": "1</tool_call>2"})
  assert "1</tool_call>2" not in text
  assert tc.parse_tool_call(text).call == tc.ToolCall("calculator", {"expression": "1</tool_call>2"})


@given(st.text(max_size=150))
def test_roundtrip_any_expression_string(expr):
  parsed = tc.parse_tool_call(tc.render_tool_call("calculator", {"expression": expr}))
  assert parsed.call == tc.ToolCall("calculator", {"expression": expr})


def test_first_call_wins():
  text = (tc.render_tool_call("calculator", {"expression": "1+1"})
          + tc.render_tool_call("calculator", {"expression": "5*5"}))
  assert tc.execute_tool_call(text).content == "2"


def test_no_call():
  assert tc.parse_tool_call("The answer is <answer>4</answer>") is None
  assert tc.execute_tool_call("just text") is None


def test_unterminated_call_is_still_parsed():
  text = call_text('{"name": "calculator", "arguments": {"expression": "7/2"}}', close=False)
  assert tc.execute_tool_call(text) == tc.ToolOutcome("3.5", ok=True)


def test_whitespace_inside_tags():
  text = call_text('\n  {"name": "calculator", "arguments": {"expression": "6*7"}}  \n')
  assert tc.execute_tool_call(text).content == "42"


@pytest.mark.parametrize("payload, message", [
    ('{"name": "calculator", "arguments": {"expression": "1+1"}', "error: tool call is not valid JSON"),
    ("{'name': 'calculator'}", "error: tool call is not valid JSON"),
    ('{"name": "calculator", "arguments": {"expression": "1"}} extra', "error: tool call is not valid JSON"),
    ("", "error: empty tool call"),
    ("   ", "error: empty tool call"),
    ('["calculator", "1+1"]', 'error: tool call must be a JSON object with "name" and "arguments"'),
    ('"1+1"', 'error: tool call must be a JSON object'),
    ('{"arguments": {"expression": "1+1"}}', 'error: tool call has no "name" string'),
    ('{"name": 3, "arguments": {"expression": "1+1"}}', 'error: tool call has no "name" string'),
    ('{"name": "calculator"}', 'error: calculator needs an "expression" string argument'),  # no arguments: {}
    ('{"name": "calculator", "arguments": "1+1"}', 'error: "arguments" is a string that is not a JSON object'),
    ('{"name": "calculator", "arguments": ["1+1"]}', 'error: "arguments" must be a JSON object'),
    ('{"name": "foo", "arguments": {"expression": "1+1"}}', "error: unknown tool 'foo'; available: calculator"),
    ('{"name": "calculator", "arguments": {}}', 'error: calculator needs an "expression" string argument'),
    ('{"name": "calculator", "arguments": {"expr": "1+1"}}', "error: calculator got unexpected argument(s): 'expr'"),
    ('{"name": "calculator", "arguments": {"expression": 14}}', 'error: calculator needs an "expression" string'),
    ('{"name": "calculator", "arguments": {"expression": "1/0"}}', "error: division by zero"),
    ('{"name": "calculator", "arguments": {"expression": "9**9**9"}}', "error: '**' (power) is not supported"),
    ('{"name": "calculator", "arguments": {"expression": "__import__(\'os\')"}}',
     "error: function calls are not allowed"),
    ('{"name": "calculator", "arguments": {"expression": "x + 1"}}', "error: unknown name 'x'"),
    ('{"name": "calculator", "arguments": {"expression": "' + "1+" * 150 + '1"}}',
     "error: expression too long (301 characters; max 200)"),
    ('{"name": "calculator", "arguments": {"expression": "' + "1" * 2000 + '"}}',
     "error: tool call too long"),
    ("[" * 5000 + "]" * 5000, "error: tool call too long"),
    ("[" * 499 + "]" * 499, "error: tool call must be a JSON object"),
])
def test_malformed_calls_become_error_observations(payload, message):
  outcome = tc.execute_tool_call(call_text(payload))
  assert not outcome.ok
  assert outcome.content.startswith(message), outcome.content
  assert len(outcome.content) <= 120


def test_unknown_tool_name_is_truncated():
  outcome = tc.execute_tool_call(call_text(json.dumps({"name": "x" * 500, "arguments": {}})))
  assert outcome.content == "error: unknown tool '" + "x" * 40 + "...'; available: calculator"


def test_over_long_output_is_truncated_with_a_marker():
  tools = {"echo": lambda args: args["text"] * 3}
  ok = tc.execute_tool_call(call_text(json.dumps({"name": "echo", "arguments": {"text": "ab"}})), tools)
  assert ok == tc.ToolOutcome("ababab", ok=True)
  long = tc.execute_tool_call(call_text(json.dumps({"name": "echo", "arguments": {"text": "a" * 100}})), tools)
  assert long == tc.ToolOutcome("a" * 200 + "...[truncated 100 characters]", ok=True)
  short = tc.execute_tool_call(call_text(json.dumps({"name": "echo", "arguments": {"text": "abc"}})), tools,
                               max_output_chars=4)
  assert short.content == "abca...[truncated 5 characters]"


def test_arguments_as_a_json_string_or_absent():
  text = call_text(json.dumps({"name": "calculator", "arguments": json.dumps({"expression": "6*7"})}))
  assert tc.execute_tool_call(text) == tc.ToolOutcome("42", ok=True)
  assert tc.parse_tool_call(call_text('{"name": "pwd"}')).call == tc.ToolCall("pwd", {})
  assert tc.parse_tool_call(call_text('{"name": "f", "parameters": {"x": 1}}')).call == tc.ToolCall("f", {"x": 1})


def test_tool_error_from_custom_tool():
  def picky(args):
    raise tc.ToolError("bad thing")
  out = tc.execute_tool_call(call_text('{"name": "picky", "arguments": {}}'), {"picky": picky})
  assert out == tc.ToolOutcome("error: bad thing", ok=False)


@given(st.text(max_size=400))
def test_execute_never_raises(text):
  for t in (text, tc.TOOL_CALL_OPEN + text, tc.TOOL_CALL_OPEN + text + tc.TOOL_CALL_CLOSE,
            call_text('{"name": "calculator", "arguments": {"expression": ' + json.dumps(text) + "}}")):
    out = tc.execute_tool_call(t)
    assert out is None or (isinstance(out.content, str) and out.ok == (not out.content.startswith("error:")))


def test_render_tool_response_and_answer():
  assert tc.render_tool_response("14") == "<tool_response>14</tool_response>"
  assert tc.render_answer("-28") == "<answer>-28</answer>"


@pytest.mark.parametrize("text, expected", [
    ("<answer>14</answer>", "14"),
    ("so <answer> -28 </answer> done", "-28"),
    ("<answer>1</answer><answer>2</answer>", "1"),
    ("<answer>3.5", "3.5"),          # unterminated: rest of the text
    ("<answer></answer>", ""),
    ("no answer here", None),
    ("</answer>14", None),
])
def test_extract_answer(text, expected):
  assert tc.extract_answer(text) == expected
