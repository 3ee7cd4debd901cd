"""TRACE's boundary scores: the frozen reference's log-probability of the gold answer y* at every tool-call boundary
(per token, the mean over y*'s tokens as TRACE defines it, or their sum as v1 TRACE did; `reduce`).

For each rollout and each existing boundary state s_t (a prefix of the rollout's tokens that ends with the
chat template's generation prompt), the frozen reference scores the gold answer's tokens as the next
assistant message.

Two ways, same outputs:

- `score_gold_answers` (the reference): one row per (rollout, boundary), prefix_t + y*, all rows in one batched
  forward: (T+1) forwards of growing prefixes per rollout, each padded to the longest.
- `score_gold_answers_packed`: one row per rollout, its tokens up to its last valid boundary followed by one copy
  of y* per valid boundary; each copy attends to the prefix up to its own boundary and to itself (a segment
  mask, `jaxcredit.models.attention.packed_attention_mask`), with positions continuing from its boundary. About
  one forward of the rollout plus (T+1)·|y*| tokens.

Letters: B rollouts, T1 = T+1 boundaries, N rows of the scoring batch, L its tokens, G scored slots per row.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from jaxcredit.packed_rows import PackedRow, lay_out_rows
from jaxcredit.trajectory import Trajectory

LogpFn = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (tokens_NxL, mask_NxL) -> logp_NxL
# (tokens_NxL, token_mask_NxL, positions_NxL, segment_ids_NxL, prefix_limit_NxL, slots_NxG) -> logp_NxG
PackedLogpFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def score_gold_answers(
  logp_fn: LogpFn,
  traj: Trajectory,
  gold_ids: Sequence[Sequence[int]],
  *,
  pad_id: int,
  reduce: str = "sum",
  length_bucket: int = 64,
  rows_bucket: int = 8,
) -> tuple[np.ndarray, np.ndarray]:
  """Scores the gold answer after every boundary of every rollout.

    gold_logp[b, t] = mean_j log p_ref(y*_j | s_t, y*_<j)   (reduce="mean": TRACE's ℓ̄_t, arXiv 2607.13988)
                    = Σ_j of the same                         (reduce="sum": this library's v1 TRACE)

  The trainer passes the trace method's `gold_reduce` knob ("mean" by default); the "sum" default here is v1's.

  Args:
    logp_fn: log-prob of each token given its prefix under the reference, [N, L] -> [N, L] float32
      (position j holds log p(tokens[j] | tokens[:j]), in nats).
    traj: the batch of rollouts (uses tokens, boundary_pos and boundary_mask).
    gold_ids: for each rollout, the token ids of the gold answer message (e.g. "<answer>42</answer>" and
      the end-of-message token).
    pad_id: padding token id.
    reduce: "sum" or "mean" over the gold tokens.
    length_bucket, rows_bucket: padding multiples that bound the number of compiled shapes.

  Returns:
    (gold_logp_BxT1 float32, boundary_mask_BxT1 bool): the mask is False where a boundary does not exist
    or its score is not finite (TRACE then skips it, never reading it as log p = 0).

  Raises:
    ValueError: for an unknown `reduce`, or a gold answer with no tokens.
  """
  _check_reduce(reduce)
  golds = _gold_lists(traj, gold_ids)
  rows, spans = [], []  # spans: (rollout, boundary, row, start, end) of each row's gold tokens
  for i, gold in enumerate(golds):
    for t in range(traj.boundary_mask_BxT1.shape[1]):
      if not traj.boundary_mask_BxT1[i, t]:
        continue
      prefix = traj.tokens_BxL[i, : traj.boundary_pos_BxT1[i, t]].tolist()
      spans.append((i, t, len(rows), len(prefix), len(prefix) + len(gold)))
      rows.append(prefix + gold)
  if not rows:
    return _reduce_spans(None, [], traj.boundary_mask_BxT1.shape, reduce)
  # One row per (rollout, boundary), each a `PackedRow` with no appended segment, laid out as the packed paths are.
  laid = lay_out_rows(
    [PackedRow(np.asarray(r, np.int32)) for r in rows],
    pad_id=pad_id,
    length_bucket=length_bucket,
    rows_multiple=rows_bucket,
  )
  logp = np.asarray(logp_fn(laid.tokens_NxL, laid.token_mask_NxL), np.float32)
  return _reduce_spans(logp, spans, traj.boundary_mask_BxT1.shape, reduce)


def _check_reduce(reduce: str) -> None:
  if reduce not in ("sum", "mean"):
    raise ValueError(f"config.credit.trace.gold_reduce must be 'sum' or 'mean', got {reduce!r}")


def _gold_lists(traj: Trajectory, gold_ids: Sequence[Sequence[int]]) -> list[list[int]]:
  """Each rollout's gold answer as a list of ints. Raises ValueError for a gold_ids of another length than the
  batch, or an empty gold answer (naming the rollout)."""
  b = traj.boundary_mask_BxT1.shape[0]
  if len(gold_ids) != b:
    raise ValueError(f"gold_ids has {len(gold_ids)} entries for {b} rollouts")
  golds = [[int(x) for x in g] for g in gold_ids]
  for i, gold in enumerate(golds):
    if not gold:
      raise ValueError(f"gold answer of rollout {i} has no tokens")
  return golds


def _reduce_spans(logp, spans, shape: tuple[int, int], reduce: str) -> tuple[np.ndarray, np.ndarray]:
  """(gold_logp_BxT1, mask_BxT1) of `shape`: for each span (b, t, row, start, end), the sum or mean of
  logp[row, start:end], kept where finite; 0 and False elsewhere."""
  gold_logp = np.zeros(shape, np.float32)
  mask = np.zeros(shape, bool)
  for i, t, k, start, end in spans:
    v = logp[k, start:end]
    score = float(v.sum() if reduce == "sum" else v.mean())
    if np.isfinite(score):
      gold_logp[i, t] = score
      mask[i, t] = True
  return gold_logp, mask


@dataclasses.dataclass
class PackedGoldBatch:
  """The packed scoring batch of `score_gold_answers_packed` (numpy, host side).

  Row n holds rollout `rows[n]`: its tokens [0, P) with P its last valid boundary position (segment 0), then one
  copy of the gold answer per valid boundary t, in order of t (segments 1, 2, ...). Pads: token pad_id, mask
  False, segment 0, limit 0, position 0.

  Attributes:
    tokens_NxL: int32 token ids.
    token_mask_NxL: bool, True on real tokens.
    positions_NxL: int32 RoPE positions: the slot index on the prefix, boundary_pos + j on the j-th token of a
      copy (so a copy sits where the gold answer would follow s_t).
    segment_ids_NxL: int32, 0 on the prefix, k on the k-th copy.
    prefix_limit_NxL: int32, boundary_pos of the copy's boundary on its tokens (it attends to prefix slots
      [0, boundary_pos)); 0 on the prefix.
    slots_NxG: int32 slots of the gold tokens to score, the copies' tokens in order; padded with 0.
    slot_mask_NxG: bool, True on real entries of slots_NxG.
    rows: the rollout index of each real row.
    copies: per real row, (t, first entry in slots_NxG, number of gold tokens) of each copy.
  """

  tokens_NxL: np.ndarray
  token_mask_NxL: np.ndarray
  positions_NxL: np.ndarray
  segment_ids_NxL: np.ndarray
  prefix_limit_NxL: np.ndarray
  slots_NxG: np.ndarray
  slot_mask_NxG: np.ndarray
  rows: list[int]
  copies: list[list[tuple[int, int, int]]]

  def arrays(self) -> tuple[np.ndarray, ...]:
    """The arguments of a `PackedLogpFn`, in order."""
    return (
      self.tokens_NxL,
      self.token_mask_NxL,
      self.positions_NxL,
      self.segment_ids_NxL,
      self.prefix_limit_NxL,
      self.slots_NxG,
    )


def pack_gold_copies(
  traj: Trajectory, gold_ids: Sequence[Sequence[int]], *, pad_id: int, length_bucket: int = 64, rows_bucket: int = 8
) -> PackedGoldBatch:
  """Builds the packed rows of `score_gold_answers_packed`: one per rollout with at least one valid boundary.

  L is rounded up to a multiple of length_bucket, G (the most gold tokens of a row, all its copies together) to
  a multiple of length_bucket, N to a multiple of rows_bucket, to bound the number of compiled shapes.

  Raises:
    ValueError: for a gold_ids of another length than the batch, or an empty gold answer.
  """
  t1 = traj.boundary_mask_BxT1.shape[1]
  rows, sources, copies = [], [], []  # the PackedRow of each rollout with a valid boundary, its index, its copies
  for i, gold in enumerate(_gold_lists(traj, gold_ids)):
    ts = [t for t in range(t1) if traj.boundary_mask_BxT1[i, t]]
    if not ts:
      continue
    bounds = [int(traj.boundary_pos_BxT1[i, t]) for t in ts]
    row, mine, g = PackedRow(traj.tokens_BxL[i, : max(bounds)]), [], len(gold)
    for t, pos in zip(ts, bounds):  # the copy after s_t: at positions pos.., attending to the prefix [0, pos)
      first = row.append(gold, pos, pos)
      mine.append((t, row.num_slots, g))
      row.score(np.arange(first, first + g))
    rows.append(row)
    sources.append(i)
    copies.append(mine)
  laid = lay_out_rows(
    rows, pad_id=pad_id, length_bucket=length_bucket, rows_multiple=rows_bucket, slot_bucket=length_bucket
  )
  return PackedGoldBatch(
    tokens_NxL=laid.tokens_NxL,
    token_mask_NxL=laid.token_mask_NxL,
    positions_NxL=laid.positions_NxL,
    segment_ids_NxL=laid.segment_ids_NxL,
    prefix_limit_NxL=laid.prefix_limit_NxL,
    slots_NxG=laid.slots_NxK,
    slot_mask_NxG=laid.slot_mask_NxK,
    rows=sources,
    copies=copies,
  )


def score_gold_answers_packed(
  packed_logp_fn: PackedLogpFn,
  traj: Trajectory,
  gold_ids: Sequence[Sequence[int]],
  *,
  pad_id: int,
  reduce: str = "sum",
  length_bucket: int = 64,
  rows_bucket: int = 8,
) -> tuple[np.ndarray, np.ndarray]:
  """`score_gold_answers` with all boundaries of a rollout in one packed row: the same outputs.

    gold_logp[b, t] = mean_j log p_ref(y*_j | s_t, y*_<j)   (reduce="mean": TRACE's ℓ̄_t, arXiv 2607.13988)
                    = Σ_j of the same                         (reduce="sum": this library's v1 TRACE)

  The trainer passes the trace method's `gold_reduce` knob ("mean" by default); the "sum" default here is v1's.

  Row b of the scoring batch (`pack_gold_copies`) is the rollout's tokens up to its last valid boundary, then one
  copy of y* per valid boundary t. Copy k attends causally to the prefix slots before boundary_pos[b, t] and to
  itself only (segment k, prefix limit boundary_pos[b, t]), at positions boundary_pos[b, t] + j: exactly the
  context of the separate row prefix_t + y*. Its first token is predicted from the prefix slot
  boundary_pos[b, t] - 1 (the generation prompt's last token), its later tokens from the copy's own previous
  token (see `jaxcredit.models.logprobs.packed_slot_logprobs`). Equal to `score_gold_answers` up to float
  rounding (1e-4 in float32, tested). Cost: about one forward of the rollout plus (T+1)·|y*| tokens, and the
  output head on the gold tokens only, against (T+1) forwards of growing prefixes.

  The gold answer is scored at temperature 1, whatever the sampling temperature: TRACE's gold score is its own
  quantity (the reference's belief in the gold answer), not a policy log-prob that must match the sampler.
  `jaxcredit.train.loop.step.make_packed_gold_fn` builds the callable this way.

  Args:
    packed_logp_fn: (tokens_NxL, token_mask_NxL, positions_NxL, segment_ids_NxL, prefix_limit_NxL, slots_NxG) ->
      logp_NxG float32: for each slot, log p_ref(tokens[n, slot] | the slots it attends to), in nats (0 where
      it attends to none before itself); e.g. `jaxcredit.models.logprobs.packed_slot_logprobs` at
      temperature 1 around the reference model. The segment mask is that of `Decoder.hidden_states`.
    traj: the batch of rollouts (uses tokens, boundary_pos and boundary_mask).
    gold_ids: for each rollout, the token ids of the gold answer message (lengths may differ).
    pad_id: padding token id.
    reduce: "sum" or "mean" over the gold tokens.
    length_bucket, rows_bucket: padding multiples that bound the number of compiled shapes (L and G are rounded
      up to multiples of length_bucket, N to a multiple of rows_bucket).

  Returns:
    (gold_logp_BxT1 float32, boundary_mask_BxT1 bool): the mask is False where a boundary does not exist
    or its score is not finite (TRACE then skips it, never reading it as log p = 0).

  Raises:
    ValueError: for an unknown `reduce`, a gold_ids of another length than the batch, or a gold answer with no
      tokens.
  """
  _check_reduce(reduce)
  batch = pack_gold_copies(traj, gold_ids, pad_id=pad_id, length_bucket=length_bucket, rows_bucket=rows_bucket)
  if not batch.rows:
    return _reduce_spans(None, [], traj.boundary_mask_BxT1.shape, reduce)
  logp = np.asarray(packed_logp_fn(*batch.arrays()), np.float32)
  if logp.shape != batch.slots_NxG.shape:
    raise ValueError(
      f"packed_logp_fn returned shape {logp.shape}, expected {batch.slots_NxG.shape} (one "
      f"log-prob per entry of slots_NxG)"
    )
  spans = [
    (i, t, k, first, first + g) for k, (i, copies) in enumerate(zip(batch.rows, batch.copies)) for t, first, g in copies
  ]
  return _reduce_spans(logp, spans, traj.boundary_mask_BxT1.shape, reduce)
