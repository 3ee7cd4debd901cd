"""TRACE's boundary scores: log p_ref(y* | s_t) of the gold answer at every tool-call boundary.

For each rollout and each existing boundary state s_t (a prefix of the rollout's tokens that ends with the
chat template's generation prompt), the frozen reference scores the gold answer's tokens as the next
assistant message. All (rollout, boundary) pairs are scored in one batched forward.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from jaxcredit.trajectory import Trajectory, pad_length

LogpFn = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (tokens_NxL, mask_NxL) -> logp_NxL


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

    gold_logp[b, t] = Σ_j log p_ref(y*_j | s_t, y*_<j)      (reduce="sum", TRACE)
                    = mean_j of the same                      (reduce="mean")

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
  if reduce not in ("sum", "mean"):
    raise ValueError(f"config.credit.gold_reduce must be 'sum' or 'mean', got {reduce!r}")
  b, t1 = traj.boundary_mask_BxT1.shape
  if len(gold_ids) != b:
    raise ValueError(f"gold_ids has {len(gold_ids)} entries for {b} rollouts")
  rows, spans, where = [], [], []
  for i in range(b):
    gold = list(gold_ids[i])
    if not gold:
      raise ValueError(f"gold answer of rollout {i} has no tokens")
    for t in range(t1):
      if not traj.boundary_mask_BxT1[i, t]:
        continue
      prefix = traj.tokens_BxL[i, : traj.boundary_pos_BxT1[i, t]].tolist()
      rows.append(prefix + gold)
      spans.append((len(prefix), len(prefix) + len(gold)))
      where.append((i, t))
  gold_logp = np.zeros((b, t1), np.float32)
  mask = np.zeros((b, t1), bool)
  if not rows:
    return gold_logp, mask
  n = pad_length(len(rows), rows_bucket)
  length = pad_length(max(len(r) for r in rows), length_bucket)
  tokens = np.full((n, length), pad_id, np.int32)
  tmask = np.zeros((n, length), bool)
  for k, r in enumerate(rows):
    tokens[k, : len(r)] = r
    tmask[k, : len(r)] = True
  logp = np.asarray(logp_fn(tokens, tmask), np.float32)
  for k, ((i, t), (s, e)) in enumerate(zip(where, spans)):
    v = logp[k, s:e]
    score = float(v.sum() if reduce == "sum" else v.mean())
    if np.isfinite(score):
      gold_logp[i, t] = score
      mask[i, t] = True
  return gold_logp, mask
