"""One RL step, in the order of its phases (`learn_step` reads the same way):

  sampled  = sample_step(run, params, prompt_ids, key)     # group_size rollouts per prompt, gathered over processes
  rollouts = pack_rollouts(run, sampled)                   # typed (jaxcredit.trajectory): arrays + host fields
  run_passes(run, rollouts, ...)                           # the PASSES the method needs fill rollouts.traj.passes
  out      = METHODS[method].advantages(traj, knobs)       # credit
  batch, _ = loss_batch(run, params, ref_params, traj, out, ref_logp)  # update.py: the typed UpdateBatch
  params, opt_state, m = ppo_updates(update, params, opt_state, batch, ...)  # update.py: packed, sharded, step.py
  row      = metrics_row(run, sampled, rollouts, out, m, ...)  # then export_step_rollouts

`run_rl_step` is `sample_step` then `learn_step` (the rest, on given rollouts).
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np

from jaxcredit import multihost
from jaxcredit.train import config as config_lib
from jaxcredit.train.tables import passes as passes_lib
from jaxcredit.train.loop.export import export_rollouts, sample_rows
from jaxcredit.train.loop.heldout import rollout_env_metrics
from jaxcredit.train.tables.methods import METHODS, outcome_advantages
from jaxcredit.train.loop.run import Run, sample_rollouts, sampler_binder, sampling_model
from jaxcredit.train.loop.update import loss_batch, make_packer, ppo_updates
from jaxcredit.trajectory import Rollouts, drop_invalid_behavior_logp, group_index


def run_passes(run: Run, rollouts: Rollouts, params, ref_params, key) -> dict:
  """Runs the chosen method's passes in order on `rollouts` (each reads the trajectory and each rollout's task,
  chat and reward), filling `rollouts.traj.passes`; returns their metrics.

  Raises:
    ValueError: a pass returned another class than its `PASSES` row's output, or arrays whose shapes are not that
      class's declared axes (`PassOutput.check_axes`, naming the pass and the field).
  """
  c = run.config
  method = METHODS[c.credit.method]
  models = {
    "policy": passes_lib.Model(run.graphdef, run.rest, params),
    "reference": passes_lib.Model(run.graphdef, run.rest, ref_params),
  }
  if run.teacher is not None:
    models["checkpoint"] = run.teacher
  if run.summarizer is not None:
    models["summarizer"] = run.summarizer
  source = config_lib.teacher_source(c)
  held: list = []  # the sampler locks a pass took (released below)
  ctx = passes_lib.PassContext(
    config=c,
    knobs=c.credit[c.credit.method],
    tok=run.tok,
    env=run.env,
    tasks=rollouts.tasks,
    messages=rollouts.messages,
    rewards=rollouts.rewards,
    key=key,
    models=models,
    teacher=source if source in ("policy", "reference") else "checkpoint",
    fns=run.pass_fns,
    sampler_for=sampler_binder(run, held),
  )
  traj = rollouts.traj
  row = {}
  try:
    for name in method.passes:
      t0 = time.time()
      output = passes_lib.PASSES[name](ctx, traj)
      output.check_axes(traj.axis_sizes(), name)
      traj.passes[name] = output
      row.update(passes_lib.pass_metrics(name, output, time.time() - t0))
  finally:
    for lock in held:  # a pass that sampled with the policy's sampler held it until now
      lock.release()
  return row


def throughput_metrics(run: Run, tokens: int, step_s: float) -> dict:
  """tokens_per_s_per_chip (the step's real tokens over its whole time, per device of the mesh) and, on a chip
  kind with a known peak (`plan.peak_flops_per_chip`), mfu = 6·N_active·tokens / (step time · chips · peak)."""
  from jaxcredit.topology import peak_flops_per_chip

  chips = run.mesh.size
  out = {"tokens_per_s_per_chip": tokens / max(step_s, 1e-9) / chips}
  peak = peak_flops_per_chip(run.mesh.devices.flat[0].device_kind)
  if peak is not None:
    out["mfu"] = 6 * run.model_cfg.num_params(active=True) * tokens / (max(step_s, 1e-9) * chips * peak)
  return out


@dataclasses.dataclass
class StepRollouts:
  """One RL step's rollouts, identical on every process (each process sampled its share of the prompt groups).

  `results[i].env` is the environment object only where this process sampled rollout i (None for the others':
  environments stay where they ran); `env_metrics` are the environment's own metrics, the mean over processes.
  """

  tasks: list  # the task of each rollout, [B] (group after group)
  results: list  # RolloutResult per rollout, [B]
  unit_rewards: list | None  # per rollout, the verified reward of each unit (EnvSpec.unit_rewards), or None
  processes: list  # the process that sampled each rollout, [B]
  env_metrics: dict
  sampler_stats: dict  # sampler_<counter>: this step's counts, summed over processes
  seconds: float  # the slowest process's sampling time
  # sampler_sync_s: putting the policy's parameters into the sampler (with several processes, each process's copy);
  # rollout_gather_s: gathering every process's rollouts (0 with one process).
  timing: dict = dataclasses.field(default_factory=dict)
  policy_version: int | None = None  # the version of the weights that sampled them (RunState.policy_version)
  # rollout.resample_tied_groups: resample_rounds, resampled_groups, tied_groups_left ({} when off)
  resample_stats: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class LocalRollouts:
  """This process's share of one step's rollouts (`sample_local`), before `gather_rollouts` makes them a
  `StepRollouts` on every process."""

  prompt_ids: list  # the step's global batch of training task indices
  results: list  # RolloutResult per rollout of this process's share
  unit_rewards: list | None
  env_metrics: dict
  sampler_stats: dict
  seconds: float  # binding the weights and sampling
  sync_s: float  # binding the weights (sampler_sync_s)
  policy_version: int | None  # the version of the weights that sampled them


def sample_local(run: Run, model, prompt_ids, key, *, version: int | None) -> LocalRollouts:
  """Samples this process's contiguous share of the step's prompt groups (`group_size` rollouts each) with `model`
  bound to the policy's sampler, holding `run.state.sampler_lock` (the rollout thread of `rollout.async_depth` and the
  evals share the sampler). Not collective: with several processes each process's key is folded with its index.

  Args:
    model: the policy as the sampler reads it (`run.sampling_model`).
    prompt_ids: the step's global batch of training task indices.
    key: the step's key.
    version: the policy version of `model` (`RunState.policy_version` when it was taken).
  """
  c = run.config
  g = c.rollout.group_size
  t0 = time.time()
  mine = prompt_ids[
    multihost.share(len(prompt_ids), what=f"config.rollout.prompts_per_step={len(prompt_ids)}", unit="prompt groups")
  ]
  if jax.process_count() > 1:
    key = jax.random.fold_in(jax.random.fold_in(key, 2), jax.process_index())
  with run.state.sampler_lock:
    stats_before = dict(run.sampler.stats)
    run.sampler.update_model(model, version=version, max_staleness=c.rollout.max_staleness)
    sync_s = time.time() - t0
    results = sample_rollouts(run, [run.train_tasks[i] for i in mine for _ in range(g)], key)
    sampler_stats = {f"sampler_{k}": int(v - stats_before.get(k, 0)) for k, v in run.sampler.stats.items()}
    sampled_version = run.sampler.version
  unit_rewards = [list(run.env.unit_rewards(r.env)) for r in results] if run.env.unit_rewards is not None else None
  return LocalRollouts(
    prompt_ids=list(prompt_ids),
    results=results,
    unit_rewards=unit_rewards,
    env_metrics=rollout_env_metrics(run, results),
    sampler_stats=sampler_stats,
    seconds=time.time() - t0,
    sync_s=sync_s,
    policy_version=sampled_version,
  )


def gather_rollouts(run: Run, local: LocalRollouts) -> StepRollouts:
  """Every process's `LocalRollouts` of one step gathered onto every process, as one `StepRollouts` (rollouts in
  the order of the step's prompt groups). Collective with several processes; with one, a change of type."""
  g = run.config.rollout.group_size
  results, unit_rewards, env_metrics = local.results, local.unit_rewards, local.env_metrics
  sampler_stats, seconds = local.sampler_stats, local.seconds
  processes = [jax.process_index()] * len(results)
  t_gather = time.time()
  if jax.process_count() > 1:
    mine = [dataclasses.replace(r, env=None) for r in results]
    shares = multihost.allgather_objects((mine, unit_rewards, env_metrics, sampler_stats, seconds))
    me = jax.process_index()
    results = sum((results if k == me else share[0] for k, share in enumerate(shares)), [])
    unit_rewards = None if unit_rewards is None else sum((share[1] for share in shares), [])
    env_metrics = multihost.mean_of([share[2] for share in shares])
    sampler_stats = {k: sum(share[3][k] for share in shares) for k in sampler_stats}
    seconds = max(share[4] for share in shares)
    processes = [k for k, share in enumerate(shares) for _ in share[0]]
  timing = {"sampler_sync_s": local.sync_s, "rollout_gather_s": time.time() - t_gather}
  return StepRollouts(
    tasks=[run.train_tasks[int(i)] for i in local.prompt_ids for _ in range(g)],
    results=results,
    unit_rewards=unit_rewards,
    processes=processes,
    env_metrics=env_metrics,
    sampler_stats=sampler_stats,
    seconds=seconds,
    timing=timing,
    policy_version=local.policy_version,
  )


def sample_step(run: Run, params, prompt_ids, key) -> StepRollouts:
  """Samples one RL step's rollouts with `params`: `group_size` per prompt of `prompt_ids` (the step's global batch
  of training task indices). With several processes each samples its contiguous share of the groups on its own
  devices (its key folded with its process index), then all rollouts are gathered onto every process
  (`sample_local`, then `gather_rollouts`). Collective."""
  t0 = time.time()
  model = sampling_model(run, params)
  build_s = time.time() - t0
  local = sample_local(run, model, prompt_ids, key, version=run.state.policy_version)
  local.seconds += build_s
  local.sync_s += build_s
  return gather_rollouts(run, local)


def tied_groups(sampled: StepRollouts, group_size: int) -> list[int]:
  """The groups (indices, in order) whose rollouts all got the same reward: no outcome contrast within them."""
  rewards = np.asarray([r.reward for r in sampled.results], np.float64).reshape(-1, group_size)
  return [k for k in range(len(rewards)) if np.all(rewards[k] == rewards[k, 0])]


def resample_tied_groups(run: Run, params, data, key, sampled: StepRollouts) -> StepRollouts:
  """Dynamic sampling: groups whose rollouts all got the same reward are replaced by groups with both outcomes,
  sampled from the next batches of training prompts, for at most `config.rollout.resample_tied_groups` rounds.

  Each round samples a whole batch (`rollout.prompts_per_step` prompts: the sampler's shapes and every process's
  share stay as in a plain step) and takes its groups that are not tied, in order, for the tied groups, in order.
  Groups still tied after the last round stay (a method may skip them: SGCD's `mixed_groups="skip"`). The step's
  sampling time and sampler counts add up over the rounds; the environment metrics stay those of the first batch.
  Collective, as `sample_step`; every process takes the same decisions (the rewards are gathered).

  Source: DAPO's dynamic sampling ("over-sample and filter out prompts with the accuracy equal to 1 and 0"; Yu et
  al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476, Sec. 3.2); SGCD
  (arXiv 2606.12634) asks for groups with both a successful and a failed sibling. Reading taken: a bounded number of
  rounds rather than sampling until the batch is full, so a step's time stays bounded.

  Returns:
    `sampled` with tied groups replaced (tasks, results, unit_rewards, processes) and `resample_stats`:
    resample_rounds (batches sampled beyond the first), resampled_groups (groups replaced), tied_groups_left.
  """
  c = run.config
  g = c.rollout.group_size
  rounds = int(c.rollout.resample_tied_groups)
  tied = tied_groups(sampled, g)
  replaced = done = 0
  while tied and done < rounds:
    extra = sample_step(run, params, [int(i) for i in next(data)], jax.random.fold_in(key, 1_000_003 + done))
    done += 1
    still_tied = set(tied_groups(extra, g))
    fresh = [k for k in range(len(extra.results) // g) if k not in still_tied]
    for dst, src in zip(tied, fresh):
      rows, new = slice(dst * g, (dst + 1) * g), slice(src * g, (src + 1) * g)
      sampled.tasks[rows] = extra.tasks[new]
      sampled.results[rows] = extra.results[new]
      sampled.processes[rows] = extra.processes[new]
      if sampled.unit_rewards is not None and extra.unit_rewards is not None:
        sampled.unit_rewards[rows] = extra.unit_rewards[new]
      replaced += 1
    tied = tied[len(fresh) :]
    sampled.seconds += extra.seconds
    sampled.sampler_stats = {k: v + extra.sampler_stats.get(k, 0) for k, v in sampled.sampler_stats.items()}
  sampled.resample_stats = {"resample_rounds": done, "resampled_groups": replaced, "tied_groups_left": len(tied)}
  return sampled


def run_rl_step(run: Run, params, opt_state, ref_params, data, update, ref_logp, rl_step: int):
  """One RL step: rollouts (`sample_step`; with `rollout.resample_tied_groups`, tied groups replaced by
  `resample_tied_groups`), then `learn_step`. Returns (params, opt_state, metrics row)."""
  t0 = time.time()
  key = jax.random.fold_in(run.key, rl_step)
  sampled = sample_step(run, params, [int(i) for i in next(data)], key)
  if run.config.rollout.resample_tied_groups > 0:
    sampled = resample_tied_groups(run, params, data, key, sampled)
  return learn_step(run, params, opt_state, ref_params, sampled, update, ref_logp, rl_step, t0=t0)


def learn_step(
  run: Run, params, opt_state, ref_params, sampled: StepRollouts, update, ref_logp, rl_step: int, *, t0=None
):
  """The rest of an RL step on its rollouts: pack, passes, advantages, the PPO updates, the metrics row (written
  every `log_every` steps) and the rollout exports. Returns (params, opt_state, metrics row).

  The same on every process (its inputs are): a 1-process run fed another run's rollouts computes that run's
  losses and gradients."""
  c = run.config
  t0 = time.time() if t0 is None else t0
  key = jax.random.fold_in(run.key, rl_step)
  rollouts = pack_rollouts(run, sampled)
  if not rollouts.traj.action_mask_BxL.any():
    # Every rollout ended before its first turn (a prompt with no room for sampling.max_new_tokens): nothing to learn
    # from, and a run that went on would report loss 0 and exit 0 (issue 54).
    lengths = [len(b) for b in rollouts.builders]
    raise ValueError(
      f"RL step {rl_step}: none of its {len(lengths)} rollouts sampled an action token (their prompts run to "
      f"{max(lengths, default=0)} tokens; a turn needs its context plus config.sampling.max_new_tokens = "
      f"{c.sampling.max_new_tokens} within config.sampling.max_len = {c.sampling.max_len})"
    )
  traj, invalid_row = drop_invalid_behavior_logp(rollouts.traj)
  rollouts = rollouts.with_traj(traj)
  t1 = time.time()
  pass_row = run_passes(run, rollouts, params, ref_params, jax.random.fold_in(key, 1))
  t_passes = time.time() - t1
  out = METHODS[c.credit.method].advantages(traj, c.credit[c.credit.method])
  if out.keep_B is not None:  # a method's own filter (SGCD's dynamic sampling): its dropped rollouts leave the loss
    traj.sample_mask_B = traj.sample_mask_B & np.asarray(out.keep_B, bool)
  t_score = time.time() - t1
  t2 = time.time()
  stale = rollouts.policy_version is not None and rollouts.policy_version < run.state.policy_version
  batch, engine_row = loss_batch(run, params, ref_params, traj, out, ref_logp, off_policy=stale)
  # Their weights are bound again before their next use; the rollout thread of rollout.async_depth samples from
  # its own copy meanwhile, so the policy's sampler keeps it.
  own = run.sampler if c.rollout.async_depth == 0 else None
  for sampler in (own, run.state.teacher_sampler, run.state.summarizer_sampler):
    if sampler is not None:
      sampler.release_weights()
  params, opt_state, m = ppo_updates(
    update,
    params,
    opt_state,
    batch,
    run.mesh,
    epochs=c.train.ppo_epochs,
    mini_batch_size=c.train.mini_batch_size,
    seed=(c.seed, rl_step),
    pack=make_packer(run),
  )
  run.state.policy_version += 1
  seconds = {"rollout_s": sampled.seconds, "passes_s": t_passes, "credit_s": t_score - t_passes, "score_s": t_score}
  seconds.update(update_s=time.time() - t2, step_s=time.time() - t0)
  row = metrics_row(run, sampled, rollouts, out, m, seconds, {**engine_row, **invalid_row}, pass_row)
  if rl_step % c.log_every == 0:
    run.writer.write("rl", rl_step, row)
  export_step_rollouts(run, rollouts, out, rl_step)
  return params, opt_state, row


def pack_rollouts(run: Run, sampled: StepRollouts) -> Rollouts:
  """The step's rollouts as `Rollouts` (`Rollouts.from_results`): rollout k in group k // group_size, rewards and
  per-unit verified rewards as sampled, turns up to the environment's `max_turns`, a rollout whose environment
  failed left out of the loss."""
  return Rollouts.from_results(
    sampled.results,
    sampled.tasks,
    group_size=run.config.rollout.group_size,
    max_turns=run.env.max_turns,
    pad_id=run.tok.pad_id,
    length_bucket=run.config.train.length_bucket,
    unit_rewards=sampled.unit_rewards,
    processes=sampled.processes,
    policy_version=sampled.policy_version,
  )


def metrics_row(
  run: Run, sampled: StepRollouts, rollouts: Rollouts, out, m: dict, seconds: dict, engine_row: dict, pass_row: dict
):
  """The RL step's row of metrics.jsonl (phase "rl"): rollouts (reward, success, turns, tool calls, answered),
  advantages over the action tokens, the updates' loss, clipping and gradient norm (`ppo_updates`' metrics `m`),
  tokens and throughput, the phases' `seconds` (rollout_s, passes_s, credit_s, score_s, update_s, step_s), the
  environment's and the sampler's own metrics (`sampled`: the step's, not the rollouts'), `engine_row` (engine correction, dropped log-probs), staleness,
  units, the method's own metrics and the passes' (`pass_row`). docs/getting-started.md's metrics table lists the keys."""
  c = run.config
  traj = rollouts.traj
  act = traj.action_mask_BxL & traj.sample_mask_B[:, None]
  a = out.adv_BxL[act]
  tm = traj.turn_mask_BxT
  tokens = int(traj.token_mask_BxL.sum())
  success_B = np.asarray([run.env.is_success(r) for r in rollouts.rewards], bool)
  row = {
    "method": c.credit.method,
    "reward_mean": float(np.mean(traj.rewards_B)),
    "success_rate": float(np.mean(success_B)),
    "mean_turns": float(np.mean(rollouts.num_turns_B)),
    "tool_calls": float(np.mean(rollouts.tool_calls_B)),
    "tool_errors": float(np.mean(rollouts.tool_errors_B)),
    "answered_frac": float(np.mean([f == "answer" for f in rollouts.finish])),
    "adv_mean": float(a.mean()) if a.size else 0.0,
    "adv_std": float(a.std()) if a.size else 0.0,
    "loss": float(m["loss"]),
    "clip_frac": float(m["clip"]),
    "ratio_dev": float(m["ratio_dev"]),
    "grad_norm": float(m["grad_norm"]),
    "updates": int(m["updates"]),
    "update_slots": m["update_slots"],
    "update_scored_slots": m["update_scored_slots"],
    "clip_frac_last": m["clip_last"],
    "ratio_dev_last": m["ratio_dev_last"],
    "clip_frac_max": m["clip_max"],
    "ratio_dev_max": m["ratio_dev_max"],
    "action_tokens": int(act.sum()),
    "tokens": tokens,
    "tokens_per_s": float(tokens / max(seconds["update_s"], 1e-9)),
    **seconds,
  }
  row.update(throughput_metrics(run, tokens, seconds["step_s"]))
  row.update(sampled.env_metrics)
  row.update(sampled.sampler_stats)
  row.update(engine_row)
  if rollouts.policy_version is not None:  # how many updates behind the sampling weights were (rollout.max_staleness)
    row["policy_staleness"] = run.state.policy_version - 1 - rollouts.policy_version
  row.update(sampled.resample_stats)
  # sampler_sync_s, rollout_gather_s; with async rollouts also learner_wait_s, sampler_idle_s (async_rollouts.py)
  row.update(sampled.timing)
  if traj.unit_mask_BxU.shape[1] > 1:
    row["units_mean"] = float(traj.unit_mask_BxU.sum(1).mean())
    row["unit_reward_mean"] = float(traj.unit_rewards_BxU[traj.unit_mask_BxU].mean())
  if out.turn_adv_BxT is not None and tm.any():
    row["turn_adv_abs_mean"] = float(np.abs(out.turn_adv_BxT[tm]).mean())
  row.update(credit_diagnostics(traj, out.adv_BxL, success_B))
  # Each term's loss, and a capped term's gradient norms, scale and share (`step.loss_and_grads`, grad_caps).
  row.update({k: float(v) for k, v in m.items() if k.startswith(("loss_", "grad_norm_", "grad_scale_", "grad_share_"))})
  if "kl" in m and c.loss.kl_coef > 0:
    row["kl"] = float(m["kl"])
  row.update({k: v for k, v in out.metrics.items() if v is not None})
  row.update(pass_row)
  return row


def credit_diagnostics(traj, adv_BxL: np.ndarray, success_B: np.ndarray) -> dict[str, float]:
  """Where a step's signal comes from (issue 51: why a dense method does or does not beat GRPO):

  contrast_group_frac          groups whose valid rollouts' rewards are not all equal (GRPO's only source of signal)
  outcome_contrast_group_frac  groups whose valid rollouts hold both a success and a failure (`success_B`, bool [B]:
                               the environment's `is_success` of each reward): the same as contrast_group_frac for a
                               run paid the outcome, and the outcome's contrast for one paid a shaped or partial reward
  nonzero_adv_token_frac       action tokens of valid rollouts with a nonzero advantage
  dense_adv_share              Σ|A - A_grpo| / (Σ|A_grpo| + Σ|A - A_grpo|) over those tokens: the share of the
                               advantage's magnitude that is not the rollout's group-normalised outcome (0 for GRPO)

  Raises ValueError when `success_B` is not one flag per rollout."""
  success_B = np.asarray(success_B, bool)
  if success_B.shape != np.shape(traj.rewards_B):
    raise ValueError(f"success_B: shape {success_B.shape}, expected one flag per rollout {np.shape(traj.rewards_B)}")
  act = traj.action_mask_BxL & traj.sample_mask_B[:, None]
  idx_PxG = group_index(traj.group_ids_B)
  rewards_PxG = np.asarray(traj.rewards_B, np.float64)[idx_PxG]
  valid_PxG = np.asarray(traj.sample_mask_B, bool)[idx_PxG] & np.isfinite(rewards_PxG)
  contrast = [len(set(r[v].tolist())) > 1 for r, v in zip(rewards_PxG, valid_PxG)]
  outcome = [len(set(s[v].tolist())) > 1 for s, v in zip(success_B[idx_PxG], valid_PxG)]
  grpo = outcome_advantages(traj)[:, None] * act
  adv = np.where(act, np.asarray(adv_BxL, np.float64), 0.0)
  dense = float(np.abs(adv - grpo)[act].sum())
  total = float(np.abs(grpo)[act].sum()) + dense
  return {
    "contrast_group_frac": float(np.mean(contrast)) if contrast else 0.0,
    "outcome_contrast_group_frac": float(np.mean(outcome)) if outcome else 0.0,
    "nonzero_adv_token_frac": float(np.mean(adv[act] != 0.0)) if act.any() else 0.0,
    "dense_adv_share": dense / total if total > 0 else 0.0,
  }


def export_step_rollouts(run: Run, rollouts: Rollouts, out, rl_step: int) -> None:
  """On process 0: every rollout of the step to `workdir/rollouts/step_N.jsonl` when `rollout.export_jsonl` is on,
  and the sample the viewer reads (whole groups, with pass outputs and credit details) to
  `workdir/rollout_samples/step_N.jsonl` every `log_rollouts_every` steps (`export_rollouts`)."""
  c = run.config
  exports: list[tuple[str, list[int] | None, bool]] = []  # (folder, rows (None: all), with_passes)
  if c.rollout.export_jsonl:
    exports.append(("rollouts", None, False))
  if c.log_rollouts_every and rl_step % c.log_rollouts_every == 0:
    exports.append(("rollout_samples", sample_rows(rollouts.traj.group_ids_B, c.log_rollouts_count), True))
  for folder, rows, with_passes in exports if jax.process_index() == 0 else ():
    export_rollouts(
      run,
      os.path.join(c.workdir, folder, f"step_{rl_step}.jsonl"),
      rollouts,
      out,
      rollout_ids=[f"step{rl_step}_{i}" for i in range(rollouts.batch_size)],
      rows=rows,
      with_passes=with_passes,
    )
