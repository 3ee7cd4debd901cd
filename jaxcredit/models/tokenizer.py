"""Tokenizer and chat template without torch: from GGUF metadata or a Hugging Face tokenizer folder.

`ChatTokenizer.from_gguf` rebuilds the byte-level BPE that a GGUF describes (`tokenizer.ggml.tokens`,
`tokenizer.ggml.merges`) as a `tokenizers.Tokenizer`, with the pre-tokenizer that `tokenizer.ggml.pre` names
(the same one as the model's Hugging Face tokenizer.json) and the control tokens (`<|im_start|>`, ...) as special
added tokens, so that they encode to single ids. The chat template (`tokenizer.chat_template`) is rendered with
jinja2 in a sandboxed environment, as transformers renders it.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime
from typing import Any, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

# llama.cpp token types (tokenizer.ggml.token_type).
_CONTROL = 3
_USER_DEFINED = 4

_QWEN2_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
  r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level(use_regex: bool) -> pre_tokenizers.PreTokenizer:
  return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=use_regex)


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
  return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"), _byte_level(False)])


# tokenizer.ggml.pre -> the pre-tokenizer of that model family's Hugging Face tokenizer.json. SmolLM2's is
# Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)] (llama.cpp's "smollm"
# regexes: \p{N}, then GPT-2's); "gpt2"/"default" is GPT-2's plain ByteLevel.
_PRE_TOKENIZERS = {
  "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level(True)]),
  "gpt2": lambda: _byte_level(True),
  "default": lambda: _byte_level(True),
  "qwen2": lambda: _split_then_bytes(_QWEN2_SPLIT),
  "llama-bpe": lambda: _split_then_bytes(_LLAMA3_SPLIT),
  "llama3": lambda: _split_then_bytes(_LLAMA3_SPLIT),
}


def _raise_exception(message: str):
  from jinja2.exceptions import TemplateError

  raise TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
  return datetime.now().strftime(fmt)


def compile_chat_template(template: str):
  """A jinja2 template compiled the way transformers compiles chat templates (sandboxed, trim_blocks,
  lstrip_blocks, loop controls, `raise_exception`, `tojson` without ASCII escaping, `strftime_now`)."""
  from jinja2.ext import loopcontrols
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise_exception
  env.globals["strftime_now"] = _strftime_now
  return env.from_string(template)


class ChatTokenizer:
  """A `tokenizers.Tokenizer` plus the chat template and the special ids a sampler needs.

  Attributes:
    tokenizer: the underlying tokenizers.Tokenizer.
    chat_template: the jinja2 source, or None.
    eos_id, pad_id, bos_id: ids (bos_id may be None); pad_id falls back to eos_id.
    stop_ids: every id that ends a generation, eos_id first: generation_config.json's eos_token_id (an int or
      a list; Llama 3 Instruct lists three), a GGUF's tokenizer.ggml.eot_token_id / eom_token_id, and the special
      token the chat template closes an assistant message with. The sampler's stop_token_ids.
    vocab_size: number of ids including added tokens (can be below the model's embedding rows).
  """

  def __init__(
    self,
    tokenizer: Tokenizer,
    chat_template: str | None,
    *,
    eos_token: str,
    pad_token: str | None = None,
    bos_token: str | None = None,
    stop_ids: Sequence[int] = (),
  ):
    """Raises ValueError when a named special token is not in the vocabulary, or a stop id is not an id of it."""
    self.tokenizer = tokenizer
    self.chat_template = chat_template
    self._template = compile_chat_template(chat_template) if chat_template else None
    self.eos_token, self.pad_token, self.bos_token = eos_token, pad_token or eos_token, bos_token
    self.eos_id = self.token_id(eos_token)
    self.pad_id = self.token_id(self.pad_token)
    self.bos_id = self.token_id(bos_token) if bos_token is not None else None
    for i in stop_ids:
      if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.vocab_size:
        raise ValueError(f"stop id {i!r} is not an id of this vocabulary (0 .. {self.vocab_size - 1})")
    ids = [self.eos_id, *stop_ids]
    end_of_turn = self._template_end_of_turn()
    if end_of_turn is not None:
      ids.append(end_of_turn)
    self.stop_ids: tuple[int, ...] = tuple(dict.fromkeys(ids))

  def _template_end_of_turn(self) -> int | None:
    """The first special token the chat template writes after an assistant message's content (ChatML's
    <|im_end|>, Llama 3's <|eot_id|>), or None (no template, or one that cannot render such a message)."""
    if self._template is None:
      return None
    marker = "\u2063END\u2063"
    try:
      text = self.apply_chat_template([{"role": "user", "content": "u"}, {"role": "assistant", "content": marker}])
    except Exception:  # noqa: BLE001 - a template may insist on other conversations; the eos is then the stop
      return None
    if marker not in text:
      return None
    special = {t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special}
    for i in self.encode(text.split(marker, 1)[1]):
      if self.tokenizer.id_to_token(i) in special:
        return i
    return None

  @property
  def vocab_size(self) -> int:
    return self.tokenizer.get_vocab_size(with_added_tokens=True)

  def token_table(self) -> list[str]:
    """Every id's token string, in id order (added tokens included; "" for an id the table skips)."""
    table = [""] * self.vocab_size
    for token, i in self.tokenizer.get_vocab(with_added_tokens=True).items():
      if 0 <= i < len(table):
        table[i] = token
    return table

  def content_digest(self) -> str:
    """sha256 (hex) of the token table and the eos / pad / bos tokens: two tokenizers with the same digest give the
    same ids for the same text. Compared wherever two models meet (eval --model, teacher and summariser
    checkpoints), where a vocabulary size alone let Llama-2's 32,000 tokens pass for Mistral-v0.1's (issue 54)."""
    h = hashlib.sha256()
    for token in self.token_table():
      h.update(token.encode("utf-8", "surrogatepass") + b"\x00")
    h.update(f"{self.eos_token}\x00{self.pad_token}\x00{self.bos_token}".encode())
    return h.hexdigest()

  def token_id(self, token: str) -> int:
    """The id of one token string (e.g. "<|im_end|>"). Raises ValueError if it is not a single token."""
    token_id = self.tokenizer.token_to_id(token)
    if token_id is None:
      raise ValueError(f"{token!r} is not a token of this vocabulary")
    return token_id

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`; special tokens written in the text map to their ids; no BOS/EOS is added."""
    return self.tokenizer.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    """The text of `ids` (special tokens kept unless skip_special_tokens)."""
    return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def apply_chat_template(
    self,
    messages: Sequence[dict[str, Any]],
    add_generation_prompt: bool = False,
    tools: Sequence[dict[str, Any]] | None = None,
    **template_kwargs,
  ) -> str:
    """Renders `messages` ([{"role": ..., "content": ...}, ...]) with the chat template, as a string.

    `tools` and any extra keyword (e.g. enable_thinking for Qwen3) are passed to the template.

    Raises:
      ValueError: when the tokenizer has no chat template.
      jinja2.TemplateError: when the template rejects the messages (its raise_exception).
    """
    if self._template is None:
      raise ValueError("this tokenizer has no chat template")
    return self._template.render(
      messages=list(messages),
      add_generation_prompt=add_generation_prompt,
      tools=tools,
      bos_token=self.bos_token or "",
      eos_token=self.eos_token,
      pad_token=self.pad_token,
      **template_kwargs,
    )

  @classmethod
  def from_gguf(cls, path) -> ChatTokenizer:
    """Builds the tokenizer from a GGUF file's `tokenizer.*` metadata (path, or a `gguf.GGUFReader`).

    Raises:
      FileNotFoundError: when path does not exist.
      ValueError: for a tokenizer model other than byte-level BPE ("gpt2"), a `tokenizer.ggml.pre` without
        a known pre-tokenizer, or missing tokens/merges.
    """
    from jaxcredit.models.gguf_loader import open_gguf

    reader = open_gguf(path)

    def field(key, default=None):
      f = reader.fields.get(key)
      return default if f is None else f.contents()

    model = field("tokenizer.ggml.model")
    if model != "gpt2":
      raise ValueError(f"tokenizer.ggml.model {model!r} is not supported; only byte-level BPE ('gpt2')")
    pre = field("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
      raise ValueError(f"tokenizer.ggml.pre {pre!r} has no known pre-tokenizer; known: {sorted(_PRE_TOKENIZERS)}")
    tokens = field("tokenizer.ggml.tokens")
    merges = field("tokenizer.ggml.merges")
    if not tokens or not merges:
      raise ValueError("GGUF metadata lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
    token_types = field("tokenizer.ggml.token_type") or [1] * len(tokens)

    bpe = models.BPE(
      vocab={t: i for i, t in enumerate(tokens)},
      merges=[tuple(m.split(" ", 1)) for m in merges],
      fuse_unk=False,
      byte_fallback=False,
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
      [AddedToken(t, special=True, normalized=False) for t, kind in zip(tokens, token_types) if kind == _CONTROL]
    )
    user_defined = [
      AddedToken(t, special=False, normalized=False) for t, kind in zip(tokens, token_types) if kind == _USER_DEFINED
    ]
    if user_defined:
      tokenizer.add_tokens(user_defined)

    def special(key):
      token_id = field(f"tokenizer.ggml.{key}_token_id")
      return None if token_id is None else tokens[int(token_id)]

    eos = special("eos")
    if eos is None:
      raise ValueError("GGUF metadata lacks tokenizer.ggml.eos_token_id")
    # llama.cpp's end-of-turn and end-of-message ids (Llama 3's <|eot_id|> and <|eom_id|>) also end a generation.
    stop_ids = [
      int(field(f"tokenizer.ggml.{k}_token_id"))
      for k in ("eot", "eom")
      if field(f"tokenizer.ggml.{k}_token_id") is not None
    ]
    return cls(
      tokenizer,
      field("tokenizer.chat_template"),
      eos_token=eos,
      pad_token=special("padding"),
      bos_token=special("bos"),
      stop_ids=stop_ids,
    )

  @classmethod
  def from_pretrained(
    cls, folder: str | os.PathLike, generation_config: str | os.PathLike | None = None
  ) -> ChatTokenizer:
    """Loads a Hugging Face tokenizer folder: tokenizer.json, and tokenizer_config.json's chat_template and
    eos/pad/bos tokens (chat_template.jinja when present overrides the config's template), plus the stop ids of
    tokenizer_config.json's `stop_token_ids` (written by `save_pretrained`) and of generation_config.json's
    `eos_token_id` (an int or a list; the file is `generation_config`, else folder/generation_config.json).

    Raises:
      FileNotFoundError: when tokenizer.json is missing.
      ValueError: when no eos_token is configured, or (naming the file and field) an eos_token_id or stop id that
        is not an int in the vocabulary.
    """
    folder = os.fspath(folder)
    tokenizer_file = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(tokenizer_file):
      raise FileNotFoundError(f"no tokenizer.json in {folder}")
    tokenizer = Tokenizer.from_file(tokenizer_file)
    config = {}
    config_file = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(config_file):
      with open(config_file, encoding="utf-8") as f:
        config = json.load(f)
    template = config.get("chat_template")
    template_file = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(template_file):
      with open(template_file, encoding="utf-8") as f:
        template = f.read()

    def token(key):
      value = config.get(key)
      return value.get("content") if isinstance(value, dict) else value

    if token("eos_token") is None:
      raise ValueError(f"{config_file} sets no eos_token")
    stop_ids = _id_list(config.get("stop_token_ids"), f"{config_file}: stop_token_ids", tokenizer)
    generation_config = generation_config or os.path.join(folder, "generation_config.json")
    if os.path.isfile(generation_config):
      with open(generation_config, encoding="utf-8") as f:
        eos = json.load(f).get("eos_token_id")
      stop_ids += _id_list(eos, f"{os.fspath(generation_config)}: eos_token_id", tokenizer)
    return cls(
      tokenizer,
      template,
      eos_token=token("eos_token"),
      pad_token=token("pad_token"),
      bos_token=token("bos_token"),
      stop_ids=stop_ids,
    )

  def save_pretrained(self, folder: str | os.PathLike) -> None:
    """Writes tokenizer.json and tokenizer_config.json so that `from_pretrained(folder)` restores this."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    self.tokenizer.save(os.path.join(folder, "tokenizer.json"))
    config = {
      "chat_template": self.chat_template,
      "eos_token": self.eos_token,
      "pad_token": self.pad_token,
      "bos_token": self.bos_token,
    }
    # The ids beyond eos (a GGUF's end-of-turn ids, generation_config.json's); written even when empty, so that a
    # folder written before stop ids were kept is told apart (`load_tokenizer` rebuilds such a GGUF cache).
    config["stop_token_ids"] = list(self.stop_ids[1:])
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
      json.dump(config, f, ensure_ascii=False, indent=1)


def _id_list(value: Any, where: str, tokenizer: Tokenizer) -> list[int]:
  """An int or a list of ints (None: []), each an id of the tokenizer's vocabulary.

  Raises:
    ValueError: naming `where` (file: field) and the bad value."""
  if value is None:
    return []
  values = value if isinstance(value, list) else [value]
  vocab = tokenizer.get_vocab_size(with_added_tokens=True)
  for i in values:
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab:
      raise ValueError(f"{where} must be an id or a list of ids in [0, {vocab}), got {i!r} (in {value!r})")
  return list(values)


def tokenizer_mismatch(a: ChatTokenizer, b: ChatTokenizer) -> str | None:
  """None when `a` and `b` have the same content (`ChatTokenizer.content_digest`), else what differs in words: the
  sizes, or the first id whose token differs ("id 5: 'ab' here, 'c' there"), or the special tokens."""
  if a.content_digest() == b.content_digest():
    return None
  if a.vocab_size != b.vocab_size:
    return f"{a.vocab_size} tokens against {b.vocab_size}"
  for i, (x, y) in enumerate(zip(a.token_table(), b.token_table())):
    if x != y:
      return f"the same size ({a.vocab_size}) but other tokens: id {i} is {x!r} against {y!r}"
  return f"other special tokens: eos/pad/bos {a.eos_token!r}/{a.pad_token!r}/{a.bos_token!r} against " + (
    f"{b.eos_token!r}/{b.pad_token!r}/{b.bos_token!r}"
  )
