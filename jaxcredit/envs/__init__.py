"""Tool-use environments. They know no model and no tokenizer: they work on text and chat messages.

- `calculator`: a safe evaluator of + - * / ( ) on integers and decimals (ast allow-list, never `eval`).
- `tool_calls`: the hermes/Qwen3 `<tool_call>` syntax, `<tool_response>` observations, `<answer>` tags.
- `arithmetic`: reasoning-gym arithmetic tasks, `ArithmeticEnv` (step/reward), warm-start demonstrations.

- `spec`: `EnvSpec`, the one record the trainer reads from an environment.

`ENVS` is the table of environments: `config.env.name` -> a function from the `config.env` node to an `EnvSpec`.
Adding an environment is one such function and one row. Submodules are imported on use; `arithmetic` imports
reasoning-gym and math-verify lazily.
"""

from __future__ import annotations

from typing import Callable

from jaxcredit.envs.spec import EnvSpec


def _arithmetic(env_config) -> EnvSpec:
  from jaxcredit.envs import arithmetic
  return arithmetic.env_spec(max_tool_calls=int(env_config.max_tool_calls))


ENVS: dict[str, Callable[..., EnvSpec]] = {
    "arithmetic": _arithmetic,
}


def make_env_spec(env_config) -> EnvSpec:
  """`ENVS[env_config.name](env_config)`; an unknown name is refused listing the known ones."""
  if env_config.name not in ENVS:
    raise ValueError(f"config.env.name={env_config.name!r} is not an environment; known: {sorted(ENVS)}")
  return ENVS[env_config.name](env_config)
