"""`jaxcredit compare EVAL_A EVAL_B ...`: two (or more) `jaxcredit eval` folders of the same tasks, B - A per metric
and per task category with a paired 95% interval over the tasks, and how many tasks each model alone passed.

    info = compare_evals(["eval/base", "eval/trained"], "compare")   # -> compare/compare_evals.json
    print(format_comparison(info))

Every folder after the first is compared with the first (A). The folders must hold evals of the same tasks: the
same split (eval.json "split") and the same task ids in the same order; else ValueError naming what differs.

The interval is paired: the two models answered the same tasks, so the task is the unit. For each metric the
per-task difference d_t = B_t - A_t (each model's value on task t: its mean over its samples of that task; for a
success rate with one sample, 1, 0 or -1) gets the normal interval of its mean,

    mean(d) ± z · s_d / √n      (s_d: the standard deviation of the d_t, n - 1 in its denominator; z = 1.959964),

which for 0/1 successes is the Wald interval of a paired difference of proportions, (n_B - n_A) / n with n_A, n_B
the tasks only A, only B passed (McNemar's discordant pairs); the tasks both or neither passed add no spread. Why
this one: one closed form for every metric (rates, counts of calls, the environment's own metrics), checkable by
hand, and correct for the pairing, which an interval on each eval separately is not (it ignores that the models
share the hard tasks, and is far wider). Like every Wald interval it is too narrow with few discordant tasks: with
none it is [0, 0]; the counts "only A" / "only B" printed beside it tell that case.

A metric's tasks are those where both evals have a value (an environment's per-category metric, e.g.
`env/bfcl_official_accuracy/base`, exists only for tasks of that category). Per category (the tasks' `category`,
e.g. BFCL's base / miss_func / miss_param / long_context) the same differences over that category's tasks.
"""

from __future__ import annotations

import json
import math
import os
from typing import Sequence

Z95 = 1.959963984540054
"""The standard normal quantile of 0.975 (as `jaxcredit.train.commands.evaluate.Z95`)."""

_NOT_METRICS = ("task_id", "category", "passed")


def is_eval_folder(path: str) -> bool:
  """Whether `path` is a `jaxcredit eval` folder (it holds eval.json)."""
  return os.path.isfile(os.path.join(path, "eval.json"))


def load_eval(folder: str) -> dict:
  """A finished eval's eval.json, with its per-task values.

  Raises:
    ValueError: no eval.json, one that is not JSON or not an eval's, an eval that has not finished, or one written
      before eval.json held per-task values (the message says how to add them).
  """
  path = os.path.join(folder, "eval.json")
  if not os.path.isfile(path):
    raise ValueError(f"{folder} has no eval.json: not a `jaxcredit eval` folder")
  try:
    with open(path, encoding="utf-8") as f:
      info = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path}: not JSON ({e})") from None
  if not isinstance(info, dict) or "split" not in info:
    raise ValueError(f"{path}: not a `jaxcredit eval` eval.json (no split)")
  if info.get("status") != "done":
    raise ValueError(f"{path}: the eval has not finished (status {info.get('status')!r}); rerun its `jaxcredit eval`")
  rows = info.get("per_task")
  if not isinstance(rows, list) or len(rows) != len(info.get("task_ids") or []):
    raise ValueError(
      f"{path} has no per-task values (written by an older `jaxcredit eval`): rerun the same `jaxcredit eval` "
      "command into this folder; it resumes from rollouts.jsonl without sampling and adds them"
    )
  return info


def check_same_tasks(folders: Sequence[str], evals: Sequence[dict]) -> None:
  """Refuses evals that are not of the same tasks as the first.

  Raises:
    ValueError: naming the folder and what differs: a key of the split (environment, split, number of tasks) with
      both values, or the first task id that differs (its position and both ids).
  """
  a = evals[0]
  for folder, b in zip(folders[1:], evals[1:]):
    for key in sorted(set(a["split"]) | set(b["split"])):
      if a["split"].get(key) != b["split"].get(key):
        raise ValueError(
          f"{folders[0]} and {folder} are evals of different splits: split.{key} is "
          f"{a['split'].get(key)!r} in the first, {b['split'].get(key)!r} in the second"
        )
    ids_a, ids_b = list(a["task_ids"]), list(b["task_ids"])
    if ids_a != ids_b:
      if len(ids_a) != len(ids_b):
        what = f"{len(ids_a)} task ids in the first, {len(ids_b)} in the second"
      else:
        i = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y)
        what = f"task {i} is {ids_a[i]!r} in the first, {ids_b[i]!r} in the second"
      raise ValueError(f"{folders[0]} and {folder} are evals of different tasks: {what}")


def paired_difference(a: Sequence[float], b: Sequence[float], z: float = Z95) -> dict:
  """B - A over paired per-task values, with the normal interval of the mean per-task difference (module docstring).

  Args:
    a, b: [n] per-task values of the two evals, task t at position t in both.

  Returns:
    {"a": mean of a, "b": mean of b, "diff": mean of b - a, "ci95": [low, high] (null when n < 2), "count": n}.

  Raises:
    ValueError: a and b of different lengths, or empty.
  """
  if len(a) != len(b) or not len(a):
    raise ValueError(f"paired_difference needs two equally long, non-empty lists, got {len(a)} and {len(b)}")
  n = len(a)
  d = [float(y) - float(x) for x, y in zip(a, b)]
  mean = sum(d) / n
  ci = None
  if n >= 2:
    half = z * math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) / math.sqrt(n)
    ci = [mean - half, mean + half]
  return {"a": sum(map(float, a)) / n, "b": sum(map(float, b)) / n, "diff": mean, "ci95": ci, "count": n}


def _is_num(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _differences(rows_a: Sequence[dict], rows_b: Sequence[dict], drop_suffix: str | None = None) -> dict:
  """Every metric's `paired_difference` over the tasks where both rows hold it; the tasks only A / only B passed."""
  names = list(dict.fromkeys(k for r in list(rows_a) + list(rows_b) for k in r if k not in _NOT_METRICS))
  if drop_suffix:
    names = [k for k in names if not k.endswith(drop_suffix)]
  metrics = {}
  for name in names:
    pairs = [(x[name], y[name]) for x, y in zip(rows_a, rows_b) if _is_num(x.get(name)) and _is_num(y.get(name))]
    if pairs:
      metrics[name] = paired_difference(*zip(*pairs))
  only_a = sum(bool(x.get("passed")) and not y.get("passed") for x, y in zip(rows_a, rows_b))
  only_b = sum(bool(y.get("passed")) and not x.get("passed") for x, y in zip(rows_a, rows_b))
  return {"count": len(rows_a), "metrics": metrics, "only_a": only_a, "only_b": only_b}


def compare_two(a: dict, b: dict) -> dict:
  """B - A of two evals of the same tasks (`check_same_tasks` first).

  Args:
    a, b: eval.json contents (`load_eval`).

  Returns:
    {"count": tasks, "metrics": {name: `paired_difference`}, "only_a", "only_b": tasks only that model passed (a
    task passes when any of its samples succeeded), "categories": {category: the same over its tasks, a
    per-category metric of that category ("<name>/<category>") left out as the category's own rows repeat it}}.
  """
  rows_a, rows_b = a["per_task"], b["per_task"]
  out = _differences(rows_a, rows_b)
  categories = list(dict.fromkeys(r.get("category") for r in rows_a if r.get("category") is not None))
  out["categories"] = {}
  for c in categories:
    keep = [i for i, r in enumerate(rows_a) if r.get("category") == c]
    out["categories"][c] = _differences([rows_a[i] for i in keep], [rows_b[i] for i in keep], drop_suffix=f"/{c}")
  return out


def compare_evals(folders: Sequence[str], out_dir: str) -> dict:
  """Compares every eval folder after the first with the first; writes `out_dir/compare_evals.json`.

  Args:
    folders: two or more `jaxcredit eval` folders of the same tasks.
    out_dir: created if missing.

  Returns:
    {"json": the path written, "split": the evals' split, "interval": how the intervals are made, "comparisons":
    [{"a", "b": folders, "model_a", "model_b", "samples_a", "samples_b", and `compare_two`'s fields}]}.

  Raises:
    ValueError: fewer than two folders, a folder listed twice, a folder that is not a finished eval (`load_eval`),
      or evals of different tasks (`check_same_tasks`).
  """
  if len(folders) < 2:
    raise ValueError(f"comparing evals needs two or more eval folders, got {len(folders)}")
  seen = set()
  for f in folders:
    if os.path.realpath(f) in seen:
      raise ValueError(f"eval folder {f} is listed twice (links resolved)")
    seen.add(os.path.realpath(f))
  evals = [load_eval(f) for f in folders]
  check_same_tasks(folders, evals)
  comparisons = []
  for folder, b in zip(folders[1:], evals[1:]):
    comparisons.append(
      {
        "a": folders[0],
        "b": folder,
        "model_a": evals[0].get("model"),
        "model_b": b.get("model"),
        "samples_a": evals[0].get("samples"),
        "samples_b": b.get("samples"),
        **compare_two(evals[0], b),
      }
    )
  info = {
    "split": evals[0]["split"],
    "interval": "paired normal: mean of per-task differences B - A ± 1.96 · s_d / √n",
    "comparisons": comparisons,
  }
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "compare_evals.json")
  with open(path, "w") as f:
    json.dump(info, f, indent=1)
    f.write("\n")
  return {"json": path, **info}


def _table(rows: list[tuple[str, ...]]) -> str:
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  return "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def _cells(name: str, m: dict) -> tuple[str, ...]:
  ci = "n/a" if m["ci95"] is None else f"[{m['ci95'][0]:+.3f}, {m['ci95'][1]:+.3f}]"
  return (name, f"{m['a']:.3f}", f"{m['b']:.3f}", f"{m['diff']:+.3f}", ci, str(m["count"]))


def format_comparison(info: dict) -> str:
  """`compare_evals`' result as text: per comparison, a table of metrics (A, B, B - A, the paired 95% interval,
  tasks), the tasks each model alone passed, and the same per category."""
  out = []
  for c in info["comparisons"]:
    out.append(f"B = {c['b']} ({c['model_b']}) - A = {c['a']} ({c['model_a']}), {c['count']} tasks:")
    head = ("metric", "A", "B", "B - A", "paired 95% interval", "tasks")
    out.append(_table([head] + [_cells(name, m) for name, m in c["metrics"].items()]))
    out.append(f"  passed by A only: {c['only_a']} tasks; by B only: {c['only_b']} tasks")
    if c["categories"]:
      rows = [("category", *head, "A only", "B only")]
      for cat, d in c["categories"].items():
        for name, m in d["metrics"].items():
          rows.append((cat, *_cells(name, m), str(d["only_a"]), str(d["only_b"])))
      out.append("per category:")
      out.append(_table(rows))
  return "\n".join(out)
