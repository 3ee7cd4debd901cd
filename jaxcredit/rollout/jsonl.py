"""Rollouts as JSONL (export and import), lossless both ways.

One JSON object per line, one line per rollout. A record holds the chat (OpenAI layout), the token-level fields
of its `RolloutBuilder` (token ids, masks, turn and unit ids, behavior log-probs, state boundaries), the reward and,
after a credit run, the per-token advantages:

  {"rollout_id": "r0", "group_id": 3, "task_id": "gsm8k/17",
   "messages": [{"role": "user", "content": "..."},
                {"role": "assistant", "content": "<tool_call>{...}</tool_call>",
                 "tool_calls": [{"id": "call_0_0", "type": "function",
                                 "function": {"name": "calculator", "arguments": "{\\"expression\\": \\"2*3\\"}"}}]},
                {"role": "tool", "content": "<tool_response>6</tool_response>", "tool_call_id": "call_0_0"}, ...],
   "token_ids": [...], "action_mask": [0, 0, 1, ...], "turn_ids": [-1, -1, 0, ...], "unit_ids": [-1, -1, 0, ...],
   "behavior_logprobs": [0.0, 0.0, -0.25, ...], "boundaries": [12, 40], "prompt_len": 12,
   "num_turns": 2, "current_unit": 0,
   "reward": 1.0, "unit_rewards": [1.0], "finish": "answer", "metadata": {"tool_calls": 1, "tool_errors": 0}}

`REQUIRED_FIELDS` and `OPTIONAL_FIELDS` list every field with its type and meaning; `validate_record` checks them.
Fields not listed are kept as they are (a reader ignores them), so a record may carry more.

Lossless: `record_to_builder(rollout_to_record(b, ...))` rebuilds `b` field for field (tokens, action_mask,
turn_ids, unit_ids, behavior_logp, boundaries, num_turns, unit), and `read_jsonl(write_jsonl(...))` gives back equal
records. Floats are written with Python's `repr` (the shortest text that reads back to the same float64), so a
float32 array exported with `float()` per element reads back, cast to float32, bit for bit. Non-finite floats
(NaN, inf) are not standard JSON: writing one is an error naming the field, except an action token's behavior
log-prob: one the engine did not give (NaN) or gave non-finite is written as null, the record flagged with
`engine_invalid_logp_tokens` (their count), and reads back as NaN (the trainer leaves such tokens out of the loss).

Strings are written as UTF-8 (non-ASCII characters unescaped, control characters escaped); a record holding a string
that UTF-8 cannot encode (a lone surrogate) is written with ASCII escapes instead, which read back to the same string.
One thing JSON cannot keep apart: a high surrogate followed by a low surrogate as two code points (not valid text)
reads back as the one character the pair encodes. `rollout_to_record` returns its strings in that read-back form, so
its records compare equal after a trip through a file.
"""

from __future__ import annotations

import copy
import json
import math
import os
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from jaxcredit.envs import tool_calls as tc
from jaxcredit.trajectory import RolloutBuilder, Trajectory, pack

ROLES = ("system", "user", "assistant", "tool")
"""Message roles a record may hold."""

MAX_TOKEN_ID = 2**31 - 1
"""Token ids are packed as int32."""

REQUIRED_FIELDS: dict[str, str] = {
  "rollout_id": "str: the rollout's id.",
  "group_id": "int | str: the prompt group; rollouts sampled from one prompt share it (any order in a file).",
  "token_ids": "[int]: every token id of the rollout (prompt, actions, observations), 0 <= id < 2**31.",
  "action_mask": "[0|1]: 1 on the tokens the policy generated (true/false also read); one per token.",
  "turn_ids": "[int]: the turn (assistant message) index of each action token, -1 on every other token; "
  "non-decreasing over the action tokens.",
  "behavior_logprobs": "[float | null]: log-prob (nats) the sampler recorded for each action token (0.0 elsewhere); "
  "finite, or null on an action token the engine gave no log-prob (then engine_invalid_logp_tokens counts them); "
  "one per token.",
  "boundaries": "[int]: token count at each state s_t: boundaries[0] = prompt_len, then the length right after "
  "each tool observation; non-decreasing, each <= len(token_ids).",
  "prompt_len": "int: tokens of the initial prompt, >= 1, equal to boundaries[0]; no action token before it.",
  "reward": "float: the outcome reward (finite).",
}
"""Fields every record must have: name -> type and meaning."""

OPTIONAL_FIELDS: dict[str, str] = {
  "task_id": "str | null: the task the prompt came from (default null).",
  "messages": "[message]: the chat in OpenAI layout (default []): {\"role\": system|user|assistant|tool, "
  "\"content\": str|null}; an assistant message that made tool calls also has \"tool_calls\": "
  "[{\"id\": \"call_<turn>_<k>\", \"type\": \"function\", \"function\": {\"name\": str, "
  "\"arguments\": <JSON string>}}]; a tool message may have \"tool_call_id\": str.",
  "tools": "[object]: the function schemas offered to the model.",
  "unit_ids": "[int]: the verified-unit index of each action token, -1 elsewhere; non-decreasing over the action "
  "tokens (default: 0 on action tokens, -1 elsewhere).",
  "num_turns": "int: assistant turns, >= max(turn_ids) + 1 (default max(turn_ids) + 1, or 0 without actions); "
  "larger when a turn generated no token.",
  "current_unit": "int: the builder's current verified unit, >= max(unit_ids) (default: "
  "max(0, max(unit_ids), len(unit_rewards) - 1)).",
  "unit_rewards": "[float]: the verified reward of each unit the rollout reached, at least max(unit_ids) + 1 "
  "entries (default [reward]).",
  "finish": "str | null: why the rollout ended (\"answer\", \"no_answer\", \"tool_budget\", \"length\").",
  "metadata": "object: anything else (default {}).",
  "engine_invalid_logp_tokens": "int: the number of nulls in behavior_logprobs: action tokens the engine returned "
  "without a (finite) log-prob, which the trainer left out of the loss; written only when > 0 (default 0).",
  "advantages": "[float]: credited advantage of each token, 0.0 off actions (written by a credit run).",
  "turn_advantages": "[float]: credited advantage of each turn, num_turns entries (written by a credit run).",
  "method": "str: the credit method that wrote the advantages.",
}
"""Fields a record may have: name -> type, meaning and the default a reader uses."""


class RecordError(ValueError):
  """A record field is missing or ill-typed, or fields disagree. `field` names it (e.g. "turn_ids[7]")."""

  def __init__(self, field: str, problem: str):
    self.field = field
    self.problem = problem
    super().__init__(f"field {field!r}: {problem}")


# ---------------------------------------------------------------------------------------------------------------
# Validation


def _is_int(x) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_num(x) -> bool:
  return (_is_int(x) or isinstance(x, (float, np.floating))) and math.isfinite(x)


def _is_bit(x) -> bool:
  return isinstance(x, (bool, np.bool_)) or (_is_int(x) and x in (0, 1))


def _type(x) -> str:
  return "null" if x is None else type(x).__name__


def _list(rec: Mapping, field: str, ok, what: str) -> list | tuple:
  value = rec[field]
  if not isinstance(value, (list, tuple)):
    raise RecordError(field, f"expected a list of {what}, got {_type(value)}")
  for i, x in enumerate(value):
    if not ok(x):
      raise RecordError(f"{field}[{i}]", f"expected {what}, got {x!r}")
  return value


def _scalar(rec: Mapping, field: str, ok, what: str):
  value = rec[field]
  if not ok(value):
    raise RecordError(field, f"expected {what}, got {value!r} ({_type(value)})")
  return value


def _derived_num_turns(rec: Mapping) -> int:
  if "num_turns" in rec:
    return int(rec["num_turns"])
  return max((int(t) for t in rec["turn_ids"]), default=-1) + 1


def _unit_ids(rec: Mapping) -> list[int]:
  if "unit_ids" in rec:
    return [int(u) for u in rec["unit_ids"]]
  return [0 if a else -1 for a in rec["action_mask"]]


def _derived_current_unit(rec: Mapping) -> int:
  if "current_unit" in rec:
    return int(rec["current_unit"])
  n_units = len(rec["unit_rewards"]) if "unit_rewards" in rec else 1
  return max([0, n_units - 1] + _unit_ids(rec))


def _check_ids(rec: Mapping, field: str, mask: Sequence[bool]) -> int:
  """Checks an id array (turn_ids / unit_ids) against the action mask; returns its max over actions (-1: none)."""
  ids = _list(rec, field, _is_int, "an int")
  last = -1
  for i, (a, t) in enumerate(zip(mask, ids)):
    if a:
      if t < 0:
        raise RecordError(f"{field}[{i}]", f"is {t} on an action token (action_mask[{i}] = 1); expected >= 0")
      if t < last:
        raise RecordError(
          f"{field}[{i}]",
          f"is {t} after {last} on an earlier action token; {field} must not decrease over the action tokens",
        )
      last = t
    elif t != -1:
      raise RecordError(f"{field}[{i}]", f"is {t} on a non-action token (action_mask[{i}] = 0); expected -1")
  return last


def _check_messages(rec: Mapping) -> None:
  msgs = rec["messages"]
  if not isinstance(msgs, (list, tuple)):
    raise RecordError("messages", f"expected a list of message objects, got {_type(msgs)}")
  for j, m in enumerate(msgs):
    where = f"messages[{j}]"
    if not isinstance(m, Mapping):
      raise RecordError(where, f"expected a message object, got {_type(m)}")
    if m.get("role") not in ROLES:
      raise RecordError(f"{where}.role", f"expected one of {', '.join(ROLES)}, got {m.get('role')!r}")
    if "content" not in m:
      raise RecordError(f"{where}.content", "missing")
    if m["content"] is not None and not isinstance(m["content"], str):
      raise RecordError(f"{where}.content", f"expected a string or null, got {_type(m['content'])}")
    if "tool_calls" in m and m["tool_calls"] is not None:
      if m["role"] != "assistant":
        raise RecordError(f"{where}.tool_calls", f"only assistant messages have tool_calls, not {m['role']}")
      calls = m["tool_calls"]
      if not isinstance(calls, (list, tuple)):
        raise RecordError(f"{where}.tool_calls", f"expected a list, got {_type(calls)}")
      for k, c in enumerate(calls):
        cw = f"{where}.tool_calls[{k}]"
        if not isinstance(c, Mapping):
          raise RecordError(cw, f"expected an object, got {_type(c)}")
        if not isinstance(c.get("id"), str):
          raise RecordError(f"{cw}.id", f"expected a string, got {c.get('id')!r}")
        if c.get("type") != "function":
          raise RecordError(f"{cw}.type", f"expected \"function\", got {c.get('type')!r}")
        fn = c.get("function")
        if not isinstance(fn, Mapping):
          raise RecordError(f"{cw}.function", f"expected an object, got {_type(fn)}")
        if not isinstance(fn.get("name"), str):
          raise RecordError(f"{cw}.function.name", f"expected a string, got {fn.get('name')!r}")
        if not isinstance(fn.get("arguments"), str):
          raise RecordError(f"{cw}.function.arguments", f"expected a JSON string, got {_type(fn.get('arguments'))}")
    if "tool_call_id" in m and not isinstance(m["tool_call_id"], str):
      raise RecordError(f"{where}.tool_call_id", f"expected a string, got {m['tool_call_id']!r}")


def check_token_ids(record: Mapping[str, Any], vocab_size: int) -> None:
  """Checks a record's token ids against the vocabulary of the model that will read them: 0 <= id < vocab_size.

  `validate_record` knows no vocabulary (a record is valid for some model); a command that loads the model checks
  this too, so that an id the embedding has no row for is refused instead of read as a clamped row.

  Args:
    record: a record that passes `validate_record`.
    vocab_size: the number of ids of the tokenizer the command loads.

  Raises:
    RecordError (a ValueError): naming the first bad id, e.g. "field 'token_ids[4]': id 60000 is outside the
      vocabulary [0, 49152) of the model's tokenizer".
  """
  for k, t in enumerate(record["token_ids"]):
    if not 0 <= t < vocab_size:
      raise RecordError(
        f"token_ids[{k}]",
        f"id {t} is outside the vocabulary [0, {vocab_size}) of the model's tokenizer (were these rollouts "
        "tokenized by another model?)",
      )


def validate_record(record: Mapping[str, Any]) -> None:
  """Checks one record: every required field present and typed, optional fields typed when present, and the
  fields consistent (see `REQUIRED_FIELDS`, `OPTIONAL_FIELDS`).

  Consistency: behavior_logprobs is null only on action tokens, as many times as engine_invalid_logp_tokens says
  (absent: none); the per-token arrays (action_mask, turn_ids, behavior_logprobs, and unit_ids / advantages when
  present) have len(token_ids) entries; turn_ids and unit_ids are -1 exactly off the action tokens and
  non-decreasing over them; num_turns > max(turn_ids); current_unit >= max(unit_ids); unit_rewards has an entry for
  every unit an action token is in; prompt_len == boundaries[0] with no action token before it; boundaries
  non-decreasing and within the tokens; advantages 0.0 off actions; turn_advantages has num_turns entries.

  Raises:
    RecordError (a ValueError): naming the first bad field, e.g. "field 'turn_ids[7]': is -1 on an action token".
  """
  if not isinstance(record, Mapping):
    raise RecordError("<record>", f"expected a JSON object, got {_type(record)}")
  for field in REQUIRED_FIELDS:
    if field not in record:
      raise RecordError(field, "missing (required fields: " + ", ".join(REQUIRED_FIELDS) + ")")
  _scalar(record, "rollout_id", lambda x: isinstance(x, str), "a string")
  _scalar(record, "group_id", lambda x: _is_int(x) or isinstance(x, str), "an int or a string")
  tokens = _list(record, "token_ids", lambda x: _is_int(x) and 0 <= x <= MAX_TOKEN_ID, "a token id (0 <= id < 2**31)")
  n = len(tokens)
  per_token = ["action_mask", "turn_ids", "behavior_logprobs"] + [f for f in ("unit_ids", "advantages") if f in record]
  mask = [bool(a) for a in _list(record, "action_mask", _is_bit, "0 or 1")]
  logps = _list(record, "behavior_logprobs", lambda x: x is None or _is_num(x), "a finite number (or null)")
  for field in per_token:
    value = record[field]
    if isinstance(value, (list, tuple)) and len(value) != n:
      raise RecordError(field, f"has {len(value)} entries but token_ids has {n} (one per token)")
  nulls = 0
  for i, (a, x) in enumerate(zip(mask, logps)):
    if x is None:
      if not a:
        raise RecordError(f"behavior_logprobs[{i}]", "is null on a non-action token; expected 0.0")
      nulls += 1
  if "engine_invalid_logp_tokens" in record:
    _scalar(record, "engine_invalid_logp_tokens", lambda x: _is_int(x) and x >= 0, "an int >= 0")
  flagged = record.get("engine_invalid_logp_tokens", None)
  if flagged is None and nulls:
    raise RecordError(
      "engine_invalid_logp_tokens",
      f"missing, but behavior_logprobs holds {nulls} null(s) (action tokens without an engine log-prob)",
    )
  if flagged is not None and flagged != nulls:
    raise RecordError("engine_invalid_logp_tokens", f"is {flagged} but behavior_logprobs holds {nulls} null(s)")
  max_turn = _check_ids(record, "turn_ids", mask)
  if "num_turns" in record:
    _scalar(
      record, "num_turns", lambda x: _is_int(x) and x >= max_turn + 1, f"an int >= {max_turn + 1} (max(turn_ids) + 1)"
    )
  max_unit = _check_ids(record, "unit_ids", mask) if "unit_ids" in record else (0 if any(mask) else -1)
  if "current_unit" in record:
    _scalar(
      record,
      "current_unit",
      lambda x: _is_int(x) and x >= max(max_unit, 0),
      f"an int >= {max(max_unit, 0)} (max(unit_ids))",
    )
  _scalar(record, "reward", _is_num, "a finite number")
  if "unit_rewards" in record:
    ur = _list(record, "unit_rewards", _is_num, "a finite number")
    if len(ur) < max(max_unit + 1, 1):
      raise RecordError(
        "unit_rewards",
        f"has {len(ur)} entries but action tokens reach unit {max_unit} (needs at least {max(max_unit + 1, 1)})",
      )
  elif max_unit > 0:
    raise RecordError(
      "unit_rewards", f"missing, but action tokens reach unit {max_unit} (the default [reward] covers unit 0 only)"
    )
  bounds = _list(record, "boundaries", _is_int, "an int")
  if not bounds:
    raise RecordError("boundaries", "is empty; boundaries[0] must be the prompt length")
  prompt_len = _scalar(
    record,
    "prompt_len",
    lambda x: _is_int(x) and 1 <= x <= n,
    f"an int in [1, {n}] (1 <= prompt_len <= len(token_ids))",
  )
  if bounds[0] != prompt_len:
    raise RecordError("boundaries", f"boundaries[0] = {bounds[0]} differs from prompt_len = {prompt_len}")
  for t in range(1, len(bounds)):
    if not bounds[t - 1] <= bounds[t] <= n:
      raise RecordError(
        f"boundaries[{t}]", f"is {bounds[t]}; expected {bounds[t - 1]} <= it <= {n} (non-decreasing, within the tokens)"
      )
  if any(mask[:prompt_len]):
    first = mask.index(True)
    raise RecordError("action_mask", f"action_mask[{first}] = 1 inside the prompt (prompt_len = {prompt_len})")
  if record.get("task_id") is not None:
    _scalar(record, "task_id", lambda x: isinstance(x, str), "a string or null")
  if record.get("finish") is not None:
    _scalar(record, "finish", lambda x: isinstance(x, str), "a string or null")
  if "messages" in record:
    _check_messages(record)
  if "tools" in record:
    _list(record, "tools", lambda x: isinstance(x, Mapping), "a function-schema object")
  if "metadata" in record:
    _scalar(record, "metadata", lambda x: isinstance(x, Mapping), "an object")
  if "advantages" in record:
    adv = _list(record, "advantages", _is_num, "a finite number")
    for i, (a, v) in enumerate(zip(mask, adv)):
      if not a and v != 0:
        raise RecordError(f"advantages[{i}]", f"is {v!r} on a non-action token; expected 0.0")
  if "turn_advantages" in record:
    ta = _list(record, "turn_advantages", _is_num, "a finite number")
    if len(ta) != _derived_num_turns(record):
      raise RecordError("turn_advantages", f"has {len(ta)} entries for {_derived_num_turns(record)} turns")
  if "method" in record:
    _scalar(record, "method", lambda x: isinstance(x, str), "a string")


# ---------------------------------------------------------------------------------------------------------------
# Export


def _np_default(o):
  if isinstance(o, np.ndarray):
    return o.tolist()
  if isinstance(o, np.generic):
    return o.item()
  raise TypeError(f"{type(o).__name__} is not JSON-serializable")


def _json_native(value, field: str):
  """A deep copy of `value` holding only JSON types (tuples -> lists, numpy -> Python), as it reads back."""
  try:
    return json.loads(json.dumps(value, default=_np_default, allow_nan=False, ensure_ascii=True))
  except (TypeError, ValueError) as e:
    raise RecordError(field, f"not JSON-serializable ({e})") from None


def extract_tool_calls(text: str | None, turn: int) -> list[dict]:
  """The OpenAI "tool_calls" of one assistant message: its well-formed `<tool_call>` blocks.

  Calls are read by `tool_calls.parse_message` outside `<think>` blocks; malformed ones (bad JSON, no name,
  arguments not an object) are skipped. No call-count or length limit applies (the text is described, not run).

  Args:
    text: the assistant message's content (None: no calls).
    turn: the message's turn index, used in the ids.

  Returns:
    [{"id": f"call_{turn}_{k}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}],
    k counting the well-formed calls from 0, in text order.
  """
  if not isinstance(text, str) or tc.TOOL_CALL_OPEN not in text:
    return []
  parsed = tc.parse_message(text, max_calls=len(text) + 1, max_call_chars=len(text) + 1)
  out = []
  for p in parsed.calls:
    if p.call is None:
      continue
    out.append(
      {
        "id": f"call_{turn}_{len(out)}",
        "type": "function",
        "function": {"name": p.call.name, "arguments": json.dumps(p.call.arguments, ensure_ascii=False)},
      }
    )
  return out


def _with_tool_calls(messages: list[dict]) -> list[dict]:
  turn = -1
  pending: list[str] | None = None  # ids of the last assistant message's calls, for the tool message after it
  for m in messages:
    if not isinstance(m, dict):
      continue  # validate_record reports it
    role = m.get("role")
    if role == "assistant":
      turn += 1
      if "tool_calls" not in m:
        calls = extract_tool_calls(m.get("content"), turn)
        if calls:
          m["tool_calls"] = calls
      pending = [c.get("id") for c in (m.get("tool_calls") or []) if isinstance(c, Mapping)]
    elif role == "tool":
      if "tool_call_id" not in m and pending is not None and len(pending) == 1 and isinstance(pending[0], str):
        m["tool_call_id"] = pending[0]
      pending = None
    else:
      pending = None
  return messages


def rollout_to_record(
  result_or_builder,
  *,
  rollout_id: str,
  group_id: int | str,
  reward: float | None = None,
  unit_rewards: Sequence[float] | None = None,
  messages: Sequence[Mapping[str, Any]] | None = None,
  tools: Sequence[Mapping[str, Any]] | None = None,
  task_id: str | None = None,
  finish: str | None = None,
  metadata: Mapping[str, Any] | None = None,
) -> dict:
  """One rollout as a JSONL record (a dict of JSON types only; see `REQUIRED_FIELDS` / `OPTIONAL_FIELDS`).

  Args:
    result_or_builder: a `RolloutBuilder`, or a `multiturn.RolloutResult` (anything with `.builder`), whose
      `.reward`, `.messages` and `.finish` are the defaults of `reward`, `messages` and `finish`, and whose
      `.tool_calls` / `.tool_errors` counts go into metadata (under `metadata`'s own keys).
    rollout_id: the rollout's id.
    group_id: its prompt group (an int or a string).
    reward: the outcome reward (required for a bare builder).
    unit_rewards: the verified reward of each unit (default [reward]).
    messages: the chat (OpenAI layout). Copied; each assistant message without "tool_calls" gets them from its
      well-formed `<tool_call>` blocks outside think blocks (`extract_tool_calls`, ids "call_<turn>_<k>", turn
      counting the assistant messages from 0); its content is kept as is, so nothing is lost. A tool message right
      after an assistant message with exactly one call gets that call's "tool_call_id" (unless it has one).
    tools: function schemas offered to the model (written only when given).
    task_id: the task's id.
    finish: why the rollout ended.
    metadata: anything else JSON-serializable (numpy scalars and arrays are converted).

  Returns:
    The record: token fields from the builder (ints, 0/1 mask, floats), plus num_turns and current_unit so that
    `record_to_builder` rebuilds it exactly.

  Raises:
    TypeError: if `result_or_builder` is neither a builder nor has `.builder`.
    ValueError (RecordError): if reward is missing for a builder, a value is not JSON-serializable or not finite,
      or the builder's fields are inconsistent (e.g. no boundaries: build it with `RolloutBuilder.from_prompt`).
  """
  if isinstance(result_or_builder, RolloutBuilder):
    result, b = None, result_or_builder
  elif isinstance(getattr(result_or_builder, "builder", None), RolloutBuilder):
    result, b = result_or_builder, result_or_builder.builder
  else:
    raise TypeError(f"expected a RolloutBuilder or a RolloutResult, got {type(result_or_builder).__name__}")
  if reward is None:
    if result is None:
      raise RecordError("reward", "required when exporting a bare RolloutBuilder")
    reward = result.reward
  if messages is None:
    messages = list(getattr(result, "messages", None) or [])
  if finish is None and result is not None:
    finish = getattr(result, "finish", None)
  meta: dict[str, Any] = {}
  if result is not None:
    for key in ("tool_calls", "tool_errors"):
      if _is_int(getattr(result, key, None)):
        meta[key] = int(getattr(result, key))
  meta.update(dict(metadata or {}))
  if not b.boundaries:
    raise RecordError("boundaries", "the builder has none; build it with RolloutBuilder.from_prompt")
  if isinstance(group_id, np.integer):
    group_id = int(group_id)
  if not isinstance(reward, (bool, np.bool_)) and isinstance(reward, (int, float, np.integer, np.floating)):
    reward = float(reward)
  record: dict[str, Any] = {
    "rollout_id": rollout_id,
    "group_id": group_id,
    "task_id": task_id,
    "messages": _with_tool_calls(_json_native(list(messages), "messages")),
  }
  if tools is not None:
    record["tools"] = _json_native(list(tools), "tools")
  record.update(
    {
      "token_ids": [int(t) for t in b.tokens],
      "action_mask": [1 if a else 0 for a in b.action_mask],
      "turn_ids": [int(t) for t in b.turn_ids],
      "unit_ids": [int(u) for u in b.unit_ids],
      # A log-prob the engine did not give (NaN) or gave non-finite is null; the rollout is flagged with their count.
      "behavior_logprobs": [float(x) if math.isfinite(x) else None for x in b.behavior_logp],
      "boundaries": [int(x) for x in b.boundaries],
      "prompt_len": int(b.boundaries[0]),
      "num_turns": int(b.num_turns),
      "current_unit": int(b.unit),
      "reward": reward,
      "unit_rewards": [float(x) for x in (unit_rewards if unit_rewards is not None else [reward])],
      "finish": finish,
      "metadata": _json_native(meta, "metadata"),
    }
  )
  invalid = sum(x is None for x in record["behavior_logprobs"])
  if invalid:
    record["engine_invalid_logp_tokens"] = invalid
  validate_record(record)
  for key in ("rollout_id", "group_id", "task_id", "finish"):
    if isinstance(record[key], str):
      record[key] = _json_native(record[key], key)  # a surrogate pair becomes its character, as it reads back
  return record


# ---------------------------------------------------------------------------------------------------------------
# Import


def record_to_builder(record: Mapping[str, Any]) -> RolloutBuilder:
  """The `RolloutBuilder` a record was exported from (the exact inverse of `rollout_to_record` on tokens,
  action_mask, turn_ids, unit_ids, behavior_logp, boundaries, num_turns and unit; a null behavior log-prob is NaN).

  Missing optional fields take their defaults (`OPTIONAL_FIELDS`): unit_ids 0 on actions, num_turns
  max(turn_ids) + 1, unit max(0, max(unit_ids), len(unit_rewards) - 1).

  Raises:
    ValueError (RecordError): if the record fails `validate_record`.
  """
  validate_record(record)
  return RolloutBuilder(
    tokens=[int(t) for t in record["token_ids"]],
    action_mask=[bool(a) for a in record["action_mask"]],
    turn_ids=[int(t) for t in record["turn_ids"]],
    behavior_logp=[math.nan if x is None else float(x) for x in record["behavior_logprobs"]],
    boundaries=[int(x) for x in record["boundaries"]],
    num_turns=_derived_num_turns(record),
    unit_ids=_unit_ids(record),
    unit=_derived_current_unit(record),
  )


def _record_name(i: int, record) -> str:
  rid = record.get("rollout_id") if isinstance(record, Mapping) else None
  return f"record {i}" + (f" (rollout_id {rid!r})" if isinstance(rid, str) else "")


def _dump_line(record: Mapping) -> str:
  kw = dict(default=_np_default, allow_nan=False, separators=(",", ":"))
  line = json.dumps(record, ensure_ascii=False, **kw)
  try:
    line.encode("utf-8")
  except UnicodeEncodeError:  # a lone surrogate: escape everything (reads back to the same string)
    line = json.dumps(record, ensure_ascii=True, **kw)
  return line


def write_jsonl(path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> None:
  """Writes records to `path` (UTF-8), one compact JSON object per line, each checked by `validate_record` first
  (the file is written only when all pass).

  Raises:
    ValueError: naming the record (index, rollout_id) and field that fails `validate_record` or is not
      JSON-serializable (e.g. a NaN).
  """
  lines = _checked_lines(records)
  with open(path, "w", encoding="utf-8", newline="\n") as f:
    f.write("".join(line + "\n" for line in lines))


def _checked_lines(records: Iterable[Mapping[str, Any]]) -> list[str]:
  """Each record checked (`validate_record`) and dumped to one JSON line; raises ValueError naming the record."""
  lines = []
  for i, rec in enumerate(records):
    try:
      validate_record(rec)
      lines.append(_dump_line(rec))
    except (TypeError, ValueError) as e:
      raise ValueError(f"{_record_name(i, rec)}: {e}") from None
  return lines


def append_jsonl(path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> None:
  """Appends records to `path` as `write_jsonl` writes them (each checked first; nothing is written unless all
  pass), flushed and synced to disk: a process killed afterwards leaves them whole, one killed during the write
  at most a last line without its newline.

  Raises:
    ValueError: as `write_jsonl`.
  """
  lines = _checked_lines(records)
  with open(path, "a", encoding="utf-8", newline="\n") as f:
    f.write("".join(line + "\n" for line in lines))
    f.flush()
    os.fsync(f.fileno())


def _reject_constant(name: str):
  raise ValueError(f"{name} is not standard JSON (non-finite numbers are not allowed)")


def _no_duplicate_keys(pairs: list) -> dict:
  """json's object hook: refuses an object that names a key twice (json.loads keeps the last silently)."""
  out = {}
  for key, value in pairs:
    if key in out:
      raise ValueError(f"the key {key!r} appears twice in one object")
    out[key] = value
  return out


def read_jsonl(path: str | os.PathLike, *, vocab_size: int | None = None) -> list[dict]:
  """Reads the records of a JSONL file (blank lines skipped), each checked by `validate_record` and, when
  `vocab_size` is given, by `check_token_ids` (every token id in [0, vocab_size)).

  Returns:
    The records as parsed, in file order (defaults are not filled in: `record_to_builder` and
    `records_to_trajectory` apply them).

  Raises:
    ValueError: "<path>, line <n>: ..." for a line that is not UTF-8, not JSON (NaN / Infinity included, or an
      object naming a key twice), not an object, or whose record fails `validate_record` or `check_token_ids` (the message names the field).
  """
  with open(path, "rb") as f:
    data = f.read()
  if data.startswith(b"\xef\xbb\xbf"):
    data = data[3:]
  records = []
  for lineno, raw in enumerate(data.split(b"\n"), start=1):
    if not raw.strip():
      continue
    where = f"{os.fspath(path)}, line {lineno}"
    try:
      text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise ValueError(f"{where}: not valid UTF-8 (byte {e.start})") from None
    try:
      rec = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as e:
      raise ValueError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
    except (ValueError, RecursionError) as e:
      raise ValueError(f"{where}: invalid JSON ({e})") from None
    try:
      validate_record(rec)
      if vocab_size is not None:
        check_token_ids(rec, vocab_size)
    except RecordError as e:
      raise ValueError(f"{where}: {e}") from None
    records.append(rec)
  return records


def records_to_trajectory(
  records: Sequence[Mapping[str, Any]],
  *,
  max_turns: int | None = None,
  pad_id: int,
  length_bucket: int = 64,
  vocab_size: int | None = None,
) -> tuple[Trajectory, dict[int | str, int]]:
  """Packs records into a `Trajectory` (row i is records[i]; the order is kept, never assumed group-major).

  Args:
    records: B records.
    max_turns: T (default: the most turns of any record, at least 1).
    pad_id: token id used for padding.
    length_bucket: L is rounded up to a multiple of this.
    vocab_size: when given, every token id must be in [0, vocab_size) (`check_token_ids`).

  Returns:
    (trajectory, group_ids): trajectory.group_ids_B holds dense int32 ids, numbered by first appearance of each
    record's group_id (ints and strings alike; 1 and "1" are different groups); group_ids maps each original
    group_id to its dense id, in that order. rewards_B are the records' rewards, unit_rewards their unit_rewards
    (default [reward]), behavior_logp_BxL their behavior_logprobs cast to float32.

  Raises:
    ValueError: for no records, a record that fails `validate_record` (or `check_token_ids`) or holds a float
      beyond float32's range (naming its index, rollout_id and field), or what `trajectory.pack` rejects (a record with more than
      `max_turns` turns).
  """
  if not records:
    raise ValueError("records is empty: nothing to pack")
  builders = []
  for i, rec in enumerate(records):
    try:
      builders.append(record_to_builder(rec))
      if vocab_size is not None:
        check_token_ids(rec, vocab_size)
    except ValueError as e:
      raise ValueError(f"{_record_name(i, rec)}: {e}") from None
  f32_max = float(np.finfo(np.float32).max)
  for i, rec in enumerate(records):
    for field in ("behavior_logprobs", "reward", "unit_rewards"):
      values = rec.get(field, [])
      values = values if isinstance(values, (list, tuple)) else [values]
      big = [k for k, x in enumerate(values) if x is not None and abs(float(x)) > f32_max]
      if big:
        where = f"{field}[{big[0]}]" if field != "reward" else field
        raise ValueError(f"{_record_name(i, rec)}: field {where!r}: {float(values[big[0]])!r} overflows float32")
  mapping: dict[int | str, int] = {}
  group_ids = []
  for rec in records:
    g = int(rec["group_id"]) if _is_int(rec["group_id"]) else rec["group_id"]
    if g not in mapping:
      mapping[g] = len(mapping)
    group_ids.append(mapping[g])
  rewards = [float(rec["reward"]) for rec in records]
  unit_rewards = [[float(x) for x in rec.get("unit_rewards", [rec["reward"]])] for rec in records]
  if max_turns is None:
    max_turns = max(1, max(b.num_turns for b in builders))
  traj = pack(
    builders,
    rewards,
    group_ids,
    unit_rewards=unit_rewards,
    max_turns=max_turns,
    pad_id=pad_id,
    length_bucket=length_bucket,
  )
  return traj, mapping


def attach_credit(
  records: Sequence[Mapping[str, Any]],
  adv_BxL,
  turn_adv_BxT=None,
  *,
  method: str | None = None,
) -> list[dict]:
  """Copies of the records with the credit a method assigned (the records themselves are not changed).

  Row i of the arrays belongs to records[i] (as `records_to_trajectory` packs them). Credited fields already in a
  record are replaced: "turn_advantages" / "method" are dropped when not given now.

  Args:
    records: B records.
    adv_BxL: [B, L] per-token advantages, L >= the longest record; each record gets its first len(token_ids)
      values as "advantages", set to 0.0 off its action tokens.
    turn_adv_BxT: optional [B, T] per-turn advantages, T >= the most turns; each record gets its first num_turns
      values as "turn_advantages".
    method: the credit method's name, written as "method".

  Returns:
    The new records. Values are written with `float()`, so a float32 array reads back bit for bit.

  Raises:
    ValueError: on shapes that do not cover the records, or non-finite values (naming the record).
  """
  adv = np.asarray(adv_BxL)
  b = len(records)
  if adv.ndim != 2 or adv.shape[0] != b:
    raise ValueError(f"adv_BxL has shape {adv.shape}; expected [{b}, L] (one row per record)")
  turn_adv = None if turn_adv_BxT is None else np.asarray(turn_adv_BxT)
  if turn_adv is not None and (turn_adv.ndim != 2 or turn_adv.shape[0] != b):
    raise ValueError(f"turn_adv_BxT has shape {turn_adv.shape}; expected [{b}, T] (one row per record)")
  if method is not None and not isinstance(method, str):
    raise TypeError(f"method must be a string, got {type(method).__name__}")
  out = []
  for i, rec in enumerate(records):
    name = _record_name(i, rec)
    n = len(rec["token_ids"])
    if n > adv.shape[1]:
      raise ValueError(f"{name} has {n} tokens but adv_BxL has only {adv.shape[1]} columns")
    mask = np.asarray([bool(a) for a in rec["action_mask"]], bool)
    a = np.where(mask, adv[i, :n], 0)
    if not np.isfinite(a).all():
      raise ValueError(f"{name}: advantages has a non-finite value at token {int(np.flatnonzero(~np.isfinite(a))[0])}")
    new = copy.deepcopy(dict(rec))
    new["advantages"] = [float(x) for x in a.tolist()]
    new.pop("turn_advantages", None)
    new.pop("method", None)
    if turn_adv is not None:
      t = _derived_num_turns(rec)
      if t > turn_adv.shape[1]:
        raise ValueError(f"{name} has {t} turns but turn_adv_BxT has only {turn_adv.shape[1]} columns")
      ta = turn_adv[i, :t]
      if not np.isfinite(ta).all():
        raise ValueError(f"{name}: turn_advantages has a non-finite value")
      new["turn_advantages"] = [float(x) for x in ta.tolist()]
    if method is not None:
      new["method"] = method
    out.append(new)
  return out
