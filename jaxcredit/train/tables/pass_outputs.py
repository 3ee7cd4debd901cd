"""The passes' outputs as declared types: each `PASSES` row names its output class, a dataclass whose fields carry
their axes, and a method reads a pass's output as that class (`read_output`).

    out = read_output(traj, "teacher_plain", TeacherOutput)     # refused unless the method runs that pass
    out.logp_BxL[b, t], out.valid_B[b]

Axes (a field's `axes` metadata; the shape suffix of its name says the same): "B" rollouts, "L" rollout tokens
(padded, as `traj.tokens_BxL`), "T1" turn boundaries (`traj.boundary_mask_BxT1`: turns + 1), "D" a model's hidden size,
"2" a pair. Strings per rollout are lists with axes ("B",). The declared axes are what the trainer checks a pass's
output against (`check_axes`), what `jaxcredit credit` / the rollout export cut each rollout's share by
(`rollout_values`), and what `method_checks.check_knobs` builds its stand-in outputs from (`stand_in`).

Every output has `valid_B` (bool: the pass could score the rollout) and `reasons` ("" when valid, else why not:
"no_context", "over_budget", "non_finite", "no_boundary", "empty_skill", "no_peer", "not_mixed", "empty_summary"). A
rollout whose pass is invalid loses only its dense term; its rows are 0 and are never read as scores.

A leaf module: numpy and dataclasses only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, TypeVar

import numpy as np

AXIS_SIZES_FOR_STAND_INS = {"D": 4, "2": 2}
"""Sizes of the axes a trajectory does not fix, in `stand_in` outputs."""


def output_field(*axes: str, dtype: Any = np.float32, stand_in: Any = 0) -> Any:
  """A pass output's field: its `axes` (leading "B"), the dtype of its `stand_in` value (str for a list of strings) and
  that value (a constant, or a function of the shape returning the array) in `check_knobs`' stand-in outputs."""
  if not axes or axes[0] != "B":
    raise ValueError(f"a pass output field's axes start with 'B' (one row per rollout), got {axes}")
  return dataclasses.field(metadata={"axes": tuple(axes), "dtype": dtype, "stand_in": stand_in})


T = TypeVar("T", bound="PassOutput")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PassOutput:
  """What every pass returns (subclass it to add fields with `output_field`).

  Attributes:
    valid_B: bool [B], False where the pass could not score the rollout.
    reasons: [B] strings, "" when valid, else why not.
  """

  valid_B: np.ndarray = output_field("B", dtype=bool, stand_in=True)
  reasons: list[str] = output_field("B", dtype=str, stand_in="")

  @classmethod
  def axes(cls) -> dict[str, tuple[str, ...]]:
    """{field: its axes}, in declaration order."""
    return {f.name: f.metadata["axes"] for f in dataclasses.fields(cls)}

  def values(self) -> dict[str, Any]:
    """{field: value} (no copies)."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

  def check_axes(self, sizes: Mapping[str, int], who: str) -> None:
    """Refuses a field whose shape is not its axes' sizes (`sizes`: "B", "L", "T1"; "D" and "2" as they come, "2"
    only 2), or a per-rollout list of another length.

    Raises:
      ValueError: naming `who` (the pass), the field, its axes and both shapes.
    """
    seen = dict(sizes)
    for name, axes in self.axes().items():
      value = getattr(self, name)
      shape = (len(value),) if isinstance(value, (list, tuple)) else tuple(np.shape(value))
      want = []
      for axis, n in zip(axes, shape + (None,) * len(axes)):
        want.append(seen.setdefault(axis, n) if axis != "2" else 2)
      if len(shape) != len(axes) or tuple(want) != shape:
        raise ValueError(
          f"pass {who!r}: its output's {name} has shape {shape}, but its declared axes {axes} are {tuple(want)} here"
        )

  @classmethod
  def stand_in(cls: type[T], sizes: Mapping[str, int]) -> T:
    """An output of this class with every rollout valid and each field its declared stand-in value, shaped by
    `sizes` ("B", "L", "T1"; "D" = 4, "2" = 2): what `check_knobs` runs a method on."""
    sizes = {**AXIS_SIZES_FOR_STAND_INS, **sizes}
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
      shape = tuple(sizes[a] for a in f.metadata["axes"])
      fill, dtype = f.metadata["stand_in"], f.metadata["dtype"]
      if dtype is str:
        kwargs[f.name] = [fill] * shape[0]
      elif callable(fill):
        kwargs[f.name] = np.asarray(fill(shape), dtype)
      else:
        kwargs[f.name] = np.full(shape, fill, dtype)
    return cls(**kwargs)

  def rollout_values(self, i: int, turns: int, tokens: int) -> dict[str, Any]:
    """Rollout i's share as JSON values (`export.rollout_values`): each field's row i, per-token rows cut to its
    `tokens`, per-boundary rows to `turns` + 1; vectors per token (hidden states, axes ending in "D") left out."""
    return rollout_values(self.values(), self.axes(), i, turns=turns, tokens=tokens)


def rollout_values(
  values: Mapping[str, Any], axes: Mapping[str, tuple[str, ...]], i: int, *, turns: int, tokens: int
) -> dict[str, Any]:
  """Row i of each value by its declared `axes` (fields without axes are left out), as JSON values: "L" cut to
  `tokens`, "T" to `turns`, "T1" to `turns` + 1, non-finite numbers as None; vectors per token ("D") left out."""
  cut = {"L": tokens, "T": turns, "T1": turns + 1}
  row: dict[str, Any] = {}
  for key, value in values.items():
    ax = axes.get(key)
    if ax is None or "D" in ax:
      continue
    if isinstance(value, (list, tuple)):
      v = value[i]
      row[key] = v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
      continue
    x = np.asarray(value)[i]
    if len(ax) > 1 and ax[1] in cut:
      x = x[: cut[ax[1]]]
    if np.issubdtype(x.dtype, np.floating):
      x = np.where(np.isfinite(x), x, np.nan).astype(np.float64)
      none = np.asarray(None, dtype=object)
      row[key] = np.where(np.isnan(x), none, x).tolist() if x.ndim else (float(x) if np.isfinite(x) else None)
    else:
      row[key] = x.tolist()
  return row


class PassReadError(ValueError):
  """A method read a pass it does not run, or read a pass's output as a class it is not (`read_output`)."""


def read_output(traj: Any, name: str, kind: type[T]) -> T:
  """`traj.passes[name]` as `kind`, for a method's advantage function.

  Raises:
    PassReadError: when the method does not run pass `name` (naming it and the passes that ran), or when that pass's
      output is not a `kind` (naming both classes).
  """
  out = traj.passes.get(name)
  if out is None:
    raise PassReadError(
      f"reads the output of pass {name!r}, which is not among the passes it runs {tuple(traj.passes)}"
    )
  if not isinstance(out, kind):
    raise PassReadError(f"reads pass {name!r} as {kind.__name__}, but that pass outputs {type(out).__name__}")
  return out


# ---------------------------------------------------------------------------------------------------------------
# The shipped passes' outputs (jaxcredit.train.tables.passes.PASSES).


def _alternating(shape: tuple[int, ...]) -> np.ndarray:
  return np.arange(shape[0]) % 2 == 0  # a success and a failure: a mixed group of two


@dataclasses.dataclass(frozen=True, kw_only=True)
class GoldAnswerOutput(PassOutput):
  """`gold_answer` (TRACE): log p_ref(y* | s_t) at every boundary.

  Attributes:
    gold_logp_BxT1: float32 [B, T1] nats: the reference's (mean or summed, `gold_reduce`) log-prob of the gold answer
      at each boundary, 0 where `boundary_mask_BxT1` is False.
    boundary_mask_BxT1: bool [B, T1], True at the rollout's real boundaries (s_0 .. s_T).
  """

  gold_logp_BxT1: np.ndarray = output_field("B", "T1")
  boundary_mask_BxT1: np.ndarray = output_field("B", "T1", dtype=bool, stand_in=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherOutput(PassOutput):
  """A teacher pass: the teacher's scores of the rollout's own action tokens.

  Attributes:
    logp_BxL, entropy_BxL: float32 [B, L] nats on action tokens of valid rollouts, 0 elsewhere.
    context_cut_tokens_B: int32 [B], tokens cut from the context to fit `teacher.max_context_tokens`.
  """

  logp_BxL: np.ndarray = output_field("B", "L")
  entropy_BxL: np.ndarray = output_field("B", "L")
  context_cut_tokens_B: np.ndarray = output_field("B", dtype=np.int32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PeerTeacherOutput(TeacherOutput):
  """`teacher_peer` (hsd_grpo): a teacher pass shown a successful peer. peer_B: int32 [B], the peer's batch row, -1
  for none."""

  peer_B: np.ndarray = output_field("B", dtype=np.int32, stand_in=-1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PeerStatesOutput(PeerTeacherOutput):
  """`teacher_peer_states` (HSD): as `PeerTeacherOutput` with hidden_BxLxD, float32 [B, L, D], the teacher's final
  hidden states that predict each action token (0 elsewhere): its whole distribution there, with its head."""

  hidden_BxLxD: np.ndarray = output_field("B", "L", "D")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DivergenceOutput(TeacherOutput):
  """A teacher pass with the policy beside it (GEAR, SGCD). divergence_BxL: float32 [B, L] nats, the full-vocabulary
  reverse KL(policy || teacher) at each action token; student_entropy_BxL: the policy's entropy there."""

  divergence_BxL: np.ndarray = output_field("B", "L")
  student_entropy_BxL: np.ndarray = output_field("B", "L")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SkillOutput(PassOutput):
  """`hindsight_skill` (ToolOPD): skills, [B] strings the teacher wrote; skill_tokens_B, int32 [B], their tokens;
  success_B, bool [B], the rollout's outcome the skill was written from."""

  skills: list[str] = output_field("B", dtype=str, stand_in="s")
  skill_tokens_B: np.ndarray = output_field("B", dtype=np.int32, stand_in=1)
  success_B: np.ndarray = output_field("B", dtype=bool, stand_in=_alternating)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SiblingSummaryOutput(PassOutput):
  """`sibling_summary` (SGCD): summaries, [B] strings (one per group, repeated on its rollouts); summary_tokens_B,
  int32 [B]; siblings_Bx2, int32 [B, 2], the rows of the successful and failed sibling summarised; mixed_B, bool [B],
  the group holds both outcomes; success_B, bool [B]."""

  summaries: list[str] = output_field("B", dtype=str, stand_in="s")
  summary_tokens_B: np.ndarray = output_field("B", dtype=np.int32, stand_in=1)
  siblings_Bx2: np.ndarray = output_field("B", "2", dtype=np.int32)
  mixed_B: np.ndarray = output_field("B", dtype=bool, stand_in=True)
  success_B: np.ndarray = output_field("B", dtype=bool, stand_in=_alternating)
