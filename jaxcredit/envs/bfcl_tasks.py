"""BFCL V3 multi-turn's task data: bfcl-eval's 800 sessions, their splits and CrEST's protocol split.

`bfcl_multi_turn` runs the sessions (and re-exports these names); this module only reads bfcl-eval's data files.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import pathlib
from typing import Sequence

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
EVAL_EVERY = 10  # every 10th session (a base session with its variants) by a stable hash is held out for eval


def package_dir() -> pathlib.Path:
  """bfcl-eval's package folder (its data, backends and checkers).

  Raises:
    ImportError: naming the install command when bfcl-eval is missing.
  """
  spec_ = importlib.util.find_spec("bfcl_eval")
  if spec_ is None or not spec_.submodule_search_locations:
    raise ImportError("the BFCL environments need bfcl-eval: pip install --no-deps bfcl-eval mpmath")
  return pathlib.Path(list(spec_.submodule_search_locations)[0])


def read_jsonl(path: pathlib.Path) -> list[dict]:
  """bfcl-eval's data files are JSON Lines despite the .json name; the last line has no newline."""
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


@dataclasses.dataclass(frozen=True)
class BfclTask:
  """One multi-turn session.

  Attributes:
    task_id: BFCL's id, e.g. "multi_turn_base_0".
    category: one of `CATEGORIES`.
    requests: the user messages of each request (a request is a list of messages; a held-out-function request
      has none: its message is made from `held_out`).
    ground_truth: per request, BFCL's ground-truth calls as Python call strings, e.g. "cd(folder='document')".
    initial_config: the backends' initial state, by class name (JSON text, so the task stays hashable).
    involved_classes: backend class names.
    held_out: request index -> names of the functions that become available at that request (miss_func).
    excluded: functions never offered.
  """

  task_id: str
  category: str
  requests: tuple[tuple[dict, ...], ...]
  ground_truth: tuple[tuple[str, ...], ...]
  initial_config: str
  involved_classes: tuple[str, ...]
  held_out: tuple[tuple[int, tuple[str, ...]], ...] = ()
  excluded: tuple[str, ...] = ()

  @property
  def num_units(self) -> int:
    return len(self.requests)

  @property
  def long_context(self) -> bool:
    return "long_context" in self.category


@functools.lru_cache(maxsize=None)
def load_tasks(categories: tuple[str, ...] = CATEGORIES) -> tuple[BfclTask, ...]:
  """All tasks of the given categories, in BFCL's order.

  Raises:
    ValueError: for an unknown category, or a data file whose questions and answers disagree.
    ImportError: when bfcl-eval is not installed.
  """
  for c in categories:
    if c not in CATEGORIES:
      raise ValueError(f"unknown BFCL multi-turn category {c!r}; known: {', '.join(CATEGORIES)}")
  data = package_dir() / "data"
  tasks = []
  for c in categories:
    questions = read_jsonl(data / f"BFCL_v4_multi_turn_{c}.json")
    answers = {
      a["id"]: a["ground_truth"] for a in read_jsonl(data / "possible_answer" / f"BFCL_v4_multi_turn_{c}.json")
    }
    for q in questions:
      gt = answers.get(q["id"])
      if gt is None or len(gt) != len(q["question"]):
        raise ValueError(
          f"bfcl-eval data: task {q['id']} has {len(q['question'])} requests but "
          f"{'no' if gt is None else len(gt)} ground-truth turns"
        )
      held = tuple(sorted((int(k), tuple(v)) for k, v in (q.get("missed_function") or {}).items()))
      tasks.append(
        BfclTask(
          task_id=q["id"],
          category=c,
          requests=tuple(tuple(turn) for turn in q["question"]),
          ground_truth=tuple(tuple(t) for t in gt),
          initial_config=json.dumps(q.get("initial_config", {})),
          involved_classes=tuple(q["involved_classes"]),
          held_out=held,
          excluded=tuple(q.get("excluded_function") or ()),
        )
      )
  return tuple(tasks)


@functools.lru_cache(maxsize=None)
def split_groups() -> dict[str, str]:
  """task id -> the name of its split group: sessions that share a session index (a base session and its miss_func,
  miss_param and long_context variants) or a first request (BFCL repeats a few opening requests across sessions) are
  joined, transitively, and the group is named by its smallest "session_<i>". Every task of every category."""
  tasks = load_tasks(CATEGORIES)
  parent: dict[str, str] = {}

  def find(x: str) -> str:
    while parent.setdefault(x, x) != x:
      x = parent[x]
    return x

  def first_request(t: BfclTask) -> str:
    return next((m.get("content", "") for m in t.requests[0] if m.get("role") == "user"), "") if t.requests else ""

  for t in tasks:
    a, b = find(f"session_{session_index(t.task_id)}"), find(f"first:{first_request(t)}")
    if a != b:
      parent[b] = a
  name: dict[str, str] = {}  # root -> the smallest session name of its group
  for t in tasks:
    session = f"session_{session_index(t.task_id)}"
    root = find(session)
    name[root] = min(name.get(root, session), session, key=lambda n: int(n.split("_")[1]))
  return {t.task_id: name[find(f"session_{session_index(t.task_id)}")] for t in tasks}


def is_eval(task_id: str) -> bool:
  """Whether a task is in the eval split: every `EVAL_EVERY`-th *group* by a stable hash (sha256) of its name
  (`split_groups`): a base session and its miss_func, miss_param and long_context variants, and sessions that open
  with the same request, are on the same side.

  Hashed by task id (before 2026-12-06), 47 of the 62 non-base eval sessions were variants of a base session in the
  train split, starting with the same first request (issue 54)."""
  group = split_groups()[task_id]
  return int(hashlib.sha256(group.encode()).hexdigest(), 16) % EVAL_EVERY == 0


BACKENDS = (
  "GorillaFileSystem",
  "MathAPI",
  "MessageAPI",
  "TwitterAPI",
  "TicketAPI",
  "TradingBot",
  "TravelAPI",
  "VehicleControlAPI",
)


PROTOCOLS = ("", "crest")
"""Values of config.env.bfcl_multi_turn.protocol: "" the hashed split (`is_eval`), "crest" `crest_split`'s."""
CREST_SEED = 0
"""The seed of `crest_split`'s draw of the 100 Base training sessions."""
CREST_TRAIN = 100
"""Base sessions CrEST trains on (arXiv 2608.13179, App. C.1); it evaluates 100 sessions of each category."""


def session_index(task_id: str) -> int:
  """The session's index within its category, e.g. 17 for "multi_turn_miss_param_17". BFCL's four categories are
  variants of the same 200 sessions: index i of miss_func, miss_param and long_context is base session i with a
  function held out, a parameter missing, or a long context added."""
  return int(task_id.rsplit("_", 1)[1])


@functools.lru_cache(maxsize=None)
def crest_split(seed: int = CREST_SEED, sessions: int = 200) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """The session indices of the CrEST protocol's split: `CREST_TRAIN` of the `sessions` Base sessions drawn by
  `random.Random(seed).sample`, and the others.

  CrEST (arXiv 2608.13179, App. C.1) trains on 100 Base sessions and reports 100 sessions each of Base, Miss Func,
  Miss Param and Long Context; it does not publish which ids. Our reading: a seeded draw of the 100 training
  indices, and for evaluation the other 100 indices in each of the four categories. So the eval sets are disjoint
  from the training sessions not only by id but by session: no evaluated Miss Func / Miss Param / Long Context
  session is a variant of a Base session trained on.

  Returns:
    (train indices, eval indices), each sorted, disjoint, together range(sessions).
  """
  import random

  train = sorted(random.Random(seed).sample(range(sessions), CREST_TRAIN))
  return tuple(train), tuple(i for i in range(sessions) if i not in set(train))


def _crest_pool(split: str) -> list[BfclTask]:
  """The CrEST protocol's tasks of a split: train the Base sessions of `crest_split`'s training indices; eval the
  other indices' sessions of all four categories, in rounds of (base, miss_func, miss_param, long_context) by
  index, so that the first 4k tasks hold k sessions of each category."""
  train, held = crest_split()
  by_id = {t.task_id: t for t in load_tasks(CATEGORIES)}
  if split == "train":
    return [by_id[f"multi_turn_base_{i}"] for i in train]
  return [by_id[f"multi_turn_{c}_{i}"] for i in held for c in CATEGORIES]


def _is_eval_task(task_id: str, protocol: str) -> bool:
  """Whether a task is in the eval split of `protocol` (`make_tasks`'s rule)."""
  if protocol == "crest":
    return task_id in _crest_eval_ids()
  return is_eval(task_id)


@functools.lru_cache(maxsize=None)
def _crest_eval_ids() -> frozenset[str]:
  return frozenset(t.task_id for t in _crest_pool("eval"))


def make_tasks(
  split: str,
  num: int | None = None,
  seed: int | None = None,
  *,
  categories: Sequence[str] = CATEGORIES,
  classes: Sequence[str] = (),
  protocol: str = "",
) -> list[BfclTask]:
  """Tasks of one split: eval is a fixed tenth (by a hash of the id), train the rest, shuffled by `seed`; with
  `protocol="crest"`, `crest_split`'s (train: 100 Base sessions; eval: 100 each of the four categories).

  Args:
    categories: the split's categories (ignored by the crest protocol, which fixes them).
    classes: when given, only sessions whose backends are all among these classes (e.g. ("TradingBot",) for short
      prompts); empty: every session.
    protocol: one of `PROTOCOLS`.

  Raises:
    ValueError: unknown split, category, class or protocol, or `num` larger than the split (naming
      config.env.num_train_tasks or config.eval.num_tasks).
  """
  if split not in ("train", "eval"):
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
  if protocol not in PROTOCOLS:
    raise ValueError(f"config.env.bfcl_multi_turn.protocol: unknown protocol {protocol!r}; known: '', 'crest'")
  unknown = [c for c in classes if c not in BACKENDS]
  if unknown:
    raise ValueError(f"config.env.bfcl_multi_turn.classes: unknown backend(s) {unknown}; known: {', '.join(BACKENDS)}")
  if protocol == "crest":
    pool = _crest_pool(split)
    categories = ("base",) if split == "train" else CATEGORIES
  else:
    pool = [
      t
      for t in load_tasks(tuple(categories))
      if is_eval(t.task_id) == (split == "eval") and (not classes or set(t.involved_classes) <= set(classes))
    ]
  if split == "train":
    import random

    random.Random(0 if seed is None else int(seed)).shuffle(pool)
  num = len(pool) if num is None else int(num)
  if not 0 <= num <= len(pool):
    key = "config.env.num_train_tasks" if split == "train" else "config.eval.num_tasks"
    raise ValueError(
      f"{key}={num}, but the BFCL multi-turn {split} split of {list(categories)}"
      + (" (protocol crest)" if protocol == "crest" else "")
      + (f" on {list(classes)}" if classes else "")
      + f" has {len(pool)} tasks"
    )
  return pool[:num]
