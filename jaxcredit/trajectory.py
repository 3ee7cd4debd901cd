"""A rollout's data from sampling to the update, one declared type per stage: the step's types.

A rollout is built token-in, token-out: its token ids only grow, and `action_mask`, `turn_ids` and
`behavior_logp` grow with them (one entry per token). `RolloutBuilder` is the host-side growing form;
`Trajectory` is the padded batch of arrays the jitted code consumes (`pack`); `Rollouts` is one RL step's batch:
the trajectory with each rollout's host fields (task, chat, finish, tool counts, process), built once per step
(`Rollouts.from_results`, after the gather over processes) or from JSONL records (`Rollouts.from_records`,
`jaxcredit credit`); nothing after it reads the sampler's results (which hold live environment objects) or parallel
lists of them. `LossInput` is what a method hands one of its loss terms (`DistillInput`, `VocabKLInput`) and
`UpdateBatch` what the jitted update reads, unpacked or packed (`PackedLayout`).

It is a leaf module (numpy and jax only): rollouts build it, scoring and the teacher passes read it and add their
outputs by name (`Trajectory.passes`), the credit adapters, the method, the metrics row, the exports and the update
step consume it.

Shape letters: B rollouts in the batch (group after group in training; any order offline, the groups given by
`traj.group_ids_B`), L tokens (padded), T max turns (assistant messages), U verified units (CrEST's user turns; U = 1
where the environment verifies only the outcome); the update batch's axes (N rows, L and K slots) are given with
`UpdateBatch` below.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

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


@dataclasses.dataclass(frozen=True)
class Rollouts:
  """One step's rollouts: `traj` (the padded arrays every jitted phase reads) and, per rollout, what only the host
  needs (the task, the chat, why it ended, its tool counts, the process that sampled it).

  Attributes:
    traj: the padded batch (`jaxcredit.trajectory.Trajectory`); its `passes` fill as the passes run.
    tasks: [B] each rollout's task (the environment's object; None where a record's task is not needed).
    messages: [B] each rollout's chat in OpenAI layout: the prompt messages, then each assistant and tool message.
    builders: [B] each rollout's tokens as sampled (`RolloutBuilder`), what the JSONL export writes.
    rewards: [B] each outcome reward as the environment gave it (Python floats; `traj.rewards_B` is float32).
    finish: [B] why each rollout ended ("answer", "no_answer", "tool_budget", "length", "env_error"; None offline
      where a record says nothing).
    tool_calls_B: int32 [B] tool calls made.
    tool_errors_B: int32 [B] tool calls that failed.
    process_B: int32 [B] the process that sampled each rollout (0 with one process).
    policy_version: the version of the weights that sampled them (`RunState.policy_version`), None when unknown.

  Raises (on construction):
    ValueError: a per-rollout field without one entry per rollout of `traj`, naming the field.
  """

  traj: Trajectory
  tasks: tuple[Any, ...]
  messages: tuple[Sequence[Mapping[str, Any]], ...]
  builders: tuple[RolloutBuilder, ...]
  rewards: tuple[float, ...]
  finish: tuple[str | None, ...]
  tool_calls_B: np.ndarray
  tool_errors_B: np.ndarray
  process_B: np.ndarray
  policy_version: int | None = None

  def __post_init__(self) -> None:
    b = self.traj.batch_size
    for field in ("tasks", "messages", "builders", "rewards", "finish", "tool_calls_B", "tool_errors_B", "process_B"):
      n = len(getattr(self, field))
      if n != b:
        raise ValueError(f"Rollouts.{field} has {n} entries for the trajectory's {b} rollouts")

  @property
  def batch_size(self) -> int:
    return self.traj.batch_size

  @property
  def num_turns_B(self) -> np.ndarray:
    """int32 [B] assistant turns of each rollout."""
    return np.asarray([b.num_turns for b in self.builders], np.int32)

  def with_traj(self, traj: Trajectory) -> Rollouts:
    """The same rollouts with another trajectory of the same batch (one with some behaviour log-probs dropped)."""
    return dataclasses.replace(self, traj=traj)

  @classmethod
  def from_results(
    cls,
    results: Sequence[Any],
    tasks: Sequence[Any],
    *,
    group_size: int,
    max_turns: int,
    pad_id: int,
    length_bucket: int,
    unit_rewards: Sequence[Sequence[float]] | None = None,
    processes: Sequence[int] | None = None,
    policy_version: int | None = None,
  ) -> Rollouts:
    """A step's sampled rollouts (`rollout.multiturn.RolloutResult`s, group after group: rollout k in group
    k // group_size) as `Rollouts`, turns padded to `max_turns`, tokens to a multiple of `length_bucket`.

    A rollout whose environment failed (finish "env_error": its server errored or vanished) is left out of the
    loss (`traj.sample_mask_B` False): its reward says nothing about the policy.

    Raises:
      ValueError: as `jaxcredit.trajectory.pack` (a rollout with more than `max_turns` turns, unequal lengths).
    """
    traj = pack(
      [r.builder for r in results],
      [r.reward for r in results],
      [k // group_size for k in range(len(results))],
      max_turns=max_turns,
      pad_id=pad_id,
      length_bucket=length_bucket,
      unit_rewards=unit_rewards,
    )
    finish = tuple(r.finish for r in results)
    env_failed = np.asarray([f == "env_error" for f in finish], bool)
    if env_failed.any():
      traj.sample_mask_B = traj.sample_mask_B & ~env_failed
    return cls(
      traj=traj,
      tasks=tuple(tasks),
      messages=tuple(list(r.messages) for r in results),
      builders=tuple(r.builder for r in results),
      rewards=tuple(float(r.reward) for r in results),
      finish=finish,
      tool_calls_B=np.asarray([r.tool_calls for r in results], np.int32),
      tool_errors_B=np.asarray([r.tool_errors for r in results], np.int32),
      process_B=np.asarray([0] * len(results) if processes is None else list(processes), np.int32),
      policy_version=policy_version,
    )

  @classmethod
  def from_records(
    cls, records: Sequence[Mapping[str, Any]], traj: Trajectory, builders: Sequence[RolloutBuilder], tasks=None
  ) -> Rollouts:
    """JSONL rollout records (docs/rollouts-jsonl.md) as `Rollouts`, `traj` their trajectory in the records' order
    (`rollout.jsonl.records_to_trajectory`) and `builders` theirs (`record_to_builder`); `tasks` one per record, or
    None (no pass needs them). Tool counts come from each record's metadata (0 where absent)."""
    meta = [r.get("metadata") or {} for r in records]
    return cls(
      traj=traj,
      tasks=tuple(tasks) if tasks is not None else (None,) * len(records),
      messages=tuple(list(r.get("messages") or []) for r in records),
      builders=tuple(builders),
      rewards=tuple(float(r["reward"]) for r in records),
      finish=tuple(r.get("finish") for r in records),
      tool_calls_B=np.asarray([int(m.get("tool_calls", 0)) for m in meta], np.int32),
      tool_errors_B=np.asarray([int(m.get("tool_errors", 0)) for m in meta], np.int32),
      process_B=np.asarray([int(m.get("process", 0)) for m in meta], np.int32),
      policy_version=None,
    )


@dataclasses.dataclass(frozen=True)
class LossInput:
  """The typed input of one loss term that a method feeds (`LossTerm.input` declares the class; the method returns
  an instance in `MethodOutput.loss_inputs[term]`). Subclasses are frozen dataclasses whose fields are per-token
  arrays at the rollouts' layout, named with their shape: `*_BxL` float32 [B, L], `*_BxLxD` float32 [B, L, D] (HSD's
  teacher hidden states). In the update batch each becomes one array of `UpdateBatch.inputs_NxK`, keyed by its
  name without the shape suffix (`batch_key`: `distill_target_BxL` -> "distill_target") and read at the scored slots.
  """

  @classmethod
  def keys(cls) -> tuple[str, ...]:
    """The input's field names (`*_BxL`, `*_BxLxD`)."""
    return tuple(f.name for f in dataclasses.fields(cls))

  @classmethod
  def batch_keys(cls) -> tuple[str, ...]:
    """Its arrays' keys in `UpdateBatch.inputs_NxK`: the field names without the shape suffix."""
    return tuple(batch_key(k) for k in cls.keys())

  def batch_arrays(self, shape_BxL: tuple[int, ...], *, term: str) -> dict[str, np.ndarray]:
    """{batch key: float32 array} for the update batch, each checked against the advantages' [B, L] shape.

    Raises:
      ValueError: a field whose shape is not `shape_BxL` (with a trailing axis D for `*_BxLxD`), naming the loss
        term, the class and the field.
    """
    out = {}
    want = tuple(shape_BxL)
    for f in dataclasses.fields(self):
      value = np.asarray(getattr(self, f.name), np.float32)
      per_dim = f.name.endswith("_BxLxD")
      if (value.ndim != 3 or value.shape[:2] != want) if per_dim else value.shape != want:
        raise ValueError(
          f"loss term {term!r}: {type(self).__name__}.{f.name} has shape {value.shape}, expected the advantages' "
          f"{want}" + (" with a trailing axis D" if per_dim else "")
        )
      out[batch_key(f.name)] = value
    return out


def batch_key(field: str) -> str:
  """A `LossInput` field's key in the update batch: its name without the shape suffix ("_BxL" or "_BxLxD").

  Raises:
    ValueError: a name with neither suffix.
  """
  for suffix in ("_BxLxD", "_BxL"):
    if field.endswith(suffix) and len(field) > len(suffix):
      return field[: -len(suffix)]
  raise ValueError(f"a loss input's field is named with its shape, *_BxL or *_BxLxD; got {field!r}")


@dataclasses.dataclass(frozen=True)
class DistillInput(LossInput):
  """The "distill" term's input (ToolOPD): per action token, the weight of the distillation toward the teacher's
  log-prob of the sampled token and that log-prob (nats)."""

  distill_weight_BxL: np.ndarray
  distill_target_BxL: np.ndarray


@dataclasses.dataclass(frozen=True)
class VocabKLInput(LossInput):
  """The "vocab_kl" term's input (HSD): the teacher's final hidden state that predicted each token ([B, L, D], the
  policy's width) and the per-token weight of the full-vocabulary KL (1 on distilled action tokens, else 0)."""

  teacher_hidden_BxLxD: np.ndarray
  vocab_kl_weight_BxL: np.ndarray


# ---------------------------------------------------------------------------------------------------------------
# The update batch

# Axes of the update batch: N rows, L token slots per row, K scored slots per row. Unpacked, a row is one rollout
# (N = B) and K = L (every slot, the action mask picks the scored ones); packed (`PackedLayout`), a row holds a
# group's prompt once and its rollouts' continuations, and K is the row's scored (action) slots, padded.


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedLayout:
  """How a packed update batch's rows are laid out: the rows as `jaxcredit.packed_rows.lay_out_rows` built them
  (positions, segments, prefix limits, scored slots) and which rollout each scored slot holds.

  Attributes:
    positions_NxL: int32 [N, L] RoPE positions (a continuation goes on at its position in its own rollout).
    segment_ids_NxL: int32 [N, L] 0 on the shared prefix, k on the row's k-th rollout continuation.
    prefix_limit_NxL: int32 [N, L] the prefix slots [0, limit) each slot attends to (besides its own segment).
    slots_NxK: int32 [N, K] the row slot of each scored slot (0 on padding, where `action_mask_NxK` is False).
    rollout_ids_NxK: int32 [N, K] the scored slot's rollout within its row (0, 1, ...), for per-sequence
      aggregation (`jaxcredit.train.loop.loss.aggregate`'s `seq_ids_BxL`).
    rollouts_N: float32 [N] the batch's rollouts counted on the first row, 0 elsewhere (the sequence count of the
      Dr.GRPO denominator, which includes rollouts without a scored token).
  """

  positions_NxL: Any
  segment_ids_NxL: Any
  prefix_limit_NxL: Any
  slots_NxK: Any
  rollout_ids_NxK: Any
  rollouts_N: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class UpdateBatch:
  """One update's batch, what the jitted loss reads (`jaxcredit.train.loop.step.loss_and_grads`): host numpy arrays
  when built, placed on the mesh by `jaxcredit.sharding.shard_batch` (a pytree: every array's leading axis is N).

  Axes (above): N rows, L token slots per row, K scored slots per row (K = L unpacked).

  Attributes:
    tokens_NxL: int32 [N, L] the rows' tokens, right-padded.
    token_mask_NxL: bool [N, L] real tokens (contiguous from slot 0).
    action_mask_NxK: bool [N, K] the scored tokens (the loss's mask; False on padding).
    behavior_logp_NxK: float32 [N, K] nats, the sampler's log-prob of each token (or the trainer's own under the
      weights that sampled it, for an external engine or stale rollouts: `update.engine_correction`).
    adv_NxK: float32 [N, K] the method's token advantages; None where no term reads them (the warm start).
    ref_logp_NxK: float32 [N, K] nats, the reference's log-probs, when a term reads them (the KL terms).
    behavior_weight_NxK: float32 [N, K] the truncated importance weight of an external engine or of stale rollouts,
      or None.
    inputs_NxK: {key: float32 [N, K] or [N, K, D]} the method's loss-term inputs (`LossInput.batch_keys`).
    packed: the packed rows' layout, or None for one rollout per row.
    group_ids_N: int [N] each unpacked row's group (host only: what packing groups prompts by), or None.
  """

  tokens_NxL: Any
  token_mask_NxL: Any
  action_mask_NxK: Any
  behavior_logp_NxK: Any
  adv_NxK: Any = None
  ref_logp_NxK: Any = None
  behavior_weight_NxK: Any = None
  inputs_NxK: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  packed: PackedLayout | None = None
  group_ids_N: Any = None

  @property
  def num_rows(self) -> int:
    return int(self.tokens_NxL.shape[0])

  def scored_arrays(self) -> dict[str, Any]:
    """{name: array} of every per-scored-slot array present ([N, K] or [N, K, D]), the loss inputs by their keys."""
    own = {
      "action_mask": self.action_mask_NxK,
      "behavior_logp": self.behavior_logp_NxK,
      "adv": self.adv_NxK,
      "ref_logp": self.ref_logp_NxK,
      "behavior_weight": self.behavior_weight_NxK,
    }
    return {**{k: v for k, v in own.items() if v is not None}, **self.inputs_NxK}

  def take(self, rows: np.ndarray) -> UpdateBatch:
    """The unpacked batch's `rows` (indices into N), every array with them (a PPO mini-batch).

    Raises:
      ValueError: on a packed batch (its rows mix rollouts).
    """
    if self.packed is not None:
      raise ValueError("UpdateBatch.take: a packed batch's rows mix rollouts; take rows before packing")
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[rows], self)

  def for_device(self) -> UpdateBatch:
    """The batch without its host-only fields (`group_ids_N`), as `shard_batch` places it."""
    return dataclasses.replace(self, group_ids_N=None)
