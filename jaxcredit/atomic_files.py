"""Writing a file whole or not at all: the text goes to a temporary file beside it, then replaces it in one rename,
so a reader (or a run killed mid-write) never sees half a file. The temporary name holds the process id, so processes
writing the same file (hosts of a pod sharing a folder) do not write into each other's."""

from __future__ import annotations

import json
import os
from typing import Any


def write_text_atomic(path: str, text: str) -> None:
  """Writes `text` (UTF-8) to `path`, replacing it whole."""
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)


def write_json_atomic(path: str, obj: Any, *, indent: int | None = 1, sort_keys: bool = False) -> None:
  """Writes `obj` as JSON (`indent`, `sort_keys`, then a newline) to `path`, replacing it whole."""
  write_text_atomic(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n")
