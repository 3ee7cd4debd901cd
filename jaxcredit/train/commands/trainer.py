"""The training loop: warm start, then RL with dense credit; resumable; metrics, curves and checkpoints.

  run = build_run(config)                  # model, tokenizer, env spec, tasks, mesh, teacher, checkpointer
  restore or (eval, warm start, eval, reference + step-0 checkpoint)
  for step in range(start + 1, total_steps + 1):
    rollouts -> trajectory -> PASSES the method needs -> METHODS advantages -> jitted update -> log -> checkpoint
  eval, curves.png

The trainer names no environment and no method: `ENVS` (jaxcredit.envs), `METHODS` (train/tables/methods.py), `PASSES`
(train/tables/passes.py) and `LOSS_TERMS` (train/loop/step.py) are the tables it reads.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from jaxcredit import multihost, output_lock, sharding
from jaxcredit.train.loop import metrics as metrics_lib
from jaxcredit.train.loop import step as step_lib
from jaxcredit.train.loop.async_rollouts import RolloutPipeline
from jaxcredit.train.loop.export import write_viewer
from jaxcredit.train.loop.heldout import eval_heldout, periodic_eval
from jaxcredit.train.loop.rl_step import learn_step, run_rl_step
from jaxcredit.train.loop.run import (
  Run,
  StopRequests,
  TrainingStopped,
  build_run,
  data_iterator,
  progress_bar,
  reference_copy,
  run_steps,
)
from jaxcredit.train.loop.update import loss_config_of
from jaxcredit.train.loop.warm_start import warm_start, write_warm_start_model


def _fresh_start(run: Run, optimizer, opt_sh, data, stop: StopRequests | None = None):
  """Eval, warm start, eval; then the reference and the step-0 checkpoint, written together: a reference left
  by a run that died before its step-0 checkpoint is removed first, so such a workdir always starts over. A
  warm start stopped mid-way resumes (its eval before is not repeated); its checkpoints go once step 0 is saved."""
  c = run.config
  params = run.params
  resuming_warm_start = run.ckpt.latest_warm_start_step() is not None
  if c.eval.before_sft and c.sft.steps > 0 and not resuming_warm_start:
    eval_heldout(run, params, "before_warm_start", 0)
  if c.sft.steps > 0:
    params = warm_start(run, params, stop)
    if c.eval.after_sft:
      eval_heldout(run, params, "after_warm_start", 0)
  ref_params = reference_copy(run, params)
  run.ckpt.remove_reference()
  run.ckpt.save_reference(ref_params)
  opt_state = jax.jit(optimizer.init, out_shardings=opt_sh)(params)
  _save(run, 0, params, opt_state, data.get_state())
  run.ckpt.remove_warm_start()
  return params, opt_state, ref_params


def run_overview(
  c: ml_collections.ConfigDict,
  *,
  resume_step: int | None,
  num_eval_tasks: int,
  sft_only: bool = False,
  warm_start_step: int | None = None,
) -> str:
  """The run's phases and their sizes, in order, as printed when training starts (each phase then has its own
  progress bar). `resume_step` is the latest checkpoint's RL step, or None for a fresh run; `warm_start_step` the
  latest warm-start checkpoint's step (a warm start stopped mid-way), or None."""
  phases = []
  if resume_step is None:
    if c.eval.before_sft and c.sft.steps > 0 and warm_start_step is None:
      phases.append(f"eval ({num_eval_tasks} held-out tasks)")
    sft_evals = f", an eval every {c.eval.sft_every}" if c.eval.sft_every and c.eval.sft_every < c.sft.steps else ""
    if c.sft.steps > 0 and warm_start_step is not None:
      phases.append(f"warm start steps {warm_start_step + 1}-{c.sft.steps} (resumed{sft_evals})")
    elif c.sft.steps > 0:
      phases.append(f"warm start ({c.sft.steps} steps of {c.sft.batch_size} demonstrations{sft_evals})")
      if c.eval.after_sft:
        phases.append(f"eval ({num_eval_tasks})")
  rl_start = 0 if resume_step is None else resume_step
  if not sft_only:
    rollouts = c.rollout.prompts_per_step * c.rollout.group_size
    updates = c.train.ppo_epochs * (rollouts // (c.train.mini_batch_size or rollouts))
    left = max(c.total_steps - rl_start, 0)
    phases.append(
      f"RL steps {rl_start + 1}-{c.total_steps} ({left} x {rollouts} rollouts, {c.credit.method}"
      + (f", {updates} updates each" if updates > 1 else "")
      + (f", rollouts sampled up to {c.rollout.async_depth} step(s) ahead" if c.rollout.async_depth else "")
      + (f", an eval every {c.eval.every}" if c.eval.every and c.eval.every < c.total_steps else "")
      + ")"
      if left
      else f"RL: none left (checkpoint at step {rl_start} of total_steps={c.total_steps})"
    )
    if c.eval.at_end:
      phases.append(f"eval ({num_eval_tasks})")
  if resume_step is not None:
    where = f"resuming at RL step {resume_step}"
  elif warm_start_step is not None:
    where = f"resuming the warm start at step {warm_start_step}"
  else:
    where = "fresh run"
  return f"[jaxcredit] {c.workdir}, {where}: " + " -> ".join(phases)


def train(config: ml_collections.ConfigDict, *, sft_only: bool = False) -> dict:
  """Runs (or resumes) the whole job. Returns the last eval metrics (or {}).

  Everything runs with the policy's sharding table (config.sharding_rules) in force (`sharding.use_rules`); a
  teacher checkpoint's passes run with its own (config.teacher.sharding_rules).

  Raises:
    output_lock.OutputBusyError: another process is writing to `config.workdir`.
  """
  # One writer per workdir (`jaxcredit.output_lock`): the primary process holds its lock from before the config is
  # written to the end; a second run pointed at it is refused, naming the first.
  lock = (
    output_lock.hold(config.workdir, "sft" if sft_only else "train")
    if multihost.is_primary()
    else contextlib.nullcontext()
  )
  with lock:
    run = build_run(config)
    try:
      with sharding.use_rules(run.rules):
        return _train(run, sft_only)
    finally:
      run.close()


def _train(run: Run, sft_only: bool) -> dict:
  # One `with` block from the first checkpoint restore to the last RL step: no window between the warm start and RL
  # where SIGTERM kills the process unchecked. The final eval and reports run outside it (Ctrl-C stops them at once).
  with StopRequests() as stop:
    trained = _warm_start_and_rl(run, sft_only, stop)
  return {} if trained is None else _end_of_training(run, *trained)


def _warm_start_and_rl(run: Run, sft_only: bool, stop: StopRequests) -> tuple[Any, int] | None:
  """The warm start (or the resume) and the RL steps; the trained parameters and the last RL step, or None when
  `sft_only`. Raises TrainingStopped after a checkpointed stop."""
  c = run.config
  optimizer = step_lib.make_optimizer(
    c.optim.learning_rate,
    name=c.optim.name,
    warmup_steps=c.optim.warmup_steps,
    weight_decay=c.optim.weight_decay,
    max_grad_norm=c.optim.max_grad_norm,
    b1=c.optim.b1,
    b2=c.optim.b2,
  )
  opt_sh = step_lib.opt_state_shardings(optimizer, run.params, run.params_shardings, run.mesh)
  data = data_iterator(len(run.train_tasks), c.rollout.prompts_per_step, seed=c.seed)
  latest = run.ckpt.latest_step()
  print(
    run_overview(
      c,
      resume_step=latest,
      num_eval_tasks=len(run.eval_tasks),
      sft_only=sft_only,
      warm_start_step=None if latest is not None else run.ckpt.latest_warm_start_step(),
    )
  )
  if latest is not None:
    params, opt_state, ref_params, rl_step = _resume(run, latest, optimizer, opt_sh, data)
  else:
    params, opt_state, ref_params = _fresh_start(run, optimizer, opt_sh, data, stop)
    rl_step = 0
    signum = stop.agreed()
    if signum is not None:  # a signal during the eval after the warm start: step 0 is checkpointed
      run.writer.close()
      raise TrainingStopped(signum, 0, run.ckpt.directory)
  if sft_only:
    model_dir = write_warm_start_model(run, params)
    print(
      f"[jaxcredit] warm start done; checkpoint in {run.ckpt.directory}"
      + (f"; the policy as a model folder: {model_dir} (use it as --config.model.source)" if model_dir else "")
    )
    run.writer.close()
    return None
  update = step_lib.make_update_fn(
    step_lib.pg_token_loss,
    run.graphdef,
    run.rest,
    optimizer,
    loss_config_of(c),
    run.mesh,
    run.params_shardings,
    opt_sh,
    num_micro=c.train.num_micro_batches,
  )
  # The reference's log-probs when a loss term reads them: the KL term (loss.kl_coef > 0) or a method's own (HSD's).
  reads_ref = any("ref_logp" in step_lib.LOSS_TERMS[t].batch_keys for t in step_lib.loss_terms(loss_config_of(c)))
  ref_logp = step_lib.make_logp_fn(run.graphdef, run.rest, c.sampling.temperature) if reads_ref else None
  return _rl_steps(run, params, opt_state, ref_params, data, update, ref_logp, rl_step, stop)


def _rl_steps(run: Run, params, opt_state, ref_params, data, update, ref_logp, rl_step: int, stop: StopRequests):
  """RL steps `rl_step` + 1 .. total_steps: each step's rollouts (sampled in turn, or ahead on a thread with
  `rollout.async_depth`; train/loop/async_rollouts.py), `learn_step`, then the cadence the warm start shares
  (`run.run_steps`: the checkpoint, a stop, the periodic eval). Returns
  (params, the last RL step); raises TrainingStopped after a checkpointed stop."""
  c = run.config
  bar = progress_bar(c, total=c.total_steps, initial=rl_step, desc="RL")
  pipeline = None
  if c.rollout.async_depth > 0 and rl_step < c.total_steps:
    pipeline = RolloutPipeline(
      run, data, params, first_step=rl_step + 1, last_step=c.total_steps, depth=c.rollout.async_depth
    )

  def one_step(s: int) -> None:
    nonlocal params, opt_state
    if pipeline is None:
      params, opt_state, row = run_rl_step(run, params, opt_state, ref_params, data, update, ref_logp, s)
    else:
      t0 = time.time()
      sampled = pipeline.take(s)
      params, opt_state, row = learn_step(run, params, opt_state, ref_params, sampled, update, ref_logp, s, t0=t0)
    if not (np.isfinite(row["loss"]) and np.isfinite(row["grad_norm"])):
      raise FloatingPointError(
        f"RL step {s}: loss {row['loss']}, grad norm {row['grad_norm']}; stopping before this state is "
        f"checkpointed (latest good checkpoint: step {run.ckpt.latest_step()} in {run.ckpt.directory})"
      )
    if pipeline is not None:
      pipeline.publish(params)  # the sampler's next weights; the step after the ones in flight is scheduled
    bar.set_postfix(reward=f"{row['reward_mean']:.2f}", loss=f"{row['loss']:.3f}", tools=f"{row['tool_calls']:.1f}")

  def save(s: int) -> None:
    _save(run, s, params, opt_state, data.get_state() if pipeline is None else pipeline.data_state(s))

  try:
    run_steps(
      rl_step + 1,
      c.total_steps,
      one_step,
      stop=stop,
      checkpoint_every=c.checkpoint_every,
      save=save,
      evaluate=lambda s: periodic_eval(run, params, s),
      bar=bar,
      writer=run.writer,
      directory=run.ckpt.directory,
    )
  finally:
    if pipeline is not None:  # rollouts sampled ahead are dropped (sampled again on resume: same prompts and keys)
      pipeline.close()
  return params, max(rl_step, c.total_steps)


def _save(run: Run, rl_step: int, params, opt_state, data_state: dict) -> None:
  """The RL checkpoint of step `rl_step`: parameters, optimizer state, the prompt iterator's state after the step's
  prompts and the policy version."""
  meta = {
    "rl_step": rl_step,
    "data_state": data_state,
    "phase": "rl",
    "seed": run.config.seed,
    "policy_version": run.state.policy_version,
  }
  run.ckpt.save(rl_step, params, opt_state, meta)


def _resume(run: Run, latest: int, optimizer, opt_sh, data):
  """The run's state at its latest RL checkpoint: (params, opt_state, ref_params, rl_step). Metric rows past it are
  dropped (a stop after the checkpoint wrote some), and a periodic eval the stop cut off runs now."""
  params, opt_state, meta = run.ckpt.restore(
    latest, run.params, jax.jit(optimizer.init, out_shardings=opt_sh)(run.params)
  )
  rl_step = int(meta["rl_step"])
  run.state.policy_version = int(meta.get("policy_version", rl_step))  # checkpoints before it was saved: RL steps
  data.set_state(meta["data_state"])
  dropped = run.writer.truncate_after("rl", rl_step) + run.writer.truncate_after("eval", rl_step)
  print(
    f"[jaxcredit] resumed from {run.ckpt.directory} at RL step {rl_step}"
    + (f" (dropped {dropped} metric rows past the checkpoint)" if dropped else "")
  )
  ref_params = run.ckpt.restore_reference(reference_copy(run, run.params))
  if rl_step < run.config.total_steps:  # a stop between the step's checkpoint and its periodic eval: eval it now
    periodic_eval(run, params, rl_step)
  return params, opt_state, ref_params, rl_step


def contrast_summary(rows: list[dict], groups_per_step: int) -> str:
  """One line on the RL steps' groups with an outcome contrast (a success and a failure: the groups an outcome
  advantage learns from), from the rl rows' `contrast_group_frac`; "" without rl rows."""
  fracs = [r["contrast_group_frac"] for r in rows if r.get("phase") == "rl" and "contrast_group_frac" in r]
  if not fracs:
    return ""
  with_contrast = round(sum(fracs) * groups_per_step)
  per_step = ", ".join(str(round(f * groups_per_step)) for f in fracs[-12:])
  return (
    f"RL: {with_contrast} of {len(fracs) * groups_per_step} groups had an outcome contrast (a success and a failure) "
    f"over {len(fracs)} steps{' (the last 12 by step: ' if len(fracs) > 12 else ' (by step: '}{per_step})"
  )


def _end_of_training(run: Run, params, rl_step: int) -> dict:
  """The eval at the end, the curves and the credit viewer; the last eval's metrics (or {})."""
  c = run.config
  last = {}
  if c.eval.at_end:
    last = eval_heldout(run, params, f"rl_step_{rl_step}", rl_step)
  viewer = None
  if run.writer.enabled:
    rows = run.writer.rows()
    summary = contrast_summary(rows, int(c.rollout.prompts_per_step) * max(1, jax.process_count()))
    if summary:
      print(f"[jaxcredit] {summary}")
    metrics_lib.plot_curves(c.workdir, rows)
    viewer = write_viewer(run)
  run.writer.close()
  print(
    f"[jaxcredit] done: {c.workdir}/metrics.jsonl, {c.workdir}/curves.png, checkpoints in {run.ckpt.directory}"
    + (f"; credit viewer: {viewer}" if viewer else "")
  )
  return last
