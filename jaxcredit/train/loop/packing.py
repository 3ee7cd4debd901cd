"""Packing a step's rollouts for the update: each group's shared prompt once per row, and the output head on the
scored (action) tokens only.

The rollouts of a group start with the same prompt. Right-padded one per row (the trajectory layout), a step at
[B, L] runs the model on every rollout's copy of the prompt, on its padding, and the output head (a V x D product
per position) on every slot, although the loss reads only the action tokens. `pack_update_batch` lays out instead,
per row, the group's longest common prefix once (segment 0) followed by each rollout's continuation (segments
1, 2, ...), which attends to the prefix and to itself (`jaxcredit.models.attention.packed_attention_mask`, with
`prefix_limit` the prefix length), at the RoPE positions it has in its own rollout. The loss then scores the K
action slots of each row with `jaxcredit.models.logprobs.packed_slot_logprobs`. Every scored token keeps exactly
its context, so log-probs, losses and gradients equal the unpacked ones up to float summation order
(tests/train/test_packing.py); on the quickstart the update runs on 35-40% of the slots
(docs/benchmarks.md, "Packing the update"). The rows are built and laid out by `jaxcredit.packed_rows`, the layout
TRACE's gold scoring shares.

Layout of a packed batch (B is then the packed rows, L the row length, K the scored slots per row):
  tokens_BxL, token_mask_BxL, positions_BxL, segment_ids_BxL, prefix_limit_BxL: the rows;
  slots_BxK: int32, the row slot of each scored token (padding entries: 0, masked);
  every other per-token array of the input (`action_mask_BxL`, `adv_BxL`, `behavior_logp_BxL`, ...) keeps its
    name, its second axis now the K scored slots (the loss terms are elementwise, so they read it unchanged); a
    `*_BxLxD` array (HSD's teacher hidden states) keeps its trailing axis: [B, K, D];
  rollout_ids_BxL: int32 [B, K], the scored token's rollout within its row (0, 1, ...), for per-sequence
    aggregation (`jaxcredit.train.loop.loss.aggregate`);
  rollouts_B: float32 [B], the input's rollouts counted on the first row (the Dr.GRPO denominator's sequence
    count, which includes rollouts without a scored token).
"""

from __future__ import annotations

import numpy as np

from jaxcredit.packed_rows import PackedRow, lay_out_rows
from jaxcredit.trajectory import pad_length

ROW_KEYS = ("tokens_BxL", "token_mask_BxL")


def _common_prefix(rows: list[np.ndarray]) -> int:
  """Length of the longest common prefix of 1-D token arrays."""
  n = min(len(r) for r in rows)
  first = rows[0][:n]
  p = n
  for r in rows[1:]:
    diff = np.flatnonzero(r[:n] != first)
    if diff.size:
      p = min(p, int(diff[0]))
  return p


def pack_update_batch(
  batch: dict,
  *,
  length_bucket: int = 128,
  max_row_len: int = 1024,
  rows_multiple: int = 1,
  slot_bucket: int = 64,
) -> dict:
  """Packs an update batch of right-padded rollouts (`jaxcredit.train.loop.update.update_batch`) into group rows with scored slots.

  Rollouts are grouped by `group_ids_B` (default: each its own group). A group's rows start with the longest
  common prefix of its rollouts' tokens; continuations are appended while the row stays within
  max(max_row_len, the longest rollout rounded up to length_bucket), else a new row repeats the prefix. Rollouts without an action token are
  left out (they add nothing to any loss; they still count in `rollouts_B`).

  Args:
    batch: host arrays: tokens_BxL int, token_mask_BxL bool (each row's real tokens contiguous from slot 0),
      action_mask_BxL bool (the tokens the loss scores), any other [B, L] per-token arrays ([B, L, D] when named
      `*_BxLxD`), optionally group_ids_B int. Arrays of another shape are not allowed (they would be silently dropped).
    length_bucket: the row length is rounded up to a multiple of this.
    max_row_len: tokens per row before a group spills onto a new row (0: as long as the longest rollout's
      unpacked row). Longer rows share a prompt among more rollouts, but a packed row attends through a dense
      [L, L] mask, so attention's cost per token grows with L: on 2 CPU cores 512 was fastest both for
      SmolLM2-135M and for a 4-layer 256-wide model (docs/benchmarks.md, "Packing the update").
    rows_multiple: the number of rows is rounded up to a multiple of this (data-parallel size times
      micro-batches), with empty rows.
    slot_bucket: K, the scored slots per row, is rounded up to a multiple of this.

  Returns:
    The packed batch (module docstring), numpy arrays.

  Raises:
    ValueError: naming the key, for a missing tokens/mask/action array, an array that is not [B, L] or [B], a mask
      whose real tokens are not contiguous from slot 0, an action token on padding, or bucket sizes < 1.
  """
  for key in ("tokens_BxL", "token_mask_BxL", "action_mask_BxL"):
    if key not in batch:
      raise ValueError(f"pack_update_batch: the batch has no {key!r}")
  for name, value in (("length_bucket", length_bucket), ("rows_multiple", rows_multiple), ("slot_bucket", slot_bucket)):
    if value < 1:
      raise ValueError(f"pack_update_batch: {name} must be >= 1, got {value}")
  tokens = np.asarray(batch["tokens_BxL"])
  mask = np.asarray(batch["token_mask_BxL"]).astype(bool)
  scored = np.asarray(batch["action_mask_BxL"]).astype(bool)
  b, length = tokens.shape
  token_keys = [k for k in batch if k not in ROW_KEYS and k != "group_ids_B"]
  for k in token_keys:
    if np.shape(batch[k])[:2] != (b, length) or (np.ndim(batch[k]) > 2 and not k.endswith("_BxLxD")):
      raise ValueError(
        f"pack_update_batch: {k} has shape {np.shape(batch[k])}, expected the tokens' {(b, length)} (or [B, L, D] "
        f"for a *_BxLxD array)"
      )
  groups = np.asarray(batch.get("group_ids_B", np.arange(b)))
  if groups.shape != (b,):
    raise ValueError(f"pack_update_batch: group_ids_B has shape {groups.shape}, expected {(b,)}")
  lengths = mask.sum(axis=1)
  if (mask != (np.arange(length)[None, :] < lengths[:, None])).any():
    raise ValueError("pack_update_batch: token_mask_BxL must hold each row's real tokens contiguously from slot 0")
  if (scored & ~mask).any():
    raise ValueError("pack_update_batch: action_mask_BxL marks padding slots")

  kept = [i for i in range(b) if scored[i].any()]
  longest = int(max((lengths[i] for i in kept), default=1))
  cap = max(int(max_row_len), pad_length(longest, length_bucket))
  # rows: (prefix_len, prefix source rollout, [rollouts]); each row's used length is prefix + its continuations.
  rows: list[tuple[int, int, list[int]]] = []
  for g in dict.fromkeys(groups[kept].tolist()):
    members = [i for i in kept if groups[i] == g]
    p = _common_prefix([tokens[i, : lengths[i]] for i in members])
    in_row: list[int] = []
    used = p
    for i in members:
      extra = int(lengths[i]) - p
      if in_row and used + extra > cap:
        rows.append((p, members[0], in_row))
        in_row, used = [], p
      in_row.append(i)
      used += extra
    rows.append((p, members[0], in_row))

  packed, scored_slots = [], []  # per row: the PackedRow, and (rollout, its scored positions) per segment
  for p, source, members in rows:
    packed_row, segments = PackedRow(tokens[source, :p]), []
    for i in members:
      at = packed_row.append(tokens[i, p : lengths[i]], p, p)
      t = np.flatnonzero(scored[i])
      packed_row.score(np.where(t < p, t, at + t - p))
      segments.append((i, t))
    packed.append(packed_row)
    scored_slots.append(segments)
  laid = lay_out_rows(
    packed,
    token_dtype=tokens.dtype,
    length_bucket=length_bucket,
    rows_multiple=rows_multiple,
    slot_bucket=slot_bucket,
  )
  num_rows, num_slots = laid.slots_NxK.shape
  out = {
    "tokens_BxL": laid.tokens_NxL,
    "token_mask_BxL": laid.token_mask_NxL,
    "positions_BxL": laid.positions_NxL,
    "segment_ids_BxL": laid.segment_ids_NxL,
    "prefix_limit_BxL": laid.prefix_limit_NxL,
    "slots_BxK": laid.slots_NxK,
    "rollout_ids_BxL": np.zeros((num_rows, num_slots), np.int32),
    "rollouts_B": np.zeros((num_rows,), np.float32),
  }
  for k in token_keys:
    out[k] = np.zeros((num_rows, num_slots) + np.shape(batch[k])[2:], np.asarray(batch[k]).dtype)
  out["rollouts_B"][0] = b
  for r, segments in enumerate(scored_slots):
    k = 0
    for seg, (i, t) in enumerate(segments):
      out["rollout_ids_BxL"][r, k : k + len(t)] = seg
      for key in token_keys:
        out[key][r, k : k + len(t)] = np.asarray(batch[key])[i, t]
      k += len(t)
  return out


def pack_if_short(
  batch: dict, *, length_bucket: int = 128, max_row_len: int = 512, rows_multiple: int = 1, slot_bucket: int = 64
) -> dict:
  """`pack_update_batch` when every rollout's row (its length rounded up to `length_bucket`) fits `max_row_len`;
  otherwise the batch as it is, without `group_ids_B`. A packed row attends through a dense [L, L] segment mask
  (memory O(L^2) per row, where the unpacked path's attention can be chunked), so long rollouts (BFCL's 2k-6k
  token prompts) stay on the unpacked path.

  Raises:
    ValueError: as `pack_update_batch`, and for max_row_len < 1.
  """
  if max_row_len < 1:
    raise ValueError(f"pack_if_short: max_row_len must be >= 1, got {max_row_len}")
  lengths = np.asarray(batch["token_mask_BxL"]).astype(bool).sum(axis=1)
  if pad_length(int(lengths.max(initial=1)), length_bucket) > max_row_len:
    return {k: v for k, v in batch.items() if k != "group_ids_B"}
  return pack_update_batch(
    batch,
    length_bucket=length_bucket,
    max_row_len=max_row_len,
    rows_multiple=rows_multiple,
    slot_bucket=slot_bucket,
  )
