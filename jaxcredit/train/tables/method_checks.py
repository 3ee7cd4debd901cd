"""The checks of a `METHODS` row that run when a run is configured (`config.validate`), before any model loads.

    method_knobs(name)         # its config node's defaults: its passes' knobs, then its own
    check_passes(name)         # its passes exist and run after the passes whose outputs they read
    check_knobs(name, knobs)   # its advantage function runs on stand-ins of its passes' outputs with these knobs

A knob outside a credit function's range, a read of a pass the method does not run, or a loss term whose arrays the
method does not return is refused here, naming the config key, not at the run's first RL step.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxcredit import credit
from jaxcredit.train.tables.methods import METHODS
from jaxcredit.train.tables.pass_outputs import PassReadError
from jaxcredit.train.tables.passes import PASSES


def method_knobs(name: str) -> dict[str, Any]:
  """The defaults of `config.credit.<name>`: the knobs of the passes method `name` runs (`Pass.knobs`, in its
  `passes` order), then its own (`Method.knobs`, which may set its default for a pass's knob).

  A pass that is not a `PASSES` row adds none (`check_passes` refuses it, naming it, when the method is chosen).
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


def check_passes(name: str) -> None:
  """Refuses method `name` when its passes disagree: a pass it runs that is not a `PASSES` row, or a pass that reads
  the output of a pass (`Pass.after`) the method does not run before it. Runs no model and no credit function.

  Raises:
    ValueError: naming the method and the pass, e.g. "method 'x': its pass 'teacher_skill' reads the output of
      'hindsight_skill', which it does not run before it (its passes: (...))".
  """
  passes = tuple(METHODS[name].passes)
  unknown = [p for p in passes if p not in PASSES]
  if unknown:
    raise ValueError(
      f"method {name!r} runs pass(es) {unknown}, which are not PASSES rows; known passes: {sorted(PASSES)}"
    )
  for i, p in enumerate(passes):
    for src in PASSES[p].after:
      if src not in passes[:i]:
        raise ValueError(
          f"method {name!r}: its pass {p!r} reads the output of {src!r}, which it does not run before it (its "
          f"passes: {passes}); run {src!r} before {p!r}"
        )


def check_knobs(name: str, knobs: Mapping[str, Any]) -> None:
  """Runs method `name` on a 2-rollout synthetic trajectory, so that the credit functions refuse a knob outside its
  range when the run is configured, not at its first RL step. The trajectory holds a stand-in output of each pass
  the method runs (`PassOutput.stand_in` of the row's class: every rollout valid) and nothing else, so a read of a
  pass it does not run, or of a field its pass's class lacks, is refused here too.

  Raises:
    ValueError: "config.credit.<name>.<knob> = <value>: must be ..." where the credit function's message names one
      of `knobs` (`<fn>: knob `<knob>` must be ..., got ...`; the knobs carry the functions' argument names), else
      "config.credit.<name>: " + its message; "method <name> reads ..." for a read of a pass it does not run or a
      field its output lacks; "method <name>: loss term ..." for a declared loss term (`Method.loss_terms`) whose
      typed input (`LossTerm.input`) the output lacks or holds misshapen, or an input for a term it does not declare.
  """
  from jaxcredit.trajectory import RolloutBuilder, pack

  builders = []
  for _ in range(2):
    b = RolloutBuilder.from_prompt([1, 2])
    b.append_action([3, 4], [-1.0, -1.0])
    builders.append(b)
  traj = pack(builders, [1.0, 0.0], [0, 0], max_turns=1, pad_id=0, length_bucket=4)
  method = METHODS[name]
  traj.passes = {p: PASSES[p].output.stand_in(traj.axis_sizes()) for p in method.passes if p in PASSES}
  try:
    # Jitted, as in training: run eagerly, every primitive compiled on its own made this 15 s for the ten methods in
    # a fresh process (CrEST alone 4.6 s, on every command that validates), against 3 s jitted.
    out = method.advantages(traj, knobs)
  except PassReadError as e:
    raise ValueError(f"method {name!r} {e}") from None
  except AttributeError as e:  # a field its pass's output class does not declare
    raise ValueError(f"method {name!r} reads a field its passes' outputs do not declare: {e}") from None
  except (ValueError, TypeError) as e:
    raise ValueError(knob_error_message(name, knobs, e)) from None
  from jaxcredit.train.loop.step import LOSS_TERMS, term_inputs  # imports the model layers: only here

  try:
    out.input_arrays(term_inputs(t for t in method.loss_terms if t in LOSS_TERMS))
  except ValueError as e:
    raise ValueError(f"method {name!r}: {e}") from None


def knob_error_message(name: str, knobs: Mapping[str, Any], error: Exception) -> str:
  """A credit function's knob error (`credit.KnobError`: `grpo_advantages: knob `eps` must be > 0.0, got -1.0.`) said
  with the config key and value the user set (`config.credit.grpo.eps = -1.0: must be > 0.0`); any other error's
  message is prefixed with `config.credit.<name>: `."""
  if isinstance(error, credit.KnobError) and error.knob in knobs:
    return f"config.credit.{name}.{error.knob} = {knobs[error.knob]!r}: {error.rule}"
  return f"config.credit.{name}: {error}"
