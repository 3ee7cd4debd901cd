"""The training loop: warm start, then RL with dense credit; resumable; metrics, curves and checkpoints.

  run = build(config)                    # model, tokenizer, env spec, tasks, mesh, teacher, checkpointer
  restore or (eval, warm start, eval, reference + step-0 checkpoint)
  for step in range(start + 1, total_steps + 1):
    rollouts -> trajectory -> PASSES the method needs -> METHODS advantages -> jitted update -> log -> checkpoint
  eval, curves.png

The trainer names no environment and no method: `ENVS` (jaxcredit.envs), `METHODS` (train/methods.py), `PASSES`
(train/passes.py) and `LOSS_TERMS` (train/step.py) are the tables it reads.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import os
import re
import shutil
import signal
import threading
import time
from typing import Any, Callable

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from jaxcredit import multihost, sharding
from jaxcredit.envs import EnvSpec, make_env_spec
from jaxcredit.models import load, load_tokenizer, resolve_source, save_converted
from jaxcredit.models.decoder import compute_params, param_logical_axes
from jaxcredit.rollout.chat_format import ChatFormat
from jaxcredit.rollout import jsonl as jsonl_lib
from jaxcredit.rollout.multiturn import RolloutResult, build_demonstration, run_rollouts
from jaxcredit.sampling import Sampler, SamplingParams
from jaxcredit.train import checkpoint as ckpt_lib
from jaxcredit.train import config as config_lib
from jaxcredit.train.engines import ENGINES, make_jax_sampler
from jaxcredit.train import metrics as metrics_lib
from jaxcredit.train import packing
from jaxcredit.train import passes as passes_lib
from jaxcredit.train import step as step_lib
from jaxcredit.train.methods import METHODS
from jaxcredit.trajectory import pack
from jaxcredit.viz import page as viz_page


@dataclasses.dataclass
class Run:
  """Everything the loop needs, built once."""

  config: ml_collections.ConfigDict
  mesh: Any
  tok: Any
  fmt: ChatFormat
  model_cfg: Any  # the policy's ModelConfig (compute dtype cfg.dtype; parameters stored in cfg.param_dtype)
  rules: dict  # the policy's sharding table (config.sharding_rules), in force while the run trains
  graphdef: Any
  rest: Any
  params: Any  # the trained parameters (master weights), in model_cfg.param_dtype
  params_shardings: Any
  sampler: Sampler
  env: EnvSpec
  train_tasks: list
  eval_tasks: list
  teacher: passes_lib.Model | None  # a teacher checkpoint (config.teacher.source), when the method uses one
  pass_fns: passes_lib.PassFns
  writer: metrics_lib.MetricsWriter
  ckpt: ckpt_lib.Checkpointer
  key: jax.Array
  teacher_sampler: Sampler | None = None  # built on first use, for hindsight skills from a teacher checkpoint
  # With several processes: the mesh over this process's devices that its samplers run on (None with one process:
  # the sampler reads the training mesh's parameters directly).
  local_mesh: Any = None
  # The number of parameter updates so far (warm-start steps and RL steps; saved with each checkpoint): the version
  # a rollout engine's weights are compared against (config.rollout.max_staleness), in rollout exports.
  policy_version: int = 0
  policy_logp: Any = None  # jitted (params, tokens, mask) -> log-probs, built when an external engine samples

  def close(self) -> None:
    """Stops what the run started outside this process (a launched rollout server)."""
    self.sampler.close()


def _bar(config, **kw):
  return tqdm(disable=not config.progress, dynamic_ncols=True, **kw)


def model_overrides_dict(config: ml_collections.ConfigDict) -> dict:
  """The numerics the config may change (remat, attention, MoE implementation), as ModelConfig fields."""
  return {
    "remat": bool(config.model.remat),
    "attention_impl": config.model.attention_impl,
    "attention_chunk": int(config.model.attention_chunk),
    "moe_impl": config.model.moe_impl,
  }


def model_overrides(cfg, config: ml_collections.ConfigDict):
  """cfg with `model_overrides_dict(config)` applied."""
  return dataclasses.replace(cfg, **model_overrides_dict(config))


def _check_processes(config) -> None:
  """With several processes: each samples whole prompt groups (credit needs a group's rollouts together, and a
  group never spans processes), and the mesh must split into equal per-process sampling meshes.

  Raises:
    ValueError: naming the field, its value and the process count.
  """
  p = jax.process_count()
  if p == 1:
    return
  multihost.share(
    config.rollout.prompts_per_step,
    what=f"config.rollout.prompts_per_step={config.rollout.prompts_per_step} (groups of "
    f"group_size={config.rollout.group_size} rollouts; a group never spans processes)",
    unit="prompt groups",
  )
  multihost.local_mesh_shape(dict(config.mesh), p)


def _sampling_model(run: Run, params, graphdef=None, rest=None):
  """The model the sampler reads: `params` in the compute dtype; with several processes, this process's own copy
  on its devices (`multihost.local_copy`; collective)."""
  graphdef = run.graphdef if graphdef is None else graphdef
  rest = run.rest if rest is None else rest
  if run.local_mesh is None:
    return nnx.merge(graphdef, params, rest)
  return nnx.merge(graphdef, *multihost.local_copy((compute_params(run.model_cfg, params), rest), run.local_mesh))


def _load_teacher(config, mesh, tok, policy_cfg) -> passes_lib.Model | None:
  """The teacher checkpoint `config.teacher.source` names (None for "policy" / "reference"), sharded like the
  policy; a tokenizer whose vocabulary differs from the policy's is refused naming both sizes."""
  source = config_lib.teacher_source(config)
  if METHODS[config.credit.method].teacher is None or source in ("policy", "reference"):
    return None
  cache_dir = config.model.cache_dir or None
  try:
    path = resolve_source(source)  # once: a Hub id is looked up in its cache (or fetched) a single time
    model, _ = load(
      path,
      cache_dir=cache_dir,
      dtype=config.model.compute_dtype or None,
      param_dtype="",  # frozen: stored in the compute dtype, no master weights
      mesh=mesh,
      config_overrides=model_overrides_dict(config),
    )
    teacher_tok = load_tokenizer(path, cache_dir=cache_dir)
  except (OSError, ValueError) as e:
    raise ValueError(
      f"config.teacher.source={source!r} could not be loaded as a teacher ({e}); it must be "
      f"'policy', 'reference', 'smollm2', a .gguf file, a Hugging Face or converted folder, "
      f"or a Hub id"
    ) from None
  if teacher_tok.vocab_size != tok.vocab_size or model.cfg.vocab_size != policy_cfg.vocab_size:
    raise ValueError(
      f"config.teacher.source={source!r} has a vocabulary of {teacher_tok.vocab_size} tokens "
      f"({model.cfg.vocab_size} embedding rows); the policy's has {tok.vocab_size} "
      f"({policy_cfg.vocab_size} rows). A teacher must share the policy's tokenizer."
    )
  graphdef, params, rest = step_lib.split_model(model)
  rules = sharding.resolve_rules(dict(config.teacher.sharding_rules))
  params = jax.device_put(params, sharding.param_shardings(params, mesh, param_logical_axes(model.cfg), rules))
  return passes_lib.Model(graphdef, rest, params, rules=rules)


def build(config: ml_collections.ConfigDict, *, write_config: bool = True) -> Run:
  """Validates the config and loads everything a run needs. With `write_config=False` (e.g. `credit_file`) nothing
  is written to the workdir."""
  config_lib.validate(config)
  _check_processes(config)
  if write_config:
    ckpt_lib.check_or_write_config(config.workdir, config.to_dict(), write=False)
  if config.compilation_cache_dir:
    # Which programs are kept stays jax's choice (JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS, 1 s by default).
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(config.compilation_cache_dir))
  logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" notice: we bound inputs
  rules = sharding.resolve_rules(dict(config.sharding_rules))
  mesh = sharding.make_mesh(dict(config.mesh))
  cache_dir = config.model.cache_dir or None
  source = resolve_source(config.model.source)
  env = make_env_spec(config.env)
  if config.sft.steps > 0 and env.demonstration is None:
    raise ValueError(
      f"config.sft.steps={config.sft.steps}, but environment {config.env.name!r} has no "
      f"demonstrations for a warm start; set config.sft.steps=0"
    )
  train_tasks = env.make_tasks("train", config.env.num_train_tasks, config.seed)  # bad sizes fail before the load
  eval_tasks = env.make_tasks("eval", config.eval.num_tasks, None)
  t0 = time.time()
  model, _ = load(
    source,
    cache_dir=cache_dir,
    dtype=config.model.compute_dtype or None,
    param_dtype=config.model.param_dtype,
    mesh=mesh,
    config_overrides=model_overrides_dict(config),
  )
  tok = load_tokenizer(source, cache_dir=cache_dir)
  print(f"[jaxcredit] model {config.model.source} loaded in {time.time() - t0:.1f}s")
  graphdef, params, rest = step_lib.split_model(model)
  p_sh = sharding.param_shardings(params, mesh, param_logical_axes(model.cfg), rules)
  params = jax.device_put(params, p_sh)
  local_mesh = None
  if jax.process_count() > 1:  # each process samples on its own devices, from its own copy of the policy
    local_mesh = sharding.make_mesh(
      multihost.local_mesh_shape(dict(config.mesh), jax.process_count()), devices=jax.local_devices()
    )
    model = nnx.merge(graphdef, *multihost.local_copy((params, rest), local_mesh))
  teacher = _load_teacher(config, mesh, tok, model.cfg)
  # Last, so that nothing fails after a rollout server is launched. Sampler: traced at its first generate, inside
  # train's use_rules block.
  sampler = ENGINES[config.rollout.engine].build(config, model, tok)
  if write_config:
    if multihost.is_primary():
      ckpt_lib.check_or_write_config(config.workdir, config.to_dict())
    multihost.barrier("config.json written")
  return Run(
    config=config,
    mesh=mesh,
    tok=tok,
    fmt=ChatFormat.from_tokenizer(tok),
    model_cfg=model.cfg,
    rules=rules,
    graphdef=graphdef,
    rest=rest,
    params=params,
    params_shardings=p_sh,
    sampler=sampler,
    env=env,
    train_tasks=train_tasks,
    eval_tasks=eval_tasks,
    teacher=teacher,
    pass_fns=passes_lib.PassFns(mesh, config.sampling.temperature),
    writer=metrics_lib.MetricsWriter(config.workdir, tensorboard=config.tensorboard, enabled=jax.process_index() == 0),
    ckpt=ckpt_lib.Checkpointer(config.workdir, max_to_keep=config.max_checkpoints_to_keep),
    key=jax.random.key(config.seed),
    local_mesh=local_mesh,
  )


def _data_iterator(num_tasks: int, batch: int, seed: int):
  ds = grain.MapDataset.range(num_tasks).shuffle(seed=seed).repeat().batch(batch, drop_remainder=True)
  return iter(ds.to_iter_dataset())


def _sampling_params(run: Run, *, greedy: bool = False) -> SamplingParams:
  s = run.config.sampling
  return SamplingParams(
    temperature=1.0 if greedy else s.temperature,
    top_p=1e-6 if greedy else s.top_p,
    max_new_tokens=s.max_new_tokens,
    stop_token_ids=run.tok.stop_ids,
    stop_strings=run.env.stop_strings,
  )


def _sample(run: Run, tasks, key, *, greedy=False):
  """Rollouts of `tasks` by the parameters the sampler holds (bound with `run.sampler.update_model(
  _sampling_model(run, params))`, collective with several processes; sampling itself is process-local)."""
  envs = [run.env.make_env(t) for t in tasks]
  prompts = [run.env.initial_messages(t) for t in tasks]
  return run_rollouts(
    run.sampler,
    run.tok,
    run.fmt,
    envs,
    prompts,
    _sampling_params(run, greedy=greedy),
    key,
    max_turns=run.env.max_turns,
    max_len=run.config.sampling.max_len,
  )


def eval_key(offset: int) -> jax.Array:
  """The key of the held-out eval batch that starts at rollout `offset`: fixed, so that every eval of a run (and
  `jaxcredit eval` of its checkpoints) draws the same samples when `config.eval.greedy` is off."""
  return jax.random.fold_in(jax.random.key(0), offset)


def sample_eval_batch(run: Run, tasks, offset: int, *, greedy: bool) -> list[RolloutResult]:
  """One batch of held-out rollouts, one per task of `tasks` (the batch starting at rollout `offset` of the eval),
  by the parameters the sampler holds: greedy, or at the rollouts' temperature and top-p with `eval_key(offset)`.
  `run` needs only `config`, `env`, `tok`, `fmt` and `sampler` (`jaxcredit eval` passes its own)."""
  return _sample(run, tasks, eval_key(offset), greedy=greedy)


def eval_summaries(run: Run, results) -> list[tuple[bool, int, int, bool]]:
  """Per rollout: (success, tool calls, assistant turns, answered), what `eval_metrics` averages."""
  return [(run.env.is_success(r.reward), r.tool_calls, r.builder.num_turns, r.finish == "answer") for r in results]


def eval_metrics(summaries, env_rows) -> dict:
  """The held-out eval's metrics: success_rate, tool_calls, mean_turns, answered_frac (means over the rollouts'
  `eval_summaries`), the environment's own metrics (the mean of `env_rows`, one `_env_metrics` dict per process)
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


def evaluate(run: Run, params, stage: str, step: int, *, sft_step: int | None = None) -> dict:
  """Rollouts on the held-out tasks, greedy (`config.eval.greedy`, the default) or sampled at the rollouts'
  temperature and top-p with a fixed key per batch (the same draws for every eval of a run); logs a phase="eval" row
  at RL step `step` (0 before RL; a warm-start eval also carries `sft_step`). With several processes each evaluates
  its share of the tasks and the row is over all of them (the environment's own metrics: the mean of the
  processes'). `jaxcredit eval` (train/evaluate.py) samples and scores through the same functions."""
  t0 = time.time()
  results = []
  bs = run.config.eval.batch_size
  mine = run.eval_tasks[multihost.uneven_share(len(run.eval_tasks))]
  # Collective once; the batches below are local.
  run.sampler.update_model(_sampling_model(run, params), version=run.policy_version)
  for i in _bar(run.config, iterable=range(0, len(mine), bs), desc=f"eval {stage}", leave=False):
    results += sample_eval_batch(run, mine[i : i + bs], i, greedy=bool(run.config.eval.greedy))
  summaries = sum(multihost.allgather_objects(eval_summaries(run, results)), [])
  env_rows = multihost.allgather_objects(_env_metrics(run, results) if results else {})
  m = {"stage": stage, **eval_metrics(summaries, env_rows), "seconds": time.time() - t0}
  if sft_step is not None:
    m["sft_step"] = int(sft_step)
  run.writer.write("eval", step, m)
  print(
    f"[jaxcredit] eval {stage}: success {m['success_rate']:.3f}, tool calls {m['tool_calls']:.2f}, "
    f"answered {m['answered_frac']:.2f} ({m['seconds']:.0f}s)"
  )
  return m


def _env_metrics(run: Run, results) -> dict:
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


def warm_start(run: Run, params, stop: "StopRequests | None" = None) -> Any:
  """Supervised warm start on demonstrations from the training tasks: cross-entropy on the action tokens, or on
  every token when `sft.loss_tokens == "all"` (a policy trained from scratch also learns from the prompts and the
  tool observations, e.g. to copy the names it reads).

  Checkpoints every `sft.checkpoint_every` steps, at its last step, and when `stop` has seen SIGTERM / Ctrl-C
  (then raises `TrainingStopped`); a warm-start checkpoint in the workdir is resumed from: parameters, optimizer
  state, the demonstration order and the demonstration RNG, so the later steps equal an uninterrupted run's.
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
  data = _data_iterator(len(run.train_tasks), c.sft.batch_size, seed=c.seed + 1)
  rng = np.random.default_rng(c.seed)
  start = run.ckpt.latest_warm_start_step()
  if start is not None:
    params, opt_state, meta = run.ckpt.restore_warm_start(start, params, opt_state)
    run.policy_version = start  # one update per warm-start step
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
  bar = _bar(c, total=c.sft.steps, initial=start, desc="warm start")
  for s in range(start + 1, c.sft.steps + 1):
    t0 = time.time()
    demos = [
      build_demonstration(run.tok, run.fmt, run.env.demonstration(run.train_tasks[int(i)], rng)) for i in next(data)
    ]
    traj = pack(
      demos,
      [0.0] * len(demos),
      list(range(len(demos))),
      max_turns=run.env.max_turns,
      pad_id=run.tok.pad_id,
      length_bucket=c.sft.length_bucket,
    )
    batch = _batch(traj, {})
    del batch["group_ids_B"]
    if c.sft.loss_tokens == "all":
      # every real token after a row's first is a target: prompts and tool observations too
      batch["action_mask_BxL"] = traj.token_mask_BxL & (np.cumsum(traj.token_mask_BxL, axis=1) > 1)
    n_tok = int(batch["action_mask_BxL"].sum())
    params, opt_state, m = update(params, opt_state, sharding.shard_batch(batch, run.mesh))
    run.policy_version += 1
    m = jax.device_get(m)
    dt = time.time() - t0
    run.writer.write(
      "sft",
      s,
      {
        "loss": float(m["loss"]),
        "grad_norm": float(m["grad_norm"]),
        "action_tokens": n_tok,
        "tokens_per_s": traj.token_mask_BxL.sum() / dt,
        "step_s": dt,
      },
    )
    bar.update(1)
    signum = stop.agreed() if stop is not None else None
    stopped = signum is not None
    if s % c.sft.checkpoint_every == 0 or s == c.sft.steps or stopped:
      meta = {"sft_step": s, "data_state": data.get_state(), "rng_state": rng.bit_generator.state, "phase": "sft"}
      run.ckpt.save_warm_start(s, params, opt_state, meta)
    _warm_start_eval(run, params, s)
    if stopped:
      bar.close()
      run.writer.close()
      raise TrainingStopped(signum, s, run.ckpt.warm_start_dir, phase="warm-start")
  bar.close()
  return params


def ppo_updates(
  update,
  params,
  opt_state,
  batch: dict,
  mesh,
  *,
  epochs: int,
  mini_batch_size: int,
  seed: tuple[int, int],
  pack: Callable[[dict], dict] | None = None,
):
  """`epochs` passes over one step's rollouts, each split into mini-batches of `mini_batch_size` rollouts (0: the
  whole batch), one optimizer update per mini-batch: PPO's epochs and mini-batches, with verl's and TRL's meaning.
  One epoch of the whole batch is exactly one update, as without PPO epochs.

  Every pass draws a fresh order of the rollouts from `seed` (the run's seed and the RL step, so a resumed run
  repeats it). The behaviour log-probs stay those of the sampler, so from the second update on the ratio departs
  from 1 and the PPO clip acts. Each mini-batch's loss is normalised by its own tokens.

  Args:
    update: `step.make_update_fn`'s (params, opt_state, batch) -> (params, opt_state, metrics).
    batch: host arrays with a leading [B] axis (`_batch`).
    mesh: where each mini-batch is placed (`sharding.shard_batch`).
    pack: applied to each mini-batch before it is placed (`_packer`: group rows, scored slots), or None: the
      trajectory rows as they are.

  Returns:
    (params, opt_state, metrics): metrics are the mean over the updates of each scalar, plus "updates",
    "update_slots" / "update_scored_slots" (token slots the model and the output head ran on, summed),
    "clip_last" / "ratio_dev_last" (the last update's clip fraction and mean |ratio - 1|) and "clip_max" /
    "ratio_dev_max" (their largest over the updates).
  """
  b = len(next(iter(batch.values())))
  size = mini_batch_size or b
  num_mini_batches = b // size
  rng = np.random.default_rng(list(seed))
  rows, slots, scored = [], 0, 0
  for _ in range(epochs):
    order = rng.permutation(b) if epochs * num_mini_batches > 1 else np.arange(b)
    for k in range(num_mini_batches):
      idx = np.sort(order[k * size : (k + 1) * size])
      mini = {name: np.asarray(x)[idx] for name, x in batch.items()}
      mini = pack(mini) if pack is not None else {name: x for name, x in mini.items() if name != "group_ids_B"}
      slots += int(np.size(mini["tokens_BxL"]))
      scored += int(np.size(mini["action_mask_BxL"]))
      mini = sharding.shard_batch(mini, mesh)
      params, opt_state, m = update(params, opt_state, mini)
      rows.append(jax.device_get(m))
  metrics = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
  metrics["updates"] = len(rows)
  metrics["update_slots"], metrics["update_scored_slots"] = slots, scored
  for key in ("clip", "ratio_dev"):
    metrics[f"{key}_last"] = float(rows[-1][key])
    metrics[f"{key}_max"] = float(max(r[key] for r in rows))
  return params, opt_state, metrics


def _packer(run: Run) -> Callable[[dict], dict] | None:
  """`packing.pack_if_short` with the run's buckets, rows a multiple of the data-parallel size times the
  micro-batches (a mini-batch with a rollout longer than `train.pack_max_row_len` stays unpacked); None when
  `train.pack_rollouts` is off."""
  c = run.config
  if not c.train.pack_rollouts:
    return None
  dp = sharding.data_parallel_size(run.mesh)
  return functools.partial(
    packing.pack_if_short,
    length_bucket=c.train.length_bucket,
    max_row_len=c.train.pack_max_row_len,
    rows_multiple=dp * c.train.num_micro_batches,
    slot_bucket=c.train.slot_bucket,
  )


def _batch(traj, extra: dict, behavior_logp_BxL=None) -> dict:
  """The update's batch: the trajectory's token arrays and group ids plus what the loss terms read
  (`LossTerm.batch_keys`). `behavior_logp_BxL` replaces the sampler's log-probs (`_engine_correction`)."""
  return {
    "group_ids_B": traj.group_ids_B,
    "tokens_BxL": traj.tokens_BxL,
    "token_mask_BxL": traj.token_mask_BxL,
    "action_mask_BxL": traj.action_mask_BxL & traj.sample_mask_B[:, None],
    "behavior_logp_BxL": traj.behavior_logp_BxL if behavior_logp_BxL is None else behavior_logp_BxL,
    **{k: np.asarray(v, np.float32) for k, v in extra.items()},
  }


def drop_invalid_behavior_logp(traj):
  """Takes out of the loss the action tokens whose sampler log-prob is not finite: an engine that returned none
  (vLLM's null, read as NaN) or a broken one. Such a token's log-ratio is meaningless; kept, it would get the
  largest importance weight (`loss.engine_is_cap`) or make the loss NaN. The token stays in the context.

  Returns:
    (a shallow copy of `traj` with those tokens off `action_mask_BxL` and their `behavior_logp_BxL` 0.0,
    {"engine_invalid_logp_tokens": how many there were}). `traj` itself is not changed.
  """
  act = traj.action_mask_BxL & traj.sample_mask_B[:, None]
  invalid = act & ~np.isfinite(traj.behavior_logp_BxL)
  kept = copy.copy(traj)
  if invalid.any():
    kept.action_mask_BxL = traj.action_mask_BxL & ~invalid
    kept.behavior_logp_BxL = np.where(invalid, 0.0, traj.behavior_logp_BxL).astype(np.float32)
  return kept, {"engine_invalid_logp_tokens": int(invalid.sum())}


def _engine_correction(run: Run, params, traj):
  """For rollouts from an external engine (`engines.Engine.external`): the trainer's own log-probs of the sampled
  tokens under `params` (the weights before this step's update), the truncated importance weight
  min(exp(trainer - engine), loss.engine_is_cap) per action token (1 elsewhere), and the metrics of the
  engine-trainer gap. The PPO ratio is then taken against the trainer's log-probs (decoupled PPO: the trainer's
  policy at sampling time is the proximal policy) and the weight corrects for the engine (docs/engines.md).

  Returns:
    (trainer_logp_BxL float32, weight_BxL float32, metrics): engine_logp_gap_mean / _max (|trainer - engine| over
    action tokens, nats), engine_is_weight_mean, engine_is_truncated_frac (tokens whose weight hit the cap).
  """
  c = run.config
  if run.policy_logp is None:
    run.policy_logp = step_lib.make_logp_fn(run.graphdef, run.rest, c.sampling.temperature)
  trainer = np.asarray(multihost.to_host(run.policy_logp(params, traj.tokens_BxL, traj.token_mask_BxL)), np.float32)
  engine = np.asarray(traj.behavior_logp_BxL, np.float32)
  # A non-finite engine log-prob is no evidence of the engine's policy (`drop_invalid_behavior_logp`).
  act = traj.action_mask_BxL & traj.sample_mask_B[:, None] & np.isfinite(engine)
  log_ratio = np.where(act, trainer - engine, 0.0)
  cap = float(c.loss.engine_is_cap)
  weight = np.where(act, np.minimum(np.exp(np.minimum(log_ratio, 50.0)), cap), 1.0).astype(np.float32)
  gap = np.abs(log_ratio[act])
  row = {
    "engine_logp_gap_mean": float(gap.mean()) if gap.size else 0.0,
    "engine_logp_gap_max": float(gap.max()) if gap.size else 0.0,
    "engine_is_weight_mean": float(weight[act].mean()) if gap.size else 1.0,
    "engine_is_truncated_frac": float((weight[act] >= cap).mean()) if gap.size else 0.0,
  }
  return np.where(act, trainer, engine).astype(np.float32), weight, row


def _loss_config(c: ml_collections.ConfigDict) -> step_lib.PolicyLossConfig:
  """The loss: PPO-clip, the KL term when `loss.kl_coef > 0`, and the method's own terms weighted by its knobs."""
  method = METHODS[c.credit.method]
  knobs = c.credit[c.credit.method]
  weights = {
    step_lib.LOSS_TERMS[t].knob: float(knobs[step_lib.LOSS_TERMS[t].knob])
    for t in method.loss_terms
    if step_lib.LOSS_TERMS[t].knob
  }
  return step_lib.PolicyLossConfig(
    eps_low=c.loss.eps_low,
    eps_high=c.loss.eps_high,
    aggregation=c.loss.aggregation,
    kl_coef=c.loss.kl_coef,
    kl_estimator=c.loss.kl_estimator,
    temperature=c.sampling.temperature,
    terms=("policy",) + method.loss_terms,
    max_len=c.sampling.max_len,
    **weights,
  )


def _reference_copy(run: Run, params):
  """The frozen reference: a copy of `params` in the compute dtype (it is only read; float32 master weights need
  no float32 reference)."""
  return jax.tree_util.tree_map(jnp.copy, compute_params(run.model_cfg, params))


def _fresh_start(run: Run, optimizer, opt_sh, data, stop: "StopRequests | None" = None):
  """Eval, warm start, eval; then the reference and the step-0 checkpoint, written together: a reference left
  by a run that died before its step-0 checkpoint is removed first, so such a workdir always starts over. A
  warm start stopped mid-way resumes (its eval before is not repeated); its checkpoints go once step 0 is saved."""
  c = run.config
  params = run.params
  resuming_warm_start = run.ckpt.latest_warm_start_step() is not None
  if c.eval.before_sft and c.sft.steps > 0 and not resuming_warm_start:
    evaluate(run, params, "before_warm_start", 0)
  if c.sft.steps > 0:
    params = warm_start(run, params, stop)
    if c.eval.after_sft:
      evaluate(run, params, "after_warm_start", 0)
  ref_params = _reference_copy(run, params)
  run.ckpt.remove_reference()
  run.ckpt.save_reference(ref_params)
  opt_state = jax.jit(optimizer.init, out_shardings=opt_sh)(params)
  run.ckpt.save(
    0,
    params,
    opt_state,
    {"rl_step": 0, "data_state": data.get_state(), "phase": "rl", "seed": c.seed, "policy_version": run.policy_version},
  )
  run.ckpt.remove_warm_start()
  return params, opt_state, ref_params


def _warm_start_eval(run: Run, params, sft_step: int) -> None:
  """The held-out eval every `config.eval.sft_every` warm-start steps (stage "sft_step_N", RL step 0, `sft_step` N):
  the warm start's learning curve. Not at its last step (eval.after_sft covers it), and not again for a step that
  already has one (a resumed warm start)."""
  every = run.config.eval.sft_every
  if not every or sft_step % every or sft_step >= run.config.sft.steps:
    return
  stage = f"sft_step_{sft_step}"
  if any(r.get("phase") == "eval" and r.get("stage") == stage for r in run.writer.rows()):
    return
  evaluate(run, params, stage, 0, sft_step=sft_step)


def _periodic_eval(run: Run, params, rl_step: int) -> None:
  """The held-out eval every `config.eval.every` RL steps (stage "rl_step_N"), unless the step already has one or is
  the last (eval.at_end covers it)."""
  every = run.config.eval.every
  if not every or rl_step <= 0 or rl_step % every or rl_step >= run.config.total_steps:
    return
  if any(r.get("phase") == "eval" and r.get("step") == rl_step for r in run.writer.rows()):
    return
  evaluate(run, params, f"rl_step_{rl_step}", rl_step)


def _write_warm_start_model(run: Run, params) -> str | None:
  """The warm-started policy as a converted model folder, `workdir/warm_start_model` (float32 parameters, the
  tokenizer, provenance in source.json), so that several RL runs can start from one warm start with
  `config.model.source` pointing at it and `config.sft.steps=0`. Written by one process of a single-process run
  only (gathering a sharded model to one host is not done here); returns the folder, or None when not written."""
  if jax.process_count() > 1:
    print("[jaxcredit] several processes: the warm-started policy stays in the checkpoint only (no model folder)")
    return None
  folder = os.path.join(run.config.workdir, "warm_start_model")
  if os.path.exists(folder):
    shutil.rmtree(folder)
  source = {
    "warm_start_of": str(run.config.model.source),
    "workdir": os.path.abspath(run.config.workdir),
    "sft_steps": int(run.config.sft.steps),
    "env": str(run.config.env.name),
    "seed": int(run.config.seed),
  }
  save_converted(folder, run.model_cfg, nnx.to_pure_dict(jax.device_get(params)), run.tok, source=source)
  return folder


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
  """
  run = build(config)
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
  return {} if trained is None else _finish(run, *trained)


def _warm_start_and_rl(run: Run, sft_only: bool, stop: "StopRequests") -> tuple[Any, int] | None:
  """The warm start (or the resume) and the RL steps; the trained parameters and the last RL step, or None when
  `sft_only`. Raises TrainingStopped after a checkpointed stop."""
  c = run.config
  optimizer = step_lib.make_optimizer(
    c.optim.learning_rate,
    name=c.optim.name,
    warmup_steps=c.optim.warmup_steps,
    weight_decay=c.optim.weight_decay,
    max_grad_norm=c.optim.max_grad_norm,
  )
  opt_sh = step_lib.opt_state_shardings(optimizer, run.params, run.params_shardings, run.mesh)
  loss_cfg = _loss_config(c)
  data = _data_iterator(len(run.train_tasks), c.rollout.prompts_per_step, seed=c.seed)
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
    params, opt_state, meta = run.ckpt.restore(
      latest, run.params, jax.jit(optimizer.init, out_shardings=opt_sh)(run.params)
    )
    rl_step = int(meta["rl_step"])
    run.policy_version = int(meta.get("policy_version", rl_step))  # checkpoints before it was saved: RL steps
    data.set_state(meta["data_state"])
    dropped = run.writer.truncate_after("rl", rl_step) + run.writer.truncate_after("eval", rl_step)
    print(
      f"[jaxcredit] resumed from {run.ckpt.directory} at RL step {rl_step}"
      + (f" (dropped {dropped} metric rows past the checkpoint)" if dropped else "")
    )
    ref_params = run.ckpt.restore_reference(_reference_copy(run, run.params))
    if rl_step < c.total_steps:  # a stop between the step's checkpoint and its periodic eval: eval it now
      _periodic_eval(run, params, rl_step)
  else:
    params, opt_state, ref_params = _fresh_start(run, optimizer, opt_sh, data, stop)
    rl_step = 0
    signum = stop.agreed()
    if signum is not None:  # a signal during the eval after the warm start: step 0 is checkpointed
      run.writer.close()
      raise TrainingStopped(signum, 0, run.ckpt.directory)
  if sft_only:
    model_dir = _write_warm_start_model(run, params)
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
    loss_cfg,
    run.mesh,
    run.params_shardings,
    opt_sh,
    num_micro=c.train.num_micro_batches,
  )
  ref_logp = step_lib.make_logp_fn(run.graphdef, run.rest, c.sampling.temperature) if c.loss.kl_coef > 0 else None
  bar = _bar(c, total=c.total_steps, initial=rl_step, desc="RL")
  for rl_step in range(rl_step + 1, c.total_steps + 1):
    params, opt_state, row = rl_step_fn(run, params, opt_state, ref_params, data, update, ref_logp, rl_step)
    if not (np.isfinite(row["loss"]) and np.isfinite(row["grad_norm"])):
      raise FloatingPointError(
        f"RL step {rl_step}: loss {row['loss']}, grad norm {row['grad_norm']}; stopping before this state is "
        f"checkpointed (latest good checkpoint: step {run.ckpt.latest_step()} in {run.ckpt.directory})"
      )
    bar.update(1)
    bar.set_postfix(reward=f"{row['reward_mean']:.2f}", loss=f"{row['loss']:.3f}", tools=f"{row['tool_calls']:.1f}")
    signum = stop.agreed()
    if rl_step % c.checkpoint_every == 0 or rl_step == c.total_steps or signum is not None:
      run.ckpt.save(
        rl_step,
        params,
        opt_state,
        {
          "rl_step": rl_step,
          "data_state": data.get_state(),
          "phase": "rl",
          "seed": c.seed,
          "policy_version": run.policy_version,
        },
      )
    if signum is not None:
      bar.close()
      run.writer.close()
      raise TrainingStopped(signum, rl_step, run.ckpt.directory)
    _periodic_eval(run, params, rl_step)
  bar.close()
  return params, rl_step


def _finish(run: Run, params, rl_step: int) -> dict:
  """The eval at the end, the curves and the credit viewer; the last eval's metrics (or {})."""
  c = run.config
  last = {}
  if c.eval.at_end:
    last = evaluate(run, params, f"rl_step_{rl_step}", rl_step)
  viewer = None
  if run.writer.enabled:
    metrics_lib.plot_curves(c.workdir, run.writer.rows())
    viewer = _write_viewer(run)
  run.writer.close()
  print(
    f"[jaxcredit] done: {c.workdir}/metrics.jsonl, {c.workdir}/curves.png, checkpoints in {run.ckpt.directory}"
    + (f"; credit viewer: {viewer}" if viewer else "")
  )
  return last


def _write_viewer(run: Run) -> str | None:
  """The credit viewer's pages (jaxcredit.viz.page) for the latest rollout sample, with the trained method's
  advantages (`jaxcredit viz` adds other methods). Returns the index's path, or None without samples."""
  folder = os.path.join(run.config.workdir, "rollout_samples")
  steps = sorted(
    int(f[5:-6]) for f in (os.listdir(folder) if os.path.isdir(folder) else []) if re.fullmatch(r"step_\d+\.jsonl", f)
  )
  if not steps:
    return None
  records = jsonl_lib.read_jsonl(os.path.join(folder, f"step_{steps[-1]}.jsonl"))
  if not records:
    return None
  name = run.config.credit.method
  return viz_page.write_rollout_pages(
    os.path.join(run.config.workdir, "viewer", f"step_{steps[-1]}"),
    {name: records},
    run.tok.decode,
    step=steps[-1],
    summaries={name: METHODS[name].summary},
    notes={name: f"as trained at step {steps[-1]}"},
    peer_ids={
      name: [f"step{steps[-1]}_{i}" for i in range(run.config.rollout.prompts_per_step * run.config.rollout.group_size)]
    },
  )


def _sampler_for(run: Run):
  """Binds the policy's sampler to a model of the policy's graph, or builds (once) a sampler for a teacher
  checkpoint. The next rollouts rebind the policy's sampler to the policy (`rollouts`). With several processes
  binding is collective, and each process samples on its own copy of the model."""

  def bind(model: passes_lib.Model):
    if model.graphdef is run.graphdef:
      run.sampler.update_model(_sampling_model(run, model.params, model.graphdef, model.rest))
      return run.sampler
    if run.local_mesh is None:
      merged = nnx.merge(model.graphdef, model.params, model.rest)
    else:  # each process generates every rollout's text (the same inputs, the same outputs) on its own devices
      merged = nnx.merge(model.graphdef, *multihost.local_copy((model.params, model.rest), run.local_mesh))
    if run.teacher_sampler is None:
      run.teacher_sampler = make_jax_sampler(run.config, merged, run.tok)
    run.teacher_sampler.update_model(merged)
    return run.teacher_sampler

  return bind


def run_passes(run: Run, traj, results, tasks, params, ref_params, key) -> dict:
  """Runs the chosen method's passes in order, filling `traj.passes`; returns their metrics."""
  c = run.config
  method = METHODS[c.credit.method]
  models = {
    "policy": passes_lib.Model(run.graphdef, run.rest, params),
    "reference": passes_lib.Model(run.graphdef, run.rest, ref_params),
  }
  if run.teacher is not None:
    models["checkpoint"] = run.teacher
  source = config_lib.teacher_source(c)
  ctx = passes_lib.PassContext(
    config=c,
    knobs=c.credit[c.credit.method],
    tok=run.tok,
    env=run.env,
    tasks=tasks,
    results=results,
    key=key,
    models=models,
    teacher=source if source in ("policy", "reference") else "checkpoint",
    fns=run.pass_fns,
    sampler_for=_sampler_for(run),
  )
  row = {}
  for name in method.passes:
    t0 = time.time()
    traj.passes[name] = passes_lib.PASSES[name](ctx, traj)
    row.update(passes_lib.pass_metrics(name, traj.passes[name], time.time() - t0))
  return row


def _throughput(run: Run, tokens: int, step_s: float) -> dict:
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
  policy_version: int | None = None  # the version of the weights that sampled them (Run.policy_version)


def sample_step(run: Run, params, prompt_ids, key) -> StepRollouts:
  """Samples one RL step's rollouts: `group_size` per prompt of `prompt_ids` (the step's global batch of training
  task indices). With several processes each samples its contiguous share of the groups on its own devices (its
  key folded with its process index), then all rollouts are gathered onto every process. Collective."""
  c = run.config
  g = c.rollout.group_size
  t0 = time.time()
  mine = prompt_ids[
    multihost.share(len(prompt_ids), what=f"config.rollout.prompts_per_step={len(prompt_ids)}", unit="prompt groups")
  ]
  if jax.process_count() > 1:
    key = jax.random.fold_in(jax.random.fold_in(key, 2), jax.process_index())
  stats_before = dict(run.sampler.stats)
  run.sampler.update_model(
    _sampling_model(run, params), version=run.policy_version, max_staleness=c.rollout.max_staleness
  )
  sync_s = time.time() - t0
  results = _sample(run, [run.train_tasks[i] for i in mine for _ in range(g)], key)
  sampler_stats = {f"sampler_{k}": int(v - stats_before.get(k, 0)) for k, v in run.sampler.stats.items()}
  unit_rewards = [list(run.env.unit_rewards(r.env)) for r in results] if run.env.unit_rewards is not None else None
  env_metrics = _env_metrics(run, results)
  seconds = time.time() - t0
  processes = [jax.process_index()] * len(results)
  t_gather = time.time()
  if jax.process_count() > 1:
    local = [dataclasses.replace(r, env=None) for r in results]
    shares = multihost.allgather_objects((local, unit_rewards, env_metrics, sampler_stats, seconds))
    me = jax.process_index()
    results = sum((results if k == me else share[0] for k, share in enumerate(shares)), [])
    unit_rewards = None if unit_rewards is None else sum((share[1] for share in shares), [])
    env_metrics = multihost.mean_of([share[2] for share in shares])
    sampler_stats = {k: sum(share[3][k] for share in shares) for k in sampler_stats}
    seconds = max(share[4] for share in shares)
    processes = [k for k, share in enumerate(shares) for _ in share[0]]
  timing = {"sampler_sync_s": sync_s, "rollout_gather_s": time.time() - t_gather}
  return StepRollouts(
    tasks=[run.train_tasks[int(i)] for i in prompt_ids for _ in range(g)],
    results=results,
    unit_rewards=unit_rewards,
    processes=processes,
    env_metrics=env_metrics,
    sampler_stats=sampler_stats,
    seconds=seconds,
    timing=timing,
    policy_version=run.sampler.version,
  )


def rl_step_fn(run: Run, params, opt_state, ref_params, data, update, ref_logp, rl_step: int):
  """One RL step: rollouts (`sample_step`), then `learn_step`. Returns (params, opt_state, metrics row)."""
  t0 = time.time()
  key = jax.random.fold_in(run.key, rl_step)
  sampled = sample_step(run, params, [int(i) for i in next(data)], key)
  return learn_step(run, params, opt_state, ref_params, sampled, update, ref_logp, rl_step, t0=t0)


def learn_step(
  run: Run, params, opt_state, ref_params, sampled: StepRollouts, update, ref_logp, rl_step: int, *, t0=None
):
  """The rest of an RL step on its rollouts: pack, passes, advantages, the PPO updates, the metrics row (written
  every `log_every` steps) and the rollout exports. Returns (params, opt_state, metrics row).

  The same on every process (its inputs are): a 1-process run fed another run's rollouts computes that run's
  losses and gradients."""
  c = run.config
  method = METHODS[c.credit.method]
  g = c.rollout.group_size
  t0 = time.time() if t0 is None else t0
  key = jax.random.fold_in(run.key, rl_step)
  tasks, results = sampled.tasks, sampled.results
  t_roll = sampled.seconds
  traj = pack(
    [r.builder for r in results],
    [r.reward for r in results],
    [k // g for k in range(len(results))],
    max_turns=run.env.max_turns,
    pad_id=run.tok.pad_id,
    length_bucket=c.train.length_bucket,
    unit_rewards=sampled.unit_rewards,
  )
  traj, invalid_row = drop_invalid_behavior_logp(traj)
  t1 = time.time()
  pass_row = run_passes(run, traj, results, tasks, params, ref_params, jax.random.fold_in(key, 1))
  t_passes = time.time() - t1
  out = method.advantages(traj, c.credit[c.credit.method])
  if out.keep_B is not None:  # a method's own filter (SGCD's dynamic sampling): its dropped rollouts leave the loss
    traj.sample_mask_B = traj.sample_mask_B & np.asarray(out.keep_B, bool)
  t_score = time.time() - t1
  t2 = time.time()
  extra = out.batch_arrays()
  if ref_logp is not None:
    extra["ref_logp_BxL"] = multihost.to_host(ref_logp(ref_params, traj.tokens_BxL, traj.token_mask_BxL))
  step_lib.check_batch_keys(extra, _loss_config(c), who=f"method {c.credit.method!r}")
  behavior_logp, engine_row = traj.behavior_logp_BxL, {}
  if ENGINES[c.rollout.engine].external:
    behavior_logp, extra["behavior_weight_BxL"], engine_row = _engine_correction(run, params, traj)
  for sampler in (run.sampler, run.teacher_sampler):  # their weights are bound again before their next use
    if sampler is not None:
      sampler.release_weights()
  params, opt_state, m = ppo_updates(
    update,
    params,
    opt_state,
    _batch(traj, extra, behavior_logp),
    run.mesh,
    epochs=c.train.ppo_epochs,
    mini_batch_size=c.train.mini_batch_size,
    seed=(c.seed, rl_step),
    pack=_packer(run),
  )
  run.policy_version += 1
  t_update = time.time() - t2
  act = traj.action_mask_BxL & traj.sample_mask_B[:, None]
  a = out.adv_BxL[act]
  tm = traj.turn_mask_BxT
  row = {
    "method": c.credit.method,
    "reward_mean": float(np.mean(traj.rewards_B)),
    "success_rate": float(np.mean([run.env.is_success(r.reward) for r in results])),
    "mean_turns": float(np.mean([r.builder.num_turns for r in results])),
    "tool_calls": float(np.mean([r.tool_calls for r in results])),
    "tool_errors": float(np.mean([r.tool_errors for r in results])),
    "answered_frac": float(np.mean([r.finish == "answer" for r in results])),
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
    "tokens": int(traj.token_mask_BxL.sum()),
    "tokens_per_s": float(traj.token_mask_BxL.sum() / max(t_update, 1e-9)),
    "rollout_s": t_roll,
    "passes_s": t_passes,
    "credit_s": t_score - t_passes,
    "score_s": t_score,
    "update_s": t_update,
    "step_s": time.time() - t0,
  }
  row.update(_throughput(run, row["tokens"], row["step_s"]))
  row.update(sampled.env_metrics)
  row.update(sampled.sampler_stats)
  row.update(engine_row)
  row.update(invalid_row)
  if sampled.policy_version is not None:  # how many updates behind the sampling weights were (rollout.max_staleness)
    row["policy_staleness"] = run.policy_version - 1 - sampled.policy_version
  row.update(sampled.timing)  # prefill_tokens, decode_tokens, extends, rebuilds of this step's rollouts
  if traj.unit_mask_BxU.shape[1] > 1:
    row["units_mean"] = float(traj.unit_mask_BxU.sum(1).mean())
    row["unit_reward_mean"] = float(traj.unit_rewards_BxU[traj.unit_mask_BxU].mean())
  if out.turn_adv_BxT is not None and tm.any():
    row["turn_adv_abs_mean"] = float(np.abs(out.turn_adv_BxT[tm]).mean())
  row.update({k: float(v) for k, v in m.items() if k.startswith("loss_")})
  if "kl" in m and c.loss.kl_coef > 0:
    row["kl"] = float(m["kl"])
  row.update({k: v for k, v in out.metrics.items() if v is not None})
  row.update(pass_row)
  if rl_step % c.log_every == 0:
    run.writer.write("rl", rl_step, row)
  exports = []  # (folder, rows, with_passes)
  if c.rollout.export_jsonl:
    exports.append(("rollouts", None, False))
  if c.log_rollouts_every and rl_step % c.log_rollouts_every == 0:
    exports.append(("rollout_samples", sample_rows(traj.group_ids_B, c.log_rollouts_count), True))
  for folder, rows, with_passes in exports if jax.process_index() == 0 else ():
    export_rollouts(
      run,
      os.path.join(c.workdir, folder, f"step_{rl_step}.jsonl"),
      results,
      tasks,
      traj,
      out,
      rollout_ids=[f"step{rl_step}_{i}" for i in range(len(results))],
      rows=rows,
      with_passes=with_passes,
      processes=sampled.processes,
      policy_version=sampled.policy_version,
    )
  return params, opt_state, row


def sample_rows(group_ids_B, count: int) -> list[int]:
  """The rollouts of the groups that hold the first `count` rollouts, in batch order: whole groups, so that a
  group method's advantages can be computed again from the sample (`jaxcredit viz`)."""
  group_ids = [int(g) for g in np.asarray(group_ids_B)]
  keep = set(group_ids[:count])
  return [i for i, g in enumerate(group_ids) if g in keep]


def export_rollouts(
  run: Run,
  path: str,
  results,
  tasks,
  traj,
  out,
  *,
  rollout_ids,
  rows=None,
  with_passes: bool = False,
  processes=None,
  policy_version: int | None = None,
) -> None:
  """Writes rollouts as JSONL (jaxcredit/rollout/jsonl.py; docs/rollouts-jsonl.md), with the advantages computed for
  them: one line per rollout, its group id the index of its prompt group. `rows`: which rollouts (default all);
  `with_passes`: also every pass output of each rollout under metadata["passes"] (`pass_outputs_of`) and the
  method's per-rollout details (TRACE's state values, GEAR's segments, ...) under metadata["credit_details"];
  `processes`: the process that sampled each rollout, recorded as metadata["process"] when several did;
  `policy_version`: the version of the weights that sampled them (`Run.policy_version`), metadata["policy_version"]."""
  rows = range(len(results)) if rows is None else list(rows)
  records = []
  for i in rows:
    res, task = results[i], tasks[i]
    records.append(
      jsonl_lib.rollout_to_record(
        res,
        rollout_id=rollout_ids[i],
        group_id=int(traj.group_ids_B[i]),
        unit_rewards=[float(x) for x in traj.unit_rewards_BxU[i][traj.unit_mask_BxU[i]]],
        task_id=_task_id(task),
        tools=run.env.tools(task) if run.env.tools is not None else None,
        metadata={
          **({"passes": pass_outputs_of(traj, i)} if with_passes else {}),
          **({"credit_details": rollout_values(out.details, i, traj)} if with_passes and out.details else {}),
          **({"process": int(processes[i])} if processes is not None and len(set(processes)) > 1 else {}),
          **({"policy_version": int(policy_version)} if policy_version is not None else {}),
        },
      )
    )
  turn_adv = None if out.turn_adv_BxT is None else out.turn_adv_BxT[list(rows)]
  records = jsonl_lib.attach_credit(records, out.adv_BxL[list(rows)], turn_adv, method=run.config.credit.method)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  jsonl_lib.write_jsonl(path, records)


def pass_outputs_of(traj, i: int) -> dict:
  """Rollout i's share of every pass output (`traj.passes[name][key]`), as JSON values (`rollout_values`)."""
  return {name: rollout_values(outputs, i, traj) for name, outputs in traj.passes.items()}


def rollout_values(outputs: dict, i: int, traj) -> dict:
  """Rollout i's share of `outputs` (pass outputs or `MethodOutput.details`), as JSON values: row i of each array or
  list with one entry per rollout, per-token rows (`*_BxL`) cut to the rollout's tokens, per-turn rows (`*_BxT`) to
  its turns and per-boundary rows (`*_BxT1`) to its turns + 1, non-finite numbers as None. Values that are not per
  rollout are left out."""
  b, n = traj.tokens_BxL.shape[0], int(traj.token_mask_BxL[i].sum())
  turns = int(traj.turn_mask_BxT[i].sum())
  cut = {"_BxL": n, "_BxT": turns, "_BxT1": turns + 1}
  row: dict = {}
  for key, value in outputs.items():
    if isinstance(value, (list, tuple)) and len(value) == b:
      v = value[i]
      row[key] = v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
      continue
    array = np.asarray(value) if isinstance(value, np.ndarray) or hasattr(value, "shape") else None
    if array is None or array.ndim == 0 or array.shape[0] != b:
      continue
    x = array[i]
    suffix = next((s for s in ("_BxT1", "_BxL", "_BxT") if key.endswith(s)), None)
    if suffix is not None and x.ndim >= 1:
      x = x[: cut[suffix]]
    if np.issubdtype(x.dtype, np.floating):
      x = np.where(np.isfinite(x), x, np.nan).astype(np.float64)
      row[key] = np.where(np.isnan(x), None, x).tolist() if x.ndim else (float(x) if np.isfinite(x) else None)
    else:
      row[key] = x.tolist()
  return row


def _task_id(task) -> str | None:
  for key in ("task_id", "query_id", "id"):
    v = getattr(task, key, None)
    if v is not None:
      return str(v)
  return None


def _prompt_key(messages) -> str | None:
  """The prompt of a chat (its messages before the first assistant message) as a comparable string; None if empty."""
  first = next((k for k, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
  prompt = [{"role": m.get("role"), "content": m.get("content")} for m in messages[:first]]
  return json.dumps(prompt, sort_keys=True) if prompt else None


def _same_task(env, a, b) -> bool:
  """Whether two tasks give a pass the same inputs (a task may sit in both the train and the eval split)."""
  return a is b or (
    env.gold_answer_text(a) == env.gold_answer_text(b) and env.privileged_info(a) == env.privileged_info(b)
  )


def tasks_of_records(env, tasks: list, records: list[dict], *, source: str, need: str) -> list:
  """The environment task each rollout record was sampled from, for passes that read the task (gold answers,
  privileged information).

  A record's `task_id` finds the task with that id (`task_id`, `query_id` or `id` of the task). A record without
  one (tasks that carry no id, such as plain strings) is matched by its own prompt: its messages before the first
  assistant message equal `env.initial_messages(task)`. A task is never guessed: a record neither finds is refused.

  Args:
    env: the EnvSpec (its `initial_messages`).
    tasks: the environment's tasks (train, then eval).
    records: rollout records (docs/rollouts-jsonl.md).
    source: where the records came from, for error messages.
    need: what needs the tasks, for error messages.

  Raises:
    ValueError: a record whose task_id the environment does not have; a record without task_id whose prompt is
      no task's (or is two different tasks' prompt), naming the file and the rollout.
  """
  by_id, by_prompt = {}, {}
  for t in tasks:
    tid = _task_id(t)
    if tid is not None:
      by_id.setdefault(tid, t)
    key = _prompt_key(env.initial_messages(t))
    if key not in by_prompt:
      by_prompt[key] = t
    elif by_prompt[key] is not None and not _same_task(env, by_prompt[key], t):
      by_prompt[key] = None  # two different tasks with one prompt: a record cannot say which it was
  found = []
  for r in records:
    tid, where = r.get("task_id"), f"{source}: rollout {r['rollout_id']!r}"
    if tid is not None:
      if str(tid) not in by_id:
        raise ValueError(
          f"{where} has task_id {tid!r}, which the environment does not have among its {len(tasks)} train and eval "
          f"tasks ({len(by_id)} with an id); {need} need the task"
        )
      found.append(by_id[str(tid)])
      continue
    key = _prompt_key(r.get("messages") or [])
    if key is None:
      raise ValueError(f"{where} has no task_id and no prompt messages; {need} need the task it was sampled from")
    if by_prompt.get(key, False) is None:
      raise ValueError(f"{where} has no task_id and its prompt is the prompt of several different tasks")
    if key not in by_prompt:
      raise ValueError(
        f"{where} has no task_id and its prompt (its messages before the first assistant message) is none of the "
        f"environment's {len(tasks)} train and eval tasks' prompts; {need} need the task"
      )
    found.append(by_prompt[key])
  return found


MAX_CREDIT_TURNS = 4096
"""The most turns a rollout of a `jaxcredit credit` file may have (the per-turn arrays are [B, T])."""


def credit_file(config: ml_collections.ConfigDict, in_path: str, out_path: str) -> dict:
  """Computes the config's method's advantages for rollouts made elsewhere (`jaxcredit credit`).

  Reads `in_path` (rollouts JSONL, any order: groups come from their group ids; for a method with passes, token
  ids in [0, the policy tokenizer's vocabulary), checked naming the line), credits them with
  `credit_records` and writes the records with "advantages", "turn_advantages" and "method" to `out_path`. The
  workdir's config.json is neither checked nor written.

  Returns:
    {"rollouts": B, "groups": number of groups, "method": name}.

  Raises:
    ValueError: as `credit_records`.
  """
  vocab_size = None
  if METHODS[config.credit.method].passes:  # the passes read the ids with the policy: check them, naming the line
    tok = load_tokenizer(resolve_source(config.model.source), cache_dir=config.model.cache_dir or None)
    vocab_size = tok.vocab_size
  records = jsonl_lib.read_jsonl(in_path, vocab_size=vocab_size)
  credited, groups = credit_records(config, records, source=in_path)
  jsonl_lib.write_jsonl(out_path, credited)
  return {"rollouts": len(records), "groups": groups, "method": config.credit.method}


def credit_records(
  config: ml_collections.ConfigDict, records: list[dict], *, source: str, details: bool = False
) -> tuple[list[dict], int]:
  """The config's method's advantages for rollout records (docs/rollouts-jsonl.md).

  Runs the passes the method needs with the config's models (the latest checkpoint of config.workdir and its
  reference when there is one, else config.model.source for both). Passes that need the task (privileged info, gold
  answers) find it by the record's task_id among the environment's train and eval tasks.

  Args:
    config: a training config; its `credit.method` is the method.
    records: rollout records, any order (groups come from their group ids).
    source: where the records came from, for error messages.
    details: also every pass output and the method's details of each rollout under metadata["passes"] and
      metadata["credit_details"] (what `jaxcredit viz` draws).

  Returns:
    (the records with "advantages", "turn_advantages" and "method", in their order; the number of groups).

  Raises:
    ValueError: no records, a bad record (file and line named), a duplicate rollout id, a group smaller than the
      method needs, groups of unequal size for a group method, a token id outside the policy tokenizer's vocabulary when the method runs passes, or a task_id
      the environment does not have when a pass needs the task.
  """
  c = config
  config_lib.validate(c)  # before any record is read: a bad key is named, not met as a crash in the credit run
  method = METHODS[c.credit.method]
  in_path = source
  if not records:
    raise ValueError(f"{in_path} holds no rollouts")
  env = make_env_spec(c.env)
  builders = [jsonl_lib.record_to_builder(r) for r in records]
  turns = {r["rollout_id"]: b.num_turns for r, b in zip(records, builders)}
  if len(turns) != len(records):
    seen, dup = set(), None
    for r in records:
      dup = r["rollout_id"] if r["rollout_id"] in seen else dup
      seen.add(r["rollout_id"])
    raise ValueError(f"{in_path}: rollout_id {dup!r} appears more than once (rollout ids must be unique)")
  longest = max(turns, key=turns.get)
  if turns[longest] > max(env.max_turns, MAX_CREDIT_TURNS):
    raise ValueError(
      f"{in_path}: rollout {longest!r} has num_turns={turns[longest]}, more than the environment's "
      f"max_turns ({env.max_turns}) and the {MAX_CREDIT_TURNS} a credit run accepts"
    )
  max_turns = max(env.max_turns, turns[longest])
  sizes = {}
  for r in records:
    sizes[r["group_id"]] = sizes.get(r["group_id"], 0) + 1
  small = {g: n for g, n in sizes.items() if n < method.min_group_size}
  if small:
    raise ValueError(
      f"{c.credit.method} needs groups of at least {method.min_group_size} rollouts; in {in_path} "
      f"group(s) {sorted(small, key=str)[:5]} have {sorted(set(small.values()))}"
    )
  if method.min_group_size > 1 and len(set(sizes.values())) > 1:  # a group baseline is vmapped over one group size
    g0, n0 = next(iter(sizes.items()))
    g, n = next((g, n) for g, n in sizes.items() if n != n0)
    raise ValueError(
      f"{c.credit.method} needs groups of one size; in {in_path} group {g!r} has {n} rollouts but group {g0!r} has "
      f"{n0} (every group needs the same number of rollouts)"
    )
  if method.passes:
    run = build(c, write_config=False)
    pad_id = run.tok.pad_id
  else:
    run, pad_id = None, 0
  try:
    traj, groups = jsonl_lib.records_to_trajectory(
      records,
      max_turns=max_turns,
      pad_id=pad_id,
      length_bucket=c.train.length_bucket,
      vocab_size=run.tok.vocab_size if run is not None else None,
    )
  except ValueError as e:
    raise ValueError(f"{in_path}: {e}") from None
  traj, _ = drop_invalid_behavior_logp(traj)  # null behavior log-probs (engine_invalid_logp_tokens), as in training
  if method.passes:
    tasks = tasks_of_records(
      run.env, list(run.train_tasks) + list(run.eval_tasks), records, source=in_path, need=f"{c.credit.method}'s passes"
    )
    results = [
      RolloutResult(
        builder=b,
        env=None,
        reward=float(r["reward"]),
        finish=r.get("finish") or "",
        tool_calls=0,
        tool_errors=0,
        messages=list(r.get("messages") or []),
      )
      for r, b in zip(records, builders)
    ]
    params, ref_params = run.params, run.params
    latest = run.ckpt.latest_step()
    if latest is not None:
      params = run.ckpt.restore_params(latest, run.params)
    if run.ckpt.has_reference():
      ref_params = run.ckpt.restore_reference(_reference_copy(run, run.params))
    with sharding.use_rules(run.rules):
      run_passes(run, traj, results, tasks, params, ref_params, jax.random.key(c.seed))
  out = method.advantages(traj, c.credit[c.credit.method])
  credited = jsonl_lib.attach_credit(records, out.adv_BxL, out.turn_adv_BxT, method=c.credit.method)
  if details:
    for i, r in enumerate(credited):
      r["metadata"] = {
        **(r.get("metadata") or {}),
        "passes": pass_outputs_of(traj, i),
        "credit_details": rollout_values(out.details, i, traj),
      }
  return credited, len(groups)
