"""Math with a calculator tool: reasoning-gym generators with numeric answers, or tasks read from a file.

The arithmetic environment (`jaxcredit.envs.arithmetic`) generalised in two ways:

  * Tasks come from a configurable list of reasoning-gym generators (`GENERATORS`), or from a file source
    (`jaxcredit.envs.sources`: "jsonl:...", "hf:...", "tfds:...").
  * The reward is the task's own verifier (`score_answer`): the generator's `score_answer` for reasoning-gym tasks,
    math-verify against the gold answer for file tasks. Either way the answer must be a plain number of at most
    `arithmetic.MAX_ANSWER_CHARS` characters (`arithmetic.normalize_answer`), which bounds the verifiers' time and
    keeps an unevaluated expression from earning the reward; the reward is 1.0 when the verifier gives full credit
    and 0.0 otherwise (reasoning-gym's partial credit, e.g. 0.01 for any number or len(gold)/len(answer) when the
    gold is a substring of the answer, is not passed on).

A rollout is as in arithmetic (`MathEnv` is `ArithmeticEnv` with the reward swapped): the calculator tool
(+ - * / and parentheses, exact), `<answer>` ending the episode, think blocks never acted on, at most
`max_tool_calls` calls.

Demonstrations exist only when every task carries an expression the calculator evaluates to its gold answer: the
generators in `EXPRESSION_GENERATORS` (tasks whose printed expression does not evaluate exactly to the gold answer,
such as `basic_arithmetic`'s floor-division ones, are dropped) or a file source with `expression_field`. Otherwise
`EnvSpec.demonstration` is None and `config.sft.steps` must be 0.

Splits: the eval split of the generators is a prefix of one fixed sequence (`arithmetic.EVAL_SEED`); the train
split for a seed never holds a task whose expression (or, without one, whose question, whitespace collapsed) is
among the first `EVAL_RESERVE` eval tasks, and no split repeats one. For a file, the eval split is `eval_holdout`
records held out of the source (a fixed pseudo-random choice) or the first `eval_holdout` records of `eval_source`;
train never holds a record whose prompt equals one of them.

reasoning-gym notes (0.1.25): item `idx` of a dataset with seed `s` is generated from `random.Random(s + idx)`, so
split seeds are far apart (as in arithmetic). `gsm_symbolic` picks its template for item `idx` from a list whose
length is the dataset size, so every dataset here is built with one fixed size (`STREAM_SIZE`). Each generator's
dataset seed is the split's seed plus an offset derived from its name (`_generator_seed`), so that different
generators do not share their random draws.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import json
import zlib
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any, Iterator, Mapping, Protocol, Sequence

import numpy as np

from jaxcredit.envs import arithmetic, sources, spec, tool_calls
from jaxcredit.envs.calculator import CalculatorError, evaluate, format_number


@dataclasses.dataclass(frozen=True)
class Generator:
  """What this environment knows of one reasoning-gym generator.

  Attributes:
    expression: its metadata["expression"] is the calculator expression of the question (demonstrations).
    solution_key: the metadata key of a worked reference solution (privileged info), or None.
    note: why it is here (for docs).
    defaults: reasoning-gym config arguments used unless `generator_kwargs` sets them.
  """

  expression: bool = False
  solution_key: str | None = None
  note: str = ""
  defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)


GENERATORS: dict[str, Generator] = {
  # reasoning-gym's default (up to 6 terms of 4 digits) can spend seconds to minutes on one item (a brute-force
  # divisor search on products up to 1e24) and gives values past the calculator's 1e15 bound.
  "basic_arithmetic": Generator(
    True,
    note="+ - * / ( ) expressions; floor-division golds that differ from the printed expression are dropped",
    defaults={"max_terms": 4, "max_digits": 3},
  ),
  "chain_sum": Generator(True, note="sums and differences"),
  "products": Generator(True, note="products of up to 5-digit numbers"),
  "decimal_chain_sum": Generator(True, note="sums of decimals, exact golds"),
  "gsm_symbolic": Generator(solution_key="answer_cot", note="grade-school word problems with a worked solution"),
  "simple_equations": Generator(note="linear equations in one variable, integer solutions"),
  "leg_counting": Generator(note="sums of legs over animals"),
  "simple_geometry": Generator(note="the missing interior angle of a polygon"),
  "lcm": Generator(note="least common multiple (the calculator checks candidates)"),
  "gcd": Generator(note="greatest common divisor (the calculator checks candidates)"),
}
EXPRESSION_GENERATORS = tuple(n for n, g in GENERATORS.items() if g.expression)
DEFAULT_GENERATORS = (
  "basic_arithmetic",
  "chain_sum",
  "products",
  "decimal_chain_sum",
  "gsm_symbolic",
  "simple_equations",
  "leg_counting",
  "simple_geometry",
)

EVAL_SIZE = 64  # the held-out split's default size
EVAL_RESERVE = 512  # the eval split may be any prefix up to this size; train avoids all of it
EVAL_HOLDOUT = 64  # file sources: records held out for the eval split (`eval_holdout` default)
STREAM_SIZE = 1_000_000  # reasoning-gym dataset size: the most items one generator stream can give
_MAX_MISSES = 2000  # consecutive items of one generator without a new task: its problem space is used up

SYSTEM_PROMPT = tool_calls.calculator_prompt(
  "Solve the math problem. To use the calculator (numbers, + - * / and parentheses), write:",
  "2*(3+4)",
  "Give the final answer as a plain number, e.g. <answer>14</answer>.",
)


@dataclasses.dataclass(frozen=True)
class MathTask:
  """One problem.

  Attributes:
    task_id: unique id: "<split>/<generator>/<reasoning-gym index>", or the file record's task id.
    question: the user message.
    answer: the gold answer as text (a plain number for generator tasks).
    source: the generator name, or the source spec ("jsonl:/data/train.jsonl") of a file task.
    verifier: "reasoning_gym" (the generator's `score_answer`) or "math_verify" (file tasks).
    expression: an expression the calculator evaluates to the gold answer, or None.
    solution: a reference solution (gsm_symbolic's worked answer, a file's `info_field`), or None.
    metadata: generator tasks: reasoning-gym's metadata plus "seed" (dataset seed) and "generator_kwargs" (JSON);
      file tasks: the `TaskRecord` metadata. Not compared.
  """

  task_id: str
  question: str
  answer: str
  source: str
  verifier: str
  expression: str | None = None
  solution: str | None = None
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)


# --- verifiers ------------------------------------------------------------------------------------------------------


def score_answer(task: MathTask, answer: str | None) -> float:
  """The reward of `answer` (the text inside `<answer>`) on `task`: 1.0 or 0.0.

  The answer must be a plain number (`arithmetic.normalize_answer`: optional sign, thousands commas, decimals, one
  `$...$` or `\\boxed{...}` wrapper; at most `arithmetic.MAX_ANSWER_CHARS` characters), else 0.0 without calling a
  verifier. Generator tasks: 1.0 when the generator's `score_answer` gives full credit to the number as written, to
  it without commas, or to its canonical form ("14.0" -> "14", "0.50" -> "0.5"). File tasks: math-verify against
  the gold answer (`arithmetic.answer_is_correct`, no signal-based timeouts). Never raises on the answer text.
  """
  if answer is None:
    return 0.0
  s = arithmetic.normalize_answer(answer)
  if s is None:
    return 0.0
  if task.verifier == "math_verify":
    return 1.0 if arithmetic.answer_is_correct(s, task.answer) else 0.0
  if task.verifier != "reasoning_gym":
    raise ValueError(f"task {task.task_id}: unknown verifier {task.verifier!r}")
  ds = _dataset(task.source, int(task.metadata["seed"]), task.metadata.get("generator_kwargs", "{}"))
  entry = {"question": task.question, "answer": task.answer, "metadata": task.metadata}
  for candidate in dict.fromkeys((s, s.replace(",", ""), _canonical(s))):
    if candidate is None:
      continue
    try:
      if float(ds.score_answer(candidate, entry)) >= 1.0:
        return 1.0
    except Exception:  # noqa: BLE001 - a generator's scorer failing on odd text scores 0
      continue
  return 0.0


def _canonical(number: str) -> str | None:
  """A plain number written canonically: no commas, no trailing zeros, no "-0" ("1,200.50" -> "1200.5")."""
  try:
    d = Decimal(number.replace(",", ""))
  except InvalidOperation:
    return None
  if d == d.to_integral_value():
    return str(int(d))
  return format(d.normalize(), "f")


# --- reasoning-gym tasks --------------------------------------------------------------------------------------------


def make_gym_tasks(
  split: str,
  num: int | None = None,
  seed: int | None = None,
  *,
  generators: Sequence[str] = DEFAULT_GENERATORS,
  generator_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
  eval_reserve: int = EVAL_RESERVE,
  stats: dict[str, int] | None = None,
) -> list[MathTask]:
  """Makes a deterministic list of distinct tasks, taking one from each generator in turn.

  Args:
    split: "train" or "eval".
    num: number of tasks; defaults to `EVAL_SIZE` for eval, required for train.
    seed: train seed (default 0); must be None for eval.
    generators: names from `GENERATORS`.
    generator_kwargs: generator name -> keyword arguments of its reasoning-gym config (difficulty, e.g.
      {"products": {"max_digits": 3}}), over `GENERATORS[name].defaults` and reasoning-gym's defaults.
    eval_reserve: train avoids the first this many eval tasks (made with the same arguments); eval `num` must not
      exceed it.
    stats: if given, filled with counts: "kept", "dropped_generator_error" (reasoning-gym raised while making the
      item, e.g. basic_arithmetic's ZeroDivisionError), "dropped_not_number" (gold is not a plain number),
      "dropped_inexact" (the calculator's value of the expression is not the gold answer),
      "dropped_unverified" (the generator's scorer refuses its own gold), "dropped_duplicate",
      "dropped_eval_overlap".

  Returns:
    `num` tasks, `verifier="reasoning_gym"`.

  Raises:
    ValueError: unknown split or generator, empty `generators`, `num` missing or < 0, eval `num` > `eval_reserve`,
      a seed for eval, generator kwargs its config refuses, or fewer than `num` distinct tasks exist.
  """
  if split not in ("train", "eval"):
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
  generators = tuple(generators)
  if not generators:
    raise ValueError("generators is empty")
  for g in generators:
    if g not in GENERATORS:
      raise ValueError(f"unknown generator {g!r}; available: {', '.join(GENERATORS)}")
  kwargs = dict(generator_kwargs or {})
  for g in kwargs:
    if g not in generators:
      raise ValueError(f"generator_kwargs names {g!r}, which is not among the generators {list(generators)}")
  kwargs_json = {g: json.dumps({**GENERATORS[g].defaults, **kwargs.get(g, {})}, sort_keys=True) for g in generators}

  def draw(split, base_seed, num, exclude, strict):
    return _generate(split, base_seed, num, generators, kwargs_json, exclude, stats if strict else None, strict)

  return arithmetic.split_tasks(
    split, num, seed, draw, _key, eval_size=EVAL_SIZE, eval_reserve=eval_reserve, reserve_note=" (eval_reserve)"
  )


def _key(task: MathTask) -> str:
  """What makes two tasks the same: the expression (spaces removed), else the question (whitespace collapsed)."""
  if task.expression is not None:
    return "expr:" + "".join(task.expression.split())
  return "q:" + " ".join(task.question.split())


def _generate(split, base_seed, num, generators, kwargs_json, exclude, stats, strict=True) -> list[MathTask]:
  """The first `num` kept tasks of the round-robin stream; with strict=False, fewer when it runs dry."""
  counts = collections.Counter(
    {
      k: 0
      for k in (
        "dropped_generator_error",
        "dropped_not_number",
        "dropped_inexact",
        "dropped_unverified",
        "dropped_duplicate",
        "dropped_eval_overlap",
      )
    }
  )

  def read(i, drawn):
    idx, item = drawn
    if item is None:
      return None, "dropped_generator_error"
    return _task(split, generators[i], idx, item, base_seed, kwargs_json[generators[i]])

  tasks = arithmetic.draw_tasks(
    split,
    [_items(g, base_seed, kwargs_json[g]) for g in generators],
    num,
    read,
    _key,
    exclude,
    counts,
    strict=strict,
    max_misses=_MAX_MISSES,
    where=lambda i: f"generators {list(generators)} (stuck on {generators[i]!r})",
  )
  if stats is not None:
    stats.update(counts, kept=len(tasks))
  return tasks


def _task(split, name, idx, item, base_seed, kwargs_json) -> tuple[MathTask | None, str]:
  """One reasoning-gym item as a task, or (None, why it is dropped)."""
  gold = str(item["answer"]).strip()
  if arithmetic.normalize_answer(gold) != gold:
    return None, "dropped_not_number"
  info = GENERATORS[name]
  meta = dict(item["metadata"], seed=_generator_seed(name, base_seed), generator_kwargs=kwargs_json)
  expression = str(meta["expression"]) if info.expression else None
  solution = meta.get(info.solution_key) if info.solution_key else None
  task = MathTask(
    task_id=f"{split}/{name}/{idx}",
    question=item["question"],
    answer=gold,
    source=name,
    verifier="reasoning_gym",
    expression=expression,
    solution=str(solution) if solution else None,
    metadata=meta,
  )
  if expression is not None:
    try:
      value = evaluate(expression)
    except CalculatorError:
      return None, "dropped_inexact"
    if value != Fraction(gold.replace(",", "")) or score_answer(task, format_number(value)) != 1.0:
      return None, "dropped_inexact"
  if score_answer(task, gold) != 1.0:
    return None, "dropped_unverified"
  return task, "kept"


def _generator_seed(name: str, base_seed: int) -> int:
  """The dataset seed of generator `name` in the split with seed `base_seed`: offset by a hash of the name so that
  generators do not draw their numbers from the same `random.Random(seed + idx)` states."""
  return base_seed + (zlib.crc32(name.encode()) % 1000) * 1_000_003


def _items(name: str, base_seed: int, kwargs_json: str) -> Iterator[tuple[int, dict]]:
  ds = _dataset(name, _generator_seed(name, base_seed), kwargs_json)
  for idx in range(STREAM_SIZE):
    try:
      item = ds[idx]
    except Exception:  # noqa: BLE001 - e.g. basic_arithmetic's ZeroDivisionError on some items: skipped
      item = None
    yield idx, item
  while True:  # the stream is used up: _generate stops after _MAX_MISSES of these
    yield -1, None


@functools.lru_cache(maxsize=64)
def _dataset(name: str, seed: int, kwargs_json: str):
  # imported lazily: `import reasoning_gym` loads every dataset module (about 2 s)
  import reasoning_gym

  try:
    return reasoning_gym.create_dataset(name, seed=seed, size=STREAM_SIZE, **json.loads(kwargs_json))
  except (TypeError, AssertionError, ValueError) as e:
    raise ValueError(f"reasoning-gym generator {name!r} refuses the arguments {kwargs_json}: {e}") from None


# --- file tasks -----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FileFields:
  """Where a file source's records keep each part of a task ("": not read).

  Attributes:
    prompt_field: the question.
    answer_field: the gold answer (math-verify reads it: a number, or LaTeX such as "\\frac{1}{2}").
    info_field: a reference solution (privileged info).
    id_field: a task id (else "<split>/<index>").
    expression_field: an expression the calculator evaluates to the gold answer (enables demonstrations).
  """

  prompt_field: str = "question"
  answer_field: str = "answer"
  info_field: str = ""
  id_field: str = ""
  expression_field: str = ""

  def open(self, spec_: str, split: str) -> sources.JsonlSource | sources.HFSource | sources.TfdsSource:
    return sources.open_source(
      spec_,
      split,
      prompt_field=self.prompt_field,
      answer_field=self.answer_field,
      info_field=self.info_field,
      id_field=self.id_field,
      metadata_fields=(self.expression_field,) if self.expression_field else (),
    )


class FileTasks(collections.abc.Sequence):
  """A list-like view of chosen records of a source, read (and turned into `MathTask`s) when indexed.

  `tasks[i]` (an int or numpy integer) -> `MathTask`; `tasks[a:b]` -> list; `len(tasks)`.
  """

  def __init__(self, source, indices: np.ndarray, expression_field: str = ""):
    self.source = source
    self.indices = np.asarray(indices, np.int64)
    self.expression_field = expression_field

  def __len__(self) -> int:
    return len(self.indices)

  def __getitem__(self, i):
    if isinstance(i, slice):
      return [self[j] for j in range(*i.indices(len(self)))]
    return _file_task(self.source[int(self.indices[i])], self.expression_field)

  def __repr__(self) -> str:
    return f"FileTasks({self.source!r}, {len(self)} tasks)"


def _file_task(record: sources.TaskRecord, expression_field: str) -> MathTask:
  where = f"{record.metadata.get('source')} task {record.task_id!r}"
  if not record.prompt.strip():
    raise sources.SourceError(f"{where}: empty prompt")
  if not record.answer.strip():
    raise sources.SourceError(f"{where}: empty answer")
  expression = None
  if expression_field:
    expression = record.metadata.get(expression_field)
    if not isinstance(expression, str) or not expression.strip():
      raise sources.SourceError(f"{where}: field {expression_field!r} must hold an expression (text)")
  return MathTask(
    task_id=record.task_id,
    question=record.prompt,
    answer=record.answer.strip(),
    source=str(record.metadata.get("source")),
    verifier="math_verify",
    expression=expression,
    solution=record.privileged_info or None,
    metadata=record.metadata,
  )


def make_file_tasks(
  split: str,
  num: int | None = None,
  seed: int | None = None,
  *,
  source: str,
  source_split: str = "train",
  eval_source: str = "",
  eval_split: str = "test",
  eval_holdout: int = EVAL_HOLDOUT,
  fields: FileFields = FileFields(),
) -> FileTasks:
  """Tasks read from a file source (`jaxcredit.envs.sources.open_source`), answers verified by math-verify.

  Eval: with `eval_source` "", `eval_holdout` records of `source` chosen by a fixed seed, in that order; otherwise
  the first `eval_holdout` records of `eval_source` (split `eval_split`). The eval split is a prefix of these.
  Train: the other records of `source` (all of them when `eval_source` is set), skipping any whose prompt
  (whitespace collapsed) equals an eval record's or an earlier train record's; when more remain than `num`, a
  subset chosen by `seed`; in source order. Records are read once here (to check them) and again when indexed;
  none is kept.

  Args:
    split: "train" or "eval".
    num: number of tasks: eval at most `eval_holdout` (default all of them); train at most this many (default
      all).
    seed: train seed (default 0); must be None for eval.
    source: the train source spec, "jsonl:...", "hf:..." or "tfds:...".
    source_split: its split (a DatasetDict key or TFDS split; a label for JSONL).
    eval_source: the eval source spec, or "" to hold records out of `source`.
    eval_split: the split of `eval_source`.
    eval_holdout: how many records form the eval split (see above).
    fields: the field names.

  Returns:
    A `FileTasks` (list-like) of `MathTask`s with `verifier="math_verify"`.

  Raises:
    ValueError: unknown split, a seed for eval, `num` < 0 or eval `num` > the eval records, `eval_holdout` < 1 or
      not below the number of records when holding out, or no train records left.
    FileNotFoundError, ImportError, sources.SourceError: from opening and reading the sources (a missing file or
      field, a line that is not JSON, an empty record), and a calculator expression that does not evaluate to the
      gold answer.
  """
  if split not in ("train", "eval"):
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
  if num is not None and num < 0:
    raise ValueError(f"num must be >= 0, got {num}")
  if eval_holdout < 1:
    raise ValueError(f"eval_holdout must be >= 1, got {eval_holdout}")
  src = fields.open(source, source_split)
  if eval_source:
    esrc = fields.open(eval_source, eval_split)
    reserved = np.arange(min(eval_holdout, len(esrc)), dtype=np.int64)
    pool = np.arange(len(src), dtype=np.int64)
  else:
    if eval_holdout >= len(src):
      raise ValueError(
        f"{source} has {len(src)} records; holding out eval_holdout={eval_holdout} for eval leaves "
        f"none for training (lower eval_holdout or set eval_source)"
      )
    esrc = src
    perm = np.random.default_rng(arithmetic.EVAL_SEED).permutation(len(src))
    reserved = perm[:eval_holdout]
    pool = np.sort(perm[eval_holdout:])
  if split == "eval":
    if seed is not None:
      raise ValueError("the eval split has a fixed seed; pass seed=None")
    num = len(reserved) if num is None else num
    if num > len(reserved):
      raise ValueError(
        f"asked for {num} eval tasks; the eval split has {len(reserved)} records "
        f"(eval_holdout={eval_holdout}, {eval_source or source})"
      )
    tasks = FileTasks(esrc, reserved[:num], fields.expression_field)
    for t in tasks:
      _check_expression(t)
    return tasks
  seed = 0 if seed is None else int(seed)
  num = len(pool) if num is None else num
  seen = {_prompt_key(esrc[int(i)].prompt) for i in reserved}
  order = np.random.default_rng(seed).permutation(pool) if num < len(pool) else pool
  chosen = []
  for i in order:
    if len(chosen) >= num:
      break
    task = _file_task(src[int(i)], fields.expression_field)
    key = _prompt_key(task.question)
    if key in seen:
      continue
    seen.add(key)
    _check_expression(task)
    chosen.append(int(i))
  if not chosen and num > 0:
    raise ValueError(f"{source} has no train records left once the eval records are held out")
  return FileTasks(src, np.sort(np.asarray(chosen, np.int64)), fields.expression_field)


def _prompt_key(prompt: str) -> str:
  return " ".join(prompt.split())


def _check_expression(task: MathTask) -> None:
  """Raises `sources.SourceError` when the task's expression is not one the calculator evaluates to its gold."""
  if task.expression is None:
    return
  try:
    value = format_number(evaluate(task.expression))
  except CalculatorError as e:
    raise sources.SourceError(
      f"task {task.task_id!r}: the calculator refuses its expression {task.expression!r}: {e}"
    ) from None
  if score_answer(task, value) != 1.0:
    raise sources.SourceError(
      f"task {task.task_id!r}: its expression {task.expression!r} evaluates to {value}, "
      f"which does not verify against the gold answer {task.answer!r}"
    )


# --- the environment ------------------------------------------------------------------------------------------------


def initial_messages(task: MathTask) -> list[dict]:
  """The prompt of a rollout: `[{"role": "system", ...}, {"role": "user", "content": task.question}]`."""
  return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.question}]


def gold_answer_text(task: MathTask) -> str:
  """`<answer>{number}</answer>` (`answer_as_number`): the text TRACE scores as the next assistant message."""
  return tool_calls.render_answer(answer_as_number(task))


def answer_as_number(task: MathTask) -> str:
  """The gold answer written as a plain number that earns reward 1 (the reward accepts plain numbers only).

  A gold that is a plain number is returned as it is. Otherwise (a file gold such as "\\frac{1}{2}"): the
  calculator's value of the task's expression, else math-verify's parse of the gold when it is a rational number,
  written by `format_number` ("0.5"); the first candidate that verifies is returned, else the gold unchanged.
  """
  if arithmetic.normalize_answer(task.answer) == task.answer:
    return task.answer
  return _answer_as_number(task.answer, task.expression, task.verifier)


@functools.lru_cache(maxsize=4096)
def _answer_as_number(gold: str, expression: str | None, verifier: str) -> str:
  task = MathTask(task_id="", question="", answer=gold, source="", verifier=verifier, expression=expression)
  candidates = []
  if expression is not None:
    try:
      candidates.append(format_number(evaluate(expression)))
    except CalculatorError:
      pass
  try:
    import sympy
    from math_verify import parse

    parsed = parse(gold, parsing_timeout=None)
    if parsed and getattr(parsed[0], "is_number", False) and parsed[0].is_rational:
      r = sympy.Rational(parsed[0])
      candidates.append(format_number(Fraction(int(r.p), int(r.q))))
  except Exception:  # noqa: BLE001 - a gold math-verify cannot read as a number stays as it is
    pass
  for c in candidates:
    if verifier == "math_verify" and score_answer(task, c) == 1.0:
      return c
  return gold


def privileged_info(task: MathTask) -> str:
  """The verified ground truth a teacher may see: the expression and its value (when the task has one), the
  reference solution (when it has one), the gold answer as written when it is not a plain number, and the gold
  answer in the answer format (`gold_answer_text`)."""
  parts = []
  if task.expression is not None:
    parts.append(f"{task.expression} = {task.answer}")
  if task.solution:
    parts.append(f"Reference solution:\n{task.solution}")
  if answer_as_number(task) != task.answer:
    parts.append(f"The gold answer is {task.answer}.")
  parts.append(f"The final answer is {gold_answer_text(task)}")
  return "\n".join(parts)


class MathEnv(arithmetic.ArithmeticEnv):
  """One rollout's environment: `ArithmeticEnv`'s turns (calculator calls, `<answer>`, think blocks, the call
  budget; see there), with the reward given by the task's verifier (`score_answer`)."""

  def reward(self) -> float:
    """`score_answer(task, answer)`: 1.0 or 0.0 (0.0 before the end or without an answer). Cached."""
    if not self.done:
      return 0.0  # never cached before the end (see `ArithmeticEnv.reward`)
    if self._reward is None:
      self._reward = score_answer(self.task, self.info["answer"])
    return self._reward


class _RandomLike(Protocol):
  def random(self) -> float: ...


def demonstration(task: MathTask, rng: _RandomLike) -> list[dict]:
  """A full tool-use chat for the supervised warm start: [system, user, assistant calculator call on the task's
  expression (verbatim or, with probability 1/2, without spaces), tool result as `MathEnv.step` returns it,
  assistant `<answer>{result}</answer>`].

  Args:
    task: a task with an expression.
    rng: anything with `.random() -> float` in [0, 1).

  Raises:
    ValueError: the task has no expression, or the calculator's result does not verify against the gold answer.
  """
  if task.expression is None:
    raise ValueError(f"task {task.task_id} has no calculator expression, so no demonstration")
  expr = task.expression if rng.random() < 0.5 else "".join(task.expression.split())
  call = tool_calls.render_tool_call("calculator", {"expression": expr})
  obs = MathEnv(task, max_tool_calls=1).step(call).observation
  try:
    value = format_number(evaluate(expr))
  except CalculatorError as e:
    raise ValueError(f"task {task.task_id}: the calculator refuses {expr!r}: {e}") from None
  if obs != tool_calls.render_tool_response(value) or score_answer(task, value) != 1.0:
    raise ValueError(f"task {task.task_id}: calculator gives {value!r} for {expr!r}, gold is {task.answer!r}")
  return initial_messages(task) + [
    {"role": "assistant", "content": call},
    {"role": "tool", "content": obs},
    {"role": "assistant", "content": tool_calls.render_answer(value)},
  ]


CONFIG_DEFAULTS: dict[str, Any] = {
  "generators": ",".join(DEFAULT_GENERATORS),
  "generator_kwargs": "",
  "source": "",
  "source_split": "train",
  "eval_source": "",
  "eval_split": "test",
  "eval_holdout": EVAL_HOLDOUT,
  "prompt_field": "question",
  "answer_field": "answer",
  "info_field": "",
  "id_field": "",
  "expression_field": "",
  "max_tool_calls": 2,
}
"""The `config.env` keys `env_spec` reads, with the values used when a key is absent."""


def _get(env_config, key: str):
  if env_config is None:
    return CONFIG_DEFAULTS[key]
  getter = getattr(env_config, "get", None)
  value = getter(key, None) if getter is not None else getattr(env_config, key, None)
  return CONFIG_DEFAULTS[key] if value is None else value


def env_spec(env_config=None) -> spec.EnvSpec:
  """The math-with-a-calculator environment as an `EnvSpec`, from the `config.env` node (keys: `CONFIG_DEFAULTS`).

  Keys:
    generators: comma-separated names from `GENERATORS` (used when `source` is "").
    generator_kwargs: JSON object, generator -> its reasoning-gym config arguments ("" = defaults), e.g.
      '{"products": {"max_digits": 3}}'.
    source: "" (the generators) or a file source spec "jsonl:/path.jsonl", "hf:/folder", "tfds:/folder".
    source_split, eval_source, eval_split, eval_holdout: see `make_file_tasks`.
    prompt_field, answer_field, info_field, id_field, expression_field: the file's field names (see `FileFields`).
    max_tool_calls: calculator calls per rollout; a rollout has at most max_tool_calls + 1 assistant turns.

  The demonstration is None (then `config.sft.steps` must be 0) unless every task carries an expression: all
  generators in `EXPRESSION_GENERATORS`, or a file source with `expression_field`.

  Raises:
    ValueError: `max_tool_calls` < 0, `eval_holdout` < 1, no or unknown generators, `generator_kwargs` not a JSON object of objects,
      a `source` without a known prefix.
  """
  max_tool_calls = int(_get(env_config, "max_tool_calls"))
  if max_tool_calls < 0:
    raise ValueError(f"config.env.math_tools.max_tool_calls must be >= 0, got {max_tool_calls}")
  eval_holdout = int(_get(env_config, "eval_holdout"))
  if eval_holdout < 1:  # read by file sources only, but refused for any source: a bad value never waits for one
    raise ValueError(f"config.env.math_tools.eval_holdout must be >= 1, got {eval_holdout}")
  source = str(_get(env_config, "source")).strip()
  if source:
    if not source.startswith(sources.PREFIXES):
      raise ValueError(
        f"config.env.math_tools.source={source!r} must be '' or start with one of {', '.join(sources.PREFIXES)}"
      )
    fields = FileFields(
      **{
        k: str(_get(env_config, k))
        for k in ("prompt_field", "answer_field", "info_field", "id_field", "expression_field")
      }
    )
    file_kwargs = dict(
      source=source,
      source_split=str(_get(env_config, "source_split")),
      eval_source=str(_get(env_config, "eval_source")).strip(),
      eval_split=str(_get(env_config, "eval_split")),
      eval_holdout=eval_holdout,
      fields=fields,
    )

    def make_tasks(split, num, seed):
      return make_file_tasks(split, num, seed, **file_kwargs)

    has_demos = bool(fields.expression_field)
  else:
    generators = tuple(g.strip() for g in str(_get(env_config, "generators")).split(",") if g.strip())
    if not generators:
      raise ValueError("config.env.math_tools.generators is empty (and config.env.math_tools.source is '')")
    for g in generators:
      if g not in GENERATORS:
        raise ValueError(
          f"config.env.math_tools.generators: unknown generator {g!r}; available: {', '.join(GENERATORS)}"
        )
    kwargs = _parse_generator_kwargs(str(_get(env_config, "generator_kwargs")))

    def make_tasks(split, num, seed):
      return make_gym_tasks(split, num, seed, generators=generators, generator_kwargs=kwargs)

    has_demos = all(GENERATORS[g].expression for g in generators)
  return spec.EnvSpec(
    make_tasks=make_tasks,
    make_env=lambda task: MathEnv(task, max_tool_calls=max_tool_calls),
    initial_messages=initial_messages,
    stop_strings=(tool_calls.TOOL_CALL_CLOSE, tool_calls.ANSWER_CLOSE),
    max_turns=max_tool_calls + 1,
    is_success=lambda reward: reward > 0.5,
    demonstration=demonstration if has_demos else None,
    gold_answer_text=gold_answer_text,
    privileged_info=privileged_info,
    metrics=arithmetic.metrics,  # math-verify against the gold, beside the task's own verifier
  )


def _parse_generator_kwargs(text: str) -> dict[str, dict]:
  if not text.strip():
    return {}
  try:
    obj = json.loads(text)
  except ValueError as e:
    raise ValueError(f"config.env.math_tools.generator_kwargs is not JSON: {e}") from None
  if not isinstance(obj, dict) or not all(isinstance(v, dict) for v in obj.values()):
    raise ValueError(
      'config.env.math_tools.generator_kwargs must be a JSON object of objects, e.g. {"products": {"max_digits": 3}}'
    )
  return obj
