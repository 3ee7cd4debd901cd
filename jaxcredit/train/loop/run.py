"""A training run's description and how it is built: the config validated, the policy, tokenizer, mesh, environment,
tasks, teacher checkpoint, sampler, checkpointer and metrics writer (`build_run` -> `Run`); the helpers every phase
uses to sample rollouts with the policy (`sample_rollouts`, `sampling_model`, `sampler_binder`); and the cadence the
warm start and the RL steps share (`run_steps`), with stopping a run cleanly: SIGTERM and Ctrl-C finish the step in
flight and checkpoint it (`StopRequests`), then `TrainingStopped` is raised; with several processes every process
stops after the same step."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

import grain
import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from tqdm.auto import tqdm

from jaxcredit import multihost, sharding
from jaxcredit.envs import EnvSpec, make_env_spec
from jaxcredit.models import load, load_tokenizer, resolve_source
from jaxcredit.models.decoder import compute_params, param_logical_axes
from jaxcredit.models.tokenizer import tokenizer_mismatch
from jaxcredit.rollout.chat_format import ChatFormat
from jaxcredit.rollout.multiturn import run_rollouts
from jaxcredit.sampling import Sampler, SamplingParams
from jaxcredit.sampling.engine import RolloutEngine
from jaxcredit.train.loop import checkpoint as ckpt_lib
from jaxcredit.train import config as config_lib
from jaxcredit.train.loop import metrics as metrics_lib
from jaxcredit.train.tables import passes as passes_lib
from jaxcredit.train.loop import step as step_lib
from jaxcredit.train.tables.engines import build_engine, make_jax_sampler
from jaxcredit.train.tables.methods import METHODS


@dataclasses.dataclass
class RunState:
  """What changes while a run trains (the rest of a `Run` is fixed once built)."""

  # The number of parameter updates so far (warm-start steps and RL steps; saved with each checkpoint): the version
  # a rollout engine's weights are compared against (config.rollout.max_staleness), in rollout exports.
  policy_version: int = 0
  # Held while the policy's sampler is bound and sampling: the rollout thread of rollout.async_depth, the evals and
  # a pass that samples with the policy (a hindsight skill) share one sampler.
  sampler_lock: Any = dataclasses.field(default_factory=threading.RLock)
  teacher_sampler: Sampler | None = None  # built on first use, for hindsight skills from a teacher checkpoint
  summarizer_sampler: Sampler | None = None  # built on first use, for SGCD's summariser checkpoint
  policy_logp: Any = None  # jitted (params, tokens, mask) -> log-probs, built when an external engine samples


class SamplerAndEnv:
  """What a run that samples from an environment holds open (`Run`, the eval command's `EvalRun`): `sampler` and
  `env`, and `close`, which stops what they started outside this process."""

  sampler: Any
  env: EnvSpec

  def close(self) -> None:
    """Stops what the run started outside this process (a launched rollout server, an environment's server)."""
    try:
      self.sampler.close()
    finally:
      if self.env.close is not None:
        self.env.close()


@dataclasses.dataclass(frozen=True)
class Run(SamplerAndEnv):
  """Everything the loop needs, built once (`build_run`) and never reassigned: the config, the mesh, the tokenizer, the
  environment and its tasks, the models, the engine, the writers; what changes while it trains is `state`."""

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
  sampler: RolloutEngine  # config.rollout.engine's: the in-process Sampler, or a vLLM server's client
  env: EnvSpec
  train_tasks: list
  eval_tasks: list
  teacher: passes_lib.Model | None  # a teacher checkpoint (config.teacher.source), when the method uses one
  pass_fns: passes_lib.PassFns
  writer: metrics_lib.MetricsWriter
  ckpt: ckpt_lib.Checkpointer
  key: jax.Array
  # SGCD's summariser checkpoint (config.credit.<method>.summarizer), when one is named.
  summarizer: passes_lib.Model | None = None
  # With several processes: the mesh over this process's devices that its samplers run on (None with one process:
  # the sampler reads the training mesh's parameters directly).
  local_mesh: Any = None
  state: RunState = dataclasses.field(default_factory=lambda: RunState())  # what changes while it trains


def check_env_fields(config: ml_collections.ConfigDict, env: EnvSpec) -> None:
  """Refuses a method whose passes call an `EnvSpec` field the environment lacks (`passes.Pass.env_fields`: a gold
  answer or privileged information, which an OpenEnv server may not expose).

  Raises:
    ValueError: naming the method, the pass, the missing field and the environment.
  """

  def missing(method: str) -> list[tuple[str, str]]:
    return [
      (name, field)
      for name in METHODS[method].passes
      for field in passes_lib.PASSES[name].env_fields
      if getattr(env, field) is None
    ]

  method = config.credit.method
  lacking = missing(method)
  if lacking:
    name, field = lacking[0]
    usable = ", ".join(m for m in METHODS if not missing(m))
    raise ValueError(
      f"config.credit.method={method!r} runs the pass {name!r}, which needs the environment's {field}, and "
      f"environment {config.env.name!r} has none (an OpenEnv server: config.env.openenv.gold_field names the reset "
      f"observation's field that holds the gold answer); methods that need none: {usable}"
    )


def progress_bar(config, **kw):
  return tqdm(disable=not config.progress, dynamic_ncols=True, **kw)


def model_overrides_dict(config: ml_collections.ConfigDict) -> dict:
  """The numerics the config may change (remat, attention, MoE implementation), as ModelConfig fields."""
  return {
    "remat": bool(config.model.remat),
    "remat_policy": config.model.remat_policy,
    "attention_impl": config.model.attention_impl,
    "attention_chunk": int(config.model.attention_chunk),
    "moe_impl": config.model.moe_impl,
  }


def model_overrides(cfg, config: ml_collections.ConfigDict):
  """cfg with `model_overrides_dict(config)` applied."""
  return dataclasses.replace(cfg, **model_overrides_dict(config))


def load_policy(source: str | os.PathLike, config: ml_collections.ConfigDict, mesh, *, cache_dir: str | None = None):
  """The policy model at `source` (a resolved path, `jaxcredit.models.resolve_source`) as `config.model` sets it up:
  computing in `model.compute_dtype` with parameters stored in `model.param_dtype`, sharded onto `mesh`, with the
  config's numerics (`model_overrides_dict`). Raises what `jaxcredit.models.load` raises."""
  model, _ = load(
    source,
    cache_dir=cache_dir,
    dtype=config.model.compute_dtype or None,
    param_dtype=config.model.param_dtype,
    mesh=mesh,
    config_overrides=model_overrides_dict(config),
  )
  return model


def place_params(model, mesh, rules):
  """`model` split into (graphdef, params, rest) with its parameters placed on `mesh` by the sharding table `rules`
  (`sharding.resolve_rules`), and the parameters' shardings: how the policy, a frozen teacher and an evaluated model
  are all put on the mesh."""
  graphdef, params, rest = step_lib.split_model(model)
  shardings = sharding.param_shardings(params, mesh, param_logical_axes(model.cfg), rules)
  return graphdef, jax.device_put(params, shardings), rest, shardings


def check_processes(config) -> None:
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


def sampling_model(run: Run, params, graphdef=None, rest=None):
  """The model the sampler reads: `params` in the compute dtype; with several processes, this process's own copy
  on its devices (`multihost.local_copy`; collective)."""
  graphdef = run.graphdef if graphdef is None else graphdef
  rest = run.rest if rest is None else rest
  if run.local_mesh is None:
    return nnx.merge(graphdef, params, rest)
  return nnx.merge(graphdef, *multihost.local_copy((compute_params(run.model_cfg, params), rest), run.local_mesh))


def load_frozen_model(source: str, key: str, config, mesh, tok, policy_cfg) -> passes_lib.Model:
  """A frozen model from `source` (a .gguf file, a Hugging Face or converted folder, 'smollm2', or a Hub id), sharded
  like the policy by `config.teacher.sharding_rules`, stored in the compute dtype.

  Raises:
    ValueError: naming `config.<key>` when the source cannot be loaded, or when its tokenizer's vocabulary differs
      from the policy's (naming both sizes): the texts it writes and the log-probs it scores are the policy's tokens.
  """
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
    model_tok = load_tokenizer(path, cache_dir=cache_dir)
  except (OSError, ValueError) as e:
    raise ValueError(
      f"config.{key}={source!r} could not be loaded ({e}); it must be "
      f"'policy', 'reference', 'smollm2', a .gguf file, a Hugging Face or converted folder, "
      f"or a Hub id"
    ) from None
  mismatch = tokenizer_mismatch(model_tok, tok)
  if mismatch or model.cfg.vocab_size != policy_cfg.vocab_size:
    raise ValueError(
      f"config.{key}={source!r} has a vocabulary of {model_tok.vocab_size} tokens "
      f"({model.cfg.vocab_size} embedding rows); the policy's has {tok.vocab_size} "
      f"({policy_cfg.vocab_size} rows){f': {mismatch}' if mismatch else ''}. It must share the policy's tokenizer."
    )
  rules = sharding.resolve_rules(dict(config.teacher.sharding_rules))
  graphdef, params, rest, _ = place_params(model, mesh, rules)
  return passes_lib.Model(graphdef, rest, params, rules=rules)


def load_teacher(config, mesh, tok, policy_cfg) -> passes_lib.Model | None:
  """The teacher checkpoint `config.teacher.source` names (None for "policy" / "reference"), sharded like the
  policy; a tokenizer whose vocabulary differs from the policy's is refused naming both sizes."""
  source = config_lib.teacher_source(config)
  if METHODS[config.credit.method].teacher is None or source in ("policy", "reference"):
    return None
  return load_frozen_model(source, "teacher.source", config, mesh, tok, policy_cfg)


def load_summarizer(config, mesh, tok, policy_cfg) -> passes_lib.Model | None:
  """The checkpoint `config.credit.<method>.summarizer` names (SGCD's credit-reference writer), or None when the
  method has no such knob or names "" (its teacher), "policy" or "reference"."""
  source = (config.credit.get(config.credit.method) or {}).get("summarizer", "")
  if source in passes_lib.SUMMARIZER_NAMED:
    return None
  return load_frozen_model(source, f"credit.{config.credit.method}.summarizer", config, mesh, tok, policy_cfg)


PROMPTS_CHECKED = 256
"""`check_generation_room` reads every eval task's prompt and the first this many train tasks'."""


def check_generation_room(config: ml_collections.ConfigDict, env, tok, *task_lists) -> int:
  """Refuses a sampling budget that leaves a task's first turn no room: a turn is sampled only while its context plus
  `sampling.max_new_tokens` fits `sampling.max_len` (`rollout.multiturn.run_rollouts`), so a prompt beyond that ends
  every rollout of the task before it starts, with no action token (issue 54: `max_new_tokens=2000, max_len=1024`
  trained on nothing and exited 0). Reads the rendered prompts of the first `PROMPTS_CHECKED` tasks of each list.

  Returns:
    the longest prompt read, in tokens.

  Raises:
    ValueError: naming the task, its prompt's length and both keys.
  """
  from jaxcredit.rollout.multiturn import encode_prompt

  room = int(config.sampling.max_len) - int(config.sampling.max_new_tokens)
  longest, worst = 0, None
  for tasks in task_lists:
    for task in list(tasks)[:PROMPTS_CHECKED]:
      n = len(encode_prompt(tok, env.initial_messages(task)))
      if n > longest:
        longest, worst = n, task
  if longest > room:
    name = next((getattr(worst, k) for k in ("task_id", "query_id", "id") if getattr(worst, k, None)), "a task")
    raise ValueError(
      f"{name}'s prompt is {longest} tokens: with config.sampling.max_new_tokens = {config.sampling.max_new_tokens} "
      f"it does not fit config.sampling.max_len = {config.sampling.max_len}, so its rollouts would end before their "
      f"first turn; raise max_len to at least {longest + int(config.sampling.max_new_tokens)}"
      + (
        f" or lower max_new_tokens to at most {int(config.sampling.max_len) - longest}"
        if longest < int(config.sampling.max_len)
        else ""
      )
    )
  return longest


def report_unwinnable(env, split_tasks: Mapping[str, Sequence]) -> dict[str, dict[str, int]]:
  """Prints, per split, how many tasks ground-truth play cannot finish under the environment's caps and why (its
  `unwinnable`), e.g. "[jaxcredit] caps: 213 of 716 train tasks cannot be finished by ground-truth play (71: miss_func:
  more assistant turns than max_turns=8; ...)": such tasks can never pay, in training or in an evaluation.

  Args:
    env: the `EnvSpec`.
    split_tasks: split name ("train" | "eval") -> its tasks.

  Returns:
    split -> reason -> count (empty for an environment without `unwinnable`, or when every task can finish).
  """
  out: dict[str, dict[str, int]] = {}
  if env.unwinnable is None:
    return out
  for split, tasks in split_tasks.items():
    reasons: dict[str, int] = {}
    for task in tasks:
      why = env.unwinnable(task, split)
      if why is not None:
        reasons[why] = reasons.get(why, 0) + 1
    if reasons:
      out[split] = reasons
      detail = "; ".join(f"{n}: {why}" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
      print(
        f"[jaxcredit] caps: {sum(reasons.values())} of {len(tasks)} {split} tasks cannot be finished by ground-truth "
        f"play ({detail})",
        flush=True,
      )
  return out


def build_run(config: ml_collections.ConfigDict, *, write_config: bool = True) -> Run:
  """Validates the config and loads everything a run needs. With `write_config=False` (e.g. `credit_file`) nothing
  is written to the workdir."""
  config_lib.validate(config)
  check_processes(config)
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
  check_env_fields(config, env)
  train_tasks = env.make_tasks("train", config.env.num_train_tasks, config.seed)  # bad sizes fail before the load
  eval_tasks = env.make_tasks("eval", config.eval.num_tasks, None)
  t0 = time.time()
  model = load_policy(source, config, mesh, cache_dir=cache_dir)
  tok = load_tokenizer(source, cache_dir=cache_dir)
  print(f"[jaxcredit] model {config.model.source} loaded in {time.time() - t0:.1f}s")
  check_generation_room(config, env, tok, eval_tasks, train_tasks)
  if multihost.is_primary():
    report_unwinnable(env, {"train": train_tasks, "eval": eval_tasks})
  identity = {"tokenizer": tok.content_digest()}
  if write_config:
    ckpt_lib.check_or_write_identity(config.workdir, identity, write=False)
  graphdef, params, rest, p_sh = place_params(model, mesh, rules)
  local_mesh = None
  if jax.process_count() > 1:  # each process samples on its own devices, from its own copy of the policy
    local_mesh = sharding.make_mesh(
      multihost.local_mesh_shape(dict(config.mesh), jax.process_count()), devices=jax.local_devices()
    )
    model = nnx.merge(graphdef, *multihost.local_copy((params, rest), local_mesh))
  teacher = load_teacher(config, mesh, tok, model.cfg)
  summarizer = load_summarizer(config, mesh, tok, model.cfg)
  # Last, so that nothing fails after a rollout server is launched. Sampler: traced at its first generate, inside
  # train's use_rules block.
  sampler = build_engine(config, model, tok)
  if write_config:
    if multihost.is_primary():
      ckpt_lib.check_or_write_config(config.workdir, config.to_dict())
      ckpt_lib.check_or_write_identity(config.workdir, identity)
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
    summarizer=summarizer,
    pass_fns=passes_lib.PassFns(mesh, config.sampling.temperature),
    writer=metrics_lib.MetricsWriter(config.workdir, tensorboard=config.tensorboard, enabled=jax.process_index() == 0),
    ckpt=ckpt_lib.Checkpointer(config.workdir, max_to_keep=config.max_checkpoints_to_keep),
    key=jax.random.key(config.seed),
    local_mesh=local_mesh,
  )


def data_iterator(num_tasks: int, batch: int, seed: int):
  ds = grain.MapDataset.range(num_tasks).shuffle(seed=seed).repeat().batch(batch, drop_remainder=True)
  return iter(ds.to_iter_dataset())


class SamplingRun(Protocol):
  """What sampling rollouts reads of a run (`sample_rollouts`, the held-out evals): a training `Run`, or `jaxcredit
  eval`'s `EvalRun` (read-only: a `Run` is frozen)."""

  @property
  def config(self) -> Any: ...
  @property
  def env(self) -> EnvSpec: ...
  @property
  def tok(self) -> Any: ...
  @property
  def fmt(self) -> ChatFormat: ...
  @property
  def sampler(self) -> Any: ...


def rollout_sampling_params(run: SamplingRun, *, greedy: bool = False) -> SamplingParams:
  s = run.config.sampling
  return SamplingParams(
    temperature=1.0 if greedy else s.temperature,
    top_p=1e-6 if greedy else s.top_p,
    max_new_tokens=s.max_new_tokens,
    stop_token_ids=run.tok.stop_ids,
    stop_strings=run.env.stop_strings,
  )


def sample_rollouts(run: SamplingRun, tasks, key, *, greedy=False, held_out=False):
  """Rollouts of `tasks` by the parameters the sampler holds (bound with `run.sampler.update_model(
  sampling_model(run, params))`, collective with several processes; sampling itself is process-local). Held-out
  rollouts take the environment's `eval_max_turns` when it has one (its evaluation protocol's turn cap)."""
  envs = [run.env.make_env(t) for t in tasks]
  prompts = [run.env.initial_messages(t) for t in tasks]
  return run_rollouts(
    run.sampler,
    run.tok,
    run.fmt,
    envs,
    prompts,
    rollout_sampling_params(run, greedy=greedy),
    key,
    max_turns=(run.env.eval_max_turns or run.env.max_turns) if held_out else run.env.max_turns,
    max_len=run.config.sampling.max_len,
    step_workers=run.env.step_workers,
  )


def reference_copy(run: Run, params):
  """The frozen reference: a copy of `params` in the compute dtype (it is only read; float32 master weights need
  no float32 reference)."""
  return jax.tree_util.tree_map(jnp.copy, compute_params(run.model_cfg, params))


def sampler_binder(run: Run, held: list | None = None):
  """Binds the policy's sampler to a model of the policy's graph, or builds (once) a sampler for a teacher
  checkpoint. The next rollouts rebind the policy's sampler to the policy (`rollouts`). With several processes
  binding is collective, and each process samples on its own copy of the model.

  Binding the policy's sampler takes `run.state.sampler_lock` (the rollout thread of `rollout.async_depth` samples with
  it) and appends the lock to `held`: the caller releases it when it is done with the sampler (`run_passes` does,
  after the passes)."""

  def bind(model: passes_lib.Model):
    if model.graphdef is run.graphdef:
      policy_model = sampling_model(run, model.params, model.graphdef, model.rest)  # collective: outside the lock
      if held is not None and not held:
        run.state.sampler_lock.acquire()
        held.append(run.state.sampler_lock)
      run.sampler.update_model(policy_model)
      return run.sampler
    if run.local_mesh is None:
      merged = nnx.merge(model.graphdef, model.params, model.rest)
    else:  # each process generates every rollout's text (the same inputs, the same outputs) on its own devices
      merged = nnx.merge(model.graphdef, *multihost.local_copy((model.params, model.rest), run.local_mesh))
    attr = "summarizer_sampler" if model is run.summarizer else "teacher_sampler"  # one sampler per model
    if getattr(run.state, attr) is None:
      setattr(run.state, attr, make_jax_sampler(run.config, merged, run.tok))
    getattr(run.state, attr).update_model(merged)
    return getattr(run.state, attr)

  return bind


# ---------------------------------------------------------------------------------------------------------------
# The step cadence and stopping cleanly


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
