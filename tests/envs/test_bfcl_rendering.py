"""The BFCL environments write tool calls byte for byte as Qwen3's chat template does (issue 53), and the "qwen3"
syntax reads back through the training parser."""

import pytest

pytest.importorskip("bfcl_eval")

from jaxcredit.envs import bfcl_multi_turn as bm  # noqa: E402
from jaxcredit.envs import bfcl_single as bs  # noqa: E402
from jaxcredit.envs import tool_calls  # noqa: E402


def _template_calls(tok, calls) -> str:
  """What Qwen3's chat template writes for an assistant message holding `calls` as OpenAI tool_calls: the text between
  the assistant header (and the empty think block the template adds to the last message) and <|im_end|>."""
  tool_calls_ = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
  messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "", "tool_calls": tool_calls_}]
  text = tok.apply_chat_template(messages)
  body = text.split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>", 1)[0]
  empty_think = "<think>\n\n</think>\n\n"
  return body[len(empty_think) :] if body.startswith(empty_think) else body


def test_multi_turn_ground_truth_renders_as_the_qwen3_template_does(qwen_tok):
  compared = non_ascii = 0
  for task in bm.load_tasks():
    for unit in range(task.num_units):
      calls = bm.ground_truth_calls(task, unit)
      if not calls:
        continue
      assert bm.render_calls(calls) == _template_calls(qwen_tok, calls), (task.task_id, unit)
      compared += 1
      non_ascii += any(ord(c) > 127 for c in bm.render_calls(calls))
  assert compared > 2500 and non_ascii > 0  # every request with calls of the 800 sessions; some hold non-ASCII text


def test_single_turn_ground_truth_renders_as_the_qwen3_template_does(qwen_tok):
  tasks = bs.load_tasks(("simple", "multiple", "parallel", "parallel_multiple"))
  for task in tasks:
    calls = bs.ground_truth_calls(task)
    assert bs.render_calls(calls) == _template_calls(qwen_tok, calls), task.task_id
  assert len(tasks) == 1000


def test_demonstrations_and_gold_answers_use_the_qwen3_syntax():
  task = next(t for t in bm.load_tasks() if t.task_id == "multi_turn_base_0")
  calls = bm.ground_truth_calls(task, 0)
  demo = bm.demonstration(task)
  assert demo[2] == {"role": "assistant", "content": bm.render_calls(calls)}
  assert demo[2]["content"].startswith("<tool_call>\n{") and demo[2]["content"].endswith("}\n</tool_call>")
  assert bm.unit_ground_truth(task)[0].count("<tool_call>\n{") == len(calls)
  single = bs.load_tasks(("parallel",))[0]
  assert bs.gold_answer_text(single) == bs.render_calls(bs.ground_truth_calls(single))


@pytest.mark.parametrize(
  "arguments",
  [
    {"folder": "déjà vu", "n": 3, "x": [1.5, None, True]},
    {"text": "a </tool_call> b"},  # a tag inside a value: "<" escaped, so both parsers read it back
    {"text": "<think>"},
    {"text": "a < b"},  # a "<" that opens no tag: written as is
  ],
)
def test_qwen3_syntax_reads_back_through_the_training_parser(arguments):
  text = tool_calls.render_tool_call("f", arguments, syntax="qwen3")
  parsed = tool_calls.parse_message(text + "\n" + text)
  assert [(p.call.name, p.call.arguments) for p in parsed.calls] == [("f", arguments)] * 2
  assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
  assert ("\\u003c" in text) == any(tag in str(arguments) for tag in ("<think>", "</tool_call>"))


def test_unknown_syntax_is_refused_by_name():
  with pytest.raises(ValueError, match="unknown tool-call syntax 'hermes'"):
    tool_calls.render_tool_call("f", {}, syntax="hermes")


@pytest.mark.parametrize("syntax", ["compact", "qwen3"])
def test_arguments_that_cannot_be_json_are_refused_with_their_reason(syntax):
  with pytest.raises(ValueError, match="non-finite number"):
    tool_calls.render_tool_call("f", {"x": float("nan")}, syntax=syntax)
  with pytest.raises(ValueError, match="cannot be written as JSON .*digits"):
    tool_calls.render_tool_call("f", {"n": 10**5000}, syntax=syntax)
