"""`jaxcredit eval`: a model on the environment's held-out split, scored as the trainer's held-out eval scores.

    info = evaluate_model(config, model="runs/quickstart", out_dir="eval/quickstart")   # the run's last checkpoint
    info = evaluate_model(config, model="runs/quickstart@0", out_dir="eval/warm")      # its step-0 checkpoint
    info = evaluate_model(config, out_dir="eval/base", samples=8)                      # config.model.source, pass@8

The tasks are `env.make_tasks("eval", config.eval.num_tasks, None)`, the trainer's held-out tasks; the rollouts are
sampled in batches of `config.eval.batch_size` by `heldout.sample_eval_batch` and scored by `heldout.eval_summaries`,
`heldout.env_metrics_of` and `heldout.eval_metrics`, the functions the trainer's `heldout.eval_heldout` calls: with one sample per
task, the same config and a run's checkpoint, the metrics equal the trainer's held-out eval of that checkpoint.
Decoding is greedy when `config.eval.greedy` (the default) and `samples` is 1; `samples` K > 1 draws K rollouts per
task at the rollouts' temperature and top-p (`config.sampling`) and adds pass@K and mean@K.

`out_dir` receives `rollouts.jsonl` (docs/rollouts-jsonl.md; group id = the task's index, so the K samples of a task
are one group for `jaxcredit credit`), appended batch by batch, and `eval.json`: the model, the config, the split,
the trainer's metrics ("heldout"), every metric with its count and 95% interval ("metrics") and each task's own
values ("per_task", what `jaxcredit compare` pairs between two evals of the same tasks). A rerun into the
same folder resumes: the rollouts already written are read back (their environments replayed from the recorded
assistant messages, for the environment's own metrics) and only the missing ones are sampled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import time
from typing import Any, Sequence

import ml_collections
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from jaxcredit import multihost, output_lock, sharding, trees
from jaxcredit.atomic_files import write_json_atomic
from jaxcredit.envs import EnvSpec, make_env_spec
from jaxcredit.models import load_tokenizer, resolve_source
from jaxcredit.models.tokenizer import tokenizer_mismatch
from jaxcredit.rollout import jsonl as jsonl_lib
from jaxcredit.rollout.chat_format import ChatFormat
from jaxcredit.rollout.multiturn import RolloutResult
from jaxcredit.train.loop import checkpoint as ckpt_lib
from jaxcredit.train.loop import export
from jaxcredit.train.loop import heldout as heldout_lib
from jaxcredit.train.loop import run as run_lib
from jaxcredit.train.tables.engines import build_engine
from jaxcredit.train.loop.heldout import Z95, wilson_interval  # noqa: F401 - re-exported (jaxcredit.train.commands.evaluate's API)

BOOTSTRAP_RESAMPLES = 1000
"""Resamples of the tasks for the intervals of the environment's own metrics (percentile bootstrap, seed 0)."""

IGNORED_KEYS = tuple(k for k in ckpt_lib.RUN_LENGTH_KEYS if k != "eval") + (
  "eval.every",
  "eval.sft_every",
  "eval.before_sft",
  "eval.after_sft",
  "eval.at_end",
)
"""Config keys that cannot change an eval's rollouts: a resumed eval may differ from the first run in these only."""


# ---------------------------------------------------------------------------------------------------------------
# Intervals


def mean_interval(values: Sequence[float], z: float = Z95) -> tuple[float, float] | None:
  """The normal interval of a mean, mean ± z·s/√n (s: the sample standard deviation, n - 1 in its denominator).

  Args:
    values: [n] floats, independent draws (here: one value per task).

  Returns:
    (low, high), or None when n < 2 (no spread to estimate).
  """
  x = np.asarray(values, np.float64)
  if x.size < 2:
    return None
  half = z * float(x.std(ddof=1)) / math.sqrt(x.size)
  return float(x.mean()) - half, float(x.mean()) + half


def pass_at_k(n: int, c: int, k: int) -> float:
  """The unbiased pass@k of one task from n samples of which c succeeded: 1 - C(n-c, k) / C(n, k) (Chen et al.,
  2021, "Evaluating Large Language Models Trained on Code"). With k = n: 1 if any succeeded, else 0.

  Raises:
    ValueError: unless 0 <= c <= n and 1 <= k <= n.
  """
  if not (0 <= c <= n and 1 <= k <= n):
    raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
  if n - c < k:
    return 1.0
  return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _metric(value: float, count: int, interval, method: str) -> dict:
  low, high = (None, None) if interval is None else (float(interval[0]), float(interval[1]))
  return {"value": float(value), "count": int(count), "ci95": [low, high], "interval": method}


def metric_table(env: EnvSpec, results_by_task: Sequence[Sequence[RolloutResult]], heldout: dict) -> dict[str, dict]:
  """Every metric of an eval with its count and 95% interval.

  The unit of the intervals is the task (its samples are not independent of each other): with one sample per task,
  success_rate and answered_frac get Wilson's interval over the tasks; with K > 1 samples, the normal interval of
  the mean of the per-task rates (cut to [0, 1]). tool_calls and mean_turns get the normal interval (cut at 0) of the
  mean of the per-task
  means; pass@K (a task passes when any of its K samples succeeded) Wilson's; the environment's own metrics a
  percentile bootstrap over the tasks (`BOOTSTRAP_RESAMPLES`, seed 0).

  Args:
    env: the environment (its `is_success` and `metrics`).
    results_by_task: [n tasks][K samples] finished rollouts, K equal for every task.
    heldout: `heldout.eval_metrics` of all the rollouts (the values reported).

  Returns:
    {name: {"value": float, "count": tasks, "ci95": [low, high] (null when undefined), "interval": "wilson" |
    "normal" | "bootstrap"}}; pass@K and mean@K only when K > 1.
  """
  n, k = len(results_by_task), len(results_by_task[0])
  per_task: dict[str, list[list[Any]]] = {
    "success_rate": [[env.is_success(r.reward) for r in rs] for rs in results_by_task],
    "answered_frac": [[r.finish == "answer" for r in rs] for rs in results_by_task],
    "tool_calls": [[r.tool_calls for r in rs] for rs in results_by_task],
    "mean_turns": [[r.builder.num_turns for r in rs] for rs in results_by_task],
  }
  table = {}
  for name, rows in per_task.items():
    means = [float(np.mean(row)) for row in rows]
    if name in ("success_rate", "answered_frac") and k == 1:
      table[name] = _metric(heldout[name], n, wilson_interval(int(sum(row[0] for row in rows)), n), "wilson")
    else:
      interval = mean_interval(means)
      if interval is not None:  # cut to the values the metric can take: a rate in [0, 1], a count >= 0
        top = 1.0 if name in ("success_rate", "answered_frac") else math.inf
        interval = (max(0.0, interval[0]), min(top, interval[1]))
      table[name] = _metric(heldout[name], n, interval, "normal")
  if k > 1:
    passed = sum(any(row) for row in per_task["success_rate"])
    table[f"pass@{k}"] = _metric(passed / n, n, wilson_interval(passed, n), "wilson")
    table[f"mean@{k}"] = dict(table["success_rate"])
  env_keys = [key for key in heldout if key.startswith("env/")]
  if env_keys:
    rng = np.random.default_rng(0)
    draws: dict[str, list[float]] = {key: [] for key in env_keys}
    for _ in range(BOOTSTRAP_RESAMPLES):
      pick = rng.integers(0, n, size=n)
      row = heldout_lib.env_metrics_of(env, [r.env for t in pick for r in results_by_task[t]])
      for key in env_keys:
        if key in row:
          draws[key].append(row[key])
    for key in env_keys:
      interval = tuple(np.percentile(draws[key], [2.5, 97.5])) if draws[key] else None
      table[key] = _metric(heldout[key], n, interval, "bootstrap")
  return table


def per_task_rows(env: EnvSpec, tasks: Sequence, results_by_task: Sequence[Sequence[RolloutResult]]) -> list[dict]:
  """Each task's own metrics, for comparing two evals task by task (`jaxcredit compare` of eval folders).

  Args:
    env: the environment (its `is_success` and `metrics`).
    tasks: [n] the held-out tasks.
    results_by_task: [n tasks][K samples] their finished rollouts.

  Returns:
    [n] {"task_id": str | None, "category": the task's `category` attribute (str) or None, "success_rate",
    "answered_frac", "tool_calls", "mean_turns" (means over the task's K samples), "passed" (whether any sample
    succeeded), and the environment's own metrics of the task's rollouts alone ("env/<name>"; a per-category key
    only for a task of that category)}.
  """
  rows = []
  for task, rs in zip(tasks, results_by_task):
    success = [bool(env.is_success(r.reward)) for r in rs]
    category = getattr(task, "category", None)
    rows.append(
      {
        "task_id": export.task_id_of(task),
        "category": None if category is None else str(category),
        "success_rate": float(np.mean(success)),
        "answered_frac": float(np.mean([r.finish == "answer" for r in rs])),
        "tool_calls": float(np.mean([r.tool_calls for r in rs])),
        "mean_turns": float(np.mean([r.builder.num_turns for r in rs])),
        "passed": any(success),
        **heldout_lib.env_metrics_of(env, [r.env for r in rs]),
      }
    )
  return rows


# ---------------------------------------------------------------------------------------------------------------
# The model


@dataclasses.dataclass
class EvalRun(run_lib.SamplerAndEnv):
  """What the trainer's held-out eval functions read (`heldout.sample_eval_batch`, `heldout.eval_summaries`): the
  config, the environment, the tokenizer and its chat format, and the sampler holding the evaluated model."""

  config: ml_collections.ConfigDict
  env: EnvSpec
  tok: Any
  fmt: ChatFormat
  sampler: Any
  tasks: list
  model_info: dict  # what was evaluated: {"source", "kind", and for a training workdir "step" and "base"}


_AT_STEP = re.compile(r"^(.*)@(\d+)$")


def is_training_workdir(path: str) -> bool:
  """Whether `path` is a jaxcredit training workdir (config.json and checkpoints/)."""
  return os.path.isfile(os.path.join(path, "config.json")) and os.path.isdir(os.path.join(path, "checkpoints"))


def parse_model(source: str) -> tuple[str, int | None] | None:
  """(workdir, step or None) when `source` names a training workdir, `W` or `W@STEP`; None for any other source
  (what `config.model.source` takes)."""
  if is_training_workdir(source):
    return source, None
  m = _AT_STEP.match(source)
  if m and is_training_workdir(m.group(1)):
    return m.group(1), int(m.group(2))
  return None


IDENTITY_SAMPLE_BYTES = 1 << 20


def weights_identity(path: str | os.PathLike) -> str:
  """A sha256 (hex) naming the files at `path` (one file, or a folder's files recursively, in name order): each one's
  relative name, size and modification time, and its first and last `IDENTITY_SAMPLE_BYTES`. Replacing or rewriting
  the weights changes it; reading whole multi-GB files to hash them is avoided. A path that is no file or folder (a
  Hub id not yet resolved) is named by itself."""
  h = hashlib.sha256()
  path = os.fspath(path)
  if os.path.isfile(path):
    files = [("", path)]
  elif os.path.isdir(path):
    files = sorted(
      (os.path.relpath(os.path.join(d, n), path), os.path.join(d, n)) for d, _, names in os.walk(path) for n in names
    )
  else:
    return hashlib.sha256(str(path).encode()).hexdigest()
  for name, full in files:
    st = os.stat(full)
    h.update(f"{name}\x00{st.st_size}\x00{st.st_mtime_ns}\x00".encode())
    with open(full, "rb") as f:
      h.update(f.read(IDENTITY_SAMPLE_BYTES))
      if st.st_size > 2 * IDENTITY_SAMPLE_BYTES:
        f.seek(-IDENTITY_SAMPLE_BYTES, os.SEEK_END)
        h.update(f.read(IDENTITY_SAMPLE_BYTES))
  return h.hexdigest()


def load_model(config: ml_collections.ConfigDict, source: str | None, mesh) -> tuple[Any, Any, dict]:
  """The model to evaluate and the config's tokenizer, the model's parameters on `mesh` as the config's sharding
  table (`config.sharding_rules`) places them.

  `source` is anything `config.model.source` takes (a Hugging Face folder or Hub id, a GGUF file, a converted
  checkpoint, "smollm2"), or a training workdir `W` (its latest RL checkpoint) or `W@STEP` (the checkpoint of RL step
  STEP; 0 is the policy as RL started): the policy's parameters of that checkpoint, on the model the workdir's
  config.json names. None: `config.model.source`. The compute and parameter dtypes and the runtime options are the
  config's (`model.compute_dtype`, `model.param_dtype`, `run_lib.model_overrides_dict`).

  Returns:
    (model: the nnx Decoder, tok: the tokenizer of config.model.source, info: {"source", "kind": "model" |
    "workdir", "vocab_size", and for a workdir "base" (its model.source) and "step"}).

  Raises:
    FileNotFoundError: a source that does not exist (`resolve_source`).
    ValueError: a workdir without that checkpoint (naming the steps it has); a model whose tokenizer's vocabulary
      differs from the config's tokenizer's, or with fewer embedding rows than it has tokens (naming both sizes).
  """
  cache_dir = config.model.cache_dir or None
  tok = load_tokenizer(resolve_source(config.model.source), cache_dir=cache_dir)
  source = str(config.model.source) if source is None else str(source)
  workdir = parse_model(source)
  info: dict[str, Any] = {"source": source, "kind": "model"}
  base, base_cache = source, cache_dir
  if workdir is not None:
    from jaxcredit.train.commands.report import run_config

    saved = run_config(workdir[0])
    base, base_cache = str(saved.model.source), saved.model.cache_dir or cache_dir
    ckpt = ckpt_lib.Checkpointer(workdir[0])
    steps = sorted(ckpt.manager.all_steps())
    step = steps[-1] if workdir[1] is None and steps else workdir[1]
    if step is None or step not in steps:
      raise ValueError(
        f"--model {source}: {os.path.join(workdir[0], 'checkpoints')} has no checkpoint of RL step {step}; "
        f"its steps: {steps or 'none'}"
      )
    info.update(kind="workdir", base=base, step=int(step))
  path = resolve_source(base)
  model = run_lib.load_policy(path, config, mesh, cache_dir=base_cache)
  try:
    model_tok = load_tokenizer(path, cache_dir=base_cache)
  except FileNotFoundError:  # a converted checkpoint saved without its tokenizer: only its embedding rows tell
    model_tok = None
  rows = model.cfg.vocab_size
  mismatch = None if model_tok is None else tokenizer_mismatch(model_tok, tok)
  if mismatch or rows < tok.vocab_size:
    raise ValueError(
      f"--model {source}: its vocabulary has {model_tok.vocab_size if model_tok is not None else 'an unknown number of'} "
      f"tokens ({rows} embedding rows), but the config's tokenizer (config.model.source="
      f"{config.model.source!r}) has {tok.vocab_size}{f' ({mismatch})' if mismatch else ''}: the model must share the "
      "config's tokenizer"
    )
  info["vocab_size"] = tok.vocab_size
  # What the results were produced by (issue 54: a resumed eval mixed two models): the tokenizer's content and the
  # weights' files (`weights_identity`: sizes, times and their first and last MiB), the checkpoint step's for a workdir.
  info["identity"] = {
    "tokenizer": tok.content_digest(),
    "weights": weights_identity(path),
  }
  if workdir is not None:
    info["identity"]["checkpoint"] = weights_identity(os.path.join(workdir[0], "checkpoints", str(step)))
  # Placed as the trainer places the policy (the config's sharding table), then a workdir's parameters into them.
  graphdef, params, rest, _ = run_lib.place_params(model, mesh, sharding.resolve_rules(dict(config.sharding_rules)))
  if workdir is not None:
    params = ckpt.restore_params(int(info["step"]), params)
  return nnx.merge(graphdef, params, rest), tok, info


def build_eval_run(config: ml_collections.ConfigDict, model: str | None, *, out_dir: str) -> EvalRun:
  """The environment, its held-out tasks, the model (`load_model`) and the config's rollout engine holding it.
  With `rollout.engine=vllm` and no `rollout.vllm.dir`, the engine's folder is `out_dir/vllm`.

  Raises:
    As `load_model`, and ValueError for what the environment refuses in config.env.
  """
  logging.getLogger("math_verify").setLevel(logging.ERROR)  # as `run_lib.build_run`: its "timeout disabled" notice
  env = make_env_spec(config.env)
  tasks = env.make_tasks("eval", config.eval.num_tasks, None)
  mesh = sharding.make_mesh(dict(config.mesh))
  loaded, tok, info = load_model(config, model, mesh)
  run_lib.check_generation_room(config, env, tok, tasks)  # before the engine starts (a vLLM server)
  run_lib.report_unwinnable(env, {"eval": tasks})
  if config.rollout.engine == "vllm" and not config.rollout.vllm.dir:
    config.rollout.vllm.dir = os.path.join(out_dir, "vllm")
  sampler = build_engine(config, loaded, tok)
  sampler.update_model(loaded, version=0)
  return EvalRun(config, env, tok, ChatFormat.from_tokenizer(tok), sampler, list(tasks), info)


# ---------------------------------------------------------------------------------------------------------------
# The folder


def eval_header(config: ml_collections.ConfigDict, model: str | None, samples: int) -> dict:
  """What identifies an eval, as eval.json records it: the model, the config, the split and the decoding."""
  greedy = bool(config.eval.greedy) and samples == 1
  return {
    "model": str(config.model.source) if model is None else str(model),
    "split": {"env": str(config.env.name), "name": "eval", "num_tasks": int(config.eval.num_tasks)},
    "samples": int(samples),
    "decoding": {
      "greedy": greedy,
      "temperature": None if greedy else float(config.sampling.temperature),
      "top_p": None if greedy else float(config.sampling.top_p),
      "max_new_tokens": int(config.sampling.max_new_tokens),
    },
    "config": config.to_dict(),
  }


def check_resumable(out_dir: str, header: dict) -> bool:
  """Whether `out_dir` holds an eval to resume; it must be this one (same model, split, decoding and config keys,
  `IGNORED_KEYS` aside, and when `header` holds "model_identity", the same model content: tokenizer, weights and
  checkpoint, `load_model`'s identity; the same --model string with other weights behind it is another eval).

  Raises:
    ValueError: out_dir holds another eval, naming every key that differs and both values; or an eval.json that is
      not an eval's.
  """
  path = os.path.join(out_dir, "eval.json")
  if not os.path.exists(path):
    if os.path.exists(os.path.join(out_dir, "rollouts.jsonl")):
      raise ValueError(f"--out {out_dir} holds rollouts.jsonl but no eval.json: not an eval folder to resume")
    return False
  try:
    with open(path) as f:
      saved = json.load(f)
    identity = saved.get("model_identity", "<not recorded>") if "model_identity" in header else None
    saved = {k: saved[k] for k in ("model", "split", "samples", "decoding", "config")}
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise ValueError(f"--out {out_dir}: eval.json is not an eval's ({e!r}); use a new --out") from None
  if identity is not None:
    saved["model_identity"] = identity
  # Compared as JSON reads them back (a tuple of the config is a list in eval.json).
  a, b = trees.flatten(saved, sep="."), trees.flatten(json.loads(json.dumps(header)), sep=".")
  ignored = tuple(f"config.{k}" for k in IGNORED_KEYS)
  diff = sorted(
    k for k in set(a) | set(b) if not any(k == i or k.startswith(i + ".") for i in ignored) and a.get(k) != b.get(k)
  )
  if diff:
    lines = "; ".join(
      f"{k}: the folder's eval has {a.get(k, '<missing>')!r}, now {b.get(k, '<missing>')!r}" for k in diff
    )
    raise ValueError(f"--out {out_dir} holds another eval ({lines}); use a new --out, or the same settings to resume")
  return True


def _atomic_write_json(path: str, obj) -> None:
  write_json_atomic(path, obj, indent=1)


def read_done(path: str, vocab_size: int) -> list[dict]:
  """The records of an interrupted eval's rollouts.jsonl. A last line cut off mid-write (no newline) is dropped
  from the file.

  Raises:
    ValueError: a complete line that is not a valid record (`jsonl_lib.read_jsonl`).
  """
  if not os.path.exists(path):
    return []
  with open(path, "rb") as f:
    data = f.read()
  cut = data.rfind(b"\n") + 1
  if cut < len(data):
    with open(path, "r+b") as f:
      f.truncate(cut)
  return jsonl_lib.read_jsonl(path, vocab_size=vocab_size)


def rollout_id(task: int, sample: int) -> str:
  """The id of sample `sample` of held-out task `task` in rollouts.jsonl."""
  return f"eval{task}_{sample}"


def to_record(run: EvalRun, result: RolloutResult, task_index: int, sample: int) -> dict:
  """One eval rollout as a rollouts-JSONL record: group id the task's index, metadata["sample"] its sample."""
  task = run.tasks[task_index]
  return jsonl_lib.rollout_to_record(
    result,
    rollout_id=rollout_id(task_index, sample),
    group_id=task_index,
    unit_rewards=list(run.env.unit_rewards(result.env)) if run.env.unit_rewards is not None else None,
    task_id=export.task_id_of(task),
    tools=run.env.tools(task) if run.env.tools is not None else None,
    metadata={"sample": sample},
  )


def replay(run: EvalRun, record: dict, task_index: int) -> RolloutResult:
  """The rollout of a record read back: its builder, and a fresh environment of its task fed the recorded assistant
  messages (for the environment's own metrics).

  Raises:
    ValueError: the record's task_id is not task `task_index`'s, or the replayed environment's reward differs from
      the recorded one (an environment that does not replay the same way cannot resume).
  """
  task = run.tasks[task_index]
  where = f"rollout {record['rollout_id']!r}"
  if record.get("task_id") is not None and record["task_id"] != export.task_id_of(task):
    raise ValueError(
      f"{where} has task_id {record['task_id']!r}, but held-out task {task_index} is {export.task_id_of(task)!r}"
    )
  env = run.env.make_env(task)
  for m in record.get("messages") or []:
    if m.get("role") == "assistant":
      env.step(m.get("content") or "")
  reward = float(env.reward())
  if reward != float(record["reward"]):
    raise ValueError(
      f"{where}: replaying its assistant messages gives reward {reward}, but {record['reward']} was recorded; "
      "the environment does not replay the same way, so the eval cannot resume: use a new --out"
    )
  meta = record.get("metadata") or {}
  return RolloutResult(
    builder=jsonl_lib.record_to_builder(record),
    env=env,
    reward=float(record["reward"]),
    finish=record.get("finish") or "",
    tool_calls=int(meta.get("tool_calls", 0)),
    tool_errors=int(meta.get("tool_errors", 0)),
    messages=list(record.get("messages") or []),
  )


# ---------------------------------------------------------------------------------------------------------------
# The eval


MAX_ROLLOUTS = 1_000_000
"""The most rollouts one eval samples (--samples x eval.num_tasks): its task-sample pairs and their results are held in
memory, and a million short rollouts is already days of sampling."""


def evaluate_model(
  config: ml_collections.ConfigDict, *, model: str | None = None, out_dir: str, samples: int = 1
) -> dict:
  """Evaluates a model on the held-out split (see the module docstring); resumes an eval in `out_dir`.

  Args:
    config: a validated training config (`config_lib.validate`): env, eval.num_tasks, eval.batch_size,
      eval.greedy, sampling, model dtypes, rollout.engine, mesh.
    model: what to evaluate (`load_model`); None: config.model.source.
    out_dir: the folder of eval.json and rollouts.jsonl (created; an eval there is resumed).
    samples: K >= 1 rollouts per task; K > 1 samples at config.sampling's temperature and top-p.

  Returns:
    eval.json's content: the header (`eval_header`), "model_info" (`load_model`'s info), "heldout" (the trainer's
    held-out metrics, `heldout.eval_metrics`), "metrics" (`metric_table`), "per_task" (`per_task_rows`),
    "num_rollouts", "resumed" (rollouts read
    back), "sampled" (rollouts sampled now), "seconds".

  Raises:
    ValueError: samples < 1 or samples x eval.num_tasks > MAX_ROLLOUTS; out_dir holding another eval (`check_resumable`) or a bad record; as `load_model`.
    FileNotFoundError: as `load_model`.
    output_lock.OutputBusyError: another process is writing to `out_dir` (`jaxcredit.output_lock`).
  """
  if samples < 1:
    raise ValueError(f"--samples must be >= 1, got {samples}")
  if samples * int(config.eval.num_tasks) > MAX_ROLLOUTS:
    # Every (task, sample) pair is listed before the first rollout: 1e9 samples were killed by the OOM killer.
    raise ValueError(
      f"--samples {samples} x config.eval.num_tasks = {config.eval.num_tasks} is {samples * int(config.eval.num_tasks)} "
      f"rollouts, more than one eval takes ({MAX_ROLLOUTS}); lower --samples or eval.num_tasks"
    )
  t0 = time.time()
  header = eval_header(config, model, samples)
  resuming = check_resumable(out_dir, header)
  run = build_eval_run(config, model, out_dir=out_dir)  # refusals (the model, its vocabulary) before out_dir is made
  try:
    os.makedirs(out_dir, exist_ok=True)
    lock = output_lock.hold(out_dir, "eval") if multihost.is_primary() else contextlib.nullcontext()
    with lock, sharding.use_rules(sharding.resolve_rules(dict(config.sharding_rules))):
      # Again, under the lock (another eval may have written meanwhile), now with what the model's files hold.
      header = dict(header, model_identity=run.model_info["identity"])
      resuming = check_resumable(out_dir, header)
      return _evaluate(run, header, out_dir, samples, resuming, t0)
  finally:
    run.close()


def _evaluate(run: EvalRun, header: dict, out_dir: str, samples: int, resuming: bool, t0: float) -> dict:
  c = run.config
  plan = [(t, k) for t in range(len(run.tasks)) for k in range(samples)]
  index = {rollout_id(t, k): (t, k) for t, k in plan}
  path = os.path.join(out_dir, "rollouts.jsonl")
  done: dict[tuple[int, int], RolloutResult] = {}
  for record in read_done(path, run.tok.vocab_size) if resuming else []:
    where = index.get(record["rollout_id"])
    if where is None:
      raise ValueError(f"{path}: rollout {record['rollout_id']!r} is none of this eval's {len(plan)} rollouts")
    done[where] = replay(run, record, where[0])
  resumed = len(done)
  if not resuming:
    with open(path, "w"):
      pass
    _atomic_write_json(os.path.join(out_dir, "eval.json"), {"status": "running", **header})
  greedy = header["decoding"]["greedy"]
  bs = c.eval.batch_size
  todo = len(plan) - resumed
  if resumed:
    print(f"[jaxcredit] eval: resuming {out_dir}: {resumed} rollouts done, {todo} to sample")
  bar = tqdm(total=len(plan), initial=resumed, desc="eval", unit="rollout", disable=not c.progress, dynamic_ncols=True)
  for start in range(0, len(plan), bs):
    missing = [j for j in plan[start : start + bs] if j not in done]
    if not missing:
      continue
    results = heldout_lib.sample_eval_batch(run, [run.tasks[t] for t, _ in missing], start, greedy=greedy)
    records = [to_record(run, r, t, k) for r, (t, k) in zip(results, missing)]
    jsonl_lib.append_jsonl(path, records)
    done.update(zip(missing, results))
    bar.update(len(missing))
  bar.close()
  results = [done[j] for j in plan]
  heldout = heldout_lib.eval_metrics(
    heldout_lib.eval_summaries(run, results), [heldout_lib.env_metrics_of(run.env, [r.env for r in results])]
  )
  by_task = [results[i : i + samples] for i in range(0, len(results), samples)]
  info = {
    "status": "done",
    **header,
    "model_info": run.model_info,
    "task_ids": [export.task_id_of(t) for t in run.tasks],
    "heldout": heldout,
    "metrics": metric_table(run.env, by_task, heldout),
    "per_task": per_task_rows(run.env, run.tasks, by_task),
    "num_rollouts": len(results),
    "resumed": resumed,
    "sampled": todo,
    "seconds": time.time() - t0,
  }
  _atomic_write_json(os.path.join(out_dir, "eval.json"), info)
  return info


def format_table(info: dict) -> str:
  """eval.json's metrics as a text table: metric, value, 95% interval, count."""
  rows = [("metric", "value", "95% interval", "count", "interval")]
  for name, m in info["metrics"].items():
    low, high = m["ci95"]
    ci = "n/a" if low is None else f"[{low:.3f}, {high:.3f}]"
    rows.append((name, f"{m['value']:.3f}", ci, str(m["count"]), m["interval"]))
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  return "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)
