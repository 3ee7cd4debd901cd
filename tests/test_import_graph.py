"""The package's import graph, read from the source (every `import`, at module level or inside a function): no
circle, and layers depend downward only, `credit/` (jax only) <- the middle layer (models, sampling, scoring, envs,
rollout and the top-level modules) <- `train/`, `viz/` <- `cli.py`."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = {"credit": 0, "train": 2, "viz": 2, "cli": 3}
"""Layer of each part of jaxcredit (the first name below `jaxcredit.`); every other part is layer 1."""


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in (ROOT / "jaxcredit").rglob("*.py"):
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    out[name.removesuffix(".__init__")] = path
  return out


def import_graph() -> dict[str, set[str]]:
  """module -> the jaxcredit modules it imports (an imported name that is not a module counts as its module)."""
  modules = _modules()

  def owner(name: str) -> str | None:
    while name and name not in modules:
      name = name.rpartition(".")[0]
    return name or None

  graph = {m: set() for m in modules}
  for m, path in modules.items():
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        names = [f"{node.module}.{a.name}" for a in node.names]
      else:
        continue
      for name in names:
        target = owner(name) if name.startswith("jaxcredit") else None
        if target and target != m:
          graph[m].add(target)
  return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def _layer(module: str) -> int:
  parts = module.split(".")
  return LAYERS.get(parts[1], 1) if len(parts) > 1 else 1


def test_the_import_graph_sees_the_known_edges():
  graph = import_graph()
  assert "jaxcredit.credit.outcome" in graph["jaxcredit.credit"]
  assert "jaxcredit.train.trainer" in graph["jaxcredit.cli"]
  assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle():
  assert _circles(import_graph()) == []


def test_layers_depend_downward_only():
  upward = [
    f"{m} -> {d}"
    for m, targets in import_graph().items()
    for d in sorted(targets)
    if _layer(d) > _layer(m) or (_layer(m) == 0 and _layer(d) != 0)
  ]
  assert upward == []
