"""Teacher passes: the teacher model's scores at every action token of a rollout, aligned to the rollout.

A pass takes a batch of rollouts (`jaxcredit.trajectory.Trajectory`), a teacher (parameters + model) and, per
rollout, an optional context text, and returns at every action token, aligned to the rollout's own positions:

    logp[b, p]       = log softmax(z_t / T)[tokens[b, p]]                   (nats, float32)
    entropy[b, p]    = -Σ_v softmax(z_t / T)_v log softmax(z_t / T)_v      (nats, float32)
    divergence[b, p] = KL(softmax(z_s / T) ‖ softmax(z_t / T))            (optional; nats, float32)

where z_t are the teacher's logits predicting rollout token p from its own (context-bearing) sequence, z_s the
student's (the current policy on the unmodified rollout) and T the sampling temperature. Non-action positions and
rollouts whose pass is invalid hold 0 (never read a 0 as a score: check `valid_B`).

Where the context goes (token-in, token-out): the teacher's sequence is the re-rendered prompt followed by the
rollout's continuation verbatim,

    teacher_tokens = render(prompt messages, context appended to the last user message) + tokens[prompt_len:]

so action token p of the rollout sits at teacher position p + offset with offset = len(teacher_prompt) -
prompt_len, and is predicted from teacher position p + offset - 1. Action tokens are never re-tokenized.
Per-unit contexts (CrEST, docs/teacher-passes.md v2) are token blocks inserted into the continuation (`insertions`
of `build_teacher_batch`, made by `unit_context_insertions`): the rollout's tokens between insertions stay verbatim
and the map rollout position -> teacher position (`TeacherBatch.teacher_pos_BxL`) is piecewise, one offset per
segment.

The pieces:
  - `teacher_prompt_ids` (host): the re-rendered prompt, context cut to `max_context_tokens` from its start and
    tokenized as plain text (a control-token string inside it never becomes a control token).
  - `unit_context_insertions` (host): where each unit's context goes in a rollout (the user message opening it).
  - `build_teacher_batch` (host): the padded teacher sequences, position maps, validity and reasons.
  - `teacher_pass` (pure, jittable): the scores, computed with chunked vocabulary functions (no [B, L, V] array)
    and wrapped in stop_gradient.
  - `make_teacher_pass_fn` (host): jits `teacher_pass` over (graphdef, params, rest), as the trainer jits its
    log-probs, and marks rollouts with non-finite scores invalid ("non_finite").

Validity reasons: "" (valid), "no_context" (no context available for that rollout), "over_budget" (the teacher
sequence does not fit the teacher's context budget even with the context cut), "non_finite" (a score on one of
its action tokens is not finite).

Source: docs/teacher-passes.md. Shape letters: B rollouts, L rollout tokens (padded), S teacher tokens (padded),
D hidden width, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcredit import multihost
from jaxcredit.packed_rows import PackedRow, lay_out_rows
from jaxcredit.models.logprobs import chunked_logprobs_and_entropies, chunked_reverse_kl
from jaxcredit.plain_text import encode_chat, encode_plain
from jaxcredit.trajectory import Trajectory, pad_length

DEFAULT_CONTEXT_WRAPPER = "\n\nReference (not visible to the assistant being trained): {context}"
"""Appended to the last user message of the initial prompt; `{context}` is replaced by the (cut) context."""

REASONS = ("no_context", "over_budget", "non_finite")
"""Why a rollout's pass can be invalid (its reason string; "" when valid)."""

_SENTINEL = "\u2063CONTEXT\u2063"


# ---------------------------------------------------------------------------------------------------------------
# Host side: the teacher prompt.


def cut_context(tok, context: str, max_context_tokens: int) -> str:
  """The longest suffix of `context` (found by bisection over its start) whose plain-text encoding
  (`encode_plain`) has at most `max_context_tokens` tokens: a long context is cut from its start, the most recent
  text is kept. A context that already fits is returned unchanged; 0 keeps nothing.

  Raises:
    ValueError: for a negative or non-int `max_context_tokens`.
  """
  if (
    isinstance(max_context_tokens, bool)
    or not isinstance(max_context_tokens, (int, np.integer))
    or max_context_tokens < 0
  ):
    raise ValueError(
      f"max_context_tokens (config teacher.max_context_tokens) must be an int >= 0, got {max_context_tokens!r}"
    )
  if len(encode_plain(tok, context)) <= max_context_tokens:
    return context
  lo, hi = 0, len(context)  # context[lo:] does not fit, context[hi:] fits
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if len(encode_plain(tok, context[mid:])) <= max_context_tokens:
      hi = mid
    else:
      lo = mid
  return context[hi:]


def teacher_prompt_ids(
  tok,
  prompt_messages: Sequence[Mapping[str, Any]],
  context: str,
  *,
  wrapper: str = DEFAULT_CONTEXT_WRAPPER,
  max_context_tokens: int,
) -> list[int]:
  """The teacher's prompt: the rollout's initial prompt re-rendered with the context in the last user message.

  On a copy of `prompt_messages`, the last message with role "user" gets `wrapper` appended to its content, with
  "{context}" replaced by the context cut to `max_context_tokens` tokens from its start (`cut_context`); the
  messages are rendered with the chat template (add_generation_prompt=True) and encoded, like
  `jaxcredit.rollout.multiturn.encode_prompt`. The context is tokenized as plain text: a control-token string in
  it (e.g. "<|im_end|>") stays text (for a `ChatTokenizer`; another tokenizer-like object encodes the rendered
  text with its own `encode`). Everything else encodes exactly as `encode_prompt` encodes it, so with
  `wrapper=""` (no insertion) the ids are the rollout's own prompt ids.

  Args:
    tok: a `jaxcredit.models.ChatTokenizer` (or any object with `encode` and `apply_chat_template`; see
      `encode_plain` for the control-token handling of other objects).
    prompt_messages: the rollout's initial chat messages ([{"role": ..., "content": str}, ...]); not modified.
    context: the context text (e.g. the gold answer, a peer's transcript, a hindsight skill).
    wrapper: the text appended to the user message, holding "{context}" exactly once; "" inserts nothing.
    max_context_tokens: the most tokens the context itself may take (config teacher.max_context_tokens).

  Returns:
    The teacher prompt's token ids (ending with the template's generation prompt).

  Raises:
    ValueError: when no message has role "user", the last user message's content is not a string, the wrapper
      does not hold "{context}" exactly once (and is not ""), the chat template does not render the user content
      verbatim, or `max_context_tokens` is negative.
    TypeError: when `context` is not a string.
  """
  if not isinstance(context, str):
    raise TypeError(
      f"context must be a str, got {type(context).__name__} (a rollout without a context gets None "
      f"in build_teacher_batch, not here)"
    )
  messages = [dict(m) for m in prompt_messages]
  users = [k for k, m in enumerate(messages) if m.get("role") == "user"]
  if not users:
    raise ValueError("prompt_messages has no user message to append the context to")
  last = users[-1]
  if not isinstance(messages[last].get("content"), str):
    raise ValueError(
      f"the last user message's content must be a string, got {type(messages[last].get('content')).__name__}"
    )
  if wrapper == "":
    return encode_chat(tok, messages, add_generation_prompt=True)
  if wrapper.count("{context}") != 1:
    raise ValueError(f"wrapper (config teacher.context_wrapper) must hold '{{context}}' exactly once, got {wrapper!r}")
  kept = cut_context(tok, context, max_context_tokens)
  messages[last]["content"] = messages[last]["content"] + wrapper.replace("{context}", _SENTINEL)
  rendered = tok.apply_chat_template(messages, add_generation_prompt=True)
  if rendered.count(_SENTINEL) != 1:
    raise ValueError(
      "the chat template does not render the user message's content verbatim; the context cannot be placed"
    )
  messages[last]["content"] = messages[last]["content"].replace(_SENTINEL, kept)
  return encode_chat(tok, messages, add_generation_prompt=True)


def rollout_prompt_ids(traj: Trajectory) -> list[list[int]]:
  """Each rollout's own prompt ids (tokens[:prompt_len]): the teacher prompts of a pass without context (e.g.
  TRACE, OPD, ToolOPD's first pass)."""
  return [traj.tokens_BxL[i, : int(traj.prompt_len_B[i])].tolist() for i in range(traj.batch_size)]


# ---------------------------------------------------------------------------------------------------------------
# Host side: the teacher batch.


@dataclasses.dataclass
class TeacherBatch:
  """The teacher's sequences for one pass, row b for rollout b (right-padded).

  Attributes:
    tokens_BxS: int32 teacher token ids: teacher prompt then the rollout's continuation (with any inserted context
      blocks); pad id elsewhere. An invalid rollout's row is a one-token dummy (the pad id, masked in) so that no
      row is empty.
    token_mask_BxS: bool, True on real tokens.
    offset_B: int32 len(teacher_prompt) - prompt_len (0 for invalid rollouts): rollout position p is teacher
      position p + offset up to the first insertion.
    teacher_prompt_len_B: int32 teacher prompt length (0 for invalid rollouts).
    valid_B: bool, False where the pass cannot be made.
    reasons: per rollout, "" when valid, else "no_context" or "over_budget".
    teacher_pos_BxL: int32 [B, L], the teacher position of rollout position p for every real continuation token
      (p >= prompt_len) of a valid rollout, 0 elsewhere: p + offset_B without insertions, piecewise with them
      (tokens_BxS[b, teacher_pos_BxL[b, p]] == rollout tokens[b, p]). None: use offset_B.
  """

  tokens_BxS: np.ndarray
  token_mask_BxS: np.ndarray
  offset_B: np.ndarray
  teacher_prompt_len_B: np.ndarray
  valid_B: np.ndarray
  reasons: list[str]
  teacher_pos_BxL: np.ndarray | None = None


def unit_context_insertions(
  tokens: Sequence[int] | np.ndarray,
  action_mask: Sequence[bool] | np.ndarray,
  unit_ids: Sequence[int] | np.ndarray,
  unit_contexts: Mapping[int, Sequence[int]],
  anchor_ids: Sequence[int],
) -> list[tuple[int, list[int]]] | None:
  """Where per-unit context blocks go in one rollout: each into the user message that opens its unit.

  The user message opening unit u >= 1 is the context run right before unit u's first action token; it ends with
  the chat template's text after a user message's content (`anchor_ids`, e.g. the ids of
  "<|im_end|>\n<|im_start|>assistant\n"). Unit u's block is inserted right before that anchor, i.e. at the end
  of the user message's content, as `teacher_prompt_ids` appends a context to the initial prompt's user message.

  Source: CrEST's teacher context, Wang et al., "Teach the Magnitude, Not the Direction: Verifier-Bounded Credit
  Assignment for Multi-Turn Multi-step LLM Agents", arXiv 2608.13179, App. C.1; docs/teacher-passes.md v2.

  Args:
    tokens, action_mask, unit_ids: one rollout's real tokens (int ids), action mask (bool) and unit index per
      action token (-1 elsewhere), all of the same length n (no padding).
    unit_contexts: unit u (>= 1) -> the token ids to insert for it (already wrapped and encoded); units not in it,
      units without action tokens and unit 0 (whose context goes into the initial prompt) get nothing.
    anchor_ids: the template's ids after a user message's content; must be non-empty.

  Returns:
    [(q, ids), ...] sorted by q: insert `ids` right before rollout position q (`build_teacher_batch`'s
    `insertions`); None when a unit's opening message does not end with `anchor_ids` made of non-action tokens
    (the template put no token boundary there: the context cannot be placed).

  Raises:
    ValueError: for arrays of different lengths or an empty `anchor_ids`.
  """
  n = len(tokens)
  if len(action_mask) != n or len(unit_ids) != n:
    raise ValueError(f"tokens ({n}), action_mask ({len(action_mask)}) and unit_ids ({len(unit_ids)}) must be equal")
  anchor = [int(t) for t in anchor_ids]
  if not anchor:
    raise ValueError("anchor_ids is empty: the template's text after a user message's content is needed")
  units = np.asarray(unit_ids)
  act = np.asarray(action_mask, bool)
  out = []
  for u in sorted(k for k in unit_contexts if k >= 1):
    pos = np.flatnonzero(act & (units == u))
    if pos.size == 0:
      continue
    q = int(pos[0]) - len(anchor)
    if q < 1 or act[q : int(pos[0])].any() or [int(t) for t in tokens[q : int(pos[0])]] != anchor:
      return None
    ids = [int(t) for t in unit_contexts[u]]
    if ids:
      out.append((q, ids))
  return out


def build_teacher_batch(
  traj: Trajectory,
  teacher_prompts: Sequence[Sequence[int] | None],
  *,
  max_len: int,
  pad_id: int,
  length_bucket: int = 64,
  insertions: Sequence[Sequence[tuple[int, Sequence[int]]] | None] | None = None,
) -> TeacherBatch:
  """Pads teacher_prompts[b] + traj.tokens[b, prompt_len:] (with insertions[b]'s blocks) for every rollout b.

  A rollout whose teacher prompt is None is invalid ("no_context"); one whose teacher sequence is longer than
  `max_len` is invalid ("over_budget") — the context was already cut to its own budget by `teacher_prompt_ids`,
  so what does not fit is the rollout itself. The rollout's real tokens are its leading token_mask entries
  (right padding). Rollout tokens are copied verbatim; an insertion (q, ids) puts `ids` right before rollout token
  q, so every later token moves by len(ids) (`teacher_pos_BxL` records each token's teacher position).

  Args:
    traj: the rollouts (tokens_BxL, token_mask_BxL, prompt_len_B are used).
    teacher_prompts: B entries: the teacher prompt ids (`teacher_prompt_ids`, or the rollout's own prompt,
      `rollout_prompt_ids`, for a pass without context), or None when no context is available.
    max_len: the teacher's context budget in tokens (its maximum sequence length).
    pad_id: padding token id.
    length_bucket: S is the longest valid teacher sequence rounded up to a multiple of this (bounds compiles).
    insertions: optional, B entries of [(q, ids), ...] (or None: none), q strictly increasing within
      (prompt_len, n] (n = the rollout's real length), e.g. `unit_context_insertions`' output.

  Returns:
    A `TeacherBatch` of B rows.

  Raises:
    ValueError: when teacher_prompts (or insertions) does not have B entries, a teacher prompt is empty, an
      insertion position is out of range or unsorted, or max_len / length_bucket is not a positive int.
  """
  b = traj.batch_size
  if len(teacher_prompts) != b:
    raise ValueError(f"teacher_prompts has {len(teacher_prompts)} entries for {b} rollouts")
  if insertions is not None and len(insertions) != b:
    raise ValueError(f"insertions has {len(insertions)} entries for {b} rollouts")
  for name, value in (("max_len", max_len), ("length_bucket", length_bucket)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
      raise ValueError(f"{name} must be a positive int, got {value!r}")
  rows: list[list[int] | None] = []
  reasons: list[str] = []
  offsets = np.zeros((b,), np.int32)
  prompt_lens = np.zeros((b,), np.int32)
  teacher_pos = np.zeros(traj.tokens_BxL.shape, np.int32)
  for i in range(b):
    tp = teacher_prompts[i]
    if tp is None:
      rows.append(None)
      reasons.append("no_context")
      continue
    tp = [int(t) for t in tp]
    if not tp:
      raise ValueError(f"teacher prompt of rollout {i} is empty")
    n = int(np.asarray(traj.token_mask_BxL[i]).sum())
    pl = int(traj.prompt_len_B[i])
    cont = np.asarray(traj.tokens_BxL[i, pl:n]).astype(int).tolist()
    row, pos, prev = list(tp), np.zeros((n,), np.int32), pl
    for q, ids in list((insertions[i] if insertions is not None else None) or []):
      if not prev < q <= n:
        raise ValueError(f"insertion positions of rollout {i} must increase within ({pl}, {n}], got {q}")
      pos[prev:q] = len(row) + np.arange(q - prev)
      row += cont[prev - pl : q - pl] + [int(t) for t in ids]
      prev = q
    pos[prev:n] = len(row) + np.arange(n - prev)
    row += cont[prev - pl :]
    if len(row) > max_len:
      rows.append(None)
      reasons.append("over_budget")
      continue
    rows.append(row)
    reasons.append("")
    offsets[i] = len(tp) - pl
    prompt_lens[i] = len(tp)
    teacher_pos[i, pl:n] = pos[pl:n]
  length = pad_length(max([len(r) for r in rows if r is not None] or [1]), length_bucket)
  tokens = np.full((b, length), pad_id, np.int32)
  mask = np.zeros((b, length), bool)
  for i, row in enumerate(rows):
    if row is None:
      mask[i, 0] = True
    else:
      tokens[i, : len(row)] = row
      mask[i, : len(row)] = True
  return TeacherBatch(
    tokens_BxS=tokens,
    token_mask_BxS=mask,
    offset_B=offsets,
    teacher_prompt_len_B=prompt_lens,
    valid_B=np.asarray([r == "" for r in reasons], bool),
    reasons=reasons,
    teacher_pos_BxL=teacher_pos,
  )


# ---------------------------------------------------------------------------------------------------------------
# The pass (pure, jittable).


SLOT_BUCKET = 64  # the scored positions per row of a pass are rounded up to a multiple (compiled shapes)


def _positions(mask_BxL: jax.Array) -> jax.Array:
  return jnp.maximum(jnp.cumsum(mask_BxL.astype(jnp.int32), axis=-1) - 1, 0)


def teacher_pass(
  teacher,
  teacher_tokens_BxS: jax.Array,
  teacher_mask_BxS: jax.Array,
  offset_B: jax.Array,
  valid_B: jax.Array,
  tokens_BxL: jax.Array,
  token_mask_BxL: jax.Array,
  action_mask_BxL: jax.Array,
  temperature: float | jax.Array,
  *,
  student=None,
  seq_chunk: int | None = None,
  vocab_chunk: int | None = None,
  slots_BxK: jax.Array | None = None,
  teacher_pos_BxL: jax.Array | None = None,
  hidden: bool = False,
) -> dict[str, jax.Array]:
  """The teacher's scores at every action token of the rollouts, aligned to the rollouts' positions.

  One forward of `teacher` over its sequences (`model.hidden_states`); the hidden state at teacher position
  p + offset[b] - 1, or teacher_pos_BxL[b, p] - 1 when the map is given (the one that predicts rollout token p),
  is gathered into a rollout-shaped [B, L, D] array, and
  `chunked_logprobs_and_entropies` scores the rollout's tokens against the teacher head. With a `student`, one
  forward of it over the unmodified rollout gives its hidden state at p - 1, and `chunked_reverse_kl` the
  full-vocabulary KL(student ‖ teacher). No [B, L, V] or [B, S, V] array exists. All outputs are wrapped in
  stop_gradient: no gradient flows through a pass.

      logp_BxL[b, p]       = log softmax(z_t / T)[tokens[b, p]]
      entropy_BxL[b, p]    = -Σ_v q_v log q_v,  q = softmax(z_t / T)
      divergence_BxL[b, p] = Σ_v p_s(v) (log p_s(v) - log q_v),  p_s = softmax(z_s / T)
      student_entropy_BxL[b, p] = -Σ_v p_s(v) log p_s(v)
      finite_B[b]          = all three finite on every action token of row b
      hidden_BxLxD[b, p]   = the teacher's final hidden state that predicts token p (with `hidden`)

  on action tokens (p >= 1) of valid rows whose scores are all finite; 0 elsewhere (non-action positions,
  invalid rows, rows with a non-finite score: `finite_B` tells the last apart).

  Args:
    teacher: a `jaxcredit.models.Decoder` (its `hidden_states`, `embedding`, `lm_head` are used).
    teacher_tokens_BxS, teacher_mask_BxS: int / bool [B, S], a `TeacherBatch`'s tokens and mask.
    offset_B: int [B], len(teacher_prompt) - prompt_len per rollout.
    valid_B: bool [B]; invalid rows give 0 everywhere.
    tokens_BxL, token_mask_BxL, action_mask_BxL: the rollouts' int ids and bool masks (a `Trajectory`'s).
    temperature: positive scalar, the sampling temperature T.
    student: optional `Decoder`, the current policy; when given, "divergence_BxL" and "student_entropy_BxL" (the
      policy's own entropy on the unmodified rollout, which GEAR's segments read) are returned. It must share the
      teacher's vocabulary size.
    seq_chunk, vocab_chunk: chunk sizes of the vocabulary functions (defaults as `chunked_logprobs_and_entropies`).
    slots_BxK: optional int [B, K], the positions to score (`action_slots`: each row's action positions, then
      padding); the heads and the vocabulary sums then run on those K positions only, not on all L. Positions
      left out get 0, as non-action positions do.
    teacher_pos_BxL: optional int [B, L], the teacher position of each rollout position (`TeacherBatch`'s, for
      sequences with inserted context blocks); None: p + offset_B.
    hidden: also return the teacher's whole predicted distribution at each action token, as the final hidden
      states [B, L, D] that give it with the teacher's head (HSD's full-vocabulary distillation reads them).

  Returns:
    {"logp_BxL", "entropy_BxL", ["divergence_BxL", "student_entropy_BxL"]: float32 nats [B, L];
     ["hidden_BxLxD": float32 [B, L, D]]; "finite_B": bool [B]}.

  Raises:
    ValueError: at trace time, for arrays of the wrong rank or shape, and whatever the chunked functions raise
      (e.g. a student whose vocabulary size differs from the teacher's).
  """
  t_tokens = jnp.asarray(teacher_tokens_BxS)
  t_mask = jnp.asarray(teacher_mask_BxS)
  tokens = jnp.asarray(tokens_BxL)
  r_mask = jnp.asarray(token_mask_BxL)
  action = jnp.asarray(action_mask_BxL)
  offset = jnp.asarray(offset_B)
  valid = jnp.asarray(valid_B)
  if t_tokens.ndim != 2 or t_mask.shape != t_tokens.shape:
    raise ValueError(
      f"teacher_tokens_BxS {t_tokens.shape} must be rank 2 and teacher_mask_BxS {t_mask.shape} of the same shape"
    )
  if tokens.ndim != 2 or r_mask.shape != tokens.shape or action.shape != tokens.shape:
    raise ValueError(
      f"tokens_BxL {tokens.shape}, token_mask_BxL {r_mask.shape} and action_mask_BxL "
      f"{action.shape} must be rank 2 and of the same shape"
    )
  b, l = tokens.shape
  if t_tokens.shape[0] != b or offset.shape != (b,) or valid.shape != (b,):
    raise ValueError(
      f"teacher_tokens_BxS {t_tokens.shape}, offset_B {offset.shape} and valid_B {valid.shape} "
      f"must have the rollouts' batch size {b}"
    )
  if not jnp.issubdtype(t_tokens.dtype, jnp.integer) or not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError("teacher_tokens_BxS and tokens_BxL must be integer token ids")
  t_tokens, tokens = t_tokens.astype(jnp.int32), tokens.astype(jnp.int32)
  t_mask, r_mask, action, valid = (x.astype(bool) for x in (t_mask, r_mask, action, valid))
  s = t_tokens.shape[1]

  pos_L = jnp.arange(l, dtype=jnp.int32)
  if slots_BxK is None:
    slots = jnp.broadcast_to(pos_L[None, :], (b, l))
  else:
    slots = jnp.asarray(slots_BxK)
    if slots.ndim != 2 or slots.shape[0] != b or not jnp.issubdtype(slots.dtype, jnp.integer):
      raise ValueError(f"slots_BxK must be integer positions of shape [B={b}, K], got {slots.shape} {slots.dtype}")
    slots = slots.astype(jnp.int32)

  h_t_BxSxD, _ = teacher.hidden_states(t_tokens, positions_BxL=_positions(t_mask), token_mask_BxL=t_mask)
  # The teacher's hidden state that predicts rollout token p sits at teacher position p + offset - 1.
  if teacher_pos_BxL is None:
    src_BxK = jnp.clip(slots + offset.astype(jnp.int32)[:, None] - 1, 0, s - 1)
  else:
    t_pos = jnp.asarray(teacher_pos_BxL)
    if t_pos.shape != (b, l) or not jnp.issubdtype(t_pos.dtype, jnp.integer):
      raise ValueError(f"teacher_pos_BxL must be integer positions of shape [B={b}, L={l}], got {t_pos.shape}")
    src_BxK = jnp.clip(jnp.take_along_axis(t_pos.astype(jnp.int32), slots, axis=1) - 1, 0, s - 1)
  h_t_BxKxD = jnp.take_along_axis(h_t_BxSxD, src_BxK[..., None], axis=1)
  targets_BxK = jnp.take_along_axis(tokens, slots, axis=1)
  logp, entropy = chunked_logprobs_and_entropies(
    h_t_BxKxD, teacher.output_head_DxV(), targets_BxK, temperature, seq_chunk=seq_chunk, vocab_chunk=vocab_chunk
  )
  out = {"logp_BxL": logp, "entropy_BxL": entropy}
  if student is not None:
    h_s_BxLxD, _ = student.hidden_states(tokens, positions_BxL=_positions(r_mask), token_mask_BxL=r_mask)
    h_s_prev_BxKxD = jnp.take_along_axis(h_s_BxLxD, jnp.maximum(slots - 1, 0)[..., None], axis=1)
    _, out["student_entropy_BxL"] = chunked_logprobs_and_entropies(
      h_s_prev_BxKxD, student.output_head_DxV(), targets_BxK, temperature, seq_chunk=seq_chunk, vocab_chunk=vocab_chunk
    )
    out["divergence_BxL"] = chunked_reverse_kl(
      h_s_prev_BxKxD,
      student.output_head_DxV(),
      h_t_BxKxD,
      teacher.output_head_DxV(),
      temperature,
      seq_chunk=seq_chunk,
      vocab_chunk=vocab_chunk,
    )
  if hidden:
    out["hidden_BxLxD"] = h_t_BxKxD
  if slots_BxK is not None:  # back to rollout positions; padding entries write position 0, which is never kept
    rows_Bx1 = jnp.arange(b)[:, None]
    out = {k: jnp.zeros((b, l) + x.shape[2:], x.dtype).at[rows_Bx1, slots].set(x) for k, x in out.items()}
  keep_BxL = action & r_mask & valid[:, None] & (pos_L >= 1)[None, :]
  # The scores' finiteness (a non-finite hidden state gives non-finite scores).
  scores = [x for k, x in out.items() if x.ndim == 2]
  finite_B = jnp.all(jnp.stack([jnp.isfinite(x) | ~keep_BxL for x in scores]), axis=(0, 2))
  keep_BxL = keep_BxL & finite_B[:, None]
  out = {
    k: jnp.where(keep_BxL.reshape(keep_BxL.shape + (1,) * (x.ndim - 2)), x, 0.0).astype(jnp.float32)
    for k, x in out.items()
  }
  out["finite_B"] = finite_B
  return jax.tree_util.tree_map(jax.lax.stop_gradient, out)


# ---------------------------------------------------------------------------------------------------------------
# Host side: the jitted pass and its validity.


@dataclasses.dataclass
class TeacherPassResult:
  """One pass's outputs (host numpy), aligned to the rollouts.

  Attributes:
    logp_BxL, entropy_BxL: float32 nats on action tokens of valid rollouts, 0 elsewhere.
    divergence_BxL: float32 nats (reverse KL student ‖ teacher) likewise, or None when no student was given.
    student_entropy_BxL: float32 nats, the student's entropy likewise, or None when no student was given.
    hidden_BxLxD: float32 [B, L, D], the teacher's final hidden states that predict each action token of a valid
      rollout (0 elsewhere), or None when the pass was made without `hidden`.
    valid_B: bool, False where the pass could not be made (its rows are all 0: never read them as scores).
    reasons: per rollout, "" when valid, else one of REASONS.
  """

  logp_BxL: np.ndarray
  entropy_BxL: np.ndarray
  divergence_BxL: np.ndarray | None
  valid_B: np.ndarray
  reasons: list[str]
  student_entropy_BxL: np.ndarray | None = None
  hidden_BxLxD: np.ndarray | None = None

  def arrays(self) -> dict[str, np.ndarray]:
    """The arrays by name: fields of the pass's output class (`jaxcredit.train.tables.pass_outputs.TeacherOutput`, ...)."""
    out = {"logp_BxL": self.logp_BxL, "entropy_BxL": self.entropy_BxL, "valid_B": self.valid_B}
    if self.divergence_BxL is not None:
      out["divergence_BxL"] = self.divergence_BxL
      out["student_entropy_BxL"] = self.student_entropy_BxL
    if self.hidden_BxLxD is not None:
      out["hidden_BxLxD"] = self.hidden_BxLxD
    return out

  def drop_counts(self) -> dict[str, int]:
    """How many rollouts the pass dropped, per reason (every reason of REASONS present, 0 when none)."""
    return {r: sum(x == r for x in self.reasons) for r in REASONS}


def finish_teacher_pass(outputs: Mapping[str, Any], batch: TeacherBatch) -> TeacherPassResult:
  """Host side after `teacher_pass`: a valid rollout whose scores were not all finite becomes invalid
  ("non_finite") and its rows are zeroed; the outputs become numpy.

  Args:
    outputs: what `teacher_pass` returned (jax or numpy arrays).
    batch: the `TeacherBatch` the pass ran on.

  Raises:
    ValueError: when outputs lacks "logp_BxL", "entropy_BxL" or "finite_B".
  """
  missing = [k for k in ("logp_BxL", "entropy_BxL", "finite_B") if k not in outputs]
  if missing:
    raise ValueError(f"outputs lacks {missing}; pass what teacher_pass returned")
  finite = np.asarray(outputs["finite_B"], bool)
  valid = np.asarray(batch.valid_B, bool) & finite
  reasons = [r if r or finite[i] else "non_finite" for i, r in enumerate(batch.reasons)]

  def clean(x):
    x = np.array(x, np.float32)
    x[~valid] = 0.0
    return x

  div = outputs.get("divergence_BxL")
  ent_s = outputs.get("student_entropy_BxL")
  hid = outputs.get("hidden_BxLxD")
  return TeacherPassResult(
    logp_BxL=clean(outputs["logp_BxL"]),
    entropy_BxL=clean(outputs["entropy_BxL"]),
    divergence_BxL=None if div is None else clean(div),
    valid_B=valid,
    reasons=reasons,
    student_entropy_BxL=None if ent_s is None else clean(ent_s),
    hidden_BxLxD=None if hid is None else clean(hid),
  )


def action_slots(action_mask_BxL: np.ndarray, bucket: int = SLOT_BUCKET) -> np.ndarray | None:
  """slots_BxK: each row's action positions p >= 1 in order, then padding 0; K is the longest row's count rounded up
  to `bucket` (bounds the compiled shapes). None when K would not be smaller than L (score every position).

  The rows are laid out by the one packed-row builder (`jaxcredit.packed_rows`, as the update and the gold scoring
  are): each rollout is a row of its own L slots with no appended segment, its action positions scored. Position 0
  is never scored: no token predicts it.
  """
  mask = np.asarray(action_mask_BxL, bool).copy()
  if mask.ndim != 2:
    raise ValueError(f"action_slots: action_mask_BxL must be [B, L], got shape {mask.shape}")
  mask[:, 0:1] = False
  b, l = mask.shape
  if b == 0 or l == 0:
    return None
  rows = []
  for scored_L in mask:
    row = PackedRow(np.zeros(l, np.int32))
    row.score(np.flatnonzero(scored_L))
    rows.append(row)
  laid = lay_out_rows(rows, length_bucket=l, slot_bucket=bucket)
  return None if laid.slots_NxK.shape[1] >= l else laid.slots_NxK


def make_teacher_pass_fn(
  teacher_graphdef,
  teacher_rest,
  temperature: float,
  *,
  student_graphdef=None,
  student_rest=None,
  seq_chunk: int | None = None,
  vocab_chunk: int | None = None,
  slot_bucket: int | None = SLOT_BUCKET,
  hidden: bool = False,
) -> Callable[..., TeacherPassResult]:
  """A host callable (teacher_params, batch, traj, student_params=None) -> `TeacherPassResult`.

  The model enters functionally, as in the trainer (`nnx.split(model, nnx.Param, ...)` gives graphdef, params,
  rest), so new parameters never recompile; `teacher_pass` is jitted over (params, arrays) and
  `finish_teacher_pass` applied to its outputs. With `student_graphdef` the divergence is computed and
  `student_params` must be given at each call (for GEAR the student is the policy; the teacher may be the same
  parameters). The heads run on the action positions only (`action_slots` with `slot_bucket`; None: on every
  position). With `hidden`, the result also holds the teacher's hidden states (`teacher_pass`).

  Raises (at call):
    ValueError: when student_params is given without a student graphdef or missing with one.
  """
  has_student = student_graphdef is not None

  def pass_fn(
    teacher_params, t_tokens, t_mask, offset, valid, tokens, token_mask, action_mask, student_params, slots, t_pos
  ):
    teacher = nnx.merge(teacher_graphdef, teacher_params, teacher_rest)
    student = nnx.merge(student_graphdef, student_params, student_rest) if has_student else None
    return teacher_pass(
      teacher,
      t_tokens,
      t_mask,
      offset,
      valid,
      tokens,
      token_mask,
      action_mask,
      temperature,
      student=student,
      seq_chunk=seq_chunk,
      vocab_chunk=vocab_chunk,
      slots_BxK=slots,
      teacher_pos_BxL=t_pos,
      hidden=hidden,
    )

  jitted = jax.jit(pass_fn)

  def run(teacher_params, batch: TeacherBatch, traj: Trajectory, student_params=None) -> TeacherPassResult:
    if has_student != (student_params is not None):
      raise ValueError("student_params must be given exactly when the pass was made with a student graphdef")
    outputs = jitted(
      teacher_params,
      batch.tokens_BxS,
      batch.token_mask_BxS,
      batch.offset_B,
      batch.valid_B,
      traj.tokens_BxL,
      traj.token_mask_BxL,
      traj.action_mask_BxL,
      student_params,
      None
      if slot_bucket is None
      else action_slots(traj.action_mask_BxL & traj.token_mask_BxL & batch.valid_B[:, None], slot_bucket),
      batch.teacher_pos_BxL,
    )
    return finish_teacher_pass(jax.tree.map(multihost.to_host, outputs), batch)  # global, on every process

  return run
