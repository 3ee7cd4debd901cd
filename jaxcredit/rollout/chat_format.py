"""Token-level pieces of a chat template, derived once by rendering it with sentinels.

Rollouts are token-in, token-out: earlier turns are never re-rendered from text. What the template puts
between messages (closing an assistant message, opening a tool message, the generation prompt) is found
by rendering a conversation whose contents are sentinels and cutting the text between them.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

from jaxcredit.plain_text import encode_chat, encode_with_plain_spans  # noqa: F401 - encode_chat re-exported

_ASSISTANT = "\u2063ASSISTANT\u2063"
_TOOL = "\u2063TOOL\u2063"
_USER = "\u2063USER\u2063"
_USER2 = "\u2063NEXTUSER\u2063"


class ChatTokenizerLike(Protocol):
  eos_id: int

  def encode(self, text: str) -> list[int]: ...

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

  def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool) -> str: ...


@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """Text around an observation (a tool message or the next user message), cut from the chat template.

  Attributes:
    after_assistant: text from the end of an assistant message's content to the start of the tool
      message's content (e.g. "<|im_end|>\\n<|im_start|>tool\\n").
    after_tool: text from the end of the tool content through the next generation prompt
      (e.g. "<|im_end|>\\n<|im_start|>assistant\\n").
    eos_text: the text of the end-of-message token; when the policy emitted it itself, it is not
      appended again.
    before_user: text from the end of an assistant message's content to the start of a user message's content.
    after_user: text from the end of that user content through the next generation prompt.
  """

  after_assistant: str
  after_tool: str
  eos_text: str
  before_user: str = ""
  after_user: str = ""

  @classmethod
  def from_tokenizer(cls, tok: ChatTokenizerLike) -> "ChatFormat":
    after_assistant, after_tool = _around_message(
      tok,
      {"role": "tool", "content": _TOOL},
      "the chat template does not render assistant and tool message contents verbatim; "
      "token-in/token-out rollouts need a template that does",
    )
    before_user, after_user = _around_message(
      tok,
      {"role": "user", "content": _USER2},
      "the chat template does not render a user message after an assistant message verbatim; "
      "multi-request sessions need a template that does",
    )
    return cls(
      after_assistant=after_assistant,
      after_tool=after_tool,
      eos_text=tok.decode([tok.eos_id]),
      before_user=before_user,
      after_user=after_user,
    )

  def _scaffold(self, role: str) -> tuple[str, str]:
    if role == "tool":
      return self.after_assistant, self.after_tool
    if role == "user":
      return self.before_user, self.after_user
    raise ValueError(f"an observation's role must be 'tool' or 'user', got {role!r}")

  def observation_text(self, content: str, policy_emitted_eos: bool, role: str = "tool") -> str:
    """Text appended after an assistant turn: close it, the tool (or user) message, the next generation prompt."""
    head, tail = self._scaffold(role)
    if policy_emitted_eos and head.startswith(self.eos_text):
      head = head[len(self.eos_text) :]
    return head + content + tail

  def observation_ids(self, tok, content: str, policy_emitted_eos: bool, role: str = "tool") -> list[int]:
    """`observation_text` tokenized, with `content` (environment text) read as plain text: only the template's
    scaffolding makes control tokens (`jaxcredit.plain_text`).

    Raises:
      ValueError: for a role other than "tool" or "user".
    """
    head, tail = self._scaffold(role)
    if policy_emitted_eos and head.startswith(self.eos_text):
      head = head[len(self.eos_text) :]
    return encode_with_plain_spans(tok, head + content + tail, [(len(head), len(head) + len(content))])


def _around_message(tok: ChatTokenizerLike, message: dict, error: str) -> tuple[str, str]:
  """(text from the end of an assistant message's content to the start of `message`'s content, text from the end of
  that content through the next generation prompt), cut from the template's rendering of [system, user, assistant,
  `message`].

  Raises:
    ValueError: `error`, when the assistant content or `message`'s content is not rendered verbatim.
  """
  msgs = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": _USER},
    {"role": "assistant", "content": _ASSISTANT},
    message,
  ]
  text = tok.apply_chat_template(msgs, add_generation_prompt=True)
  content = message["content"]
  if _ASSISTANT not in text or content not in text:
    raise ValueError(error)
  a_end = text.index(_ASSISTANT) + len(_ASSISTANT)
  start = text.index(content)
  return text[a_end:start], text[start + len(content) :]
