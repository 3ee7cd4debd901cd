"""The one trajectory data structure shared by rollouts, scoring, credit and the update step.

A rollout is built token-in, token-out: its token ids only grow, and `action_mask`, `turn_ids` and
`behavior_logp` grow with them (one entry per token). `RolloutBuilder` is the host-side growing form;
`Trajectory` is the padded batch of arrays the jitted code consumes.

It is a leaf module (numpy and jax only): rollouts build it, scoring and the teacher passes read it and add their
outputs by name (`Trajectory.passes`), the credit adapters and the update step consume it.

Shape letters: B rollouts in the batch, L tokens (padded), T max turns (assistant messages), U verified units
(CrEST's user turns; U = 1 where the environment verifies only the outcome).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Sequence

import jax
import numpy as np


@dataclasses.dataclass
class RolloutBuilder:
  """One rollout while it is being sampled (host side, plain Python lists).

  Attributes:
    tokens: all token ids so far (prompt, actions, observations).
    action_mask: True on tokens the policy generated.
    turn_ids: turn index of each action token, -1 elsewhere.
    behavior_logp: log-prob (nats) the sampler recorded for each action token, 0.0 elsewhere.
    boundaries: token count at each tool-call boundary: boundaries[0] = prompt length (state s_0),
      boundaries[t] = length right after the t-th tool observation (state s_t).
    num_turns: assistant messages so far.
    unit_ids: verified-unit index of each action token (CrEST), -1 elsewhere; the unit is `unit` at the time
      the action was appended (0 unless the environment opens new units with `next_unit`).
    unit: the current verified unit.
  """

  tokens: list[int] = dataclasses.field(default_factory=list)
  action_mask: list[bool] = dataclasses.field(default_factory=list)
  turn_ids: list[int] = dataclasses.field(default_factory=list)
  behavior_logp: list[float] = dataclasses.field(default_factory=list)
  boundaries: list[int] = dataclasses.field(default_factory=list)
  num_turns: int = 0
  unit_ids: list[int] = dataclasses.field(default_factory=list)
  unit: int = 0

  @classmethod
  def from_prompt(cls, prompt_ids: Sequence[int]) -> "RolloutBuilder":
    if not prompt_ids:
      raise ValueError("prompt_ids is empty: a rollout needs at least one prompt token")
    b = cls()
    b.append_context(prompt_ids)
    b.boundaries.append(len(b.tokens))
    return b

  def append_context(self, ids: Sequence[int]) -> None:
    """Appends tokens the policy did not generate (prompt, tool observation, chat scaffolding)."""
    n = len(ids)
    self.tokens.extend(int(i) for i in ids)
    self.action_mask.extend([False] * n)
    self.turn_ids.extend([-1] * n)
    self.unit_ids.extend([-1] * n)
    self.behavior_logp.extend([0.0] * n)

  def append_action(self, ids: Sequence[int], logp: Sequence[float] | None = None) -> None:
    """Appends one assistant turn's generated tokens (and their recorded log-probs)."""
    n = len(ids)
    if logp is None:
      logp = [0.0] * n
    if len(logp) != n:
      raise ValueError(f"logp has {len(logp)} entries for {n} action tokens")
    self.tokens.extend(int(i) for i in ids)
    self.action_mask.extend([True] * n)
    self.turn_ids.extend([self.num_turns] * n)
    self.unit_ids.extend([self.unit] * n)
    self.behavior_logp.extend(float(x) for x in logp)
    self.num_turns += 1

  def next_unit(self) -> None:
    """Opens the next verified unit (e.g. a new user request of a multi-request session)."""
    self.unit += 1

  @property
  def prompt_len(self) -> int:
    """Tokens of the initial prompt (state s_0)."""
    return self.boundaries[0]

  def mark_boundary(self) -> None:
    """Records the state right after a tool observation (s_t for t >= 1)."""
    self.boundaries.append(len(self.tokens))

  def __len__(self) -> int:
    return len(self.tokens)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Trajectory:
  """A padded batch of rollouts (right-padded on the token axis).

  Attributes:
    tokens_BxL: int32 token ids; padding holds the pad id.
    token_mask_BxL: bool, True on real (non-pad) tokens.
    action_mask_BxL: bool, True only on tokens the policy generated.
    turn_ids_BxL: int32 turn index of each action token, -1 elsewhere.
    behavior_logp_BxL: float32 log-prob (nats) recorded by the sampler, 0 off actions.
    boundary_pos_BxT1: int32 prefix length of boundary state s_t, 0 where absent.
    boundary_mask_BxT1: bool, True where s_t exists.
    turn_mask_BxT: bool, True on real turns.
    rewards_B: float32 outcome rewards.
    sample_mask_B: bool, False for rollouts that must not count (e.g. no action tokens).
    group_ids_B: int32 index of the prompt group each rollout belongs to. Rollouts of a group need not be
      adjacent: the advantage code groups by these ids.
    prompt_len_B: int32 tokens of each rollout's initial prompt; its continuation starts there.
    unit_ids_BxL: int32 verified-unit index of each action token, -1 elsewhere.
    unit_rewards_BxU: float32 per-unit verified rewards (U = 1: the outcome reward).
    unit_mask_BxU: bool, True on the units each rollout reached.
    passes: outputs of the passes a method ran, by pass name, each its pass row's output class
      (`jaxcredit.train.tables.pass_outputs`, e.g. `passes["teacher_plain"].logp_BxL`); empty until the trainer runs them.
  """

  tokens_BxL: np.ndarray
  token_mask_BxL: np.ndarray
  action_mask_BxL: np.ndarray
  turn_ids_BxL: np.ndarray
  behavior_logp_BxL: np.ndarray
  boundary_pos_BxT1: np.ndarray
  boundary_mask_BxT1: np.ndarray
  turn_mask_BxT: np.ndarray
  rewards_B: np.ndarray
  sample_mask_B: np.ndarray
  group_ids_B: np.ndarray
  prompt_len_B: np.ndarray
  unit_ids_BxL: np.ndarray
  unit_rewards_BxU: np.ndarray
  unit_mask_BxU: np.ndarray
  passes: dict = dataclasses.field(default_factory=dict)

  @property
  def batch_size(self) -> int:
    return int(self.tokens_BxL.shape[0])

  @property
  def max_turns(self) -> int:
    return int(self.turn_mask_BxT.shape[1])

  def axis_sizes(self) -> dict[str, int]:
    """{"B": rollouts, "L": tokens, "T": turns, "T1": boundaries}: the sizes pass outputs' declared axes take."""
    b, length = self.tokens_BxL.shape
    return {"B": int(b), "L": int(length), "T": self.max_turns, "T1": int(self.boundary_mask_BxT1.shape[1])}


def pad_length(n: int, bucket: int) -> int:
  """Smallest multiple of `bucket` >= n (bucketing bounds the number of compiled shapes)."""
  return max(bucket, -(-n // bucket) * bucket)


def pack(
  rollouts: Sequence[RolloutBuilder],
  rewards: Sequence[float],
  group_ids: Sequence[int],
  *,
  unit_rewards: Sequence[Sequence[float]] | None = None,
  max_turns: int,
  pad_id: int,
  length_bucket: int = 64,
) -> Trajectory:
  """Packs host-side rollouts into a right-padded `Trajectory`.

  Args:
    rollouts: B rollouts.
    rewards: B outcome rewards.
    group_ids: B group indices.
    unit_rewards: per rollout, the verified reward of each unit it reached (default: [reward], U = 1).
    max_turns: T, the padded number of turns (every rollout must have num_turns <= T).
    pad_id: token id used for padding.
    length_bucket: L is rounded up to a multiple of this.

  Raises:
    ValueError: on mismatched lengths or a rollout with more than `max_turns` turns.
  """
  b = len(rollouts)
  if len(rewards) != b or len(group_ids) != b:
    raise ValueError(f"rewards ({len(rewards)}) and group_ids ({len(group_ids)}) must have one entry per rollout ({b})")
  if unit_rewards is None:
    unit_rewards = [[float(r)] for r in rewards]
  if len(unit_rewards) != b:
    raise ValueError(f"unit_rewards has {len(unit_rewards)} entries for {b} rollouts")
  num_units = max(1, max(len(u) for u in unit_rewards))
  length = pad_length(max(len(r) for r in rollouts), length_bucket)
  tokens = np.full((b, length), pad_id, np.int32)
  token_mask = np.zeros((b, length), bool)
  action_mask = np.zeros((b, length), bool)
  turn_ids = np.full((b, length), -1, np.int32)
  logp = np.zeros((b, length), np.float32)
  boundary_pos = np.zeros((b, max_turns + 1), np.int32)
  boundary_mask = np.zeros((b, max_turns + 1), bool)
  turn_mask = np.zeros((b, max_turns), bool)
  unit_ids = np.full((b, length), -1, np.int32)
  unit_rewards_bu = np.zeros((b, num_units), np.float32)
  unit_mask = np.zeros((b, num_units), bool)
  for i, r in enumerate(rollouts):
    n = len(r)
    if r.num_turns > max_turns:
      raise ValueError(f"rollout {i} has {r.num_turns} turns > max_turns={max_turns}")
    tokens[i, :n] = r.tokens
    token_mask[i, :n] = True
    action_mask[i, :n] = r.action_mask
    turn_ids[i, :n] = r.turn_ids
    logp[i, :n] = r.behavior_logp
    nb = min(len(r.boundaries), max_turns + 1)
    boundary_pos[i, :nb] = r.boundaries[:nb]
    boundary_mask[i, :nb] = True
    turn_mask[i, : r.num_turns] = True
    unit_ids[i, :n] = r.unit_ids
    if r.unit_ids and max(r.unit_ids) >= len(unit_rewards[i]):
      raise ValueError(
        f"rollout {i} has action tokens in unit {max(r.unit_ids)} but {len(unit_rewards[i])} unit rewards"
      )
    unit_rewards_bu[i, : len(unit_rewards[i])] = unit_rewards[i]
    unit_mask[i, : len(unit_rewards[i])] = True
  rewards_b = np.asarray(rewards, np.float32)
  sample_mask = np.asarray(action_mask.any(axis=1), bool)
  return Trajectory(
    tokens_BxL=tokens,
    token_mask_BxL=token_mask,
    action_mask_BxL=action_mask,
    turn_ids_BxL=turn_ids,
    behavior_logp_BxL=logp,
    boundary_pos_BxT1=boundary_pos,
    boundary_mask_BxT1=boundary_mask,
    turn_mask_BxT=turn_mask,
    rewards_B=rewards_b,
    sample_mask_B=sample_mask,
    group_ids_B=np.asarray(group_ids, np.int32),
    prompt_len_B=np.asarray([r.prompt_len for r in rollouts], np.int32),
    unit_ids_BxL=unit_ids,
    unit_rewards_BxU=unit_rewards_bu,
    unit_mask_BxU=unit_mask,
  )


def drop_invalid_behavior_logp(traj):
  """Takes out of the loss the action tokens whose sampler log-prob is not finite: an engine that returned none
  (vLLM's null, read as NaN) or a broken one. Such a token's log-ratio is meaningless; kept, it would get the
  largest importance weight (`loss.engine_is_cap`) or make the loss NaN. The token stays in the context.

  Returns:
    (a shallow copy of `traj` with those tokens off `action_mask_BxL` and their `behavior_logp_BxL` 0.0,
    {"engine_invalid_logp_tokens": how many there were}). `traj` itself is not changed.
  """
  act = traj.action_mask_BxL & traj.sample_mask_B[:, None]
  invalid = act & ~np.isfinite(traj.behavior_logp_BxL)
  kept = copy.copy(traj)
  if invalid.any():
    kept.action_mask_BxL = traj.action_mask_BxL & ~invalid
    kept.behavior_logp_BxL = np.where(invalid, 0.0, traj.behavior_logp_BxL).astype(np.float32)
  return kept, {"engine_invalid_logp_tokens": int(invalid.sum())}


def group_index(group_ids_B: np.ndarray) -> np.ndarray:
  """idx_PxG: the rollouts of each group, groups in order of first appearance, rollouts in batch order.

  Group functions of `jaxcredit.credit` take [G, ...] arrays; `x_B[idx_PxG]` gathers them whatever the batch
  order, and `out_B[idx_PxG.ravel()] = out_PxG.ravel()` scatters the results back.

  Raises:
    ValueError: if the groups do not all have the same number of rollouts (vmap needs one G).
  """
  ids = np.asarray(group_ids_B)
  order = list(dict.fromkeys(ids.tolist()))
  rows = [np.flatnonzero(ids == g) for g in order]
  sizes = sorted({len(r) for r in rows})
  if len(sizes) > 1:
    raise ValueError(f"groups have different sizes {sizes}; every group needs the same number of rollouts")
  return np.stack(rows).astype(np.int32) if rows else np.zeros((0, 0), np.int32)
