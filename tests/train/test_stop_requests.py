"""StopRequests: a SIGTERM / Ctrl-C stops every process after the same step, whenever it arrives.

The multi-process decision must come from the all-gathered values alone. A signal that lands in one process after
its all-gather returned (Python runs a handler deferred while blocked in a gloo collective right after that call)
must not make that process stop while the others, which gathered None from it, go on into the next step's
collectives: the coordinator then died at the 300 s shutdown barrier (CI, 2026-12-02)."""

import os
import signal

import pytest

from jaxcredit.train.loop import run as run_lib


class _TwoProcesses:
  """Stands in for jax.process_count and multihost.allgather_objects: this process is 0 of 2; the other process's
  value is `other`; `during_gather` runs while the gather is in flight (a signal arriving then)."""

  def __init__(self, monkeypatch, stop, *, other=None, during_gather=None):
    self.other, self.during_gather, self.gathered = other, during_gather, []
    monkeypatch.setattr(run_lib.jax, "process_count", lambda: 2)
    monkeypatch.setattr(run_lib.multihost, "allgather_objects", self._allgather)

  def _allgather(self, value):
    self.gathered.append(value)
    if self.during_gather is not None:
      self.during_gather()
      self.during_gather = None
    return [value, self.other]


def test_a_signal_during_the_gather_is_agreed_at_the_next_call_on_every_process(monkeypatch):
  stop = run_lib.StopRequests()
  fake = _TwoProcesses(monkeypatch, stop, during_gather=lambda: stop._handle(signal.SIGTERM, None))
  # The other process gathered None from this one, so it goes on: this one must go on too.
  assert stop.agreed() is None
  # The next step's gather carries the signal to every process.
  assert stop.agreed() == signal.SIGTERM
  assert fake.gathered == [None, signal.SIGTERM]


def test_a_signal_seen_by_another_process_stops_this_one(monkeypatch):
  stop = run_lib.StopRequests()
  _TwoProcesses(monkeypatch, stop, other=signal.SIGINT)
  assert stop.agreed() == signal.SIGINT


def test_one_process_returns_its_own_signal_without_a_gather(monkeypatch):
  stop = run_lib.StopRequests()
  monkeypatch.setattr(
    run_lib.multihost, "allgather_objects", lambda v: pytest.fail("a single process gathered"), raising=True
  )
  assert stop.agreed() is None
  stop._handle(signal.SIGTERM, None)
  assert stop.agreed() == signal.SIGTERM


def test_the_handlers_stay_installed_for_the_whole_run_and_are_restored_after(monkeypatch):
  """One `with` block: no window between the warm start and RL where SIGTERM kills the process unchecked."""
  stop = run_lib.StopRequests()
  before = signal.getsignal(signal.SIGTERM)
  with stop:
    assert signal.getsignal(signal.SIGTERM) == stop._handle
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.signum == signal.SIGTERM
    with pytest.raises(KeyboardInterrupt):  # a second signal stops at once
      os.kill(os.getpid(), signal.SIGINT)
  assert signal.getsignal(signal.SIGTERM) == before
