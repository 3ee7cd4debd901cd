"""The RL step's typed data, after sampling: `Rollouts` (the trajectory arrays with each rollout's host fields) and
`LossInput` (what a method hands one of its loss terms: `DistillInput`, `VocabKLInput`).

A leaf module (numpy and `jaxcredit.trajectory` only). The trainer builds one `Rollouts` per step from the sampled
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
  arrays named as the update batch holds them: `*_BxL` float32 [B, L], `*_BxLxD` float32 [B, L, D] (HSD's teacher
  hidden states). They join the update batch and are packed with it (read at the scored slots).
  """

  @classmethod
  def keys(cls) -> tuple[str, ...]:
    """The update-batch keys the input fills: its field names."""
    return tuple(f.name for f in dataclasses.fields(cls))

  def batch_arrays(self, shape_BxL: tuple[int, ...], *, term: str) -> dict[str, np.ndarray]:
    """{field name: float32 array} for the update batch, each checked against the advantages' [B, L] shape.

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
      out[f.name] = value
    return out


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
