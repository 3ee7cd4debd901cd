"""Credit for rollouts made elsewhere (`jaxcredit credit`): rollout records read, their tasks found, the method's
passes run with the config's models and its advantages attached (`credit_file`, `credit_records`)."""

from __future__ import annotations

import json
from typing import Any

import jax
import ml_collections

from jaxcredit import sharding
from jaxcredit.envs import make_env_spec
from jaxcredit.models import load_tokenizer, resolve_source
from jaxcredit.rollout import jsonl as jsonl_lib
from jaxcredit.train import config as config_lib
from jaxcredit.train.loop.export import pass_outputs_of, rollout_values, task_id_of
from jaxcredit.train.tables.methods import METHODS
from jaxcredit.train.loop.rl_step import run_passes
from jaxcredit.train.loop.run import build_run, reference_copy
from jaxcredit.trajectory import Rollouts, drop_invalid_behavior_logp


def _prompt_key(messages) -> str | None:
  """The prompt of a chat (its messages before the first assistant message) as a comparable string; None if empty."""
  first = next((k for k, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
  prompt = [{"role": m.get("role"), "content": m.get("content")} for m in messages[:first]]
  return json.dumps(prompt, sort_keys=True) if prompt else None


def _same_task(env, a, b) -> bool:
  """Whether two tasks give a pass the same inputs (a task may sit in both the train and the eval split)."""
  return a is b or (
    env.gold_answer_text(a) == env.gold_answer_text(b) and env.privileged_info(a) == env.privileged_info(b)
  )


def tasks_of_records(env, tasks: list, records: list[dict], *, source: str, need: str) -> list:
  """The environment task each rollout record was sampled from, for passes that read the task (gold answers,
  privileged information).

  A record's `task_id` finds the task with that id (`task_id`, `query_id` or `id` of the task). A record without
  one (tasks that carry no id, such as plain strings) is matched by its own prompt: its messages before the first
  assistant message equal `env.initial_messages(task)`. A task is never guessed: a record neither finds is refused.

  Args:
    env: the EnvSpec (its `initial_messages`).
    tasks: the environment's tasks (train, then eval).
    records: rollout records (docs/rollouts-jsonl.md).
    source: where the records came from, for error messages.
    need: what needs the tasks, for error messages.

  Raises:
    ValueError: a record whose task_id the environment does not have, or whose prompt is not that task's; a record
      without task_id whose prompt is no task's (or is two different tasks' prompt), naming the file and the
      rollout.
  """
  by_id: dict[str, Any] = {}
  by_prompt: dict[Any, Any] = {}
  for t in tasks:
    tid = task_id_of(t)
    if tid is not None:
      by_id.setdefault(tid, t)
    key = _prompt_key(env.initial_messages(t))
    if key not in by_prompt:
      by_prompt[key] = t
    elif by_prompt[key] is not None and not _same_task(env, by_prompt[key], t):
      by_prompt[key] = None  # two different tasks with one prompt: a record cannot say which it was
  found = []
  for r in records:
    tid, where = r.get("task_id"), f"{source}: rollout {r['rollout_id']!r}"
    if tid is not None:
      if str(tid) not in by_id:
        raise ValueError(
          f"{where} has task_id {tid!r}, which the environment does not have among its {len(tasks)} train and eval "
          f"tasks ({len(by_id)} with an id); {need} need the task"
        )
      task = by_id[str(tid)]
      key = _prompt_key(r.get("messages") or [])
      if key is not None and key != _prompt_key(env.initial_messages(task)):
        # The id names another task than the one the rollout's prompt asks: its gold answer would credit it wrongly.
        raise ValueError(
          f"{where} has task_id {tid!r}, but its prompt (its messages before the first assistant message) is not "
          f"that task's; {need} need the task it was sampled from"
        )
      found.append(task)
      continue
    key = _prompt_key(r.get("messages") or [])
    if key is None:
      raise ValueError(f"{where} has no task_id and no prompt messages; {need} need the task it was sampled from")
    if by_prompt.get(key, False) is None:
      raise ValueError(f"{where} has no task_id and its prompt is the prompt of several different tasks")
    if key not in by_prompt:
      raise ValueError(
        f"{where} has no task_id and its prompt (its messages before the first assistant message) is none of the "
        f"environment's {len(tasks)} train and eval tasks' prompts; {need} need the task"
      )
    found.append(by_prompt[key])
  return found


MAX_CREDIT_TURNS = 4096


"""The most turns a rollout of a `jaxcredit credit` file may have (the per-turn arrays are [B, T])."""


def credit_file(config: ml_collections.ConfigDict, in_path: str, out_path: str) -> dict:
  """Computes the config's method's advantages for rollouts made elsewhere (`jaxcredit credit`).

  Reads `in_path` (rollouts JSONL, any order: groups come from their group ids; for a method with passes, token
  ids in [0, the policy tokenizer's vocabulary), checked naming the line), credits them with
  `credit_records` and writes the records with "advantages", "turn_advantages" and "method" to `out_path`. The
  workdir's config.json is neither checked nor written.

  Returns:
    {"rollouts": B, "groups": number of groups, "method": name}.

  Raises:
    ValueError: as `credit_records`.
  """
  vocab_size = None
  if METHODS[config.credit.method].passes:  # the passes read the ids with the policy: check them, naming the line
    tok = load_tokenizer(resolve_source(config.model.source), cache_dir=config.model.cache_dir or None)
    vocab_size = tok.vocab_size
  records = jsonl_lib.read_jsonl(in_path, vocab_size=vocab_size)
  credited, groups = credit_records(config, records, source=in_path)
  jsonl_lib.write_jsonl(out_path, credited)
  return {"rollouts": len(records), "groups": groups, "method": config.credit.method}


def credit_records(
  config: ml_collections.ConfigDict, records: list[dict], *, source: str, details: bool = False
) -> tuple[list[dict], int]:
  """The config's method's advantages for rollout records (docs/rollouts-jsonl.md).

  Runs the passes the method needs with the config's models (the latest checkpoint of config.workdir and its
  reference when there is one, else config.model.source for both). Passes that need the task (privileged info, gold
  answers) find it by the record's task_id among the environment's train and eval tasks.

  Args:
    config: a training config; its `credit.method` is the method.
    records: rollout records, any order (groups come from their group ids).
    source: where the records came from, for error messages.
    details: also every pass output and the method's details of each rollout under metadata["passes"] and
      metadata["credit_details"] (what `jaxcredit viz` draws).

  Returns:
    (the records with "advantages", "turn_advantages" and "method", in their order; the number of groups).

  Raises:
    ValueError: no records, a bad record (file and line named), a duplicate rollout id, a group smaller than the
      method needs, groups of unequal size for a group method, a token id outside the policy tokenizer's vocabulary when the method runs passes, or a task_id
      the environment does not have when a pass needs the task.
  """
  c = config
  config_lib.validate(c)  # before any record is read: a bad key is named, not met as a crash in the credit run
  method = METHODS[c.credit.method]
  in_path = source
  if not records:
    raise ValueError(f"{in_path} holds no rollouts")
  env = make_env_spec(c.env)
  builders = [jsonl_lib.record_to_builder(r) for r in records]
  turns = {r["rollout_id"]: b.num_turns for r, b in zip(records, builders)}
  if len(turns) != len(records):
    seen, dup = set(), None
    for r in records:
      dup = r["rollout_id"] if r["rollout_id"] in seen else dup
      seen.add(r["rollout_id"])
    raise ValueError(f"{in_path}: rollout_id {dup!r} appears more than once (rollout ids must be unique)")
  longest = max(turns, key=lambda rollout_id: turns[rollout_id])
  if turns[longest] > max(env.max_turns, MAX_CREDIT_TURNS):
    raise ValueError(
      f"{in_path}: rollout {longest!r} has num_turns={turns[longest]}, more than the environment's "
      f"max_turns ({env.max_turns}) and the {MAX_CREDIT_TURNS} a credit run accepts"
    )
  max_turns = max(env.max_turns, turns[longest])
  sizes: dict[Any, int] = {}
  for r in records:
    sizes[r["group_id"]] = sizes.get(r["group_id"], 0) + 1
  small = {g: n for g, n in sizes.items() if n < method.min_group_size}
  if small:
    raise ValueError(
      f"{c.credit.method} needs groups of at least {method.min_group_size} rollouts; in {in_path} "
      f"group(s) {sorted(small, key=str)[:5]} have {sorted(set(small.values()))}"
    )
  if method.min_group_size > 1 and len(set(sizes.values())) > 1:  # a group baseline is vmapped over one group size
    g0, n0 = next(iter(sizes.items()))
    g, n = next((g, n) for g, n in sizes.items() if n != n0)
    raise ValueError(
      f"{c.credit.method} needs groups of one size; in {in_path} group {g!r} has {n} rollouts but group {g0!r} has "
      f"{n0} (every group needs the same number of rollouts)"
    )
  run = build_run(c, write_config=False) if method.passes else None  # the passes' models, tokenizer and tasks
  pad_id = run.tok.pad_id if run is not None else 0
  try:
    traj, groups = jsonl_lib.records_to_trajectory(
      records,
      max_turns=max_turns,
      pad_id=pad_id,
      length_bucket=c.train.length_bucket,
      vocab_size=run.tok.vocab_size if run is not None else None,
    )
  except ValueError as e:
    raise ValueError(f"{in_path}: {e}") from None
  traj, _ = drop_invalid_behavior_logp(traj)  # null behavior log-probs (engine_invalid_logp_tokens), as in training
  if run is not None:
    tasks = tasks_of_records(
      run.env, list(run.train_tasks) + list(run.eval_tasks), records, source=in_path, need=f"{c.credit.method}'s passes"
    )
    params, ref_params = run.params, run.params
    latest = run.ckpt.latest_step()
    if latest is not None:
      params = run.ckpt.restore_params(latest, run.params)
    if run.ckpt.has_reference():
      ref_params = run.ckpt.restore_reference(reference_copy(run, run.params))
    rollouts = Rollouts.from_records(records, traj, builders, tasks)
    with sharding.use_rules(run.rules):
      run_passes(run, rollouts, params, ref_params, jax.random.key(c.seed))
  out = method.advantages(traj, c.credit[c.credit.method])
  credited = jsonl_lib.attach_credit(records, out.adv_BxL, out.turn_adv_BxT, method=c.credit.method)
  if details:
    for i, r in enumerate(credited):
      r["metadata"] = {
        **(r.get("metadata") or {}),
        "passes": pass_outputs_of(traj, i),
        "credit_details": rollout_values(out.details, i, traj),
      }
  return credited, len(groups)
