"""Arithmetic tool-use environment: reasoning-gym tasks, a calculator tool, math-verify rewards.

Tasks come from reasoning-gym's `basic_arithmetic` and `chain_sum` with small operands. A rollout is a
chat: `initial_messages(task)` (system prompt + question), then assistant turns driven through
`ArithmeticEnv.step`, which answers tool calls with `{"role": "tool", "content": observation}` content and
ends the episode on an answer, on a turn without call or answer, or on a call past the budget.
`ArithmeticEnv.reward` is 1.0 when the answer verifies against the gold number with math-verify.

The environment knows no model and no tokenizer; everything here is plain Python on text and chat
messages (dicts with "role" and "content").

reasoning-gym notes (0.1.25):
  * item `idx` of a dataset with seed `s` is generated from `random.Random(s + idx)`, so seeds `s` and
    `s + 1` give shifted copies of the same items; split seeds here are therefore far apart, and the train
    split additionally drops any expression that occurs in the eval split.
  * `basic_arithmetic` computes its answer with `/` replaced by `//` (floor division). It picks divisors
    that usually divide exactly, but when a division applies to only part of what was used to pick the
    divisor, the true value of the printed expression differs from its gold answer. Such tasks are dropped
    (see `make_tasks(stats=...)`), so every kept task's expression evaluates exactly to its gold answer.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

from jaxcredit.envs import episode, spec, tool_calls
from jaxcredit.envs.calculator import CalculatorError, evaluate, format_number

DATASETS = ("basic_arithmetic", "chain_sum")
EVAL_SIZE = 64  # the held-out split's default size
EVAL_RESERVE = 512  # the eval split may be any prefix up to this size; train avoids all of it
EVAL_SEED = 987_654_321  # reasoning-gym seed of the eval split (fixed)
_TRAIN_SEED_STRIDE = 10_000_019  # reasoning-gym seed of train seed s is s * stride (see module notes)
MAX_ANSWER_CHARS = 64  # longer answers score 0 without calling math-verify

SYSTEM_PROMPT = tool_calls.calculator_prompt(
  "Solve the arithmetic problem. To use the calculator, write:",
  "2*(3+4)",
  "Give the final number as <answer>14</answer>.",
)

_GOLD_RE = re.compile(r"-?\d+")
_NUMBER_RE = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_WRAPPERS = (re.compile(r"\$(.*)\$", re.S), re.compile(r"\\boxed\{(.*)\}", re.S))
_MATH_VERIFY_UNSAFE = re.compile(r"\^|\*\*|!|\\binom|\\choose")
"""Powers, factorials and binomials: sympy evaluates their integers eagerly inside C code ("9^9^9^9"), which neither
math-verify's signal timeout nor anything else interrupts, so `math_verify_correct` never hands them to it."""
MATH_VERIFY_TIMEOUT_S = 5
"""math-verify's own default parse and verify timeouts, used on the main thread (its timeouts are signal alarms)."""


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
  """One arithmetic problem.

  Attributes:
    task_id: unique id, "<split>/<dataset>/<reasoning-gym index>".
    question: the user message (reasoning-gym's question text, unchanged).
    answer: the gold answer, a plain integer string such as "-28".
    source: the reasoning-gym dataset name ("basic_arithmetic" or "chain_sum").
    expression: the arithmetic expression the question asks about (reasoning-gym's
      metadata["expression"]); the calculator evaluates it exactly to `answer`.
    metadata: reasoning-gym's metadata for the item, plus "seed" (the dataset seed used).
  """

  task_id: str
  question: str
  answer: str
  source: str
  expression: str
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)


def make_tasks(
  split: str,
  num: int | None = None,
  seed: int | None = None,
  *,
  datasets: Sequence[str] = DATASETS,
  min_terms: int = 2,
  max_terms: int = 3,
  min_digits: int = 1,
  max_digits: int = 2,
  stats: dict[str, int] | None = None,
) -> list[ArithmeticTask]:
  """Makes a deterministic list of distinct tasks, taking one from each of `datasets` in turn.

  The eval split is the first `num` tasks of one fixed sequence (reasoning-gym seed `EVAL_SEED`), so any
  eval size is a prefix of a larger one. The train split for `seed` never contains an expression (spaces
  ignored) of the first `EVAL_RESERVE` eval tasks made with the same difficulty arguments, and no split
  repeats an expression. Tasks whose gold answer is not a plain integer or whose expression does not
  evaluate exactly to it are dropped (see the module notes).

  Args:
    split: "train" or "eval".
    num: number of tasks; defaults to `EVAL_SIZE` for eval, required for train.
    seed: train seed (default 0); must be None for eval.
    datasets: reasoning-gym dataset names, any of `DATASETS`.
    min_terms, max_terms, min_digits, max_digits: operand count and size, passed to each dataset config.
    stats: if given, filled with counts: "kept", "dropped_inexact" (floor-division gold answers),
      "dropped_not_integer", "dropped_duplicate" (repeated expression), "dropped_eval_overlap".

  Returns:
    `num` tasks.

  Raises:
    ValueError: unknown split or dataset, `num` missing or < 0, eval `num` > `EVAL_RESERVE`, a seed for
      eval, invalid difficulty ranges, or fewer than `num` distinct tasks exist for these settings.
  """
  if split not in ("train", "eval"):
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
  for d in datasets:
    if d not in DATASETS:
      raise ValueError(f"unknown dataset {d!r}; available: {', '.join(DATASETS)}")
  if not datasets:
    raise ValueError("datasets is empty")
  if not 1 <= min_terms <= max_terms or not 1 <= min_digits <= max_digits:
    raise ValueError(f"invalid difficulty: terms {min_terms}..{max_terms}, digits {min_digits}..{max_digits}")
  difficulty = (min_terms, max_terms, min_digits, max_digits)

  def draw(split, base_seed, num, exclude, strict):
    return _generate(split, base_seed, num, tuple(datasets), difficulty, exclude, stats if strict else None, strict)

  return split_tasks(split, num, seed, draw, lambda t: _normalize(t.expression))


def split_tasks(
  split: str,
  num: int | None,
  seed: int | None,
  draw: Callable[[str, int, int, frozenset, bool], list],
  key: Callable[[Any], str],
  *,
  eval_size: int = EVAL_SIZE,
  eval_reserve: int = EVAL_RESERVE,
  reserve_note: str = "",
) -> list:
  """The split rules of generated tasks (`make_tasks`, `math_tools.make_gym_tasks`).

  Eval: the first `num` (default `eval_size`, at most `eval_reserve`) tasks drawn at `EVAL_SEED`. Train (seed
  default 0): `num` tasks drawn at `seed * _TRAIN_SEED_STRIDE`, leaving out every task whose `key` is among the first
  `eval_reserve` eval tasks.

  Args:
    split: "train" or "eval" (checked by the caller).
    draw: (split, base seed, num, keys to exclude, strict) -> tasks (`draw_tasks`; strict=False: the eval reserve,
      fewer when the stream runs dry).
    reserve_note: written after the range in the error for an eval `num` out of range (e.g. " (eval_reserve)").

  Raises:
    ValueError: a seed for eval, eval `num` out of [0, eval_reserve], train `num` missing or < 0.
  """
  if split == "eval":
    if seed is not None:
      raise ValueError("the eval split has a fixed seed; pass seed=None")
    num = eval_size if num is None else num
    if not 0 <= num <= eval_reserve:
      raise ValueError(f"eval num must be in [0, {eval_reserve}]{reserve_note}, got {num}")
    return draw("eval", EVAL_SEED, num, frozenset(), True)
  if num is None or num < 0:
    raise ValueError(f"train num must be a non-negative int, got {num!r}")
  seed = 0 if seed is None else int(seed)
  reserved = draw("eval", EVAL_SEED, eval_reserve, frozenset(), False)
  exclude = frozenset(key(t) for t in reserved)
  return draw("train", seed * _TRAIN_SEED_STRIDE, num, exclude, True)


def _normalize(expression: str) -> str:
  return "".join(expression.split())


def _generate(split, base_seed, num, datasets, difficulty, exclude, stats, strict=True) -> list[ArithmeticTask]:
  """The first `num` kept tasks of the stream; with strict=False, fewer when the stream runs dry."""
  counts = {
    "kept": 0,
    "dropped_inexact": 0,
    "dropped_not_integer": 0,
    "dropped_duplicate": 0,
    "dropped_eval_overlap": 0,
  }

  def read(_, drawn):
    name, idx, item = drawn
    expr = item["metadata"]["expression"]
    gold = item["answer"]
    if not _GOLD_RE.fullmatch(gold):
      return None, "dropped_not_integer"
    try:
      exact = evaluate(expr) == int(gold)
    except CalculatorError:
      exact = False
    if not exact:
      return None, "dropped_inexact"
    meta = dict(item["metadata"], seed=base_seed)
    task = ArithmeticTask(
      task_id=f"{split}/{name}/{idx}",
      question=item["question"],
      answer=gold,
      source=name,
      expression=expr,
      metadata=meta,
    )
    return task, "kept"

  tasks = draw_tasks(
    split,
    [_items(d, base_seed, difficulty) for d in datasets],
    num,
    read,
    lambda t: _normalize(t.expression),
    exclude,
    counts,
    strict=strict,
    max_misses=2000,  # consecutive items of one dataset without a new task: its problem space is used up
    where=lambda _: f"datasets {list(datasets)} and difficulty {difficulty}",
  )
  counts["kept"] = len(tasks)
  if stats is not None:
    stats.update(counts)
  return tasks


def draw_tasks(
  split: str,
  streams: Sequence[Iterator],
  num: int,
  read: Callable[[int, Any], tuple[Any, str]],
  key: Callable[[Any], str],
  exclude: frozenset,
  counts: dict[str, int],
  *,
  strict: bool,
  max_misses: int,
  where: Callable[[int], str],
) -> list:
  """The first `num` tasks kept from `streams`, taken in turn: each turn pulls from its stream until one is kept.

  Args:
    split: for the error message.
    streams: endless iterators of drawn items.
    read: (stream index, drawn item) -> (task, "kept"), or (None, the `counts` key of why it is dropped).
    key: task -> what makes two tasks the same; a task whose key is in `exclude` ("dropped_eval_overlap") or was
      kept already ("dropped_duplicate") is dropped.
    counts: the drop counts, incremented in place.
    strict: False: return the tasks kept so far (fewer than `num`) when the draw gives up.
    max_misses: items of one stream in a row without a kept task after which it is used up.
    where: stream index -> what the error says was drawn from.

  Raises:
    ValueError: with strict, when 50 * num + 1000 items in all, or `max_misses` of one stream in a row, keep fewer
      than `num` tasks.
  """
  tasks: list = []
  seen: set[str] = set()
  max_items = 50 * num + 1000
  tried = 0
  turn = 0
  while len(tasks) < num:
    i = turn % len(streams)
    turn += 1
    misses = 0
    while True:  # pull from this stream until one task is kept
      if tried >= max_items or misses >= max_misses:
        if not strict:
          return tasks
        raise ValueError(
          f"only {len(tasks)} distinct {split} tasks found in {tried} items for {where(i)}; asked for {num}"
        )
      tried += 1
      misses += 1
      task, reason = read(i, next(streams[i]))
      if task is None:
        counts[reason] += 1
        continue
      k = key(task)
      if k in exclude:
        counts["dropped_eval_overlap"] += 1
        continue
      if k in seen:
        counts["dropped_duplicate"] += 1
        continue
      seen.add(k)
      tasks.append(task)
      break
  return tasks


def _items(name: str, base_seed: int, difficulty) -> Iterator[tuple[str, int, dict]]:
  min_terms, max_terms, min_digits, max_digits = difficulty
  ds = _dataset(name, base_seed, min_terms, max_terms, min_digits, max_digits)
  idx = 0
  while True:
    yield name, idx, ds[idx]
    idx += 1


@functools.lru_cache(maxsize=32)
def _dataset(name, seed, min_terms, max_terms, min_digits, max_digits):
  # imported lazily: `import reasoning_gym` loads every dataset module (about 2 s)
  if name == "basic_arithmetic":
    from reasoning_gym.arithmetic.basic_arithmetic import BasicArithmeticDataset, BasicArithmeticDatasetConfig

    cfg = BasicArithmeticDatasetConfig(
      min_terms=min_terms, max_terms=max_terms, min_digits=min_digits, max_digits=max_digits, seed=seed, size=1
    )
    cfg.validate()
    return BasicArithmeticDataset(cfg)
  from reasoning_gym.arithmetic.chain_sum import ChainSumConfig, ChainSumDataset

  cfg = ChainSumConfig(
    min_terms=min_terms, max_terms=max_terms, min_digits=min_digits, max_digits=max_digits, seed=seed, size=1
  )
  cfg.validate()
  return ChainSumDataset(cfg)


def initial_messages(task: ArithmeticTask) -> list[dict]:
  """The prompt of a rollout: `[{"role": "system", ...}, {"role": "user", "content": task.question}]`."""
  return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.question}]


def gold_answer_text(task: ArithmeticTask) -> str:
  """`<answer>{gold}</answer>`: the text TRACE scores as the next assistant message."""
  return tool_calls.render_answer(task.answer)


StepResult = spec.StepResult  # the observation is a tool message's content; None when done


class ArithmeticEnv(episode.ToolEpisode):
  """One rollout's environment: answers calculator calls until an answer or the end.

  Per assistant turn (`step`), text inside `<think>...</think>` is dropped (`tool_calls.parse_message`; an
  unclosed think block gives an error observation and nothing else happens), then whichever comes first in the
  visible text decides:
    * `<tool_call>` with calls left: the call runs (malformed calls give an "error: ..." result and still
      count as a call); returns the observation, not done.
    * `<tool_call>` with no calls left: done, info["budget_exhausted"] = True, no answer.
    * `<answer>`: done, info["answered"] = True; the answer is kept for `reward`.
    * neither: done without an answer.

  `info` keys: "tool_calls" (calls run, malformed included), "tool_errors" (calls that gave an error),
  "answered", "budget_exhausted", "turns" (assistant turns seen), "finish" (None while running, then
  "answer", "no_answer" or "tool_budget"), "answer" (the extracted answer text or None).
  """

  def __init__(self, task: ArithmeticTask, max_tool_calls: int = 2, tools: Mapping[str, Callable] | None = None):
    """Args:
      task: the problem.
      max_tool_calls: how many tool calls the episode may run (>= 0).
      tools: tool name -> function(arguments) -> output text (`tool_calls.run_tool_call`); None: `tool_calls.TOOLS`
        (the calculator). The chain environment passes its one-operation calculator.

    Raises:
      ValueError: if `max_tool_calls` < 0.
    """
    if max_tool_calls < 0:
      raise ValueError(f"max_tool_calls must be >= 0, got {max_tool_calls}")
    super().__init__(task, answer=None)
    self.max_tool_calls = int(max_tool_calls)
    self.tools = tools
    self._reward: float | None = None
    self._math_verify: bool | None = None

  def step(self, assistant_text: str) -> StepResult:
    """Consumes one assistant message: runs its calculator call, or ends the episode on an answer, a call past the
    budget or neither (see the class notes; arguments, result and errors as `episode.ToolEpisode.step`)."""
    info = self.begin_step()
    # one read of the message (think blocks dropped once: stripping twice would misread a stray </think>)
    msg = tool_calls.parse_message(assistant_text, max_calls=1, max_call_chars=tool_calls.MAX_CALL_CHARS)
    if msg.error is not None:
      return self._think_error(msg.error)
    answer_at = msg.visible.find(tool_calls.ANSWER_OPEN)
    if msg.calls and (answer_at < 0 or msg.calls[0].start < answer_at):
      if info["tool_calls"] >= self.max_tool_calls:
        info["budget_exhausted"] = True
        return self._finish("tool_budget")
      info["tool_calls"] += 1
      outcome = tool_calls.run_parsed_call(msg.calls[0], self.tools)
      if not outcome.ok:
        info["tool_errors"] += 1
      return self._observe(tool_calls.render_tool_response(outcome.content))
    if msg.answer is not None:
      info["answered"] = True
      info["answer"] = msg.answer
      return self._finish("answer")
    return self._finish("no_answer")

  def reward(self) -> float:
    """1.0 when the given answer verifies against the gold answer, else 0.0 (also before the end).

    The answer must be a plain number (optionally signed, with thousands commas, a decimal part, or wrapped
    in `$...$` or `\\boxed{...}`) of at most `MAX_ANSWER_CHARS` characters; anything else scores 0 without
    reaching math-verify. This bounds math-verify's time (it has no timeout off the main thread, and an
    answer like "10^10^10^10" makes sympy run for minutes) and keeps an unevaluated expression such as
    "(3+4)*2" from earning the reward for 14. The result is cached.
    """
    if not self.done:
      return 0.0  # never cached: a reward asked for mid-episode must not freeze the episode's reward at 0
    if self._reward is None:
      answer = self.info["answer"]
      self._reward = 1.0 if (answer is not None and answer_is_correct(answer, self.task.answer)) else 0.0
    return self._reward

  def math_verify_correct(self) -> bool:
    """math-verify's verdict on the rollout's final answer against the gold (`math_verify_correct`); False before the
    end or without an answer. Cached (the metrics' bootstrap asks for it again and again)."""
    if not self.done:
      return False
    if self._math_verify is None:
      self._math_verify = math_verify_correct(self.info["answer"], self.task.answer)
    return self._math_verify


def normalize_answer(answer: str) -> str | None:
  """The plain number inside an answer, or None when it is not one.

  Strips whitespace, one `$...$` or `\\boxed{...}` wrapper and a leading "+", and reads U+2212 as "-".
  """
  if len(answer) > MAX_ANSWER_CHARS:
    return None
  s = answer.strip().replace("\u2212", "-")
  for pat in _WRAPPERS:
    m = pat.fullmatch(s)
    if m:
      s = m.group(1).strip()
  if not _NUMBER_RE.fullmatch(s):
    return None
  return s[1:] if s.startswith("+") else s  # math-verify parses "+14" as nothing


def answer_is_correct(answer: str, gold: str) -> bool:
  """Whether `answer` (the text inside `<answer>`) verifies against `gold` with math-verify.

  Non-numbers (see `normalize_answer`) are incorrect. math-verify runs without its signal-based timeouts
  (`parsing_timeout=None, timeout_seconds=None`) so this works off the main thread.
  """
  s = normalize_answer(answer)
  if s is None:
    return False
  from math_verify import parse, verify  # lazy: imports sympy (about 2 s)

  pred = parse(s, parsing_timeout=None)
  return bool(pred) and bool(verify(_parse_gold(gold), pred, timeout_seconds=None))


def math_verify_correct(answer: str | None, gold: str) -> bool:
  """Whether the final answer (the text inside `<answer>`) is right by the `math_verify` package as math benchmarks
  score it: `verify(parse(gold), parse(answer))` with its default extraction (LaTeX and plain expressions) and its
  default 5 s timeouts on the main thread (none elsewhere: they are signal alarms).

  Unlike the reward (`answer_is_correct`, plain numbers only), any form math-verify reads counts (e.g.
  "\\frac{28}{2}" for 14). Counted wrong without calling math-verify: no answer, more than `MAX_ANSWER_CHARS`
  characters, or a power, factorial or binomial (`_MATH_VERIFY_UNSAFE`: what can hang sympy beyond any timeout). A
  math-verify error is wrong.

  Source: Hugging Face's Math-Verify (github.com/huggingface/Math-Verify, `parse` and `verify`).
  """
  if answer is None or len(answer) > MAX_ANSWER_CHARS or _MATH_VERIFY_UNSAFE.search(answer):
    return False
  from math_verify import parse, verify  # lazy: imports sympy (about 2 s)

  timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
  try:
    pred = parse(answer, parsing_timeout=timeout)
    return bool(pred) and bool(verify(_parse_gold(gold), pred, timeout_seconds=timeout))
  except Exception:  # noqa: BLE001 - model-written text reaching sympy; math-verify's timeout raises too
    return False


def metrics(envs: Sequence[ArithmeticEnv]) -> dict[str, float]:
  """{"math_verify_accuracy": the fraction of rollouts whose final answer math-verify accepts} (`math_verify_correct`:
  the `math_verify` package's parse and verify against the gold, beside the stricter plain-number reward); {} for none.
  """
  if not envs:
    return {}
  return {"math_verify_accuracy": sum(e.math_verify_correct() for e in envs) / len(envs)}


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str):
  from math_verify import parse

  return parse(gold, parsing_timeout=None)


class _RandomLike(Protocol):
  def random(self) -> float: ...


def demonstration(task: ArithmeticTask, rng: _RandomLike, direct_answer_prob: float = 0.0) -> list[dict]:
  """A full tool-use chat for the supervised warm start.

  system, user question, assistant calculator call on the task's expression (written verbatim or, with
  probability 1/2, without spaces), the tool message exactly as `ArithmeticEnv.step` returns it, and the
  assistant's `<answer>{result}</answer>`. With probability `direct_answer_prob` the chat answers at once
  instead (system, user, assistant `<answer>{gold}</answer>`, no call): demonstrations of mixed quality, as when
  warm-start data comes from a model that sometimes skips its tool. A policy that cannot do the arithmetic in its
  head then fails where it copied that habit, which leaves RL a decision to learn (call the calculator); the CPU
  testbed uses it (docs/benchmarks.md).

  Args:
    task: a task from `make_tasks`.
    rng: anything with `.random() -> float` in [0, 1) (`random.Random`, `numpy.random.Generator`).
    direct_answer_prob: probability in [0, 1] of the direct-answer chat; at 0 (the default) `rng` is drawn from
      exactly as before this option existed.

  Returns:
    The messages, [system, user, assistant, tool, assistant], or [system, user, assistant] when answered directly.

  Raises:
    ValueError: if `direct_answer_prob` is outside [0, 1], or the calculator's result on the expression differs
      from the gold answer (never for tasks from `make_tasks`).
  """
  if not 0.0 <= direct_answer_prob <= 1.0:
    raise ValueError(f"config.env.arithmetic.direct_answer_prob must be in [0, 1], got {direct_answer_prob}")
  if direct_answer_prob > 0 and rng.random() < direct_answer_prob:
    return initial_messages(task) + [{"role": "assistant", "content": tool_calls.render_answer(task.answer)}]
  expr = task.expression if rng.random() < 0.5 else _normalize(task.expression)
  call = tool_calls.render_tool_call("calculator", {"expression": expr})
  env = ArithmeticEnv(task, max_tool_calls=1)
  obs = env.step(call).observation
  value = format_number(evaluate(expr))
  if value != task.answer or obs != tool_calls.render_tool_response(value):
    raise ValueError(f"task {task.task_id}: calculator gives {value!r} for {expr!r}, gold is {task.answer!r}")
  return initial_messages(task) + [
    {"role": "assistant", "content": call},
    {"role": "tool", "content": obs},
    {"role": "assistant", "content": tool_calls.render_answer(value)},
  ]


def privileged_info(task: ArithmeticTask) -> str:
  """The verified ground truth a teacher may see: the expression, its value and the answer in the answer format."""
  return f"{task.expression} = {task.answer}, so the final answer is {tool_calls.render_answer(task.answer)}"


def env_spec(max_tool_calls: int = 2, direct_answer_prob: float = 0.0):
  """The arithmetic environment as an `EnvSpec` (the `ENVS["arithmetic"]` row).

  Args:
    max_tool_calls: calculator calls per rollout; a rollout has at most max_tool_calls + 1 assistant turns.
    direct_answer_prob: share of warm-start demonstrations that answer without the calculator (`demonstration`).

  Raises:
    ValueError: if `max_tool_calls` < 0 or `direct_answer_prob` is outside [0, 1].
  """
  from jaxcredit.envs.spec import EnvSpec

  if max_tool_calls < 0:
    raise ValueError(f"config.env.arithmetic.max_tool_calls must be >= 0, got {max_tool_calls}")
  if not 0.0 <= direct_answer_prob <= 1.0:
    raise ValueError(f"config.env.arithmetic.direct_answer_prob must be in [0, 1], got {direct_answer_prob}")
  return EnvSpec(
    make_tasks=lambda split, num, seed: make_tasks(split, num, seed),
    make_env=lambda task: ArithmeticEnv(task, max_tool_calls=max_tool_calls),
    initial_messages=initial_messages,
    stop_strings=(tool_calls.TOOL_CALL_CLOSE, tool_calls.ANSWER_CLOSE),
    max_turns=max_tool_calls + 1,
    is_success=lambda reward: reward > 0.5,
    demonstration=lambda task, rng: demonstration(task, rng, direct_answer_prob),
    gold_answer_text=gold_answer_text,
    privileged_info=privileged_info,
    metrics=metrics,
  )
