"""Multi-turn tool-use rollouts: the sampler writes assistant turns, the environment answers tool calls.

The sampler knows no tools and the environment knows no tokens; this module joins them. Every rollout
grows token-in, token-out (`RolloutBuilder`): sampled ids are appended as actions, the environment's
observation is rendered through the chat template's scaffolding and appended as context. An observation is a
tool message (`StepResult.role == "tool"`) or the next user request of a multi-request session ("user"), which
opens a new verified unit (`RolloutBuilder.next_unit`). Environment and dataset text (prompts, observations) is
tokenized as plain text: only the template's scaffolding makes control tokens (`jaxcredit.plain_text`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol, Sequence

import jax

from jaxcredit.envs import episode
from jaxcredit.plain_text import clean_text
from jaxcredit.rollout.chat_format import ChatFormat, ChatTokenizerLike, encode_chat
from jaxcredit.trajectory import RolloutBuilder


class EnvLike(Protocol):
  def step(self, assistant_text: str) -> Any: ...  # -> .observation, .done, .info (with episode.TRAINER_KEYS)

  def reward(self) -> float: ...


@dataclasses.dataclass
class RolloutResult:
  builder: RolloutBuilder
  env: EnvLike
  reward: float
  finish: str  # "answer" | "no_answer" | "tool_budget" | "length" | "env_error" (the environment's server failed)
  tool_calls: int
  tool_errors: int
  messages: list[dict] = dataclasses.field(default_factory=list)  # the prompt, then each assistant/tool message


def transcript(messages: Sequence[Mapping[str, Any]]) -> str:
  """The assistant and tool messages of a rollout as plain text ("assistant: ...", "tool: ..."), one per line."""
  return "\n".join(f"{m['role']}: {m['content']}" for m in messages if m["role"] in ("assistant", "tool"))


def action_text(tok: ChatTokenizerLike, ids: Sequence[int], stop_token_ids: Sequence[int] = ()) -> str:
  """The text of one assistant turn, exactly as the model wrote it: what the environment reads.

  Every token is decoded, special ones included: a tokenizer may mark `<tool_call>`, `<think>` or `<answer>` special,
  and decoding with `skip_special_tokens` would hand the environment a call without its tags (or a thought without
  its think block). Only a final stop token (one of `stop_token_ids`, or `tok.eos_id`) is left out: it ends the
  turn, the template writes it, and it is no part of the message (the sampler keeps it as the turn's last id).

  Args:
    tok: the chat tokenizer.
    ids: the turn's sampled token ids, int, in order.
    stop_token_ids: the ids that end a turn (`SamplingParams.stop_token_ids`).

  Returns:
    The decoded text ("" for no ids).
  """
  ids = [int(i) for i in ids]
  if ids and (ids[-1] == tok.eos_id or ids[-1] in set(stop_token_ids)):
    ids = ids[:-1]
  return tok.decode(ids, skip_special_tokens=False)


def encode_prompt(tok: ChatTokenizerLike, messages: list[dict]) -> list[int]:
  """The prompt's token ids: the chat rendered with the generation prompt, contents read as plain text."""
  return encode_chat(tok, messages, add_generation_prompt=True)


def run_rollouts(
  sampler,
  tok: ChatTokenizerLike,
  fmt: ChatFormat,
  envs: Sequence[EnvLike],
  prompts: Sequence[list[dict]],
  sampling_params,
  key: jax.Array,
  *,
  max_turns: int,
  max_len: int,
  step_workers: int = 1,
) -> list[RolloutResult]:
  """Samples one rollout per environment, up to `max_turns` assistant turns each.

  Args:
    sampler: a `jaxcredit.sampling.Sampler` (anything with `generate(prompts, params, key, decode_text=)`; with a
      `session()` too, each rollout's cache is kept across turns and only new tokens are prefilled).
    tok: the chat tokenizer.
    fmt: the chat template's scaffolding around tool messages.
    envs: one environment instance per rollout (never shared between rollouts).
    prompts: the initial chat messages of each rollout.
    sampling_params: `jaxcredit.sampling.SamplingParams`; its `stop_token_ids` should hold `tok.eos_id`.
    key: PRNG key; split per turn.
    max_turns: T, the most assistant messages a rollout may have.
    max_len: the sampler's capacity; a rollout that cannot fit another turn ends with finish "length".
    step_workers: the environments of one turn step on this many threads (`EnvSpec.step_workers`: environments
      that wait on a server); 1 steps them in order. Each environment's `close()`, where it has one, is called
      when its rollout ends.

  Returns:
    One `RolloutResult` per environment, in order.

  Raises:
    ValueError: an environment's step returned info without one of `jaxcredit.envs.episode.TRAINER_KEYS` (named,
      with the environment's class), or envs and prompts differ in length.
  """
  if len(envs) != len(prompts):
    raise ValueError(f"envs ({len(envs)}) and prompts ({len(prompts)}) must have the same length")
  builders = [RolloutBuilder.from_prompt(encode_prompt(tok, p)) for p in prompts]
  messages = [list(p) for p in prompts]
  done = [False] * len(envs)
  finish = ["no_answer"] * len(envs)
  tool_calls = [0] * len(envs)
  tool_errors = [0] * len(envs)
  budget = sampling_params.max_new_tokens
  # The cache lives as long as this call (the session is local): another call starts from a fresh one.
  session = sampler.session() if hasattr(sampler, "session") else None
  try:
    for turn in range(max_turns):
      active = [i for i in range(len(envs)) if not done[i]]
      for i in list(active):
        if len(builders[i]) + budget > max_len:
          done[i], finish[i] = True, "length"
          active.remove(i)
      if not active:
        break
      key, sub = jax.random.split(key)
      # The sampler pads the shrinking set of active rows to its batch buckets, bounding compiles. Its session keeps
      # each rollout's KV cache across turns: only the observation tokens added since the last turn are prefilled.
      histories = [builders[i].tokens for i in active]
      if session is not None:
        out = session.generate(histories, sampling_params, sub, decode_text=tok.decode, ids=active)
      else:
        out = sampler.generate(histories, sampling_params, sub, decode_text=tok.decode)
      texts = []
      for j, i in enumerate(active):
        ids, logp = out.tokens[j], out.logprobs[j]
        builders[i].append_action(ids, [float(x) for x in logp])
        texts.append(action_text(tok, ids, sampling_params.stop_token_ids))  # tags the tokenizer marks special kept
        messages[i].append({"role": "assistant", "content": texts[-1]})
      results = _step_all([envs[i] for i in active], texts, step_workers)
      for j, i in enumerate(active):
        ids, reason, result = out.tokens[j], out.finish_reasons[j], results[j]
        info = episode.trainer_info(result, envs[i])
        tool_calls[i] = int(info[episode.TOOL_CALLS])
        tool_errors[i] = int(info[episode.TOOL_ERRORS])
        if result.done:
          done[i] = True
          finish[i] = _finish_reason(info, reason)
          continue
        if turn == max_turns - 1:
          done[i], finish[i] = True, "tool_budget"
          continue
        emitted_eos = bool(ids) and ids[-1] == tok.eos_id
        role = getattr(result, "role", "tool")
        if role == "user":
          builders[i].next_unit()
        observation = clean_text(result.observation)
        messages[i].append({"role": role, "content": observation})
        builders[i].append_context(fmt.observation_ids(tok, observation, emitted_eos, role))
        builders[i].mark_boundary()
  finally:  # an environment's sessions end with its rollout, also when a step raised
    for env in envs:
      close = getattr(env, "close", None)
      if close is not None:
        close()
  return [
    RolloutResult(
      builder=builders[i],
      env=envs[i],
      reward=float(envs[i].reward()),
      finish=finish[i],
      tool_calls=tool_calls[i],
      tool_errors=tool_errors[i],
      messages=messages[i],
    )
    for i in range(len(envs))
  ]


def _step_all(envs: Sequence[EnvLike], texts: Sequence[str], workers: int) -> list[Any]:
  """`env.step(text)` of each pair, on up to `workers` threads; the results in order (an exception is raised as
  the first environment's in order that raised)."""
  if workers <= 1 or len(envs) <= 1:
    return [env.step(text) for env, text in zip(envs, texts)]
  with concurrent.futures.ThreadPoolExecutor(min(workers, len(envs))) as pool:
    return list(pool.map(lambda pair: pair[0].step(pair[1]), zip(envs, texts)))


def _finish_reason(info: Mapping[str, Any], sampler_reason: str) -> str:
  if info.get("finish") == "env_error":
    return "env_error"
  if info[episode.ANSWERED]:
    return "answer"
  if info[episode.BUDGET_EXHAUSTED]:
    return "tool_budget"
  if sampler_reason == "length":
    return "length"
  return "no_answer"


def build_demonstration(tok: ChatTokenizerLike, fmt: ChatFormat, messages: list[dict]) -> RolloutBuilder:
  """Tokenizes a demonstration chat exactly as a rollout would have produced it.

  `messages` is [system?, user, assistant, tool, assistant, ..., user, assistant, ...]. The prompt is
  everything before the first assistant message; each assistant message (its content, then the
  end-of-message token) becomes an action turn; each tool or user message after it is appended through the
  same scaffolding a rollout uses (a user message opens the next verified unit).

  Raises:
    ValueError: if the chat has no assistant message or a role other than assistant/tool/user after the
      first assistant message.
  """
  first = next((k for k, m in enumerate(messages) if m["role"] == "assistant"), None)
  if first is None:
    raise ValueError("demonstration has no assistant message")
  b = RolloutBuilder.from_prompt(encode_prompt(tok, messages[:first]))
  for m in messages[first:]:
    if m["role"] == "assistant":
      b.append_action(tok.encode(m["content"]) + [tok.eos_id])
    elif m["role"] in ("tool", "user"):
      if m["role"] == "user":
        b.next_unit()
      b.append_context(fmt.observation_ids(tok, m["content"], True, m["role"]))
      b.mark_boundary()
    else:
      raise ValueError(f"unexpected role {m['role']!r} after the first assistant message")
  return b
