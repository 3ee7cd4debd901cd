"""Token-level pieces of a chat template, derived once by rendering it with sentinels.

Rollouts are token-in, token-out: earlier turns are never re-rendered from text. What the template puts
between messages (closing an assistant message, opening a tool message, the generation prompt) is found
by rendering a conversation whose contents are sentinels and cutting the text between them.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

_ASSISTANT = "\u2063ASSISTANT\u2063"
_TOOL = "\u2063TOOL\u2063"
_USER = "\u2063USER\u2063"


class ChatTokenizerLike(Protocol):
  eos_id: int

  def encode(self, text: str) -> list[int]: ...

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

  def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool) -> str: ...


@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """Text around a tool observation, cut from the chat template.

  Attributes:
    after_assistant: text from the end of an assistant message's content to the start of the tool
      message's content (e.g. "<|im_end|>\\n<|im_start|>tool\\n").
    after_tool: text from the end of the tool content through the next generation prompt
      (e.g. "<|im_end|>\\n<|im_start|>assistant\\n").
    eos_text: the text of the end-of-message token; when the policy emitted it itself, it is not
      appended again.
  """

  after_assistant: str
  after_tool: str
  eos_text: str

  @classmethod
  def from_tokenizer(cls, tok: ChatTokenizerLike, tool_role: str = "tool") -> "ChatFormat":
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": _USER},
            {"role": "assistant", "content": _ASSISTANT}, {"role": "tool", "content": _TOOL}]
    if tool_role != "tool":
      msgs[-1]["role"] = tool_role
    text = tok.apply_chat_template(msgs, add_generation_prompt=True)
    if _ASSISTANT not in text or _TOOL not in text:
      raise ValueError("the chat template does not render assistant and tool message contents verbatim; "
                       "token-in/token-out rollouts need a template that does")
    a_end = text.index(_ASSISTANT) + len(_ASSISTANT)
    t_start = text.index(_TOOL)
    return cls(after_assistant=text[a_end:t_start], after_tool=text[t_start + len(_TOOL):],
               eos_text=tok.decode([tok.eos_id]))

  def observation_text(self, content: str, policy_emitted_eos: bool) -> str:
    """Text appended after an assistant turn: close it, the tool message, the next generation prompt."""
    head = self.after_assistant
    if policy_emitted_eos and head.startswith(self.eos_text):
      head = head[len(self.eos_text):]
    return head + content + self.after_tool

  def closing_text(self, policy_emitted_eos: bool) -> str:
    """Text that closes a final assistant message (used in demonstrations)."""
    return "" if policy_emitted_eos else self.eos_text
