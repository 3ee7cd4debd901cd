"""Held-out evaluation: the rollouts of `config.eval`'s tasks by the current parameters and their metrics, during
training (`eval_heldout`, `warm_start_eval`, `periodic_eval`) and for `jaxcredit eval` (train/commands/evaluate.py), which
samples and scores through the same functions (`sample_eval_batch`, `eval_summaries`, `eval_metrics`)."""

from __future__ import annotations

import math
import time

import jax
import numpy as np

from jaxcredit import multihost
from jaxcredit.envs import EnvSpec
from jaxcredit.rollout.multiturn import RolloutResult
from jaxcredit.train.loop.run import Run, SamplingRun, progress_bar, sample_rollouts, sampling_model

Z95 = 1.959963984540054
"""The standard normal quantile of 0.975: a two-sided 95% interval."""


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
  """Wilson's score interval of a success rate: successes out of n Bernoulli trials.

    p = successes / n,  c = (p + z²/2n) / (1 + z²/n),  h = z / (1 + z²/n) · √(p(1-p)/n + z²/4n²),  [c - h, c + h]

  Unlike p ± z·√(p(1-p)/n) it stays inside [0, 1] and is not empty at p = 0 or 1 (E. B. Wilson, 1927).

  Args:
    successes: int, 0 <= successes <= n.
    n: int >= 1, the number of trials.
    z: the normal quantile (default: 95%, two-sided).

  Returns:
    (low, high), floats in [0, 1].

  Raises:
    ValueError: n < 1 or successes outside [0, n].
  """
  if n < 1 or not 0 <= successes <= n:
    raise ValueError(f"wilson_interval needs 0 <= successes <= n and n >= 1, got successes={successes}, n={n}")
  p = successes / n
  denom = 1 + z * z / n
  center = (p + z * z / (2 * n)) / denom
  half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
  return max(0.0, center - half), min(1.0, center + half)


def eval_key(offset: int) -> jax.Array:
  """The key of the held-out eval batch that starts at rollout `offset`: fixed, so that every eval of a run (and
  `jaxcredit eval` of its checkpoints) draws the same samples when `config.eval.greedy` is off."""
  return jax.random.fold_in(jax.random.key(0), offset)


def sample_eval_batch(run: SamplingRun, tasks, offset: int, *, greedy: bool) -> list[RolloutResult]:
  """One batch of held-out rollouts, one per task of `tasks` (the batch starting at rollout `offset` of the eval),
  by the parameters the sampler holds: greedy, or at the rollouts' temperature and top-p with `eval_key(offset)`.
  `run` needs only `config`, `env`, `tok`, `fmt` and `sampler` (`jaxcredit eval` passes its own)."""
  return sample_rollouts(run, tasks, eval_key(offset), greedy=greedy, held_out=True)


def eval_summaries(run: SamplingRun, results) -> list[tuple[bool, int, int, bool]]:
  """Per rollout: (success, tool calls, assistant turns, answered), what `eval_metrics` averages."""
  return [(run.env.is_success(r.reward), r.tool_calls, r.builder.num_turns, r.finish == "answer") for r in results]


def eval_metrics(summaries, env_rows) -> dict:
  """The held-out eval's metrics: success_rate, tool_calls, mean_turns, answered_frac (means over the rollouts'
  `eval_summaries`), the environment's own metrics (the mean of `env_rows`, one `rollout_env_metrics` dict per process)
  and num_tasks (the number of rollouts).

  Raises:
    ValueError: no summaries.
  """
  if not summaries:
    raise ValueError("no held-out rollouts to evaluate (config.eval.num_tasks gave no tasks)")
  success, tool_calls, turns, answered = (np.asarray(x, np.float64) for x in zip(*summaries))
  return {
    "success_rate": float(success.mean()),
    "tool_calls": float(tool_calls.mean()),
    "mean_turns": float(turns.mean()),
    "answered_frac": float(answered.mean()),
    **multihost.mean_of(env_rows),
    "num_tasks": len(summaries),
  }


def eval_heldout(run: Run, params, stage: str, step: int, *, sft_step: int | None = None) -> dict:
  """Rollouts on the held-out tasks, greedy (`config.eval.greedy`, the default) or sampled at the rollouts'
  temperature and top-p with a fixed key per batch (the same draws for every eval of a run); logs a phase="eval" row
  at RL step `step` (0 before RL; a warm-start eval also carries `sft_step`). With several processes each evaluates
  its share of the tasks and the row is over all of them (the environment's own metrics: the mean of the
  processes'). `jaxcredit eval` (train/commands/evaluate.py) samples and scores through the same functions."""
  t0 = time.time()
  results = []
  bs = run.config.eval.batch_size
  mine = run.eval_tasks[multihost.uneven_share(len(run.eval_tasks))]
  model = sampling_model(run, params)  # collective once; the batches below are local
  with run.state.sampler_lock:  # the rollout thread of rollout.async_depth waits meanwhile
    run.sampler.update_model(model, version=run.state.policy_version)
    for i in progress_bar(run.config, iterable=range(0, len(mine), bs), desc=f"eval {stage}", leave=False):
      results += sample_eval_batch(run, mine[i : i + bs], i, greedy=bool(run.config.eval.greedy))
  summaries: list = sum(multihost.allgather_objects(eval_summaries(run, results)), [])
  env_rows = multihost.allgather_objects(rollout_env_metrics(run, results) if results else {})
  m = {"stage": stage, **eval_metrics(summaries, env_rows), "seconds": time.time() - t0}
  if sft_step is not None:
    m["sft_step"] = int(sft_step)
  run.writer.write("eval", step, m)
  n = int(m.get("num_tasks", 0))
  interval = ""
  if n:
    low, high = wilson_interval(round(m["success_rate"] * n), n)
    interval = f" [{low:.2f}, {high:.2f}] of {n}"
  print(
    f"[jaxcredit] eval {stage}: success {m['success_rate']:.3f}{interval}, tool calls {m['tool_calls']:.2f}, "
    f"answered {m['answered_frac']:.2f} ({m['seconds']:.0f}s)"
  )
  return m


def rollout_env_metrics(run: Run, results) -> dict:
  """The environment's own metrics of these rollouts (`EnvSpec.metrics`), as "env/<name>"."""
  if run.env.metrics is None:
    return {}
  return env_metrics_of(run.env, [r.env for r in results])


def env_metrics_of(env: EnvSpec, envs) -> dict:
  """The environment's own metrics (`EnvSpec.metrics`) of finished environment objects, as "env/<name>"; {} when
  it has none."""
  if env.metrics is None:
    return {}
  return {f"env/{k}": float(v) for k, v in env.metrics(list(envs)).items()}


def warm_start_eval(run: Run, params, sft_step: int) -> None:
  """The held-out eval every `config.eval.sft_every` warm-start steps (stage "sft_step_N", RL step 0, `sft_step` N):
  the warm start's learning curve. Not at its last step (eval.after_sft covers it), and not again for a step that
  already has one (a resumed warm start)."""
  every = run.config.eval.sft_every
  if not every or sft_step % every or sft_step >= run.config.sft.steps:
    return
  stage = f"sft_step_{sft_step}"
  if any(r.get("phase") == "eval" and r.get("stage") == stage for r in run.writer.rows()):
    return
  eval_heldout(run, params, stage, 0, sft_step=sft_step)


def periodic_eval(run: Run, params, rl_step: int) -> None:
  """The held-out eval every `config.eval.every` RL steps (stage "rl_step_N"), unless the step already has one or is
  the last (eval.at_end covers it)."""
  every = run.config.eval.every
  if not every or rl_step <= 0 or rl_step % every or rl_step >= run.config.total_steps:
    return
  if any(r.get("phase") == "eval" and r.get("step") == rl_step for r in run.writer.rows()):
    return
  eval_heldout(run, params, f"rl_step_{rl_step}", rl_step)
