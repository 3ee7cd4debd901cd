"""Tool-use environments. They know no model and no tokenizer: they work on text and chat messages.

- `calculator`: a safe evaluator of + - * / ( ) on integers and decimals (ast allow-list, never `eval`).
- `tool_calls`: the hermes/Qwen3 `<tool_call>` syntax (several per message, think blocks skipped), schema-checked
  dispatch, `<tool_response>` observations, `<answer>` tags.
- `arithmetic`: reasoning-gym arithmetic tasks with a calculator (the quickstart).
- `chain`: a number through 4-8 dependent calculator steps, one operation per call (the long-horizon testbed).
- `math_tools`: math word problems from more reasoning-gym generators or from files, with the calculator.
- `bfcl_multi_turn`: BFCL V3 multi-turn sessions, one verified unit per user request (CrEST's setting).
- `bfcl_single`: BFCL single-turn function calling scored by BFCL's AST checker.
- `search`: search QA over a JSONL corpus with BM25 `search` and `open` tools (TRACE's BrowseComp-Plus setting).
- `mcp_tools`: questions from a task file whose tools come from MCP servers (stdio commands or HTTP URLs).
- `openenv`: an environment served by an OpenEnv server (reset/step over a WebSocket), started by the run or
  running elsewhere.
- `session`: 3-4 dependent calculator requests in one chat, each verified on its own (the long-horizon testbed).
- `sources`: tasks from JSONL files, Hugging Face `datasets` folders and TFDS folders, as grain data sources.
- `spec`: `EnvSpec` and `StepResult`, what the trainer reads from an environment.
- `episode`: the `info` keys every environment keeps (`TRAINER_KEYS`, read by the trainer) and `ToolEpisode`, the
  state and the opening and endings of `step` that the environments share.

`ENVS` is the table of environments: `config.env.name` -> an `Env` row, whose `make_spec(node)` builds the
`EnvSpec` from the environment's own config node `config.env.<name>` (its keys and defaults are the row's
`defaults`). Adding an environment is one module with a function and one row here (docs/environments.md: "Your own environment").
Submodules are imported on use, so an environment's dependencies (bfcl-eval, bm25s) are needed only when it runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from jaxcredit.envs.spec import EnvSpec, StepResult  # noqa: F401 - re-exported


@dataclasses.dataclass(frozen=True)
class Env:
  """One row of `ENVS`.

  Attributes:
    make_spec: the environment's config node (`config.env.<name>`, a ConfigDict or dict with `defaults`' keys) ->
      `EnvSpec`; raises ValueError naming the bad key.
    defaults: the node's keys and default values (their types are enforced when the config is validated).
    summary: one line describing the environment (for the docs and the reader of the table).
  """

  make_spec: Callable[[Any], EnvSpec]
  defaults: Mapping[str, Any]
  summary: str


def _arithmetic(c) -> EnvSpec:
  from jaxcredit.envs import arithmetic

  if int(c.max_tool_calls) < 0:
    raise ValueError(f"config.env.arithmetic.max_tool_calls must be >= 0, got {c.max_tool_calls}")
  return arithmetic.env_spec(max_tool_calls=int(c.max_tool_calls), direct_answer_prob=float(c.direct_answer_prob))


def _bfcl_multi_turn(c) -> EnvSpec:
  from jaxcredit.envs import bfcl_multi_turn

  return bfcl_multi_turn.env_spec(
    categories=str(c.categories).split(","),
    train_categories=str(c.train_categories).split(","),
    max_turns=int(c.max_turns),
    max_steps_per_unit=int(c.max_steps_per_unit),
    max_output_chars=int(c.max_output_chars),
    reward=str(c.reward),
    max_calls_per_message=int(c.max_calls_per_message),
    compact_tools=bool(c.compact_tools),
    classes=str(c.classes).split(","),
    protocol=str(c.protocol),
    decoder=str(c.decoder),
    eval_decoder=str(c.eval_decoder),
    eval_max_turns=int(c.eval_max_turns),
  )


def _bfcl_single(c) -> EnvSpec:
  from jaxcredit.envs import bfcl_single

  return bfcl_single.env_spec(c)


def _math_tools(c) -> EnvSpec:
  from jaxcredit.envs import math_tools

  return math_tools.env_spec(c)


def _chain(c) -> EnvSpec:
  from jaxcredit.envs import chain

  return chain.env_spec(c)


def _session(c) -> EnvSpec:
  from jaxcredit.envs import session

  return session.env_spec(c)


def _search(c) -> EnvSpec:
  from jaxcredit.envs import search

  return search.env_spec(c)


def _mcp_tools(c) -> EnvSpec:
  from jaxcredit.envs import mcp_tools

  return mcp_tools.env_spec(c)


def _openenv(c) -> EnvSpec:
  from jaxcredit.envs import openenv

  return openenv.env_spec(c)


def _defaults(module: str) -> dict:
  import importlib

  return dict(importlib.import_module(f"jaxcredit.envs.{module}").CONFIG_DEFAULTS)


ENVS: dict[str, Env] = {
  "arithmetic": Env(
    _arithmetic,
    {"max_tool_calls": 2, "direct_answer_prob": 0.0},
    "reasoning-gym arithmetic with a calculator tool; reward: math-verify on <answer> (quickstart)",
  ),
  "bfcl_multi_turn": Env(
    _bfcl_multi_turn,
    {
      "categories": "base,miss_func,miss_param,long_context",
      "train_categories": "",  # "" = categories; e.g. "base" trains on Base only (CrEST's split)
      "max_turns": 16,
      "max_steps_per_unit": 4,
      "max_output_chars": 2000,
      "reward": "all_units",
      "max_calls_per_message": 64,
      "compact_tools": False,
      "classes": "",
      "protocol": "",  # "crest": CrEST's split (100 Base to train; 100 each of the four categories to evaluate)
      "decoder": "training",  # how training rollouts read text: the strict parser (bfcl_multi_turn.DECODERS)
      "eval_decoder": "official",  # held-out evals: bfcl-eval's Qwen decoder and protocol (its official number)
      "eval_max_turns": 0,  # held-out turn cap; 0: the most bfcl-eval's protocol allows (it has no session cap)
    },
    "BFCL V3 multi-turn sessions on BFCL's backends; one verified unit per user request (BFCL's checkers)",
  ),
  "bfcl_single": Env(
    _bfcl_single,
    {"categories": "simple,multiple,parallel,parallel_multiple"},
    "BFCL single-turn function calling; reward: BFCL's AST checker",
  ),
  "chain": Env(
    _chain,
    _defaults("chain"),
    "a number through 4-8 dependent calculator steps, one operation per call; reward: the final number (TRACE's "
    "regime: failed rollouts hold right steps)",
  ),
  "math_tools": Env(
    _math_tools,
    _defaults("math_tools"),
    "math word problems (reasoning-gym generators or JSONL / datasets / TFDS files) with a "
    "calculator; reward: the generator's checker or math-verify",
  ),
  "mcp_tools": Env(
    _mcp_tools,
    _defaults("mcp_tools"),
    "questions from a task file (JSONL / datasets / TFDS) with the tools of MCP servers (stdio or HTTP); reward: "
    "the answer's verifier (math-verify or exact)",
  ),
  "openenv": Env(
    _openenv,
    _defaults("openenv"),
    "an OpenEnv environment server (reset/step over its WebSocket, started by the run or at a URL); reward: the "
    "server's",
  ),
  "session": Env(
    _session,
    _defaults("session"),
    "3-4 dependent calculator requests in one chat, each verified on its own; reward: 1 when every request is right "
    "(CrEST's regime)",
  ),
  "search": Env(
    _search,
    _defaults("search"),
    "search QA over a JSONL corpus (BrowseComp-Plus layout or generated fictional facts) with BM25 "
    "search and open tools; reward: normalised answer match",
  ),
}


def make_env_spec(env_config) -> EnvSpec:
  """`ENVS[env_config.name].make_spec(env_config[env_config.name])`.

  Raises:
    ValueError: an unknown name (listing the known ones), or what the environment refuses in its node.
  """
  if env_config.name not in ENVS:
    raise ValueError(f"config.env.name={env_config.name!r} is not an environment; known: {sorted(ENVS)}")
  node = env_config.get(env_config.name) if hasattr(env_config, "get") else getattr(env_config, env_config.name)
  if node is None:
    node = _Node(ENVS[env_config.name].defaults)
  return ENVS[env_config.name].make_spec(node)


class _Node(dict):
  """A dict read by attribute, for an environment's defaults when the config has no node for it."""

  def __getattr__(self, key):
    try:
      return self[key]
    except KeyError:
      raise AttributeError(key) from None
