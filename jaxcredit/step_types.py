"""The RL step's typed data, after sampling: `Rollouts` (the trajectory arrays with each rollout's host fields),
`LossInput` (what a method hands one of its loss terms: `DistillInput`, `VocabKLInput`) and `UpdateBatch` (what the
jitted update reads, unpacked or packed: `PackedLayout`).

A leaf module (jax, numpy and `jaxcredit.trajectory` only). The trainer builds one `Rollouts` per step from the sampled
rollouts (`Rollouts.from_results`, after the gather over processes), `jaxcredit credit` builds one from JSONL
records (`Rollouts.from_records`); the passes, the method, the metrics row and the exports read it. Nothing after
it reads the sampler's results (which hold live environment objects) or parallel lists of them.

Shape letters as in `jaxcredit.trajectory`: B rollouts (group after group in training; any order offline, the
groups given by `traj.group_ids_B`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxcredit.trajectory import RolloutBuilder, Trajectory, pack


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
