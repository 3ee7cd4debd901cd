"""bfcl-eval's own Qwen function-calling decoder, compiled from its source: the code behind BFCL's official numbers.

bfcl-eval scores a Qwen3 model (its `QwenFCHandler`, the handler of every "Qwen3-*-FC" leaderboard row) in three steps
on the raw completion text: `_parse_query_response_prompting` keeps the text after the last `</think>` (left-stripped
of newlines), `decode_ast` (single-turn) or `decode_execute` (multi-turn) reads the `<tool_call>\\n(.*?)\\n</tool_call>`
blocks of that text (`_extract_tool_calls`: blocks that are not JSON are dropped silently; any other item that is not
an object with "name" and an "arguments" object makes the decoder raise), and its runners score the decoded calls.

The handler module cannot be imported without bfcl-eval's API-client and tree-sitter dependencies (it is installed with
`--no-deps`), so this module reads the handler's and `model_handler/utils.py`'s source files, takes exactly the
functions named in `HANDLER_FUNCTIONS` and `UTILS_FUNCTIONS` (decorators dropped) and compiles them into one
namespace (`compile_functions`, which the tests also use to run bfcl-eval's eval runner). They run unchanged, with
one guard: `decode_execute` evaluates string items with Python's built-in `eval`, a branch its own type check makes
unreachable; in the namespace that name is bound to a function that raises, so model text is never evaluated whatever
a later bfcl-eval does there. `source_digest` identifies the compiled code.

Raises (every function): ImportError naming the install command when bfcl-eval is missing; RuntimeError when a named
function is absent from its file (a bfcl-eval whose decoder moved: the message names the file and function).
"""

from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import json
import re
import types
from typing import Any, Mapping, Sequence

HANDLER_FILE = "model_handler/local_inference/qwen_fc.py"
HANDLER_CLASS = "QwenFCHandler"
HANDLER_FUNCTIONS = ("_extract_tool_calls", "decode_ast", "decode_execute", "_parse_query_response_prompting")
UTILS_FILE = "model_handler/utils.py"
UTILS_FUNCTIONS = ("convert_to_function_call",)


def _refuse_eval(*_args, **_kwargs):
  raise ValueError("bfcl-eval's decoder tried to evaluate a string; jaxcredit never evaluates model text")


def compile_functions(relpath: str, names: Sequence[str], namespace: Mapping[str, Any]) -> dict[str, Any]:
  """Compiles named functions of a bfcl-eval source file, without importing that file's module.

  Args:
    relpath: the file, relative to bfcl-eval's package folder, e.g. "eval_checker/eval_runner.py".
    names: function names, or "Class.method" for a method (compiled as a plain function taking `self`).
    namespace: the globals they run with (the names they use from their module's imports).

  Returns:
    name (as given) -> function. Decorators and annotations are dropped (they name types from modules not imported).

  Raises:
    ImportError: when bfcl-eval is missing. RuntimeError: when a named class or function is absent from the file.
  """
  from jaxcredit.envs.bfcl_tasks import package_dir

  path = package_dir() / relpath
  tree = ast.parse(path.read_text(encoding="utf-8"), filename=relpath)
  out = {}
  for name in names:
    class_name, _, function_name = name.rpartition(".")
    body = tree.body
    if class_name:
      classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
      if not classes:
        raise RuntimeError(f"bfcl-eval's {relpath} has no class {class_name}: this bfcl-eval's code moved")
      body = classes[0].body
    nodes = [n for n in body if isinstance(n, ast.FunctionDef) and n.name == function_name]
    if not nodes:
      raise RuntimeError(f"bfcl-eval's {relpath} has no function {name}: this bfcl-eval's code moved")
    node = nodes[0]
    node.decorator_list, node.returns = [], None
    for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
      arg.annotation = None
    ns = {"__builtins__": builtins, **namespace}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), ns)  # noqa: S102 - bfcl-eval's source
    out[name] = ns[function_name]
  return out


@functools.lru_cache(maxsize=None)
def _compiled() -> tuple[dict[str, Any], str]:
  namespace: dict[str, Any] = {"json": json, "re": re, "eval": _refuse_eval}
  utils = compile_functions(UTILS_FILE, UTILS_FUNCTIONS, namespace)
  namespace.update(utils)
  handler = compile_functions(HANDLER_FILE, [f"{HANDLER_CLASS}.{n}" for n in HANDLER_FUNCTIONS], namespace)
  functions = {**utils, **{n.rpartition(".")[2]: f for n, f in handler.items()}}
  digest = hashlib.sha256()
  for name in sorted(functions):
    code = functions[name].__code__
    digest.update(name.encode() + code.co_code + repr(code.co_consts).encode())
  return functions, digest.hexdigest()


def _handler() -> types.SimpleNamespace:
  ns, _ = _compiled()
  return types.SimpleNamespace(_extract_tool_calls=ns["_extract_tool_calls"])


def source_digest() -> str:
  """sha256 (hex) of the compiled functions' names, bytecode and constants: equal digests, equal decoding."""
  return _compiled()[1]


def model_response(text: str) -> str:
  """What bfcl-eval keeps of a raw completion (`_parse_query_response_prompting`'s "model_responses"): the text after
  the last `</think>`, newlines stripped on the left; the whole text when there is no `</think>` (an unclosed
  `<think>` hides nothing)."""
  ns, _ = _compiled()
  usage = types.SimpleNamespace(prompt_tokens=0, completion_tokens=0)
  response = types.SimpleNamespace(choices=[types.SimpleNamespace(text=text)], usage=usage)
  return ns["_parse_query_response_prompting"](_handler(), response)["model_responses"]


def decode_ast(text: str) -> list[dict]:
  """bfcl-eval's single-turn decoding of a raw completion: `decode_ast(model_response(text))`.

  Returns:
    `[{name: {argument: value}}, ...]`; [] when no block decodes.

  Raises:
    Exception: whatever bfcl-eval's decoder raises (ValueError, KeyError, AttributeError, TypeError): its runners
      count that as "no call" (irrelevance passes, other categories fail).
  """
  ns, _ = _compiled()
  return ns["decode_ast"](_handler(), model_response(text), "Python", False)


def decode_execute(text: str) -> list[str]:
  """bfcl-eval's multi-turn decoding of a raw completion: `decode_execute(model_response(text))`.

  Returns:
    the calls as Python call strings, e.g. ["cd(folder='document')"] (`convert_to_function_call`: arguments written
    with `repr`); [] when no block decodes. jaxcredit reads these strings with `ast` (never `eval`).

  Raises:
    Exception: whatever bfcl-eval's decoder raises; its multi-turn loop then ends the request ("Failed to decode the
      model response. Proceed to next turn.").
  """
  ns, _ = _compiled()
  return ns["decode_execute"](_handler(), model_response(text), False)
