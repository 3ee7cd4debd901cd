"""Where a method's turn credit lands on the chain and session tasks: right work against the step that broke it.

  python benchmarks/chain_credit.py runs/ch2/runs/trace_seed0/rollouts [--out benchmarks/results/chain_credit.json]

Reads the rollouts a chain or session run exported with their advantages (`--set rollout.export_jsonl=true` on
`benchmarks/testbed_compare.py`, or `--config.rollout.export_jsonl=true` on `jaxcredit train`: `step_N.jsonl`, one
line per rollout with `turn_advantages`, docs/rollouts-jsonl.md) and labels each assistant turn. On chains, from the
question ("Start with 44 and apply each step in order: +18, +14, *2.") and the turn's calculator call "a op b":
  - `right`: a is the chain's value before some step j and "op b" is step j (a step done from its right value; a
    repeated one counts too);
  - `first_wrong`: the rollout's first call that is not right (a miscopied number, a step done wrongly in the head
    before it, a step out of order);
  - `after_wrong`: the calls after it;
  - `answer`: the turn without a call (the final answer).
On sessions (task ids "<split>/session/<index>", or more than one user message), from each request's verdict
(`unit_rewards`): every turn of a request answered right before any failed one is `right`, the turns of the first
failed request (its calls and its answer) are `first_wrong`, the later requests' turns `after_wrong` (built on a wrong
answer, they fail with it).

For failed rollouts (reward below 1: the outcome not reached, whatever a shaped or partial reward paid) the useful
number is the contrast inside one rollout, `right` minus `first_wrong` (means over their turns; the outcome
advantage, the same for every turn of a rollout, cancels): 0 for GRPO by construction, and for a dense method the
share of its credit that tells the right work from what broke it. Reported per step file and pooled over all of them:
mean turn advantage by label (failed and successful rollouts apart), the mean within-rollout contrast and the fraction
of failed rollouts where it is positive, how wide a rollout's turn advantages spread against their level (the dense
part's size against the outcome's), and (`all_fail_groups`) the credit by label and by turn index in the groups where
every rollout failed, where an outcome-paid GRPO's advantage is 0.
"""

import argparse
import glob
import json
import os
import re
import sys

import numpy as np

from jaxcredit.envs.chain import apply_step
from jaxcredit.rollout.jsonl import read_jsonl

_QUESTION_RE = re.compile(r"Start with (\d+) and apply each step in order: ([^.]*)\.")
_STEP_RE = re.compile(r"([+\-*])(\d+)")
_CALL_RE = re.compile(r"\s*(\d+)\s*([+\-*])\s*(\d+)\s*")


def chain_of(question: str) -> tuple[list[tuple[str, int]], list[int]]:
  """The question's steps [(op, operand)] and values [start, after step 1, ...].

  Raises:
    ValueError: a question that is not the chain task's ("Start with N and apply each step in order: ...").
  """
  m = _QUESTION_RE.search(question)
  if m is None:
    raise ValueError(f"not a chain question: {question[:80]!r}")
  steps = [(op, int(b)) for op, b in _STEP_RE.findall(m.group(2))]
  values = [int(m.group(1))]
  for op, b in steps:
    values.append(apply_step(values[-1], op, b))
  return steps, values


def _call_of(message: dict) -> tuple[int, str, int] | None:
  """(a, op, b) of an assistant message's calculator call; None for a message without a parseable one."""
  for call in message.get("tool_calls") or []:
    fn = call.get("function", call)
    args = fn.get("arguments")
    try:
      args = json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError:
      return None
    m = _CALL_RE.fullmatch(str((args or {}).get("expression", "")))
    if m is None:
      return None
    return int(m.group(1)), m.group(2), int(m.group(3))
  return None


def is_session(record: dict) -> bool:
  """Whether a rollout record is the session task's: its task id says so, or it holds more than one user message
  (a session's later requests; a chain has one)."""
  if "/session/" in str(record.get("task_id", "")):
    return True
  return sum(m.get("role") == "user" for m in record.get("messages") or []) > 1


def succeeded(record: dict) -> bool:
  """The rollout reached the outcome: reward 1 (a chain's right answer, a session's every request right). Shaped and
  partial rewards (the controls' chain progress, share of requests right) pay less than 1 for a failure."""
  return record["reward"] >= 1.0


def turn_labels(record: dict) -> list[str]:
  """One label per assistant turn of a rollout record (`right`, `first_wrong`, `after_wrong`, and on chains
  `answer`): by its calculator call on chains, by its request's verdict on sessions (`session_turn_labels`).

  Raises:
    ValueError: a record without messages, or whose user message is not a chain question (chains), or without a
      verdict for a request it acted in (sessions).
  """
  messages = record.get("messages")
  if not messages:
    raise ValueError(f"rollout {record.get('rollout_id')!r} has no messages")
  if is_session(record):
    return session_turn_labels(record)
  question = next(m["content"] for m in messages if m["role"] == "user")
  steps, values = chain_of(question)
  right_calls = {(values[j], op, b) for j, (op, b) in enumerate(steps)}
  labels, wrong_seen = [], False
  for message in messages:
    if message["role"] != "assistant":
      continue
    if not message.get("tool_calls"):
      labels.append("answer")
    elif _call_of(message) in right_calls and not wrong_seen:
      labels.append("right")
    elif not wrong_seen:
      labels.append("first_wrong")
      wrong_seen = True
    else:
      labels.append("after_wrong")
  return labels


def session_turn_labels(record: dict) -> list[str]:
  """One label per assistant turn of a session rollout, by the verdict of the request it acted in (the user message
  before it opens the request): `right` before the first failed request, `first_wrong` in it, `after_wrong` after.

  Raises:
    ValueError: a record without messages, or with an assistant turn in a request past its `unit_rewards`.
  """
  messages = record.get("messages")
  if not messages:
    raise ValueError(f"rollout {record.get('rollout_id')!r} has no messages")
  verdicts = [float(v) for v in record.get("unit_rewards") or []]
  first_failed = next((u for u, v in enumerate(verdicts) if v <= 0), len(verdicts))
  labels, request = [], -1
  for message in messages:
    if message["role"] == "user":
      request += 1
    elif message["role"] == "assistant":
      if not 0 <= request < len(verdicts):
        raise ValueError(
          f"rollout {record.get('rollout_id')!r}: an assistant turn in request {request} but unit_rewards holds "
          f"{len(verdicts)} verdicts"
        )
      labels.append("right" if request < first_failed else "first_wrong" if request == first_failed else "after_wrong")
  return labels


def landing(records: list[dict]) -> dict:
  """Mean turn advantage by label in failed and in successful rollouts, and the within-rollout contrast; the
  scale of the dense part against the outcome's: `within_rollout_range_mean` (max minus min of a rollout's turn
  advantages, averaged over rollouts: 0 for GRPO) against `rollout_level_abs_mean` (|mean of a rollout's turn
  advantages|, about the outcome advantage's size).

  Raises:
    ValueError: a record without `turn_advantages` (rollouts exported without credit), or whose turn count differs
      from its assistant messages'.
  """
  by = {"failed": {}, "succeeded": {}}
  contrasts, spreads, levels = [], [], []
  for r in records:
    adv = r.get("turn_advantages")
    if adv is None:
      raise ValueError(f"rollout {r.get('rollout_id')!r} has no turn_advantages: export them with the run's credit")
    labels = turn_labels(r)
    if len(labels) != len(adv):
      raise ValueError(f"rollout {r.get('rollout_id')!r}: {len(labels)} assistant turns but {len(adv)} advantages")
    kind = "succeeded" if succeeded(r) else "failed"
    spreads.append(float(np.max(adv) - np.min(adv)))
    levels.append(abs(float(np.mean(adv))))
    for label, a in zip(labels, adv):
      by[kind].setdefault(label, []).append(float(a))
    if kind == "failed" and "first_wrong" in labels and "right" in labels:
      right = [a for label, a in zip(labels, adv) if label == "right"]
      broke = [a for label, a in zip(labels, adv) if label == "first_wrong"]  # a chain's one call, a request's turns
      contrasts.append(float(np.mean(right)) - float(np.mean(broke)))
  return {
    "rollouts": len(records),
    "failed": sum(not succeeded(r) for r in records),
    "turn_adv_mean": {k: {label: float(np.mean(v)) for label, v in d.items()} for k, d in by.items()},
    "turns": {k: {label: len(v) for label, v in d.items()} for k, d in by.items()},
    "failed_with_right_then_wrong": len(contrasts),
    "contrast_right_minus_first_wrong_mean": float(np.mean(contrasts)) if contrasts else None,
    "contrast_positive_frac": float(np.mean([c > 0 for c in contrasts])) if contrasts else None,
    "within_rollout_range_mean": float(np.mean(spreads)) if spreads else None,
    "rollout_level_abs_mean": float(np.mean(levels)) if levels else None,
  }


def all_fail_groups(records: list[dict]) -> list[list[dict]]:
  """One step's rollouts grouped by `group_id`, keeping the groups whose every rollout failed (`succeeded`
  false): there an outcome-paid GRPO's advantage is exactly 0, so whatever credit a dense method gives those turns is
  all of its signal.

  Raises:
    ValueError: a record without `group_id`.
  """
  groups: dict = {}
  for r in records:
    if "group_id" not in r:
      raise ValueError(f"rollout {r.get('rollout_id')!r} has no group_id")
    groups.setdefault(r["group_id"], []).append(r)
  return [g for g in groups.values() if not any(succeeded(r) for r in g)]


def where_grpo_is_silent(groups: list[list[dict]]) -> dict:
  """Mean turn advantage by label and by turn index (0 = the first assistant turn) over the turns of all-fail
  groups (`all_fail_groups`, pooled over steps by the caller). For a method that points at the break, `right` lies
  above `first_wrong` and `after_wrong`; a value that rises with the turn index whatever the label credits position,
  not progress."""
  by_label: dict[str, list[float]] = {}
  by_index: list[list[float]] = []
  for g in groups:
    for r in g:
      for i, (label, a) in enumerate(zip(turn_labels(r), r["turn_advantages"])):
        by_label.setdefault(label, []).append(float(a))
        by_index += [[] for _ in range(i + 1 - len(by_index))]
        by_index[i].append(float(a))
  return {
    "groups": len(groups),
    "rollouts": sum(len(g) for g in groups),
    "turn_adv_mean": {label: float(np.mean(v)) for label, v in by_label.items()},
    "turns": {label: len(v) for label, v in by_label.items()},
    "turn_adv_mean_by_index": [float(np.mean(v)) for v in by_index],
    "turns_by_index": [len(v) for v in by_index],
  }


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("rollouts_dir", help="a run's rollouts/ folder (step_N.jsonl files)")
  ap.add_argument("--out", default=None, help="write the result JSON here")
  args = ap.parse_args(argv)
  files = sorted(
    glob.glob(os.path.join(args.rollouts_dir, "step_*.jsonl")), key=lambda p: int(re.findall(r"\d+", p)[-1])
  )
  if not files:
    sys.exit(f"chain_credit: no step_N.jsonl in {args.rollouts_dir} (run with rollout.export_jsonl=true)")
  per_step, pooled, silent = {}, [], []
  for path in files:
    records = read_jsonl(path)
    pooled += records
    groups = all_fail_groups(records)  # a step's own groups: group ids repeat from step to step
    silent += groups
    per_step[os.path.basename(path)] = {**landing(records), "all_fail_groups": where_grpo_is_silent(groups)}
  result = {"rollouts_dir": args.rollouts_dir, "method": pooled[0].get("method"), "per_step": per_step}
  result["pooled"] = {**landing(pooled), "all_fail_groups": where_grpo_is_silent(silent)}
  p = result["pooled"]
  print(f"{result['method']}: {p['rollouts']} rollouts, {p['failed']} failed; mean turn advantage by label:")
  for kind, d in p["turn_adv_mean"].items():
    print(f"  {kind}: " + ", ".join(f"{k} {v:+.3f} ({p['turns'][kind][k]} turns)" for k, v in sorted(d.items())))
  if p["contrast_right_minus_first_wrong_mean"] is not None:
    print(
      f"  failed rollouts with right calls before a wrong one: {p['failed_with_right_then_wrong']}; right minus first "
      f"wrong {p['contrast_right_minus_first_wrong_mean']:+.3f} on average, positive in "
      f"{100 * p['contrast_positive_frac']:.0f}%"
    )
  print(
    f"  a rollout's turn advantages span {p['within_rollout_range_mean']:.3f} on average (max - min), around a level "
    f"of {p['rollout_level_abs_mean']:.3f} (|their mean|)"
  )
  q = p["all_fail_groups"]
  if q["groups"]:
    print(
      f"  in the {q['groups']} all-fail groups (GRPO's advantage 0): "
      + ", ".join(f"{k} {v:+.3f}" for k, v in sorted(q["turn_adv_mean"].items()))
      + "; by turn index "
      + " ".join(f"{v:+.3f}" for v in q["turn_adv_mean_by_index"])
    )
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  main()
