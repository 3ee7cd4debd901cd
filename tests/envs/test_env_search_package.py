"""The search environment as a package (issue 33): modules of one job each, under 900 lines, importing downward only,
and every name of the old single module still reachable as `jaxcredit.envs.search.X`."""

import ast
import importlib
import pathlib

import pytest

import jaxcredit.envs

ENVS_DIR = pathlib.Path(jaxcredit.envs.__file__).parent
SEARCH_DIR = ENVS_DIR / "search"
MAX_LINES = 900

# The package modules each may import (the direction is data <- index, browsecomp, world <- env <- __init__).
ALLOWED_IMPORTS = {
  "data": set(),
  "index": {"data"},
  "browsecomp": {"data"},
  "world": {"data"},
  "env": {"data", "index", "browsecomp", "world"},
  "__init__": {"data", "index", "browsecomp", "world", "env"},
}

# Every module-level name the single-file jaxcredit/envs/search.py defined and something outside it reads: the public
# ones, plus the private ones that tests/envs/test_env_search.py and benchmarks/testbed_compare.py use.
OLD_NAMES = (
  "TOP_K SNIPPET_CHARS MAX_OUTPUT_CHARS MAX_TOOL_CALLS NUM_GENERATED EVAL_SIZE MAX_HOPS MAX_QUERY_CHARS "
  "PRIVILEGED_CHARS SEARCH_DESCRIPTION OPEN_DESCRIPTION SEARCH_ONLY_DESCRIPTION SYSTEM_PROMPT SEARCH_ONLY_PROMPT "
  "Document Hop SearchTask normalize_answer answer_matches SearchIndex StepResult snippet tool_schemas SearchEnv "
  "initial_messages gold_answer_text privileged_info demonstration derive_title load_corpus load_queries "
  "make_fictional_corpus split_tasks make_tasks CONFIG_DEFAULTS env_spec "
  "_COMPANY_KINDS _MONTHS _WORK_KINDS _TEMPLATE_WORDS _Names"
).split()


def _package_imports(path: pathlib.Path) -> set[str]:
  """The `jaxcredit.envs.search.<module>` names that a file imports."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jaxcredit.envs.search"):
      out.add(node.module.removeprefix("jaxcredit.envs.search").lstrip(".") or "__init__")
    elif isinstance(node, ast.Import):
      out |= {
        a.name.removeprefix("jaxcredit.envs.search.") for a in node.names if a.name.startswith("jaxcredit.envs.search.")
      }
  return out


def test_no_envs_module_is_over_900_lines():
  sizes = {str(p.relative_to(ENVS_DIR)): len(p.read_text().splitlines()) for p in sorted(ENVS_DIR.rglob("*.py"))}
  assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
  assert "search/env.py" in sizes, sorted(sizes)  # the package, not the single 1,493-line search.py


def test_search_package_modules_import_downward_only():
  modules = {p.stem for p in SEARCH_DIR.glob("*.py")}
  assert modules == set(ALLOWED_IMPORTS), f"modules {sorted(modules)}: update ALLOWED_IMPORTS with the new one's job"
  for name in sorted(modules):
    imported = _package_imports(SEARCH_DIR / f"{name}.py")
    assert imported <= ALLOWED_IMPORTS[name], f"search/{name}.py imports {sorted(imported - ALLOWED_IMPORTS[name])}"


@pytest.mark.parametrize("name", OLD_NAMES)
def test_old_names_are_the_objects_their_module_uses(name):
  """`jaxcredit.envs.search.X` is the very object of the submodule that defines X, so reading it (or passing it on) is
  as before; patching it there patches what the code looks up."""
  search = importlib.import_module("jaxcredit.envs.search")
  assert hasattr(search, name), f"jaxcredit.envs.search.{name} is gone"
  owners = [
    m
    for m in ("data", "index", "browsecomp", "world", "env")
    if name in vars(importlib.import_module(f"jaxcredit.envs.search.{m}"))
  ]
  assert owners, f"no search submodule holds {name}"
  for m in owners:  # a name imported into a lower module from another is the same object
    assert getattr(importlib.import_module(f"jaxcredit.envs.search.{m}"), name) is getattr(search, name), (name, m)
