"""Stopping a run cleanly: SIGTERM and Ctrl-C finish the step in flight and checkpoint it (`StopRequests`), then
`TrainingStopped` is raised; with several processes every process stops after the same step."""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable

import jax

from jaxcredit import multihost


class TrainingStopped(Exception):
  """Raised by `train` after a SIGTERM or Ctrl-C during the warm start or RL: the step in flight finished and was
  checkpointed."""

  def __init__(self, signum: int, step: int, directory: str, *, phase: str = "RL"):
    self.signum, self.step, self.phase, self.directory = signum, step, phase, directory
    super().__init__(
      f"stopped by {signal.Signals(signum).name} after {phase} step {step}, checkpointed in "
      f"{directory}; the same command resumes from it"
    )


class StopRequests:
  """While active (a `with` block in the main thread), SIGTERM and SIGINT set `signum` instead of stopping the
  process, and print one line; the RL loop then checkpoints the step in flight and stops (preemption, Ctrl-C).
  A second signal raises KeyboardInterrupt at once. Outside the main thread it does nothing. With several
  processes the loop stops when any of them has seen a signal (`agreed`)."""

  def __init__(self):
    self.signum: int | None = None
    self._previous = {}

  def _handle(self, signum, frame):
    if self.signum is not None:
      raise KeyboardInterrupt
    self.signum = signum
    print(
      f"\n[jaxcredit] {signal.Signals(signum).name}: finishing the step in flight, then saving a checkpoint "
      f"(send it again to stop at once)",
      flush=True,
    )

  def agreed(self) -> int | None:
    """The signal this process or any other has seen (None if none): with several processes every one stops after
    the same step (one small all-gather, so every process calls it at the same point)."""
    mine = self.signum  # one read: a signal arriving after it is agreed at the next call, on every process
    if jax.process_count() == 1:
      return mine
    # Decided from the gathered values alone, never from `self.signum` read again: a handler deferred while this
    # process was blocked in the all-gather runs right after it returns, and would make this process stop while
    # the others, which gathered None from it, go on into the next step's collectives.
    seen = [s for s in multihost.allgather_objects(mine) if s is not None]
    return seen[0] if seen else None

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for s in (signal.SIGTERM, signal.SIGINT):
        self._previous[s] = signal.signal(s, self._handle)
    return self

  def __exit__(self, *exc):
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    return False


def run_steps(
  first: int,
  last: int,
  step: Callable[[int], Any],
  *,
  stop: StopRequests | None,
  checkpoint_every: int,
  save: Callable[[int], Any],
  evaluate: Callable[[int], Any],
  bar,
  writer,
  directory: str,
  phase: str = "RL",
) -> None:
  """The cadence the warm start and the RL steps share: for each step `first`..`last`, `step(s)` (the work and its
  metrics row), the progress bar (`bar`, a tqdm), then a checkpoint (`save(s)`) every `checkpoint_every` steps, at
  `last`, and when a SIGTERM or Ctrl-C was seen (`stop.agreed()`, every process alike), then either the stop (the bar
  and `writer` closed, `TrainingStopped` naming `directory` and `phase`) or the step's held-out eval (`evaluate(s)`;
  a stopped step's eval runs when the run resumes).

  Raises:
    TrainingStopped: after a stop, once the step in flight is checkpointed.
  """
  for s in range(first, last + 1):
    step(s)
    bar.update(1)
    signum = stop.agreed() if stop is not None else None
    if s % checkpoint_every == 0 or s == last or signum is not None:
      save(s)
    if signum is not None:
      bar.close()
      writer.close()
      raise TrainingStopped(signum, s, directory, phase=phase)
    evaluate(s)
  bar.close()
