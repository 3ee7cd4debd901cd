"""Replays a multi-process run's RL steps in one process: `python -m tests.integration.multihost_replay RUN_WORKDIR
REPLAY_WORKDIR OUT_JSON -- CLI overrides...` (the run's own `--config.` overrides).

For each RL step N: from the run's checkpoint N-1 (and its reference), the step's exported rollouts
(rollouts/step_N.jsonl, every process's) go through `rl_step_lib.learn_step` on this process's mesh. OUT_JSON gets the
replayed loss and gradient norm of every step, and the largest difference between the replayed parameters and the
run's checkpoint N, the largest change the run made in that step (with SGD at learning rate 1 the change is the
gradient) and the largest parameter magnitude.
"""

import json
import sys

import jax
import numpy as np


def main(run_dir: str, replay_dir: str, out_path: str, overrides: list[str]) -> None:
  from jaxcredit import sharding
  from jaxcredit.cli import _load_config
  from jaxcredit.rollout import jsonl as jsonl_lib
  from jaxcredit.rollout.multiturn import RolloutResult
  from jaxcredit.train.loop import checkpoint as ckpt_lib
  from jaxcredit.train.loop import export
  from jaxcredit.train.loop import rl_step as rl_step_lib
  from jaxcredit.train.loop import run as run_lib
  from jaxcredit.train.loop import step as step_lib
  from jaxcredit.train.loop import update as update_lib

  config = _load_config("train", ["--config", "configs/quickstart.py", *overrides, f"--config.workdir={replay_dir}"])
  run = run_lib.build_run(config, write_config=False)
  c = run.config
  saved = ckpt_lib.Checkpointer(run_dir, max_to_keep=100)
  optimizer = step_lib.make_optimizer(
    c.optim.learning_rate, name=c.optim.name, max_grad_norm=c.optim.max_grad_norm, weight_decay=c.optim.weight_decay
  )
  opt_sh = step_lib.opt_state_shardings(optimizer, run.params, run.params_shardings, run.mesh)
  opt_like = jax.jit(optimizer.init, out_shardings=opt_sh)(run.params)
  ref_params = saved.restore_reference(run_lib.reference_copy(run, run.params))
  update = step_lib.make_update_fn(
    step_lib.pg_token_loss,
    run.graphdef,
    run.rest,
    optimizer,
    update_lib.loss_config_of(c),
    run.mesh,
    run.params_shardings,
    opt_sh,
    num_micro=c.train.num_micro_batches,
  )
  by_id = {export.task_id_of(t): t for t in run.train_tasks}
  out = {"devices": jax.device_count(), "processes": jax.process_count(), "steps": []}
  for rl_step in range(1, c.total_steps + 1):
    records = jsonl_lib.read_jsonl(f"{run_dir}/rollouts/step_{rl_step}.jsonl")
    results = [
      RolloutResult(
        builder=jsonl_lib.record_to_builder(r),
        env=None,
        reward=float(r["reward"]),
        finish=r["finish"],
        tool_calls=int(r["metadata"]["tool_calls"]),
        tool_errors=int(r["metadata"]["tool_errors"]),
        messages=r["messages"],
      )
      for r in records
    ]
    sampled = rl_step_lib.StepRollouts(
      tasks=[by_id[r["task_id"]] for r in records],
      results=results,
      unit_rewards=None if run.env.unit_rewards is None else [r["unit_rewards"] for r in records],
      processes=[0] * len(records),
      env_metrics={},
      sampler_stats={},
      seconds=0.0,
    )
    before = jax.tree.map(np.asarray, saved.restore_params(rl_step - 1, run.params))
    params, opt_state, _ = saved.restore(rl_step - 1, run.params, opt_like)
    with sharding.use_rules(run.rules):
      params, opt_state, row = rl_step_lib.learn_step(
        run, params, opt_state, ref_params, sampled, update, None, rl_step
      )
    theirs = jax.tree.map(np.asarray, saved.restore_params(rl_step, run.params))
    mine = jax.tree.map(np.asarray, params)
    change = max(float(np.max(np.abs(t - b))) for t, b in zip(jax.tree.leaves(theirs), jax.tree.leaves(before)))
    diff = max(float(np.max(np.abs(m - t))) for m, t in zip(jax.tree.leaves(mine), jax.tree.leaves(theirs)))
    scale = max(float(np.max(np.abs(t))) for t in jax.tree.leaves(theirs))
    out["steps"].append(
      {
        "step": rl_step,
        "loss": row["loss"],
        "grad_norm": row["grad_norm"],
        "change": change,
        "diff": diff,
        "scale": scale,
      }
    )
  with open(out_path, "w") as f:
    json.dump(out, f)


if __name__ == "__main__":
  args = sys.argv[1:]
  split = args.index("--")
  main(*args[:split], args[split + 1 :])
