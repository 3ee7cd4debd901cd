"""Tool chains: a number carried through 4-8 dependent calculator steps, one operation per call; the outcome is only
the final number.

A task is a start value and a list of steps applied left to right ("Start with 17 and apply each step in order: +8,
*3, -12, +25."). The calculator here does one operation on two whole numbers per call (`one_operation`), so a
rollout that follows the task makes one call per step, copying the previous result from the last tool response and
the next step from the question, then answers `<answer>88</answer>`. The reward is 1 only for the right final number
(`ArithmeticEnv`'s turns, budget and math-verify reward; the chain's tasks have integer answers, so it is an exact
match).

This is the regime TRACE (arXiv 2607.13988) was made for: with `skip_prob` the warm-start demonstrations sometimes
do a step in their head and call the calculator on the step after it (the demonstrator's head arithmetic is right;
a small policy that copies the habit guesses), and with `slip_prob` they copy a result wrongly; so a failed
rollout usually holds several right steps before the one that went wrong, and outcome-only credit blames them all.
`metrics` reports how far along the chain rollouts got (`chain_progress`) beside the outcome.

Splits: task `idx` of a split is drawn from `random.Random(f"chain/{split seed}/{idx}")`; the eval split is a prefix
of one fixed sequence (`arithmetic.EVAL_SEED`), and no train split holds a question of the first `EVAL_RESERVE` eval
tasks (`arithmetic.split_tasks`). Values stay whole numbers in [1, `MAX_VALUE`]: subtraction only where it stays
positive, multiplication (by 2 to 5) only where it stays within the bound.
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Any, Iterator, Mapping, Protocol, Sequence

from jaxcredit.envs import arithmetic, spec, tool_calls

MAX_VALUE = 999  # every start, intermediate and final value lies in [1, MAX_VALUE]
MAX_START = 50
MULTIPLIERS = (2, 5)  # the range of a "*" step's operand
EVAL_SIZE = 64
EVAL_RESERVE = 512

CONFIG_DEFAULTS: dict[str, Any] = {
  "min_steps": 4,
  "max_steps": 8,
  "max_operand": 20,
  "extra_calls": 2,
  "skip_prob": 0.0,
  "slip_prob": 0.0,
  "show_next_step": True,
  "reward": "outcome",
}
"""`config.env.chain`: steps per task (4-8), the largest operand of a "+" or "-" step, calls allowed beyond one per
step (`max_tool_calls = max_steps + extra_calls`), the warm-start demonstrations' habits (`demonstration`: the
chance per step of doing it in the head, and of copying a result wrongly), whether a result names the next step
(`ChainEnv`), and the reward (`REWARDS`)."""

REWARDS = ("outcome", "progress")
"""`config.env.chain.reward`: "outcome", 1.0 for the right final number, else 0.0 (TRACE's sparse reward); "progress",
a shaped reward (the control that separates credit assignment from a denser reward, issue 51): 1.0 for the right
final number, else the steps the calls reached over the steps plus the answer, (j / (n + 1)) < 1 (`ChainEnv.progress`
times n / (n + 1)). Success is the right final number under both (reward >= 1)."""

SYSTEM_PROMPT = tool_calls.calculator_prompt(
  "Apply the steps in order, one at a time. The calculator does one operation on two numbers per call; write:",
  "17+8",
  "Give the final number as <answer>25</answer>.",
)

_ONE_OPERATION_RE = re.compile(r"\s*(\d{1,7})\s*([-+*])\s*(\d{1,7})\s*")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclasses.dataclass(frozen=True)
class ChainTask:
  """One chain.

  Attributes:
    task_id: "<split>/chain/<index>".
    question: the user message.
    answer: the final value as a plain integer string.
    start: the start value.
    steps: (operator "+", "-" or "*", operand) pairs, applied left to right.
    values: the value before the first step and after each step (len(steps) + 1 entries; values[-1] is the answer).
  """

  task_id: str
  question: str
  answer: str
  start: int
  steps: tuple[tuple[str, int], ...]
  values: tuple[int, ...]


def one_operation(arguments: Mapping[str, Any]) -> str:
  """The chain's calculator: {"expression": "<a><op><b>"} with whole numbers a, b (at most 7 digits) and op one of
  + - *; returns the result as an integer string.

  Raises:
    tool_calls.ToolError: another argument, a missing expression, or an expression that is not one operation on two
      whole numbers (the message, shown to the model, says what the calculator takes).
  """
  extra = sorted(k for k in arguments if k != "expression")
  if extra:
    raise tool_calls.ToolError("calculator got unexpected argument(s): " + ", ".join(repr(k[:40]) for k in extra))
  expression = arguments.get("expression")
  if not isinstance(expression, str):
    raise tool_calls.ToolError('calculator needs an "expression" string argument, e.g. {"expression": "17+8"}')
  m = _ONE_OPERATION_RE.fullmatch(expression)
  if m is None:
    raise tool_calls.ToolError("the calculator does one operation (+, - or *) on two whole numbers, e.g. 17+8")
  return str(_OPS[m.group(2)](int(m.group(1)), int(m.group(3))))


TOOLS = {"calculator": one_operation}


def draw_steps(rng: random.Random, value: int, num_steps: int, max_operand: int) -> tuple[list, list[int]]:
  """`num_steps` random steps from `value`: ([(op, operand)], [value after each step]), every value in
  [1, MAX_VALUE] ("-" only from 3 up, "*" by MULTIPLIERS only where the product stays within the bound)."""
  steps, values = [], []
  for _ in range(num_steps):
    allowed = ["+"] if value + 2 <= MAX_VALUE else []
    if value >= 3:
      allowed.append("-")
    if value * MULTIPLIERS[0] <= MAX_VALUE:
      allowed.append("*")
    op = rng.choice(allowed)
    if op == "*":
      operand = rng.randint(MULTIPLIERS[0], min(MULTIPLIERS[1], MAX_VALUE // value))
    elif op == "+":
      operand = rng.randint(2, min(max_operand, MAX_VALUE - value))
    else:
      operand = rng.randint(2, min(max_operand, value - 1))
    value = apply_step(value, op, operand)
    steps.append((op, operand))
    values.append(value)
  return steps, values


def apply_step(value: int, op: str, operand: int) -> int:
  """`value op operand` for op "+", "-" or "*"."""
  return _OPS[op](value, operand)


def list_steps(steps: Sequence[tuple[str, int]]) -> str:
  """ "+8, *3, -12": the steps as a question lists them."""
  return ", ".join(f"{op}{operand}" for op, operand in steps)


def _draw_task(rng: random.Random, split: str, idx: int, min_steps: int, max_steps: int, max_operand: int) -> ChainTask:
  start = rng.randint(2, MAX_START)
  steps, values = draw_steps(rng, start, rng.randint(min_steps, max_steps), max_operand)
  question = f"Start with {start} and apply each step in order: {list_steps(steps)}."
  return ChainTask(f"{split}/chain/{idx}", question, str(values[-1]), start, tuple(steps), (start, *values))


def make_tasks(
  split: str,
  num: int | None = None,
  seed: int | None = None,
  *,
  min_steps: int = 4,
  max_steps: int = 8,
  max_operand: int = 20,
) -> list[ChainTask]:
  """A deterministic list of distinct chains (see the module notes for the splits).

  Args:
    split: "train" or "eval".
    num: number of tasks; defaults to `EVAL_SIZE` for eval, required for train.
    seed: train seed (default 0); None for eval.
    min_steps, max_steps: steps per chain, drawn uniformly in [min_steps, max_steps].
    max_operand: the largest operand of a "+" or "-" step (>= 2).

  Raises:
    ValueError: an unknown split, a seed for eval, `num` out of range, `min_steps` < 1, `max_steps` < `min_steps`,
      or `max_operand` < 2 (naming `config.env.chain.<key>`).
  """
  if split not in ("train", "eval"):
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
  _check_sizes(min_steps, max_steps, max_operand)

  def draw(split_name: str, base_seed: int, n: int, exclude: frozenset, strict: bool) -> list[ChainTask]:
    def stream() -> Iterator[tuple[int, ChainTask]]:
      idx = 0
      while True:
        rng = random.Random(f"chain/{base_seed}/{idx}")
        yield idx, _draw_task(rng, split_name, idx, min_steps, max_steps, max_operand)
        idx += 1

    counts = {"dropped_duplicate": 0, "dropped_eval_overlap": 0}
    return arithmetic.draw_tasks(
      split_name,
      [stream()],
      n,
      lambda _, drawn: (drawn[1], "kept"),
      lambda t: t.question,
      exclude,
      counts,
      strict=strict,
      max_misses=2000,
      where=lambda _: f"chains of {min_steps}-{max_steps} steps with operands up to {max_operand}",
    )

  return arithmetic.split_tasks(
    split, num, seed, draw, lambda t: t.question, eval_size=EVAL_SIZE, eval_reserve=EVAL_RESERVE
  )


def _check_sizes(min_steps: int, max_steps: int, max_operand: int) -> None:
  if min_steps < 1:
    raise ValueError(f"config.env.chain.min_steps must be >= 1, got {min_steps}")
  if max_steps < min_steps:
    raise ValueError(f"config.env.chain.max_steps must be >= min_steps ({min_steps}), got {max_steps}")
  if max_operand < 2:
    raise ValueError(f"config.env.chain.max_operand must be >= 2, got {max_operand}")


def initial_messages(task: ChainTask) -> list[dict]:
  """The prompt: `[{"role": "system", ...}, {"role": "user", "content": task.question}]`."""
  return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.question}]


def privileged_info(task: ChainTask) -> str:
  """Every step worked out ("17+8=25, 25*3=75, ...") and the answer in the answer format: what a teacher may see."""
  worked = ", ".join(
    f"{before}{op}{operand}={after}" for (op, operand), before, after in zip(task.steps, task.values, task.values[1:])
  )
  return f"{worked}, so the final answer is {tool_calls.render_answer(task.answer)}"


class ChainEnv(arithmetic.ArithmeticEnv):
  """One rollout: `ArithmeticEnv`'s turns (a call per message, `<answer>` ends it, think blocks never act, at most
  `max_tool_calls` calls) with the one-operation calculator (`one_operation`); keeps the integer results of its calls
  in `results` for `metrics`.

  With `show_next_step`, a result also names the step that follows the last one the calls reached ("28; next: *3",
  or "28; no steps left"): the call "a op b" reaches step j, the first step at or after the current one whose
  operator and operand are op and b (a call matching none leaves the pointer where it was). The policy then finds its
  place from the last tool response rather than by counting along the question's list, which a 3M-parameter policy
  did not learn in 1,200 warm-start steps (held-out success 0.000; docs/benchmarks.md).
  """

  def __init__(self, task: ChainTask, max_tool_calls: int, show_next_step: bool = True, reward: str = "outcome"):
    super().__init__(task, max_tool_calls=max_tool_calls, tools={"calculator": self._calculator})
    if reward not in REWARDS:
      raise ValueError(f"config.env.chain.reward must be one of {REWARDS}, got {reward!r}")
    self.show_next_step = bool(show_next_step)
    self.reward_kind = reward
    self.results: list[int] = []
    self.next_step = 0  # the index of the first step no call has reached

  def _calculator(self, arguments: Mapping[str, Any]) -> str:
    result = one_operation(arguments)
    self.results.append(int(result))
    m = _ONE_OPERATION_RE.fullmatch(arguments["expression"])
    call = (m.group(2), int(m.group(3)))
    self.next_step = next(
      (j + 1 for j in range(self.next_step, len(self.task.steps)) if self.task.steps[j] == call), self.next_step
    )
    if not self.show_next_step:
      return result
    if self.next_step == len(self.task.steps):
      return f"{result}; no steps left"
    op, operand = self.task.steps[self.next_step]
    return f"{result}; next: {op}{operand}"

  def reward(self) -> float:
    """The outcome (`ArithmeticEnv.reward`: 1.0 for the right final number); with reward "progress", a wrong or missing
    answer earns the fraction of the chain reached, progress · n / (n + 1) < 1 (`REWARDS`)."""
    outcome = super().reward()
    if self.reward_kind == "outcome" or outcome >= 1.0 or not self.done:
      return outcome
    steps = len(self.task.steps)
    return self.progress() * steps / (steps + 1)

  def progress(self) -> float:
    """How far along the chain the rollout's calls got: the largest j such that the task's value after step j is
    among the call results, over the number of steps (0 with no right result; 1 when the last value was computed,
    whether or not it was then answered). A step done in the head and right counts through the value after it."""
    reached = set(self.results)
    steps = len(self.task.steps)
    return max((j for j in range(1, steps + 1) if self.task.values[j] in reached), default=0) / steps


def metrics(envs: Sequence[ChainEnv]) -> dict[str, float]:
  """{"chain_progress": mean `ChainEnv.progress`, "chain_calls_per_step": mean calls over steps}; {} for none."""
  if not envs:
    return {}
  return {
    "chain_progress": sum(e.progress() for e in envs) / len(envs),
    "chain_calls_per_step": sum(e.info["tool_calls"] / len(e.task.steps) for e in envs) / len(envs),
  }


class _RandomLike(Protocol):
  def random(self) -> float: ...


def demonstration(
  task: ChainTask, rng: _RandomLike, skip_prob: float = 0.0, slip_prob: float = 0.0, show_next_step: bool = True
) -> list[dict]:
  """A chat for the supervised warm start: one calculator call per step, each result copied into the next call,
  then `<answer>`. Demonstrations of mixed quality: before each step but the last, with probability `skip_prob` the
  demonstrator does that step in its head (rightly) and calls the calculator on the next step with the value it
  worked out; with probability `slip_prob` a call copies its left number wrongly (one digit changed), and the chain
  goes on from the wrong result, so the demonstration's answer is wrong.

  Args:
    task: a task from `make_tasks`.
    rng: anything with `.random() -> float` in [0, 1) (`random.Random`).
    skip_prob, slip_prob: probabilities in [0, 1]; at 0 `rng` is never drawn from.
    show_next_step: the environment's tool results name the next step (`ChainEnv`).

  Returns:
    [system, user, (assistant call, tool result) per call, assistant answer].

  Raises:
    ValueError: a probability outside [0, 1] (naming `config.env.chain.<key>`).
  """
  check_habits("chain", skip_prob, slip_prob)
  env = ChainEnv(task, max_tool_calls=len(task.steps), show_next_step=show_next_step)
  calls, answer = play_steps(env, task.start, task.steps, rng, skip_prob, slip_prob)
  return initial_messages(task) + calls + [{"role": "assistant", "content": tool_calls.render_answer(str(answer))}]


def play_steps(
  env: Any, value: int, steps: Sequence[tuple[str, int]], rng: _RandomLike, skip_prob: float, slip_prob: float
) -> tuple[list[dict], int]:
  """A demonstrator's calls for `steps` from `value`, played through `env` (skips and slips as `demonstration`).

  Returns:
    ([assistant call, tool result] messages, the value the demonstrator ends with).
  """
  messages: list[dict] = []
  current = value
  i = 0
  while i < len(steps):
    if skip_prob > 0 and i + 1 < len(steps) and rng.random() < skip_prob:
      current = apply_step(current, *steps[i])
      i += 1
    left = current
    if slip_prob > 0 and rng.random() < slip_prob:
      left = _slip(left, rng)
    op, operand = steps[i]
    call = tool_calls.render_tool_call("calculator", {"expression": f"{left}{op}{operand}"})
    messages += [{"role": "assistant", "content": call}, {"role": "tool", "content": env.step(call).observation}]
    current = apply_step(left, op, operand)
    i += 1
  return messages, current


def check_habits(env: str, skip_prob: float, slip_prob: float) -> None:
  """Refuses a demonstration habit outside [0, 1], naming `config.env.<env>.skip_prob` or `slip_prob`."""
  for name, p in (("skip_prob", skip_prob), ("slip_prob", slip_prob)):
    if not 0.0 <= p <= 1.0:
      raise ValueError(f"config.env.{env}.{name} must be in [0, 1], got {p}")


def _slip(value: int, rng: _RandomLike) -> int:
  """`value` with one digit changed (never the leading digit to 0)."""
  digits = list(str(value))
  at = int(rng.random() * len(digits))
  choices = [d for d in "0123456789" if d != digits[at] and not (at == 0 and d == "0" and len(digits) > 1)]
  digits[at] = choices[int(rng.random() * len(choices))]
  return int("".join(digits))


def env_spec(env_config=None) -> spec.EnvSpec:
  """The chain environment as an `EnvSpec` (the `ENVS["chain"]` row), from the `config.env.chain` node.

  Keys (`CONFIG_DEFAULTS`): min_steps, max_steps, max_operand (tasks); extra_calls (the call budget beyond one per
  step); skip_prob, slip_prob (the warm start's demonstrations); show_next_step (tool results name the next step);
  reward ("outcome" or "progress", `REWARDS`). A rollout has at most max_steps + extra_calls + 1
  assistant turns.

  Raises:
    ValueError: a value out of range, naming `config.env.chain.<key>`.
  """

  def get(key):
    value = None if env_config is None else getattr(env_config, key, None)
    return CONFIG_DEFAULTS[key] if value is None else value

  min_steps, max_steps, max_operand = int(get("min_steps")), int(get("max_steps")), int(get("max_operand"))
  extra_calls, skip_prob, slip_prob = int(get("extra_calls")), float(get("skip_prob")), float(get("slip_prob"))
  show_next_step = bool(get("show_next_step"))
  reward = str(get("reward"))
  if reward not in REWARDS:
    raise ValueError(f"config.env.chain.reward must be one of {REWARDS}, got {reward!r}")
  _check_sizes(min_steps, max_steps, max_operand)
  if extra_calls < 0:
    raise ValueError(f"config.env.chain.extra_calls must be >= 0, got {extra_calls}")
  check_habits("chain", skip_prob, slip_prob)
  max_tool_calls = max_steps + extra_calls
  return spec.EnvSpec(
    make_tasks=lambda split, num, seed: make_tasks(
      split, num, seed, min_steps=min_steps, max_steps=max_steps, max_operand=max_operand
    ),
    make_env=lambda task: ChainEnv(task, max_tool_calls=max_tool_calls, show_next_step=show_next_step, reward=reward),
    initial_messages=initial_messages,
    stop_strings=(tool_calls.TOOL_CALL_CLOSE, tool_calls.ANSWER_CLOSE),
    max_turns=max_tool_calls + 1,
    is_success=lambda r: r >= 1.0,
    demonstration=lambda task, rng: demonstration(task, rng, skip_prob, slip_prob, show_next_step),
    gold_answer_text=lambda task: tool_calls.render_answer(task.answer),
    privileged_info=privileged_info,
    metrics=metrics,
  )
