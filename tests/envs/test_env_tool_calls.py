"""Tool-call parsing, execution and error observations; answer extraction."""

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxcredit.envs import tool_calls as tc


def call_text(payload: str, close: bool = True) -> str:
  return "Let me compute. " + tc.TOOL_CALL_OPEN + payload + (tc.TOOL_CALL_CLOSE if close else "")


def test_render_tool_call_exact_text():
  assert tc.render_tool_call("calculator", {"expression": "2*(3+4)"}) == (
    '<tool_call>{"name": "calculator", "arguments": {"expression": "2*(3+4)"}}</tool_call>'
  )


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
  text = tc.render_tool_call("calculator", {"expression": "1+1"}) + tc.render_tool_call(
    "calculator", {"expression": "5*5"}
  )
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


@pytest.mark.parametrize(
  "payload, message",
  [
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
    (
      '{"name": "calculator", "arguments": {"expression": "__import__(\'os\')"}}',
      "error: function calls are not allowed",
    ),
    ('{"name": "calculator", "arguments": {"expression": "x + 1"}}', "error: unknown name 'x'"),
    (
      '{"name": "calculator", "arguments": {"expression": "' + "1+" * 150 + '1"}}',
      "error: expression too long (301 characters; max 200)",
    ),
    ('{"name": "calculator", "arguments": {"expression": "' + "1" * 2000 + '"}}', "error: tool call too long"),
    ("[" * 5000 + "]" * 5000, "error: tool call too long"),
    ("[" * 499 + "]" * 499, "error: tool call must be a JSON object"),
  ],
)
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
  short = tc.execute_tool_call(
    call_text(json.dumps({"name": "echo", "arguments": {"text": "abc"}})), tools, max_output_chars=4
  )
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
  for t in (
    text,
    tc.TOOL_CALL_OPEN + text,
    tc.TOOL_CALL_OPEN + text + tc.TOOL_CALL_CLOSE,
    call_text('{"name": "calculator", "arguments": {"expression": ' + json.dumps(text) + "}}"),
  ):
    out = tc.execute_tool_call(t)
    assert out is None or (isinstance(out.content, str) and out.ok == (not out.content.startswith("error:")))


def test_render_tool_response_and_answer():
  assert tc.render_tool_response("14") == "<tool_response>14</tool_response>"
  assert tc.render_answer("-28") == "<answer>-28</answer>"


@pytest.mark.parametrize(
  "text, expected",
  [
    ("<answer>14</answer>", "14"),
    ("so <answer> -28 </answer> done", "-28"),
    ("<answer>1</answer><answer>2</answer>", "1"),
    ("<answer>3.5", "3.5"),  # unterminated: rest of the text
    ("<answer></answer>", ""),
    ("no answer here", None),
    ("</answer>14", None),
  ],
)
def test_extract_answer(text, expected):
  assert tc.extract_answer(text) == expected


# --- parse_message: several calls, think blocks, fuzzing -------------------------------------------------------

_JSON_VALUES = st.recursive(
  st.none()
  | st.booleans()
  | st.integers(-(10**12), 10**12)
  | st.floats(allow_nan=False, allow_infinity=False)
  | st.text(max_size=20),
  lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
  max_leaves=12,
)
_CALLS = st.tuples(st.text(min_size=1, max_size=24), st.dictionaries(st.text(max_size=12), _JSON_VALUES, max_size=5))


def _near_valid(draw_text: str, mutation: int, pos: int) -> str:
  """A valid call text damaged by one edit: a character dropped, a brace or quote added, a tag cut."""
  pos = pos % (len(draw_text) + 1)
  if mutation == 0:
    return draw_text[:pos] + draw_text[pos + 1 :]
  if mutation == 1:
    return draw_text[:pos] + "{" + draw_text[pos:]
  if mutation == 2:
    return draw_text[:pos] + '"' + draw_text[pos:]
  if mutation == 3:
    return draw_text[:pos]
  return draw_text.replace(tc.TOOL_CALL_CLOSE, "", 1)


# 2,500 examples in CI (HYPOTHESIS_PROFILE=ci), 500 in the default suite (it was 2,500 there too: 35 s). Only
# about 2,500 find a rendered call whose "<" is not escaped (1 of 3 seeds at 1,000, none at 500; docs/testing.md):
# test_closing_tag_inside_a_value_roundtrips is the check that does in every run.
FUZZ_EXAMPLES = 2500 if os.environ.get("HYPOTHESIS_PROFILE") == "ci" else 500


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(
  calls=st.lists(_CALLS, min_size=1, max_size=4),
  noise=st.text(max_size=30),
  think=st.booleans(),
  mutation=st.integers(0, 5),
  pos=st.integers(0, 10**6),
  raw=st.text(max_size=200),
)
def test_fuzz_parse_message_never_raises_and_valid_calls_round_trip(calls, noise, think, mutation, pos, raw):
  text = noise.replace("<", "(") + "".join(tc.render_tool_call(n, a) for n, a in calls)
  hidden = tc.render_tool_call("hidden", {"x": 1})
  msg = tc.parse_message(("<think>" + hidden + "</think>" if think else "") + text)
  assert [(p.call.name, p.call.arguments) for p in msg.calls] == [(n, a) for n, a in calls]
  assert msg.error is None
  for s in (_near_valid(text, mutation, pos), raw, tc.TOOL_CALL_OPEN + raw, "<think>" + raw):
    m = tc.parse_message(s)  # never raises; every entry is a call or an error
    assert all((p.call is None) != (p.error is None) for p in m.calls)
    tc.run_calls(m.calls, {})  # unknown tools and parse errors become observations


def test_parse_message_reads_every_call_outside_think_blocks():
  text = (
    "<think>"
    + tc.render_tool_call("a", {})
    + "</think>first "
    + tc.render_tool_call("b", {"x": 1})
    + " then "
    + tc.render_tool_call("c", {"s": "\u00e9\u4e2d"})
    + "<tool_call>{bad}</tool_call>"
    + '<tool_call>{"name": "d", "arguments": "{\\"k\\": 2}"}'
  )
  msg = tc.parse_message(text)
  assert [p.call.name if p.call else p.error.split(" (")[0] for p in msg.calls] == [
    "b",
    "c",
    "tool call is not valid JSON",
    "d",
  ]
  assert msg.calls[1].call.arguments == {"s": "\u00e9\u4e2d"} and msg.calls[3].call.arguments == {"k": 2}
  many = tc.parse_message(tc.render_tool_call("f", {}) * 5, max_calls=3)
  assert [p.error for p in many.calls[3:]] == ["too many tool calls in one message: 2 past the first 3 were not run"]


def test_run_calls_checks_the_schema():
  tool = tc.Tool(
    "add",
    "adds",
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}}, "required": ["a"]},
    lambda a, b=0: a + b,
  )
  calls = tc.parse_message(
    "".join(
      tc.render_tool_call("add", args)
      for args in ({"a": 1, "b": 2.5}, {"b": 1}, {"a": 1, "c": 2}, {"a": "1"}, {"a": True})
    )
  ).calls
  out = tc.run_calls(calls, {"add": tool})
  assert out[0].content == "3.5" and out[0].ok and out[0].dispatched
  assert [o.content for o in out[1:]] == [
    "error: add: missing required argument(s): 'a'",
    "error: add: unexpected argument(s): 'c' (known: a, b)",
    "error: add: argument 'a' must be of type integer, got str",
    "error: add: argument 'a' must be of type integer, got a boolean",
  ]
  assert not any(o.dispatched for o in out[1:])
  lenient = tc.run_calls(calls[3:4], {"add": tool}, check_types=False, errors_as_results=lambda e: f"E: {e}")
  assert lenient[0].dispatched and lenient[0].content.startswith("E: ")  # "1" + 0 raised inside the tool


# --- strict JSON: duplicate keys and non-finite numbers (issue 35 case 5) ---------------------------------------

# A duplicate "name" used to run the last-named tool (json.loads keeps the last value); NaN, Infinity and overflowing
# literals used to reach a number parameter as nan / inf.
STRICT_CASES = [
  ('{"name": "calculator", "name": "search", "arguments": {"expression": "1+1"}}', "duplicate key 'name'"),
  ('{"name": "f", "arguments": {"x": NaN}}', "non-finite number NaN"),
  ('{"name": "f", "arguments": {"x": 1e999}}', "non-finite number 1e999"),
  ('{"name": "f", "arguments": {"x": -Infinity}}', "non-finite number -Infinity"),
]


@pytest.mark.parametrize("payload, needle", STRICT_CASES)
def test_issue35_case5_duplicate_keys_and_non_finite_numbers_are_error_observations(payload, needle):
  msg = tc.parse_message(call_text(payload))
  assert len(msg.calls) == 1 and msg.calls[0].call is None and needle in msg.calls[0].error
  parsed = tc.parse_tool_call(call_text(payload))
  assert parsed.call is None and needle in parsed.error
  outcome = tc.execute_tool_call(call_text(payload))
  assert (
    not outcome.ok and outcome.content.startswith("error: tool call is not strict JSON") and needle in outcome.content
  )


_NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1E400", "123456789e308", "-0.5e+99999"]
_DUP_PLACES = [
  '{{"name": "f", "name": "g", "arguments": {{"x": 1}}}}',  # top level
  '{{"name": "f", "arguments": {{"x": 1, "x": 2}}}}',  # the arguments
  '{{"name": "f", "arguments": {{"o": {{"k": 1, "k": 1}}}}}}',  # nested in an argument (even equal values)
  '{{"name": "f", "arguments": {{"l": [{{"k": 1, "k": 2}}]}}}}',  # inside a list
  '{{"name": "f", "arguments": {{"x": 1}}, "arguments": {{"x": 2}}}}',  # two "arguments"
  '{{"name": "f", "arguments": {{"x": 1}}, "parameters": {{"x": 2}}}}',  # "arguments" and its alias "parameters"
  '{{"name": "f", "arguments": "{{\\"x\\": 1, \\"x\\": 2}}"}}',  # arguments given as a JSON string
]
_NUM_PLACES = [
  '{{"name": "f", "arguments": {{"x": {v}}}}}',
  '{{"name": "f", "arguments": {{"l": [1, {v}]}}}}',
  '{{"name": "f", "arguments": {{"o": {{"k": {v}}}}}}}',
  '{{"name": "f", "arguments": {{"x": 1}}, "extra": {v}}}',
  '{{"name": "f", "arguments": "{{\\"x\\": {v}}}"}}',
]


@pytest.mark.parametrize("template", _DUP_PLACES)
def test_duplicate_keys_anywhere_are_refused_by_every_entry_point(template):
  text = call_text(template.format())
  for parsed in (tc.parse_tool_call(text), *tc.parse_message(text).calls):
    assert parsed.call is None and "duplicate key" in parsed.error, parsed
  assert not tc.execute_tool_call(text).ok


@pytest.mark.parametrize("template", _NUM_PLACES)
@pytest.mark.parametrize("value", _NON_FINITE)
def test_non_finite_numbers_anywhere_are_refused_by_every_entry_point(template, value):
  text = call_text(template.format(v=value))
  for parsed in (tc.parse_tool_call(text), *tc.parse_message(text).calls):
    assert parsed.call is None and "non-finite number" in parsed.error, parsed
  assert not tc.execute_tool_call(text).ok


@pytest.mark.parametrize(
  "value", ["1e308", "-1.7976931348623157e308", "5e-324", "1e-999", "0", "-0.0", "12345678901234567890"]
)
def test_large_tiny_and_big_integer_numbers_stay_accepted(value):
  parsed = tc.parse_tool_call(call_text('{"name": "f", "arguments": {"x": ' + value + "}}"))
  assert parsed.error is None and parsed.call.arguments["x"] == json.loads(value)


def test_render_tool_call_refuses_non_finite_arguments():
  for bad in (float("nan"), float("inf"), -float("inf")):
    with pytest.raises(ValueError, match="non-finite"):
      tc.render_tool_call("f", {"x": bad})
