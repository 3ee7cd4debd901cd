"""The checks of a `METHODS` row that run when a run is configured (`config.validate`), before any model loads.

    method_knobs(name)         # its config node's defaults: its passes' knobs, then its own
    check_reads(name)          # its declarations agree: passes exist, every read is some earlier pass's write
    check_knobs(name, knobs)   # its advantage function runs on a 2-rollout trajectory with these knobs

A knob outside a credit function's range, a read the row does not declare, or a loss term whose arrays the method
does not return is refused here, naming the config key, not at the run's first RL step.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

from jaxcredit.train.methods import METHODS
from jaxcredit.train.passes import PASSES, split_read
from jaxcredit.trajectory import Trajectory


def method_knobs(name: str) -> dict[str, Any]:
  """The defaults of `config.credit.<name>`: the knobs of the passes method `name` runs (`Pass.knobs`, in its
  `passes` order), then its own (`Method.knobs`, which may set its default for a pass's knob).

  A pass that is not a `PASSES` row adds none (`check_reads` refuses it, naming it, when the method is chosen).
  """
  method = METHODS[name]
  knobs: dict[str, Any] = {}
  for p in method.passes:
    knobs.update(PASSES[p].knobs if p in PASSES else {})
  knobs.update(method.knobs)
  return knobs


def knob_owner(name: str, knob: str) -> str:
  """Who declares knob `knob` of method `name`: "its own knob" or "a knob of its pass 'p'" (for error messages)."""
  for p in METHODS[name].passes:
    if p in PASSES and knob in PASSES[p].knobs:
      return f"a knob of its pass {p!r}"
  return "its own knob"


def check_reads(name: str) -> None:
  """Refuses method `name` when its row's declarations disagree: a pass it runs that is not a `PASSES` row, a read
  that none of its passes writes (`Method.reads` against each `Pass.writes`), or a pass that reads an output no
  earlier pass of the method writes (`Pass.reads`). Runs no model and no credit function.

  Raises:
    ValueError: naming the method, the pass or "pass/key" and the passes the method runs, e.g. "method 'x' reads
      teacher_plain/score_BxL, which none of its passes ('teacher_plain',) writes (teacher_plain writes [...])".
  """
  method = METHODS[name]
  passes = tuple(method.passes)
  unknown = [p for p in passes if p not in PASSES]
  if unknown:
    raise ValueError(
      f"method {name!r} runs pass(es) {unknown}, which are not PASSES rows; known passes: {sorted(PASSES)}"
    )
  for i, p in enumerate(passes):
    for r in PASSES[p].reads:
      src, key = split_read(r, who=f"pass {p!r}")
      earlier = passes[:i]
      if src not in earlier or key not in PASSES[src].writes:
        raise ValueError(
          f"method {name!r}: its pass {p!r} reads {r}, which no pass before it in the method's passes {passes} "
          f"writes; run {src!r} (which must declare {key!r} in its writes) before {p!r}"
        )
  for r in method.reads:
    src, key = split_read(r, who=f"method {name!r}")
    if src not in passes:
      raise ValueError(
        f"method {name!r} reads {r}, but {src!r} is not among the passes it runs {passes}; add it to its `passes`"
      )
    if key not in PASSES[src].writes:
      raise ValueError(
        f"method {name!r} reads {r}, which none of its passes {passes} writes ({src} writes {list(PASSES[src].writes)})"
      )


class UndeclaredReadError(ValueError):
  """A method read a pass output (or a pass) its METHODS row does not declare (`check_knobs`)."""


class _ReadLog(dict):
  """A pass's fake outputs in `check_knobs`: a read of a key the method did not declare raises, naming it."""

  def __init__(self, method: str, pass_name: str, outputs: dict, declared: set):
    super().__init__(outputs)
    self.method, self.pass_name, self.declared = method, pass_name, declared

  def __getitem__(self, key):
    read = f"{self.pass_name}/{key}"
    if read not in self.declared:
      raise UndeclaredReadError(
        f"method {self.method!r} reads {read}, which its METHODS row does not declare in `reads` "
        f"{sorted(self.declared)}; declare every pass output its advantage function reads"
      )
    return super().__getitem__(key)

  def get(self, key, default=None):
    return self[key] if key in self else default


class _PassLog(dict):
  """The fake `traj.passes` of `check_knobs`: reading a pass the method does not run raises, naming it."""

  def __init__(self, method: str, outputs: dict):
    super().__init__(outputs)
    self.method = method

  def __getitem__(self, pass_name):
    if pass_name not in self:
      raise UndeclaredReadError(
        f"method {self.method!r} reads the outputs of pass {pass_name!r}, which is not among the passes it runs "
        f"{tuple(self)}"
      )
    return super().__getitem__(pass_name)


def _fake_output(key: str, traj: Trajectory) -> Any:
  """A valid-looking value of pass output `key` for the 2-rollout trajectory of `check_knobs`: the value of a known
  key, else zeros of the shape its suffix names (`_BxL`, `_BxLxD` with D = 4, `_BxT1`, `_BxT`, `_Bx2`, `_B`), else one string per
  rollout."""
  b = traj.batch_size
  known = {
    "boundary_mask_BxT1": traj.boundary_mask_BxT1,
    "peer_B": np.full(b, -1, np.int32),
    "success_B": np.asarray([True, False]),
    "mixed_B": np.ones(b, bool),
    "valid_B": np.ones(b, bool),
    "reasons": [""] * b,
    "skill_tokens_B": np.ones(b, np.int32),
    "summary_tokens_B": np.ones(b, np.int32),
  }
  if key in known:
    return known[key]
  shapes = {
    "_BxL": traj.tokens_BxL.shape,
    "_BxLxD": traj.tokens_BxL.shape + (4,),
    "_BxT1": traj.boundary_mask_BxT1.shape,
    "_BxT": traj.turn_mask_BxT.shape,
    "_Bx2": (b, 2),
    "_B": (b,),
  }
  for suffix, shape in shapes.items():
    if key.endswith(suffix):
      return np.zeros(shape, np.int32 if suffix == "_Bx2" else np.float32)
  return ["s"] * b


def check_knobs(name: str, knobs: Mapping[str, Any]) -> None:
  """Runs method `name` on a 2-rollout synthetic trajectory, so that the credit functions refuse a knob outside its
  range when the run is configured, not at its first RL step. The trajectory holds the outputs its passes declare
  (`Pass.writes`, every rollout valid; `_fake_output`) and nothing else; reading one the method's row does not
  declare (`Method.reads`) is refused.

  Raises:
    ValueError: "config.credit.<name>.<knob> = <value>: must be ..." where the credit function's message names one
      of `knobs` (`<fn>: knob `<knob>` must be ..., got ...`; the knobs carry the functions' argument names), else
      "config.credit.<name>: " + its message; "method <name> reads <pass>/<key>, which its METHODS row does not
      declare" for an undeclared read; a `MethodOutput.loss_arrays` entry of a wrong key or shape, or a loss term of
      the method (`Method.loss_terms`) whose `batch_keys` the output does not hold, naming the method, term and key.
  """
  from jaxcredit.trajectory import RolloutBuilder, pack

  builders = []
  for _ in range(2):
    b = RolloutBuilder.from_prompt([1, 2])
    b.append_action([3, 4], [-1.0, -1.0])
    builders.append(b)
  traj = pack(builders, [1.0, 0.0], [0, 0], max_turns=1, pad_id=0, length_bucket=4)
  method = METHODS[name]
  declared = set(method.reads)
  traj.passes = _PassLog(
    name,
    {
      p: _ReadLog(name, p, {k: _fake_output(k, traj) for k in PASSES[p].writes}, declared)
      for p in method.passes
      if p in PASSES
    },
  )
  try:
    # Jitted, as in training: run eagerly, every primitive compiled on its own made this 15 s for the ten methods in
    # a fresh process (CrEST alone 4.6 s, on every command that validates), against 3 s jitted.
    out = method.advantages(traj, knobs)
    arrays = out.batch_arrays()  # refuses loss_arrays of a wrong key or shape, by name
  except UndeclaredReadError:
    raise
  except (ValueError, TypeError) as e:
    raise ValueError(knob_error_message(name, knobs, str(e))) from None
  from jaxcredit.train.step import LOSS_TERMS, TRAINER_ARRAYS  # imports the model layers: only here

  for term in method.loss_terms:
    keys = LOSS_TERMS[term].batch_keys if term in LOSS_TERMS else ()
    missing = [k for k in keys if arrays.get(k) is None and k not in TRAINER_ARRAYS]
    if missing:
      raise ValueError(
        f"method {name!r}: loss term {term!r} reads {missing}, which its advantage function does not return "
        f"(MethodOutput.loss_arrays, or the distillation arrays)"
      )


_KNOB_ERROR = re.compile(r"^(?P<fn>\w+): knob `(?P<knob>\w+)` (?P<rule>.*?)(?:, got [^,]*?)?\.?$", re.DOTALL)


def knob_error_message(name: str, knobs: Mapping[str, Any], message: str) -> str:
  """A credit function's knob error (`grpo_advantages: knob `eps` must be > 0.0, got -1.0.`) said with the config
  key and value the user set (`config.credit.grpo.eps = -1.0: must be > 0.0`); any other message is prefixed with
  `config.credit.<name>: `."""
  m = _KNOB_ERROR.match(message)
  if m and m["knob"] in knobs:
    return f"config.credit.{name}.{m['knob']} = {knobs[m['knob']]!r}: {m['rule']}"
  return f"config.credit.{name}: {message}"
