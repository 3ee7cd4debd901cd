"""What every tool-using episode shares: the declared `info` keys and the `ToolEpisode` base class.

An environment's `step(assistant_text)` returns a `spec.StepResult` whose `info` is a copy of the episode's running
counters. The trainer reads four of its keys on every step (`TRAINER_KEYS`: `jaxcredit.rollout.multiturn` turns them
into each rollout's tool-call and tool-error counts and its finish reason, which the step's metrics average); a
missing one is refused there (`trainer_info`) rather than read as 0. `EpisodeInfo` declares them with the two that
every environment here keeps as well ("turns", "finish"); an environment adds its own keys after them
(`new_info(**extra)`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from jaxcredit.envs import spec, tool_calls

TOOL_CALLS = "tool_calls"
TOOL_ERRORS = "tool_errors"
ANSWERED = "answered"
BUDGET_EXHAUSTED = "budget_exhausted"
TRAINER_KEYS = (TOOL_CALLS, TOOL_ERRORS, ANSWERED, BUDGET_EXHAUSTED)
"""The `info` keys the trainer reads from every step (`jaxcredit.rollout.multiturn.run_rollouts`)."""


class EpisodeInfo(TypedDict):
  """The `info` keys every environment keeps (an environment's own keys follow them).

  Attributes:
    tool_calls: tool calls counted so far (what counts is the environment's: run, attempted or dispatched).
    tool_errors: calls (or messages) that gave an error.
    answered: whether the episode ended as the task asks (an answer; every request of a session handled).
    budget_exhausted: whether the episode hit its call budget.
    turns: assistant messages seen.
    finish: None while running, then the environment's reason ("answer", "no_answer", "tool_budget", ...).
  """

  tool_calls: int
  tool_errors: int
  answered: bool
  budget_exhausted: bool
  turns: int
  finish: str | None


def new_info(**extra: Any) -> dict[str, Any]:
  """A fresh episode's `info`: the `EpisodeInfo` keys at 0 / False / None, then `extra` (the environment's own keys,
  in order)."""
  info: dict[str, Any] = dict(
    EpisodeInfo(tool_calls=0, tool_errors=0, answered=False, budget_exhausted=False, turns=0, finish=None)
  )
  info.update(extra)
  return info


def trainer_info(result: Any, env: Any) -> Mapping[str, Any]:
  """The `info` of a step's result, checked to hold every key of `TRAINER_KEYS`.

  Raises:
    ValueError: naming the environment's class and the first missing key (an environment that drops one would
      otherwise have its tool calls, tool errors or finish reason read as 0 / False).
    TypeError: when the result has no info mapping at all.
  """
  info = getattr(result, "info", None)
  if not isinstance(info, Mapping):
    raise TypeError(
      f"{type(env).__name__}.step() returned no info dict (got {type(info).__name__}); it must hold the keys "
      f"{', '.join(TRAINER_KEYS)} (jaxcredit.envs.episode.new_info)"
    )
  for key in TRAINER_KEYS:
    if key not in info:
      raise ValueError(
        f"{type(env).__name__}.step() returned info without the key {key!r}; every environment's info holds "
        f"{', '.join(TRAINER_KEYS)} (jaxcredit.envs.episode.new_info)"
      )
  return info


class ToolEpisode:
  """The shared state of one tool-using rollout: `task`, `done` and `info` (`new_info`), with the openings and
  endings of `step` that every environment here writes the same way.

  Subclasses implement `step(assistant_text)` (starting with `begin_step()`) and `reward()`.
  """

  episode_kind = "episode"
  """What the `RuntimeError` of a step after the end calls the rollout ("episode", or "session")."""

  def __init__(self, task: Any, **extra_info: Any):
    self.task = task
    self.done = False
    self.info = new_info(**extra_info)

  def step(self, assistant_text: str) -> spec.StepResult:
    """Consumes one assistant message (each environment's own rules; it starts with `begin_step()`).

    Args:
      assistant_text: the assistant turn as the model wrote it (`multiturn.action_text`: special tokens kept, the
        stop token that ended the turn left out).

    Returns:
      A `StepResult`; its observation goes into `{"role": result.role, "content": observation}`; info holds
      `EpisodeInfo`'s keys.

    Raises:
      RuntimeError: if the episode is already done.
    """
    raise NotImplementedError

  def reward(self) -> float:
    """The episode's reward (each environment's own)."""
    raise NotImplementedError

  def begin_step(self) -> dict[str, Any]:
    """Opens one assistant turn: counts it in info["turns"] and returns `info` (the live dict, not a copy).

    Raises:
      RuntimeError: if the episode is already done.
    """
    if self.done:
      raise RuntimeError(f"step() called on a finished {self.episode_kind}")
    self.info["turns"] += 1
    return self.info

  def _observe(self, observation: str, role: str = "tool") -> spec.StepResult:
    """The episode goes on: `observation` is the next message's content (`role` speaks it); info copied."""
    return spec.StepResult(observation, False, dict(self.info), role)

  def _think_error(self, error: str) -> spec.StepResult:
    """A message `tool_calls.parse_message` could not read (an unclosed think block): one tool error, and an error
    observation; nothing in the message runs."""
    self.info["tool_errors"] += 1
    return self._observe(tool_calls.render_tool_response(f"error: {error}"))

  def _finish(self, reason: str) -> spec.StepResult:
    """Ends the episode: done, info["finish"] = `reason`, no observation; info copied."""
    self.done = True
    self.info["finish"] = reason
    return spec.StepResult(None, True, dict(self.info))
