"""The one packed-row layout: a shared prefix, then appended segments that each attend to the prefix up to their own
limit, and the slots whose tokens are scored. `train/loop/update.py` (the update: a group's common prompt once, then
every rollout's continuation) and `scoring/gold.py` (TRACE's gold scoring: a rollout's context once, then one copy
of the gold answer per boundary) and `scoring/teacher.action_slots` (a teacher pass: each rollout a row of its own,
its action positions scored) build their rows with `PackedRow` and lay them out with `lay_out_rows`; the model
reads the layout through `Decoder.hidden_states(positions_BxL=, segment_ids_BxL=, prefix_limit_BxL=)` and scores
the slots (`models.logprobs.packed_slot_logprobs`).

A row, slot by slot:

  segment_ids   0 0 0 0 0 | 1 1 1 | 2 2 ...     0 on the prefix, k on the k-th appended segment
  prefix_limit  0 0 0 0 0 | p p p | q q ...     segment k attends to prefix slots [0, limit) and causally to itself
  positions     0 1 2 3 4 | p ... | q ...       RoPE positions: a segment continues at its own start position

Pads: token `pad_id`, mask False, position, segment and limit 0; the slots of a row are padded with 0 and
`slot_mask` False.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxcredit.trajectory import pad_length


class PackedRow:
  """One row being built: `PackedRow(prefix_tokens)`, then `append(segment_tokens, start_position, prefix_limit)`
  for each segment and `score(slots)` for the slots to score, in the order the caller reads them back."""

  def __init__(self, prefix_tokens):
    prefix = np.asarray(prefix_tokens)
    n = len(prefix)
    self._tokens = [prefix]
    self._positions = [np.arange(n, dtype=np.int32)]
    self._segments = [np.zeros(n, np.int32)]
    self._limits = [np.zeros(n, np.int32)]
    self._slots: list[np.ndarray] = []
    self.length = n  # slots used so far
    self.num_segments = 0

  def append(self, tokens, start_position: int, prefix_limit: int) -> int:
    """Appends a segment: its tokens at RoPE positions start_position, start_position + 1, ..., attending to the
    prefix slots [0, prefix_limit). Returns the slot of its first token."""
    tokens = np.asarray(tokens)
    n = len(tokens)
    first = self.length
    self.num_segments += 1
    self._tokens.append(tokens)
    self._positions.append(np.arange(start_position, start_position + n, dtype=np.int32))
    self._segments.append(np.full(n, self.num_segments, np.int32))
    self._limits.append(np.full(n, prefix_limit, np.int32))
    self.length += n
    return first

  def score(self, slots) -> None:
    """Adds slots (of this row) whose tokens are scored, after those added before."""
    self._slots.append(np.asarray(slots, np.int32))

  @property
  def num_slots(self) -> int:
    return int(sum(len(s) for s in self._slots))

  def arrays(self) -> tuple[np.ndarray, ...]:
    """(tokens, positions, segment_ids, prefix_limit, slots) of the row, unpadded."""
    cat = np.concatenate
    slots = cat(self._slots) if self._slots else np.zeros(0, np.int32)
    return cat(self._tokens), cat(self._positions), cat(self._segments), cat(self._limits), slots


@dataclasses.dataclass
class PackedRows:
  """Rows laid out as padded arrays ([N rows, L slots] and [N rows, K scored slots]), numpy."""

  tokens_NxL: np.ndarray
  token_mask_NxL: np.ndarray
  positions_NxL: np.ndarray
  segment_ids_NxL: np.ndarray
  prefix_limit_NxL: np.ndarray
  slots_NxK: np.ndarray
  slot_mask_NxK: np.ndarray


def lay_out_rows(
  rows: list[PackedRow],
  *,
  pad_id: int = 0,
  token_dtype=np.int32,
  length_bucket: int = 64,
  rows_multiple: int = 1,
  slot_bucket: int = 64,
) -> PackedRows:
  """The rows as padded arrays: L is the longest row rounded up to a multiple of `length_bucket`, K the most scored
  slots of a row rounded up to a multiple of `slot_bucket`, N the number of rows rounded up to a multiple of
  `rows_multiple` (empty rows: all pads); at least 1 of each.

  Raises:
    ValueError: a bucket or multiple < 1.
  """
  for name, value in (("length_bucket", length_bucket), ("rows_multiple", rows_multiple), ("slot_bucket", slot_bucket)):
    if value < 1:
      raise ValueError(f"lay_out_rows: {name} must be >= 1, got {value}")
  n = pad_length(max(len(rows), 1), rows_multiple)
  length = pad_length(max((r.length for r in rows), default=1), length_bucket)
  width = pad_length(max((r.num_slots for r in rows), default=1), slot_bucket)
  out = PackedRows(
    tokens_NxL=np.full((n, length), pad_id, token_dtype),
    token_mask_NxL=np.zeros((n, length), bool),
    positions_NxL=np.zeros((n, length), np.int32),
    segment_ids_NxL=np.zeros((n, length), np.int32),
    prefix_limit_NxL=np.zeros((n, length), np.int32),
    slots_NxK=np.zeros((n, width), np.int32),
    slot_mask_NxK=np.zeros((n, width), bool),
  )
  for k, row in enumerate(rows):
    tokens, positions, segments, limits, slots = row.arrays()
    m = len(tokens)
    out.tokens_NxL[k, :m] = tokens
    out.token_mask_NxL[k, :m] = True
    out.positions_NxL[k, :m] = positions
    out.segment_ids_NxL[k, :m] = segments
    out.prefix_limit_NxL[k, :m] = limits
    out.slots_NxK[k, : len(slots)] = slots
    out.slot_mask_NxK[k, : len(slots)] = True
  return out
