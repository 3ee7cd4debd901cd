"""What `jaxcredit train --config C --help` prints, and the one-line message for an unknown config key.

The descriptions are the comments on the lines that set each key (`c.model.remat = False  # rematerialise ...`) in
the shared base config (`jaxcredit/train/config.py`) and in the experiment file; the experiment file's comment wins.
A method's knobs (`credit.<method>.<knob>`) are described by the Args sections of the credit functions' docstrings,
where the knobs get their names.
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
from typing import Any, Iterator

import ml_collections

_SETS_KEY = re.compile(r"^\s*c\.([A-Za-z_][\w.]*)\s*=[^#]*#\s*(.+?)\s*$")
_SETS_KEY_BARE = re.compile(r"^\s*c\.([A-Za-z_][\w.]*)\s*=[^#]*$")
_COMMENT_LINE = re.compile(r"^\s*#\s?(.*?)\s*$")
_BASE_CONFIG = os.path.join(os.path.dirname(__file__), "config.py")
_MAX_VALUE_CHARS = 60
_MAX_ALIGN = 52
_ARG_LINE = re.compile(r"^  ([A-Za-z_][\w]*(?:, [A-Za-z_][\w]*)*): (.+)$")


def config_items(config: ml_collections.ConfigDict, prefix: str = "") -> Iterator[tuple[str, Any]]:
  """(dotted key, value) for every leaf of `config`, in the config's own order (nodes are walked, not listed)."""
  for name, value in config.items():
    key = f"{prefix}{name}"
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      yield from config_items(ml_collections.ConfigDict(value) if isinstance(value, dict) else value, key + ".")
    else:
      yield key, value


def config_keys(config: ml_collections.ConfigDict) -> list[str]:
  """Every dotted key a `--config.KEY=value` override may name: the leaves and the nodes above them."""
  keys: list[str] = []
  for key, _ in config_items(config):
    parts = key.split(".")
    for i in range(1, len(parts)):
      node = ".".join(parts[:i])
      if node not in keys:
        keys.append(node)
    keys.append(key)
  return keys


def key_descriptions(*paths: str) -> dict[str, str]:
  """dotted key -> the comment on the line that sets it, else the first sentence of the comment lines just above it,
  read from Python config files (later files win).

  Files that cannot be read are skipped: the help still lists every key and value."""
  out: dict[str, str] = {}
  for path in (_BASE_CONFIG, *paths):
    try:
      with open(path) as f:
        lines = f.readlines()
    except OSError:
      continue
    block: list[str] = []  # the comment lines just above the current line
    for line in lines:
      m = _SETS_KEY.match(line)
      if m:
        out[m.group(1)] = m.group(2)
      elif (bare := _SETS_KEY_BARE.match(line)) and block:
        out[bare.group(1)] = _first_sentence(" ".join(block))
      comment = _COMMENT_LINE.match(line)
      block = block + [comment.group(1)] if comment else []
  return out


def _first_sentence(text: str) -> str:
  """The comment block's first sentence (up to a '. ' outside parentheses), at most 160 characters."""
  depth, end = 0, len(text)
  for i, ch in enumerate(text):
    depth += (ch == "(") - (ch == ")")
    if depth == 0 and ch == "." and (i + 1 == len(text) or text[i + 1] == " "):
      end = i
      break
  sentence = text[:end]
  return sentence if len(sentence) <= 160 else sentence[:157] + "..."


def knob_descriptions() -> dict[tuple[str, str], str]:
  """(method, knob) -> the first line describing `knob` in the Args of a `jaxcredit.credit` function, preferring
  the method's own functions (names starting with the method's name) and skipping "as <other function>" lines."""
  import jaxcredit.credit as credit

  found: dict[tuple[str, str], str] = {}
  functions = [(n, f) for n, f in vars(credit).items() if inspect.isfunction(f) and not n.startswith("_")]
  for fn_name, fn in functions:
    doc = inspect.getdoc(fn) or ""
    if "Args:" not in doc:
      continue
    args_block = doc.split("Args:", 1)[1].split("\n\n", 1)[0]
    method = fn_name.split("_", 1)[0]
    for line in args_block.splitlines():
      m = _ARG_LINE.match(line)
      if not m or m.group(2).startswith("as "):
        continue
      for name in m.group(1).split(", "):
        found.setdefault((method, name), m.group(2).rstrip())
        found.setdefault(("*", name), m.group(2).rstrip())
  return found


def _show(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 3] + "..."


def describe_config(config: ml_collections.ConfigDict, config_file: str | None = None) -> str:
  """Every key of `config` with its value and, where its config file comments it, a one-line description.

  Args:
    config: the loaded config (overrides applied).
    config_file: the experiment file it came from (`configs/X.py`), for its comments.

  Returns:
    One line per key, `key = value  # description`, values as Python literals cut to 60 characters.
  """
  descriptions = key_descriptions(*([config_file] if config_file else []))
  knobs = knob_descriptions()

  def describe(key: str) -> str:
    if key in descriptions:
      return descriptions[key]
    parts = key.split(".")
    if len(parts) == 3 and parts[0] == "credit":
      return knobs.get((parts[1], parts[2])) or knobs.get(("*", parts[2]), "")
    return ""

  rows = [(key, _show(value), describe(key)) for key, value in config_items(config)]
  width = min(max((len(k) + len(v) + 3 for k, v, _ in rows), default=0), _MAX_ALIGN)
  lines = []
  for key, value, text in rows:
    left = f"{key} = {value}"
    lines.append(f"{left:{width}s}  # {text}" if text else left)
  return "\n".join(lines)


def override_keys(args: list[str]) -> list[str]:
  """The dotted keys named by `--config.KEY=value` / `--config.KEY value` arguments, in order."""
  keys = []
  for a in args:
    if a.startswith("--config."):
      keys.append(a[len("--config.") :].split("=", 1)[0])
  return keys


# Keys that were renamed or removed, with what replaces them (checked before the closest-spelling guess).
RENAMED_KEYS = {
  "credit.trace.beta": (
    "TRACE follows its paper since 2026-12-04: beta is now credit.trace.alpha_turn (default 0.2); v1's TRACE is "
    "value=raw_delta, td_horizon=1, terminal_scale=0, std=sample, dense_norm=group_rms, gold_reduce=sum"
  ),
  "credit.trace.scale": "TRACE's outcome term follows its paper since 2026-12-04: credit.trace.std (population | sample)",
}


def unknown_key_message(config: ml_collections.ConfigDict, args: list[str]) -> str | None:
  """One line naming the first override key that `config` does not have and the closest existing key (or, for a
  renamed key, what replaces it); None when every override names an existing key."""
  known = config_keys(config)
  for key in override_keys(args):
    if key in known:
      continue
    if key in RENAMED_KEYS:
      return f"unknown config key {key!r}: {RENAMED_KEYS[key]}"
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if not close:  # a typo in one component of a long key: compare the last component within its node
      node, _, leaf = key.rpartition(".")
      siblings = [k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == node]
      near = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
      close = [f"{node}.{near[0]}" if node else near[0]] if near else []
    hint = f"; the closest key is {close[0]!r}" if close else "; `--help` with the same --config lists every key"
    return f"unknown config key {key!r}{hint}"
  return None
