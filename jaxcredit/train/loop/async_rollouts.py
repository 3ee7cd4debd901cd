"""Rollouts that overlap learning: `rollout.async_depth = k >= 1` samples the next steps' rollouts on a thread
while the learner runs this step's passes, credit and update.

  pipeline = RolloutPipeline(run, data, params, first_step=s, last_step=S, depth=k)
  for step in range(s, S + 1):
    sampled = pipeline.take(step)            # this step's rollouts (gathered over processes)
    params, ... = learn_step(run, params, ..., sampled, ...)
    pipeline.publish(params)                 # the sampler's next weights; schedules step + k + 1
  pipeline.close()

Versions. `RunState.policy_version` counts parameter updates (one per RL step). Step N's update starts from version
V(N) = V(s) + (N - s). Its rollouts are sampled with the newest published weights whose version is at least
V(N) - k, so `policy_staleness` = V(N) - (the sampling version) is at most k; with k = 1 the rollouts of step N + 1
are sampled while step N learns (one step off-policy). The sampler reads its own copy of the weights, made when
they are published (the update donates its input buffers), so the sampling side holds one more copy of the policy
in the compute dtype.

What runs where:
- the rollout thread: binding its copy to the policy's sampler and sampling this process's share of a step's
  groups (`rl_step.sample_local`), holding `run.state.sampler_lock` (evals and a pass that samples with the policy take
  it too, so they wait for the rollouts in progress, and the thread waits for them);
- the main thread, in program order on every process: drawing each step's prompts, copying published weights onto
  the sampler's devices (collective with several processes), gathering each step's rollouts over processes
  (`rl_step.gather_rollouts`), and everything `learn_step` does. Collectives never run on the thread, so every
  process issues them in the same order.

Prompts and keys. Step N's prompts are drawn from the prompt iterator by the main thread when step N is scheduled
(up to k steps ahead) and its key is `fold_in(run.key, N)`, as in the synchronous loop. A checkpoint after step N
records the iterator's state after step N's prompts, so rollouts in flight at a stop are dropped and, on resume,
sampled again from the same prompts and keys (with the resumed weights: a resumed run samples them with fresher
weights than the run that stopped would have).

The off-policy correction: `update.loss_batch` treats rollouts whose sampling version is older than the step's as
another engine's (decoupled PPO with the truncated importance weight; docs/engines.md).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any

import jax
from flax import nnx

from jaxcredit.train.loop import rl_step
from jaxcredit.train.loop.run import Run, reference_copy, sampling_model


def sampler_copy(run: Run, params):
  """The policy as the sampler reads it, in arrays of its own: the update donates (deletes) `params`' buffers while
  the thread samples from this copy. With several processes `sampling_model` already copies onto this process's
  devices (collective)."""
  if run.local_mesh is not None:
    return sampling_model(run, params)
  return nnx.merge(run.graphdef, reference_copy(run, params), run.rest)


@dataclasses.dataclass
class _Job:
  step: int
  prompt_ids: list
  key: jax.Array
  min_version: int


class RolloutPipeline:
  """Samples RL steps `first_step`..`last_step` on a thread, at most `depth` policy versions behind the learner.

  Args:
    run: the training run (its sampler, tasks, environment and `sampler_lock`).
    data: the prompt iterator (`run.data_iterator`); only the main thread draws from it.
    params: the weights the first step's update starts from (version `run.state.policy_version`).
    first_step, last_step: the RL steps to sample (inclusive).
    depth: `rollout.async_depth`, >= 1.

  Raises:
    ValueError: depth < 1.
  """

  def __init__(self, run: Run, data, params, *, first_step: int, last_step: int, depth: int):
    if depth < 1:
      raise ValueError(f"config.rollout.async_depth must be >= 1 for a rollout pipeline, got {depth}")
    self.run = run
    self.depth = int(depth)
    self.first_step, self.last_step = int(first_step), int(last_step)
    self._data = data
    self._first_version = int(run.state.policy_version)
    self._cond = threading.Condition()
    self._jobs: collections.deque[_Job] = collections.deque()
    self._results: dict[int, rl_step.LocalRollouts] = {}
    self._data_states: dict[int, dict] = {}
    self._error: tuple[int, BaseException] | None = None  # (the step being sampled, what it raised)
    self._stopping = False
    self._model: Any = None
    self._version: int | None = None
    self.sampler_idle_s = 0.0  # time the thread waited for weights or work (sampler idle)
    self._scheduled = first_step - 1
    self.publish(params)
    self._thread = threading.Thread(target=self._work, name="jaxcredit-rollouts", daemon=True)
    self._thread.start()
    for step in range(first_step, min(first_step + depth, last_step) + 1):
      self._schedule(step)

  def min_version(self, step: int) -> int:
    """The oldest policy version step `step`'s rollouts may be sampled with: V(step) - depth."""
    return self._first_version + (step - self.first_step) - self.depth

  def publish(self, params) -> None:
    """Hands the sampler the learner's weights at version `run.state.policy_version` (after an update) and schedules the
    next step to sample. Main thread; collective with several processes."""
    model = sampler_copy(self.run, params)
    with self._cond:
      self._model, self._version = model, int(self.run.state.policy_version)
      self._cond.notify_all()
    if self._scheduled >= self.first_step and self._scheduled < self.last_step:
      self._schedule(self._scheduled + 1)

  def _schedule(self, step: int) -> None:
    ids = [int(i) for i in next(self._data)]
    self._data_states[step] = self._data.get_state()
    job = _Job(step, ids, jax.random.fold_in(self.run.key, step), self.min_version(step))
    with self._cond:
      self._jobs.append(job)
      self._scheduled = step
      self._cond.notify_all()

  def data_state(self, step: int) -> dict:
    """The prompt iterator's state right after step `step`'s prompts were drawn: what a checkpoint after step
    `step` records (the steps sampled ahead are drawn again on resume)."""
    return self._data_states[step]

  def take(self, step: int) -> rl_step.StepRollouts:
    """Step `step`'s rollouts, gathered over processes (collective), once the thread has sampled them.

    Raises:
      the rollout thread's own exception when it failed before sampling this step (with a note naming the step it
      was sampling), so the CLI reports it as it would a synchronous one; RuntimeError: the pipeline was closed.
    """
    t0 = time.time()
    with self._cond:
      while step not in self._results and self._error is None and not self._stopping:
        self._cond.wait()
      if step not in self._results and self._error is not None:  # steps sampled before the failure are learnt first
        failed, error = self._error
        error.add_note(f"(raised on the rollout thread while sampling RL step {failed})")
        raise error
      if step not in self._results:
        raise RuntimeError(f"the rollout pipeline was closed before RL step {step}'s rollouts")
      local = self._results.pop(step)
    waited = time.time() - t0
    for old in [s for s in self._data_states if s < step - 1]:
      del self._data_states[old]
    sampled = rl_step.gather_rollouts(self.run, local)
    sampled.timing["learner_wait_s"] = waited  # the learner idle, waiting for this step's rollouts
    sampled.timing["sampler_idle_s"] = self.sampler_idle_s
    self.sampler_idle_s = 0.0
    return sampled

  def close(self) -> None:
    """Stops the thread after the sampling in progress (a step's rollouts cannot be cut short) and drops what was
    sampled ahead. Idempotent."""
    with self._cond:
      self._stopping = True
      self._jobs.clear()
      self._cond.notify_all()
    # A second Ctrl-C must not end the process while the thread is inside XLA (it aborts): wait for it regardless.
    while self._thread.is_alive() and threading.current_thread() is not self._thread:
      try:
        self._thread.join()
      except KeyboardInterrupt:
        print("[jaxcredit] waiting for the rollout thread to finish the rollouts it is sampling", flush=True)
    self._results.clear()
    self._model = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def _work(self) -> None:
    while True:
      t_idle = time.time()
      with self._cond:
        while not self._stopping and not (
          self._jobs and self._version is not None and self._version >= self._jobs[0].min_version
        ):
          self._cond.wait()
        if self._stopping:
          return
        job = self._jobs.popleft()
        model, version = self._model, self._version
      self.sampler_idle_s += time.time() - t_idle
      try:
        local = rl_step.sample_local(self.run, model, job.prompt_ids, job.key, version=version)
      except BaseException as e:  # handed to the learner, which raises it from `take`
        with self._cond:
          self._error = (job.step, e)
          self._cond.notify_all()
        return
      with self._cond:
        self._results[job.step] = local
        self._cond.notify_all()
