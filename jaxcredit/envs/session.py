"""Sessions: 3-4 user requests in one chat, each verified on its own, each continuing from the result of the one
before; the outcome reward is 1 only when every request is answered right.

Request 1 gives a start value and 1-3 steps ("Start with 17 and apply each step in order: +8, *3."); each later
request continues from the previous request's result ("Take that result and apply: -12, +25."). A request is
answered with `<answer>N</answer>`, which ends it: its verdict is whether N is the request's true value (computed from
the true value of the request before, so a wrong answer also fails the requests built on it, as BFCL's state checks
do), and the next request arrives as a user message (`StepResult.role == "user"`: a new verified unit). The tool is
the chain environment's calculator, one operation per call (`chain.one_operation`).

This is the regime CrEST (arXiv 2608.13179) was made for: the GRPO reward is 1 only when every request succeeds (its
GRPO baseline, `reward="all_units"`), and `unit_rewards` gives each request's own 0/1 verdict for its
turn-segmented advantages; `unit_privileged_info` gives the teacher each request's worked steps. The warm-start
demonstrations take the chain's habits (`skip_prob`, `slip_prob`), so a failed session usually holds requests that
were answered right.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Sequence

from jaxcredit.envs import arithmetic, chain, episode, spec, tool_calls

EVAL_SIZE = 64
EVAL_RESERVE = 512
REWARDS = ("all_units", "unit_fraction")

CONFIG_DEFAULTS: dict[str, Any] = {
  "min_requests": 3,
  "max_requests": 4,
  "max_steps_per_request": 2,
  "max_operand": 20,
  "extra_calls": 1,
  "reward": "all_units",
  "skip_prob": 0.0,
  "slip_prob": 0.0,
  "split_key": "first_request",
}
"""`config.env.session`: requests per session, steps per request (1 to `max_steps_per_request`), the largest operand
of a "+" or "-" step, calls allowed per request beyond one per step, the outcome reward ("all_units": 1 only when
every request passed, CrEST's GRPO baseline; "unit_fraction": the share that passed), and the demonstrations'
habits (as `chain.demonstration`), and what keeps the splits apart (`SPLIT_KEYS`)."""

SPLIT_KEYS = ("first_request", "session")
"""`config.env.session.split_key`: what the train split may not share with the first `EVAL_RESERVE` eval sessions
(and what makes two sessions of a split distinct). "first_request": a session's opening request (a start and one or
two steps, which recur by chance: with "session", 13 of the first 64 eval sessions opened like one of 2,000 train
sessions; issue 54); "session": the whole list of requests, the split before 2026-12-06 (the committed session
testbed results were made with it)."""

SYSTEM_PROMPT = tool_calls.calculator_prompt(
  "The user gives requests one at a time; apply each step in order. The calculator does one operation on two "
  "numbers per call; write:",
  "17+8",
  "Answer each request with its number as <answer>25</answer>.",
)


@dataclasses.dataclass(frozen=True)
class SessionTask:
  """One session.

  Attributes:
    task_id: "<split>/session/<index>".
    requests: the user message of each request (requests[0] is the prompt's).
    start: the start value.
    steps: per request, its (operator, operand) steps.
    values: per request, the value before its first step and after each of its steps (so values[u][-1] is request
      u's answer and values[u + 1][0] == values[u][-1]).
    answer: the last request's answer, a plain integer string.
  """

  task_id: str
  requests: tuple[str, ...]
  start: int
  steps: tuple[tuple[tuple[str, int], ...], ...]
  values: tuple[tuple[int, ...], ...]
  answer: str

  @property
  def unit_answers(self) -> tuple[int, ...]:
    """Each request's true answer."""
    return tuple(v[-1] for v in self.values)


def _draw_task(rng: random.Random, split: str, idx: int, sizes: tuple[int, int, int, int]) -> SessionTask:
  min_requests, max_requests, max_steps, max_operand = sizes
  value = rng.randint(2, chain.MAX_START)
  requests, steps, values = [], [], []
  for u in range(rng.randint(min_requests, max_requests)):
    unit_steps, unit_values = chain.draw_steps(rng, value, rng.randint(1, max_steps), max_operand)
    listed = chain.list_steps(unit_steps)
    lead = f"Start with {value} and apply each step in order" if u == 0 else "Take that result and apply"
    requests.append(f"{lead}: {listed}.")
    steps.append(tuple(unit_steps))
    values.append((value, *unit_values))
    value = unit_values[-1]
  return SessionTask(f"{split}/session/{idx}", tuple(requests), values[0][0], tuple(steps), tuple(values), str(value))


def make_tasks(
  split: str,
  num: int | None = None,
  seed: int | None = None,
  *,
  min_requests: int = 3,
  max_requests: int = 4,
  max_steps_per_request: int = 2,
  max_operand: int = 20,
  split_key: str = "first_request",
) -> list[SessionTask]:
  """A deterministic list of distinct sessions: task `idx` from `random.Random(f"session/{split seed}/{idx}")`, the
  eval split a prefix of one fixed sequence, no train split holding the first request (`split_key="first_request"`)
  or the requests (`"session"`) of the first `EVAL_RESERVE` eval sessions (`arithmetic.split_tasks`).

  Raises:
    ValueError: an unknown split, a seed for eval, `num` out of range, or a size out of range (naming
      `config.env.session.<key>`).
  """
  if split not in ("train", "eval"):
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
  _check_sizes(min_requests, max_requests, max_steps_per_request, max_operand)
  if split_key not in SPLIT_KEYS:
    raise ValueError(f"config.env.session.split_key must be one of {SPLIT_KEYS}, got {split_key!r}")
  sizes = (min_requests, max_requests, max_steps_per_request, max_operand)
  key = (lambda t: t.requests[0]) if split_key == "first_request" else (lambda t: "\n".join(t.requests))

  def draw(split_name: str, base_seed: int, n: int, exclude: frozenset, strict: bool) -> list[SessionTask]:
    def stream():
      idx = 0
      while True:
        yield idx, _draw_task(random.Random(f"session/{base_seed}/{idx}"), split_name, idx, sizes)
        idx += 1

    return arithmetic.draw_tasks(
      split_name,
      [stream()],
      n,
      lambda _, drawn: (drawn[1], "kept"),
      key,
      exclude,
      {"dropped_duplicate": 0, "dropped_eval_overlap": 0},
      strict=strict,
      max_misses=2000,
      where=lambda _: f"sessions of sizes {sizes}",
    )

  return arithmetic.split_tasks(split, num, seed, draw, key, eval_size=EVAL_SIZE, eval_reserve=EVAL_RESERVE)


def _check_sizes(min_requests: int, max_requests: int, max_steps_per_request: int, max_operand: int) -> None:
  if min_requests < 1:
    raise ValueError(f"config.env.session.min_requests must be >= 1, got {min_requests}")
  if max_requests < min_requests:
    raise ValueError(f"config.env.session.max_requests must be >= min_requests ({min_requests}), got {max_requests}")
  if max_steps_per_request < 1:
    raise ValueError(f"config.env.session.max_steps_per_request must be >= 1, got {max_steps_per_request}")
  if max_operand < 2:
    raise ValueError(f"config.env.session.max_operand must be >= 2, got {max_operand}")


def initial_messages(task: SessionTask) -> list[dict]:
  """[system, user (request 1)]."""
  return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.requests[0]}]


def unit_privileged_info(task: SessionTask) -> list[str]:
  """Per request, its steps worked out and its answer ("17+8=25, 25*3=75, so this request's answer is
  <answer>75</answer>"): CrEST's per-unit teacher sees the texts of the requests before the one it scores."""
  out = []
  for steps, values in zip(task.steps, task.values):
    worked = ", ".join(f"{a}{op}{n}={b}" for (op, n), a, b in zip(steps, values, values[1:]))
    out.append(f"{worked}, so this request's answer is {tool_calls.render_answer(str(values[-1]))}")
  return out


def privileged_info(task: SessionTask) -> str:
  """Every request's steps worked out, in order (`unit_privileged_info`, one line each)."""
  return "\n".join(f"Request {u + 1}: {text}" for u, text in enumerate(unit_privileged_info(task)))


class SessionEnv(episode.ToolEpisode):
  """One session: calls run one operation each; an `<answer>` ends the current request (verified against its true
  value) and the next request arrives as a user message; the session ends after the last request.

  Per assistant message: an unclosed think block gives an error observation (one tool error); else the first action
  decides: a call runs if the request has calls left (`steps + extra_calls`), otherwise the request ends unanswered
  (failed; `budget_exhausted` set); `<answer>` ends the request with its verdict; a message with neither ends the
  request unanswered. `info` keys: `episode.EpisodeInfo`'s, then "unit" (the current request) and "unit_rewards"
  (the verdicts so far). `answered` is True when every request was answered (right or wrong).
  """

  episode_kind = "session"

  def __init__(self, task: SessionTask, extra_calls: int = 1, reward: str = "all_units"):
    if reward not in REWARDS:
      raise ValueError(f"config.env.session.reward must be one of {REWARDS}, got {reward!r}")
    super().__init__(task, unit=0, unit_rewards=[])
    self.extra_calls = int(extra_calls)
    self.reward_kind = reward
    self.unit = 0
    self.passed: list[bool] = []
    self.calls_in_unit = 0
    self.steps_in_unit = 0
    self.answers_given = 0
    self.results: list[int] = []

  def step(self, assistant_text: str) -> spec.StepResult:
    """Consumes one assistant message (see the class notes); returns the tool result, the next request (role
    "user") or the end.

    Raises:
      RuntimeError: after the end.
    """
    info = self.begin_step()
    self.steps_in_unit += 1
    msg = tool_calls.parse_message(assistant_text, max_calls=1, max_call_chars=tool_calls.MAX_CALL_CHARS)
    if msg.error is not None:
      return self._think_error(msg.error)
    answer_at = msg.visible.find(tool_calls.ANSWER_OPEN)
    if msg.calls and (answer_at < 0 or msg.calls[0].start < answer_at):
      if self.calls_in_unit >= len(self.task.steps[self.unit]) + self.extra_calls:
        info["budget_exhausted"] = True
        return self._end_unit(None)
      info["tool_calls"] += 1
      self.calls_in_unit += 1
      outcome = tool_calls.run_parsed_call(msg.calls[0], chain.TOOLS)
      if not outcome.ok:
        info["tool_errors"] += 1
      elif outcome.content.isdigit():
        self.results.append(int(outcome.content))
      return self._observe(tool_calls.render_tool_response(outcome.content))
    return self._end_unit(msg.answer)

  def _end_unit(self, answer: str | None) -> spec.StepResult:
    right = answer is not None and answer.strip() == str(self.task.unit_answers[self.unit])
    self.answers_given += answer is not None
    self.passed.append(right)
    self.info["unit_rewards"] = [float(p) for p in self.passed]
    self.unit += 1
    self.info["unit"] = self.unit
    self.calls_in_unit = self.steps_in_unit = 0
    if self.unit >= len(self.task.requests):
      self.info["answered"] = self.answers_given == len(self.task.requests)
      return self._finish("answer" if self.info["answered"] else "no_answer")
    return self._observe(self.task.requests[self.unit], "user")

  def unit_rewards(self) -> list[float]:
    """0/1 per request the policy acted in: the verdicts, then 0 for a request it had started when the rollout
    stopped (its turn limit)."""
    out = [float(p) for p in self.passed]
    if not self.done and self.steps_in_unit > 0:
      out.append(0.0)
    return out

  def reward(self) -> float:
    """ "all_units": 1.0 when the session ended with every request right; "unit_fraction": the share of the
    session's requests that passed (0 for requests never reached)."""
    if self.reward_kind == "unit_fraction":
      return sum(self.passed) / len(self.task.requests)
    return float(self.done and all(self.passed) and len(self.passed) == len(self.task.requests))


def metrics(envs: Sequence[SessionEnv]) -> dict[str, float]:
  """Request-level success over sessions; {} for none.

  Returns:
    "session_unit_success": requests passed over requests (never-reached requests count as failed);
    "session_units_before_first_failure": the mean share of a session's requests passed before its first failure;
    "session_request_success_given_right_input": requests passed over requests answered from a right input (a
      session's first request, or one after a request that passed): how often one request is right by itself. A
      wrong answer fails every request built on it, so the first two fall with session length while this one does
      not (issue 51's 40-80% band for the per-request verdicts is read on it); 0.0 when no request had a right input.
  """
  if not envs:
    return {}
  units = sum(len(e.task.requests) for e in envs)
  first = []
  right_input = right_from_right_input = 0
  for e in envs:
    k = next((i for i, p in enumerate(e.passed) if not p), len(e.passed))
    first.append(k / len(e.task.requests))
    for i, p in enumerate(e.passed):
      if i == 0 or e.passed[i - 1]:
        right_input += 1
        right_from_right_input += p
  return {
    "session_unit_success": sum(sum(e.passed) for e in envs) / units,
    "session_units_before_first_failure": sum(first) / len(envs),
    "session_request_success_given_right_input": right_from_right_input / right_input if right_input else 0.0,
  }


def demonstration(task: SessionTask, rng: Any, skip_prob: float = 0.0, slip_prob: float = 0.0) -> list[dict]:
  """A chat for the supervised warm start: per request, the chain's demonstrator calls (`chain.play_steps`: a step
  in the head with `skip_prob`, a number copied wrongly with `slip_prob`, whereupon this request's answer is wrong
  and the next requests continue from it), its `<answer>`, then the next request.

  Raises:
    ValueError: a probability outside [0, 1] (naming `config.env.session.<key>`).
  """
  chain.check_habits("session", skip_prob, slip_prob)
  env = SessionEnv(task, extra_calls=0)
  messages = initial_messages(task)
  current = task.start
  for steps in task.steps:
    calls, current = chain.play_steps(env, current, steps, rng, skip_prob, slip_prob)
    answer = tool_calls.render_answer(str(current))
    messages += calls + [{"role": "assistant", "content": answer}]
    result = env.step(answer)
    if not result.done:
      messages.append({"role": "user", "content": result.observation})
  return messages


def env_spec(env_config=None) -> spec.EnvSpec:
  """The session environment as an `EnvSpec` (the `ENVS["session"]` row), from `config.env.session`
  (`CONFIG_DEFAULTS`). A rollout may take max_requests * (max_steps_per_request + extra_calls + 1) assistant turns:
  each request's calls and its answer (a call past a request's budget ends the request).

  Raises:
    ValueError: a value out of range, naming `config.env.session.<key>`.
  """

  def get(key):
    value = None if env_config is None else getattr(env_config, key, None)
    return CONFIG_DEFAULTS[key] if value is None else value

  sizes = {k: int(get(k)) for k in ("min_requests", "max_requests", "max_steps_per_request", "max_operand")}
  _check_sizes(**sizes)
  split_key = str(get("split_key"))
  if split_key not in SPLIT_KEYS:
    raise ValueError(f"config.env.session.split_key must be one of {SPLIT_KEYS}, got {split_key!r}")
  extra_calls, reward = int(get("extra_calls")), str(get("reward"))
  skip_prob, slip_prob = float(get("skip_prob")), float(get("slip_prob"))
  if extra_calls < 0:
    raise ValueError(f"config.env.session.extra_calls must be >= 0, got {extra_calls}")
  if reward not in REWARDS:
    raise ValueError(f"config.env.session.reward must be one of {REWARDS}, got {reward!r}")
  chain.check_habits("session", skip_prob, slip_prob)
  max_turns = sizes["max_requests"] * (sizes["max_steps_per_request"] + extra_calls + 1)
  return spec.EnvSpec(
    make_tasks=lambda split, num, seed: make_tasks(split, num, seed, **sizes, split_key=split_key),
    make_env=lambda task: SessionEnv(task, extra_calls=extra_calls, reward=reward),
    initial_messages=initial_messages,
    stop_strings=(tool_calls.TOOL_CALL_CLOSE, tool_calls.ANSWER_CLOSE),
    max_turns=max_turns,
    is_success=lambda r: r >= 1.0,
    demonstration=lambda task, rng: demonstration(task, rng, skip_prob, slip_prob),
    gold_answer_text=lambda task: tool_calls.render_answer(task.answer),
    privileged_info=privileged_info,
    unit_rewards=lambda env: env.unit_rewards(),
    unit_privileged_info=unit_privileged_info,
    metrics=metrics,
  )
