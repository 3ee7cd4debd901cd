"""The package's import graph, read from the source (every `import`, at module level or inside a function): no
circle, and layers depend downward only, `credit/` (jax only) <- the middle layer (models, sampling, scoring, envs,
rollout and the top-level modules) <- `train/`, `viz/` <- `cli.py`; inside the middle layer, the arrows its parts
may not draw (`MIDDLE_FORBIDDEN`)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = {"credit": 0, "train": 2, "viz": 2, "cli": 3}
"""Layer of each part of jaxcredit (the first name below `jaxcredit.`); every other part is layer 1."""


MIDDLE_FORBIDDEN = {
  # the model families, their layers, checkpoints and log-probs: what the rest runs, so it runs none of them
  "models": {"sampling", "scoring", "envs", "rollout"},
  # generation (the sampler, the vLLM engine) and the passes' scoring both run models, neither runs the other
  "sampling": {"scoring", "envs", "rollout"},
  "scoring": {"sampling", "envs", "rollout"},
  # environments are text in, text out: no model, sampler or scorer
  "envs": {"models", "sampling", "scoring", "rollout"},
  # the rollout loop drives a sampler it is handed and an environment: it imports no model or scorer
  "rollout": {"models", "sampling", "scoring"},
}
"""Middle-layer part -> the middle-layer parts it may not import (the top-level modules, `trajectory`, `sharding`,
`plain_text`, ..., are shared by all)."""

CLI_FORBIDDEN = {"sampling", "scoring", "rollout"}
"""The CLI reaches engines, scorers and the rollout loop through `train/` (its tables), never directly."""


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
  assert "jaxcredit.train.commands.trainer" in graph["jaxcredit.cli"]
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


def _part(module: str) -> str:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else ""


def _forbidden_arrows(graph: dict[str, set[str]]) -> list[str]:
  return [
    f"{m} -> {d}"
    for m, targets in graph.items()
    for d in sorted(targets)
    if _part(d) in MIDDLE_FORBIDDEN.get(_part(m), set()) or (_part(m) == "cli" and _part(d) in CLI_FORBIDDEN)
  ]


def test_the_middle_layers_parts_and_the_cli_draw_only_allowed_arrows():
  assert _forbidden_arrows(import_graph()) == []


def test_the_part_rules_see_the_arrows_that_were_drawn_before():
  """The two arrows the coarse layers let pass before issue 55: the teacher pass importing the sampler's log-probs
  (now `models.logprobs`) and the CLI importing the vLLM engine (now through `train.engines`)."""
  before = {
    "jaxcredit.scoring.teacher": {"jaxcredit.sampling.logprobs", "jaxcredit.trajectory"},
    "jaxcredit.cli": {"jaxcredit.sampling.vllm_engine", "jaxcredit.train.tables.engines"},
  }
  assert _forbidden_arrows(before) == [
    "jaxcredit.scoring.teacher -> jaxcredit.sampling.logprobs",
    "jaxcredit.cli -> jaxcredit.sampling.vllm_engine",
  ]
