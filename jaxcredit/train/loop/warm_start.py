"""The supervised warm start (`warm_start`): cross-entropy on demonstrations from the training tasks, resumable
from its own checkpoints; and the warm-started policy written as a model folder (`write_warm_start_model`), at its
end and, with `sft.model_every`, every that many steps on the way."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcredit import sharding
from jaxcredit.models import save_converted
from jaxcredit.rollout.multiturn import build_demonstration
from jaxcredit.train.loop import step as step_lib
from jaxcredit.train.loop.heldout import warm_start_eval
from jaxcredit.train.loop.run import Run, StopRequests, data_iterator, progress_bar, run_steps
from jaxcredit.train.loop.update import update_batch
from jaxcredit.trajectory import pack


def warm_start(run: Run, params, stop: StopRequests | None = None) -> Any:
  """Supervised warm start on demonstrations from the training tasks: cross-entropy on the action tokens, or on
  every token when `sft.loss_tokens == "all"` (a policy trained from scratch also learns from the prompts and the
  tool observations, e.g. to copy the names it reads).

  Its steps run with the RL steps' cadence (`run.run_steps`): checkpoints every `sft.checkpoint_every` steps, at
  its last step, and when `stop` has seen SIGTERM / Ctrl-C (then raises `TrainingStopped`), a held-out eval every
  `eval.sft_every` steps; a warm-start checkpoint in the workdir is resumed from: parameters, optimizer state, the
  demonstration order and the demonstration RNG, so the later steps equal an uninterrupted run's. With
  `sft.model_every` = M > 0, the policy after every M-th step before the last is also written as a model folder,
  `workdir/warm_start_model_step_<s>` (`write_warm_start_model`): one warm start then offers RL every earlier point
  of its curve, each equal to the final policy of a warm start stopped there (the schedule does not read
  `sft.steps`).
  """
  c = run.config
  optimizer = step_lib.make_optimizer(
    c.sft.learning_rate, warmup_steps=c.sft.warmup_steps, max_grad_norm=c.optim.max_grad_norm
  )
  opt_sh = step_lib.opt_state_shardings(optimizer, params, run.params_shardings, run.mesh)
  opt_state = jax.jit(optimizer.init, out_shardings=opt_sh)(params)
  update = step_lib.make_update_fn(
    step_lib.pg_token_loss,
    run.graphdef,
    run.rest,
    optimizer,
    step_lib.SFT_LOSS,
    run.mesh,
    run.params_shardings,
    opt_sh,
    num_micro=c.train.num_micro_batches,
  )
  data = data_iterator(len(run.train_tasks), c.sft.batch_size, seed=c.seed + 1)
  rng = np.random.default_rng(c.seed)
  start = run.ckpt.latest_warm_start_step()
  if start is not None:
    params, opt_state, meta = run.ckpt.restore_warm_start(start, params, opt_state)
    run.state.policy_version = start  # one update per warm-start step
    data.set_state(meta["data_state"])
    rng.bit_generator.state = meta["rng_state"]
    dropped = run.writer.truncate_after("sft", start)
    print(
      f"[jaxcredit] warm start resumed from {run.ckpt.warm_start_dir} at step {start}"
      + (f" (dropped {dropped} metric rows past it)" if dropped else "")
    )
  else:
    start = 0
    params = jax.tree_util.tree_map(jnp.copy, params)  # the update donates its input
  demonstration = run.env.demonstration
  if demonstration is None:  # build_run() refuses a warm start on such an environment first
    raise ValueError(f"environment {c.env.name!r} has no demonstrations for a warm start; set config.sft.steps=0")
  bar = progress_bar(c, total=c.sft.steps, initial=start, desc="warm start")
  if start > 0:  # a stop between a step's checkpoint and its eval: eval it now (not again if it has one)
    warm_start_eval(run, params, start)

  def one_step(s: int) -> None:
    nonlocal params, opt_state
    t0 = time.time()
    demos = [build_demonstration(run.tok, run.fmt, demonstration(run.train_tasks[int(i)], rng)) for i in next(data)]
    traj = pack(
      demos,
      [0.0] * len(demos),
      list(range(len(demos))),
      # a demonstration of a multi-request session spans several units; the warm start reads no reward of any
      unit_rewards=[[0.0] * (d.unit + 1) for d in demos],
      max_turns=run.env.max_turns,
      pad_id=run.tok.pad_id,
      length_bucket=c.sft.length_bucket,
    )
    batch = update_batch(traj).for_device()
    if c.sft.loss_tokens == "all":
      # every real token after a row's first is a target: prompts and tool observations too
      all_tokens = traj.token_mask_BxL & (np.cumsum(traj.token_mask_BxL, axis=1) > 1)
      batch = dataclasses.replace(batch, action_mask_NxK=all_tokens)
    n_tok = int(batch.action_mask_NxK.sum())
    params, opt_state, m = update(params, opt_state, sharding.shard_batch(batch, run.mesh))
    run.state.policy_version += 1
    m = jax.device_get(m)
    dt = time.time() - t0
    row = {"loss": float(m["loss"]), "grad_norm": float(m["grad_norm"]), "action_tokens": n_tok}
    run.writer.write("sft", s, {**row, "tokens_per_s": traj.token_mask_BxL.sum() / dt, "step_s": dt})
    if c.sft.model_every and s % c.sft.model_every == 0 and s < c.sft.steps:
      write_warm_start_model(run, params, step=s)

  def save(s: int) -> None:
    meta = {"sft_step": s, "data_state": data.get_state(), "rng_state": rng.bit_generator.state, "phase": "sft"}
    run.ckpt.save_warm_start(s, params, opt_state, meta)

  run_steps(
    start + 1,
    c.sft.steps,
    one_step,
    stop=stop,
    checkpoint_every=c.sft.checkpoint_every,
    save=save,
    evaluate=lambda s: warm_start_eval(run, params, s),
    bar=bar,
    writer=run.writer,
    directory=run.ckpt.warm_start_dir,
    phase="warm-start",
  )
  return params


def write_warm_start_model(run: Run, params, step: int | None = None) -> str | None:
  """The warm-started policy as a converted model folder, `workdir/warm_start_model` (float32 parameters, the
  tokenizer, provenance in source.json), so that several RL runs can start from one warm start with
  `config.model.source` pointing at it and `config.sft.steps=0`. `step`: the policy after that warm-start step,
  written to `workdir/warm_start_model_step_<step>` instead (`sft.model_every`); source.json's `sft_steps` is the
  step it holds. Written by one process of a single-process run only (gathering a sharded model to one host is not
  done here); returns the folder, or None when not written (an existing folder of that name is replaced)."""
  if jax.process_count() > 1:
    if step is None:
      print("[jaxcredit] several processes: the warm-started policy stays in the checkpoint only (no model folder)")
    return None
  name = "warm_start_model" if step is None else f"warm_start_model_step_{step}"
  folder = os.path.join(run.config.workdir, name)
  if os.path.exists(folder):
    shutil.rmtree(folder)
  source = {
    "warm_start_of": str(run.config.model.source),
    "workdir": os.path.abspath(run.config.workdir),
    "sft_steps": int(run.config.sft.steps if step is None else step),
    "env": str(run.config.env.name),
    "seed": int(run.config.seed),
  }
  save_converted(folder, run.model_cfg, nnx.to_pure_dict(jax.device_get(params)), run.tok, source=source)
  return folder
