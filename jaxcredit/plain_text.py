"""Text from an environment or a dataset is encoded as plain text: it never becomes a control token.

Observations, user messages, tool results, documents and teacher contexts may hold strings such as "<|im_end|>"
(an echoed tool name, a web page). Encoded as ordinary text they cannot end a message or open a role; only the chat
template's own scaffolding produces control tokens.

A leaf module (tokenizers only). Tokenizer-like objects: a `jaxcredit.models.ChatTokenizer` (anything whose
`.tokenizer` is a `tokenizers.Tokenizer`) is handled exactly; another object is used through its own
`encode_plain` when it has one, else through `encode` (its control-token handling is then its own).
"""

from __future__ import annotations

import re
import weakref
from typing import Any, Mapping, Sequence

_PLAIN_TOKENIZERS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _hf_tokenizer(tok):
  """The underlying `tokenizers.Tokenizer` of a `ChatTokenizer`, or None for another tokenizer-like object."""
  try:
    from tokenizers import Tokenizer
  except ImportError:  # pragma: no cover - tokenizers is a dependency
    return None
  hf = getattr(tok, "tokenizer", None)
  return hf if isinstance(hf, Tokenizer) else None


def _plain_tokenizer(tok, hf):
  """A copy of `hf` that encodes control-token strings as plain text (cached per tokenizer object)."""
  try:
    plain = _PLAIN_TOKENIZERS.get(tok)
  except TypeError:
    plain = None
  if plain is None:
    from tokenizers import Tokenizer

    plain = Tokenizer.from_str(hf.to_str())
    plain.encode_special_tokens = True
    try:
      _PLAIN_TOKENIZERS[tok] = plain
    except TypeError:
      pass
  return plain


def clean_text(text: str) -> str:
  """`text` with lone UTF-16 surrogates (which no tokenizer accepts; a tool may echo one a model wrote as a JSON
  escape) replaced by U+FFFD; surrogate pairs become their character. Valid text is returned unchanged."""
  try:
    text.encode("utf-8")
    return text
  except UnicodeEncodeError:
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def encode_plain(tok, text: str) -> list[int]:
  """Token ids of `text` read as plain text: a control-token string in it (e.g. "<|im_end|>") is split into
  ordinary tokens instead of mapping to the control token's id. No BOS/EOS is added."""
  hf = _hf_tokenizer(tok)
  if hf is not None:
    return list(_plain_tokenizer(tok, hf).encode(text, add_special_tokens=False).ids)
  if hasattr(tok, "encode_plain"):
    return list(tok.encode_plain(text))
  return list(tok.encode(text))


def encode_with_plain_spans(tok, text: str, spans: Sequence[tuple[int, int]]) -> list[int]:
  """tok.encode(text), except that each text[start:end] of `spans` is read as plain text.

  The tokenizer splits a text at control tokens and encodes each piece between them on its own; this does the
  same, but a control-token string that overlaps a span is not matched, so the piece that holds a span (with the text
  around it up to the nearest real control tokens) is encoded as plain text. Without control-token strings in the
  spans the ids equal tok.encode(text).

  Args:
    tok: a tokenizer-like object (see the module notes).
    text: the whole text, e.g. a rendered chat.
    spans: sorted, non-overlapping (start, end) character ranges of environment or dataset text.

  Raises:
    ValueError: for spans out of range, unsorted or overlapping.
  """
  prev = 0
  for start, end in spans:
    if not prev <= start <= end <= len(text):
      raise ValueError(
        f"plain-text spans must be sorted, non-overlapping and inside the text; got {list(spans)} "
        f"for a text of {len(text)} characters"
      )
    prev = end
  hf = _hf_tokenizer(tok)
  if hf is None:  # a tokenizer-like object without a `tokenizers.Tokenizer`: its own encode, unprotected
    return list(tok.encode(text))
  specials = sorted(
    {t.content for t in hf.get_added_tokens_decoder().values() if t.special and t.content}, key=len, reverse=True
  )
  pattern = re.compile("|".join(re.escape(s) for s in specials)) if specials else None
  parts: list = []
  pos = 0
  if pattern is not None:
    for m in pattern.finditer(text):
      if any(m.start() < end and start < m.end() for start, end in spans):
        continue  # a control-token string inside environment text stays text
      parts.append(text[pos : m.start()])
      parts.append(int(hf.token_to_id(m.group())))
      pos = m.end()
  parts.append(text[pos:])
  plain = _plain_tokenizer(tok, hf)
  ids: list[int] = []
  for part in parts:
    if isinstance(part, int):
      ids.append(part)
    elif part:
      ids.extend(plain.encode(part, add_special_tokens=False).ids)
  return ids


_MESSAGE = "\u2063MSG{}\u2063"


def encode_chat(tok, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> list[int]:
  """The chat rendered by the template and tokenized, with every message's content read as plain text.

  Contents come from datasets and environments: a control-token string in one stays text. The template is rendered
  with a sentinel in place of each content, so the contents' character spans are known exactly; a template that
  does not render a content verbatim (it changed the sentinel) is rendered and encoded as is, unprotected.
  """
  probe = [dict(m, content=_MESSAGE.format(i)) for i, m in enumerate(messages)]
  text = tok.apply_chat_template(probe, add_generation_prompt=add_generation_prompt)
  out, spans, pos = [], [], 0
  for i, m in enumerate(messages):
    at = text.find(_MESSAGE.format(i), pos)
    if at < 0:
      return list(
        tok.encode(tok.apply_chat_template([dict(x) for x in messages], add_generation_prompt=add_generation_prompt))
      )
    out.append(text[pos:at])
    start = sum(len(x) for x in out)
    content = clean_text(str(m.get("content", "")))
    out.append(content)
    spans.append((start, start + len(content)))
    pos = at + len(_MESSAGE.format(i))
  out.append(text[pos:])
  return encode_with_plain_spans(tok, "".join(out), spans)
