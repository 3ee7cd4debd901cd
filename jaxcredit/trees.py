"""Nested dicts as flat {path: leaf} dicts and back: parameter trees ('/'-joined paths such as "layers/wq", as
checkpoints and weight files name them) and configs ('.'-joined, as `--config.a.b` names a key).

Plain Python with no imports, so every layer (credit, models, envs, sampling, train, viz) may use it.
"""

from __future__ import annotations

from typing import Any, Mapping


def _check_sep(sep: Any) -> None:
  if not isinstance(sep, str) or not sep:
    raise ValueError(f"sep must be a non-empty string, got {sep!r}")


def flatten(tree: Mapping[Any, Any], sep: str = "/") -> dict[str, Any]:
  """The leaves of a nested mapping keyed by their paths.

  Args:
    tree: a mapping whose values are leaves or mappings (any `Mapping` nests; everything else is a leaf, lists
      included). Keys are written with `str`.
    sep: what joins the keys of a path.

  Returns:
    {path: leaf} in the tree's insertion order, depth first. An empty mapping holds no leaf and leaves no entry.

  Raises:
    ValueError: two leaves with one path (a key holding `sep` where a nested path is the same, or keys equal as text
      such as 1 and "1"), naming the path; or an empty `sep`.
  """
  _check_sep(sep)
  out: dict[str, Any] = {}

  def walk(prefix: str, node: Mapping[Any, Any]) -> None:
    for key, value in node.items():
      path = f"{prefix}{sep}{key}" if prefix else str(key)
      if isinstance(value, Mapping):
        walk(path, value)
      elif path in out:
        raise ValueError(f"two leaves have the path {path!r} (a key holds {sep!r}, or two keys read the same)")
      else:
        out[path] = value

  walk("", tree)
  return out


def unflatten(flat: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
  """The nested dict of a {path: leaf} mapping: the inverse of `flatten` (for trees without empty mappings).

  Args:
    flat: {path: leaf}, each path one or more non-empty keys joined by `sep`.
    sep: what joins the keys of a path.

  Returns:
    Nested dicts in the paths' first-seen order.

  Raises:
    ValueError: a path that is not a str or has an empty key, or paths that do not nest (one is a leaf where another goes on through
      it), naming the paths; or an empty `sep`.
  """
  _check_sep(sep)
  tree: dict[str, Any] = {}
  made: dict[int, str] = {}  # id of each dict made here -> the first path through it (a leaf may be a dict too)
  for path, value in flat.items():
    if not isinstance(path, str):
      raise ValueError(f"path {path!r} is a {type(path).__name__}, not a str")
    *parents, leaf = parts = path.split(sep)
    if not all(parts):
      raise ValueError(f"path {path!r} has an empty key (split on {sep!r})")
    node = tree
    for i, part in enumerate(parents):
      if part not in node:
        node[part] = {}
        made[id(node[part])] = path
      elif id(node[part]) not in made:
        raise ValueError(
          f"path {path!r} goes through {sep.join(parts[: i + 1])!r}, but {sep.join(parts[: i + 1])!r} is a leaf"
        )
      node = node[part]
    if leaf in node:  # paths are distinct, so what is there is a dict made for a longer path
      raise ValueError(f"path {path!r} is a leaf, but {path!r} already holds {made[id(node[leaf])]!r}")
    node[leaf] = value
  return tree
