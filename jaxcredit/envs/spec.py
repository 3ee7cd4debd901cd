"""What the trainer needs from an environment, as one record (`EnvSpec`); `jaxcredit.envs.ENVS` maps names to
the functions that build them.

The trainer imports no environment module: it asks `ENVS[config.env.name](config.env)` for an `EnvSpec` and
uses only its fields. Tasks are opaque to the trainer; every function here takes the task it was given.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """Everything the trainer needs from one environment.

  Attributes:
    make_tasks: (split "train" | "eval", num, seed | None) -> list of tasks (seed is None for eval).
    make_env: task -> a fresh environment (one per rollout, never shared) with `step(assistant_text)` ->
      (.observation, .done, .info) and `reward()`, as `jaxcredit.rollout.multiturn.EnvLike`.
    initial_messages: task -> the prompt's chat messages (system?, user).
    stop_strings: strings that end an assistant turn (the closing tags of a tool call and of an answer).
    max_turns: the most assistant turns a rollout may take (T).
    is_success: reward -> whether the rollout solved the task (for success rates, HSD peers, ToolOPD outcomes).
    demonstration: (task, rng) -> a full chat for the supervised warm start, or None when the environment has
      no demonstrations (then `config.sft.steps` must be 0).
    gold_answer_text: task -> the gold answer written as the next assistant message (TRACE scores it); None when
      the environment has no gold answers (an OpenEnv server that exposes none): then the methods whose passes
      read one are refused at start-up (`jaxcredit.train.loop.run.check_env_fields`).
    privileged_info: task -> the verified ground truth a teacher may see and the policy never does (CrEST,
      GEAR, HSD's fallback): the gold answer, a reference solution, or BFCL's ground-truth calls; None as for
      `gold_answer_text`.
    unit_privileged_info: task -> one ground-truth text per verified unit (unit u's ground truth: BFCL's
      ground-truth calls of request u and their results, executed); CrEST's per-unit teacher shows unit u the texts
      of the units before it (docs/teacher-passes.md). None: the environment verifies only the outcome (U = 1).
    unit_rewards: env -> per-unit verified rewards of a finished rollout (CrEST), one per unit it reached; None
      means the environment verifies only the outcome (U = 1, the outcome reward).
    tools: task -> the tool schemas of the task (OpenAI/Qwen3 function schemas), for exported rollouts and
      docs; the prompt already lists them. None: the environment describes its tools in its own prompt.
    metrics: finished envs -> extra scalar metrics for the step's row (e.g. BFCL's official accuracy beside
      the training reward); None: none.
    eval_max_turns: the most assistant turns of a held-out rollout, where an evaluation protocol allows more than
      training does (BFCL multi-turn: bfcl-eval has no session cap); None: `max_turns`.
    unwinnable: (task, split "train" | "eval") -> why ground-truth play cannot finish the task under that split's
      caps (turns, steps per request), or None when it can; reported at start-up (`jaxcredit.train.loop.run.
      report_unwinnable`), since such a task can never pay. None: the environment has no caps to check.
    step_workers: the environments of one turn step on this many threads (the rollout loop, `jaxcredit.rollout.
      multiturn.run_rollouts`): more than 1 for environments that wait on a server; 1 (the default) steps them in
      order.
    close: called once when the run ends (stops a server the environment started); None: nothing to stop.
  """

  make_tasks: Callable[[str, int, int | None], list]
  make_env: Callable[[Any], Any]
  initial_messages: Callable[[Any], list[dict]]
  stop_strings: tuple[str, ...]
  max_turns: int
  is_success: Callable[[float], bool]
  demonstration: Callable[[Any, Any], list[dict]] | None
  gold_answer_text: Callable[[Any], str] | None
  privileged_info: Callable[[Any], str] | None
  unit_rewards: Callable[[Any], Sequence[float]] | None = None
  unit_privileged_info: Callable[[Any], Sequence[str]] | None = None
  tools: Callable[[Any], list[dict]] | None = None
  metrics: Callable[[Sequence[Any]], dict[str, float]] | None = None
  eval_max_turns: int | None = None
  unwinnable: Callable[[Any, str], str | None] | None = None
  step_workers: int = 1
  close: Callable[[], None] | None = None


class EnvironmentUnavailable(RuntimeError):
  """The environment cannot go on: its server is gone, did not start, or cannot reproduce a task's start state.
  `jaxcredit train` / `eval` print its one line and exit 1 (what was written stays)."""


@dataclasses.dataclass
class StepResult:
  """What an environment's `step(assistant_text)` returns.

  Attributes:
    observation: the next message's content, or None when the episode is done.
    done: whether the episode ended with this assistant message.
    info: the environment's running counters (a copy): "tool_calls", "tool_errors", "answered" (ended as the
      task asks: an answer, or the last request of a session handled), "budget_exhausted" (the keys the trainer
      reads, `jaxcredit.envs.episode.TRAINER_KEYS`; `episode.new_info` starts them), then the environment's own.
    role: who speaks next: "tool" (the results of this message's calls) or "user" (the next request of a
      multi-request session: it opens a new verified unit).
  """

  observation: str | None
  done: bool
  info: dict
  role: str = "tool"
