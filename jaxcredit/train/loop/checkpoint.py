"""Resumable runs: orbax checkpoints of everything a resume needs, and the config-compatibility check.

A checkpoint holds params, optimizer state and a JSON `meta` item (RL step, phase, data-iterator state,
RNG key, metrics-row count). The warm start keeps its own checkpoints in `<workdir>/warm_start` (its step, data
position and the demonstration RNG's state in `meta`), so a warm start stopped mid-way resumes where it stopped;
they are removed once the step-0 RL checkpoint is written. The frozen reference (the policy as RL starts) is written once to
`<workdir>/reference`, right before the step-0 checkpoint; a fresh start removes any reference a dead run left. `<workdir>/config.json` records the training config; a rerun whose training keys
differ is refused before anything in the workdir is touched.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxcredit import multihost, trees
from jaxcredit.atomic_files import write_json_atomic

# Keys that only change how long a run is, how often it logs / checkpoints / evaluates / writes model folders, where
# it goes, or where an environment's server is.
# Everything else changes what is trained and must match on resume.
RUN_LENGTH_KEYS = (
  "workdir",
  "config_file",
  "total_steps",
  "log_every",
  "checkpoint_every",
  "max_checkpoints_to_keep",
  "eval",
  "model.cache_dir",
  "progress",
  "tensorboard",
  "compilation_cache_dir",
  "log_rollouts_every",
  "log_rollouts_count",
  "sft.checkpoint_every",
  "sft.model_every",
  # where an environment's server runs (a restarted server has another port) and how long to wait for it
  "env.openenv.url",
  "env.openenv.command",
  "env.openenv.cwd",
  "env.openenv.log",
  "env.openenv.startup_timeout_s",
  "env.openenv.timeout_s",
  "env.openenv.max_concurrent",
  "env.mcp_tools.servers",
  "env.mcp_tools.timeout_s",
  "env.mcp_tools.startup_timeout_s",
)


def _is_run_length(key: str) -> bool:
  return any(key == k or key.startswith(k + ".") for k in RUN_LENGTH_KEYS)


def _other_method_knob(key: str, method: str | None) -> bool:
  """`credit.<name>.<knob>` of a method other than the one trained: it cannot change the run."""
  parts = key.split(".")
  return len(parts) >= 3 and parts[0] == "credit" and parts[1] != method


def _other_env_key(key: str, env: str | None) -> bool:
  """`env.<name>.<key>` of an environment other than the one trained on."""
  parts = key.split(".")
  return len(parts) >= 3 and parts[0] == "env" and parts[1] != env


ADDED_KEYS = {
  "optim.b1": 0.9,
  "optim.b2": 0.999,
  "env.chain.reward": "outcome",
  "env.session.split_key": "session",
}
"""Training keys added after runs were saved, each with the value that reproduces what a run saved without it did:
a config.json that lacks one reads as holding that value (so an earlier run resumes unless the key now differs)."""


def training_key_diff(saved: dict, current: dict) -> list[str]:
  """Training keys whose values differ between two config dicts (run-length keys, the knobs of methods other
  than the trained one and the keys of other environments ignored; a key of `ADDED_KEYS` missing from `saved` reads
  as its value there)."""
  a, b = trees.flatten(saved, sep="."), trees.flatten(current, sep=".")
  a = {**{k: v for k, v in ADDED_KEYS.items() if k in b}, **a}
  method = b.get("credit.method")
  env = b.get("env.name")
  keys = sorted(
    k
    for k in set(a) | set(b)
    if not _is_run_length(k) and not _other_method_knob(k, method) and not _other_env_key(k, env)
  )
  return [k for k in keys if a.get(k, "<missing>") != b.get(k, "<missing>")]


class WorkdirRefused(ValueError):
  """The workdir holds a run this config may not resume or overwrite (other training keys, another tokenizer, no
  config.json beside checkpoints, an unreadable config.json): a refusal of the input, exit 2 at the CLI."""


def check_or_write_config(workdir: str, config_dict: dict, *, write: bool = True) -> bool:
  """Refuses a workdir trained with different training keys; writes config.json for a new run.

  Args:
    write: False only checks; the trainer checks first and writes once the run is built, so a config that
      fails to build (bad mesh, missing model) leaves nothing behind that would block its corrected rerun.

  Returns:
    True if the workdir already held a run with a compatible config.

  Raises:
    WorkdirRefused: naming every training key that differs (and both values); config.json unreadable (naming the
      file); checkpoints without a config.json to check them against. Nothing is written.
  """
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path):
    try:
      with open(path) as f:
        saved = json.load(f)
      if not isinstance(saved, dict):
        raise ValueError(f"a JSON {type(saved).__name__}, not an object")
    except (OSError, ValueError) as e:
      raise WorkdirRefused(
        f"{path} is not a readable config ({e}); restore it, or use a new --config.workdir"
      ) from None
    diff = training_key_diff(saved, config_dict)
    if diff:
      a, b = trees.flatten(saved, sep="."), trees.flatten(config_dict, sep=".")
      lines = "\n".join(
        f"  {k}: checkpoint has {a.get(k, '<missing>')!r}, config has {b.get(k, '<missing>')!r}" for k in diff
      )
      raise WorkdirRefused(
        f"workdir {workdir} holds a run trained with different training keys; refusing to resume or "
        f"overwrite it:\n{lines}\nUse a new --config.workdir, or set these keys back."
      )
    if write:
      _atomic_write_json(path, config_dict)  # run-length keys may change
    return True
  checkpoints = os.path.join(workdir, "checkpoints")
  if os.path.isdir(checkpoints) and os.listdir(checkpoints):
    raise WorkdirRefused(
      f"workdir {workdir} holds checkpoints but no config.json to check this config's training keys against; "
      "restore config.json, or use a new --config.workdir"
    )
  if write:
    os.makedirs(workdir, exist_ok=True)
    _atomic_write_json(path, config_dict)
  return False


def check_or_write_identity(workdir: str, identity: dict, *, write: bool = True) -> None:
  """Refuses to resume a workdir whose run was made with other content behind the same config (issue 54): its
  `identity.json` ({"tokenizer": `ChatTokenizer.content_digest`}) must equal `identity`; a workdir without one (made
  before it was recorded) gets it. A changed tokenizer would turn the same text into other ids than the checkpoint's
  policy learnt.

  Raises:
    ValueError: naming the workdir and what differs (both digests' first 12 characters).
  """
  path = os.path.join(workdir, "identity.json")
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    diff = sorted(k for k in identity if k in saved and saved[k] != identity[k])
    if diff:
      lines = ", ".join(f"{k} {str(saved[k])[:12]}... now {str(identity[k])[:12]}..." for k in diff)
      raise WorkdirRefused(
        f"workdir {workdir} holds a run made with another {' and '.join(diff)} behind the same config ({lines}); "
        "refusing to resume it: point config.model.source at what the run was made with, or use a new workdir"
      )
  if write:
    os.makedirs(workdir, exist_ok=True)
    _atomic_write_json(path, identity)


def _atomic_write_json(path: str, obj: Any) -> None:
  write_json_atomic(path, obj, indent=2, sort_keys=True)


def saved_steps(workdir: str) -> list[int]:
  """The RL steps of the checkpoints saved in `workdir`/checkpoints (0: the warm start), ascending; [] when none.
  Reads the folder only (no checkpoint manager is made, nothing is created)."""
  folder = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in (os.listdir(folder) if os.path.isdir(folder) else []) if n.isdigit())


class Checkpointer:
  """Thin wrapper over orbax's CheckpointManager for the trainer's state."""

  def __init__(self, workdir: str, *, max_to_keep: int = 2):
    self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
    self.reference_dir = os.path.abspath(os.path.join(workdir, "reference"))
    self.manager = ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False),
    )
    self.warm_start_dir = os.path.abspath(os.path.join(workdir, "warm_start"))
    self._warm_start = None

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def _warm_start_manager(self) -> ocp.CheckpointManager:
    if self._warm_start is None:
      self._warm_start = ocp.CheckpointManager(
        self.warm_start_dir,
        options=ocp.CheckpointManagerOptions(max_to_keep=1, create=True, enable_async_checkpointing=False),
      )
    return self._warm_start

  def latest_warm_start_step(self) -> int | None:
    """The warm-start step of the latest warm-start checkpoint, or None."""
    if not os.path.isdir(self.warm_start_dir):
      return None
    return self._warm_start_manager().latest_step()

  def save_warm_start(self, step: int, params, opt_state, meta: dict) -> None:
    _save(self._warm_start_manager(), step, params, opt_state, meta)

  def restore_warm_start(self, step: int, params_like, opt_state_like) -> tuple[Any, Any, dict]:
    return _restore(self._warm_start_manager(), step, params_like, opt_state_like)

  def remove_warm_start(self) -> None:
    """Removes the warm-start checkpoints (called once the step-0 RL checkpoint holds their result)."""
    if self._warm_start is not None:
      self._warm_start.close()
      self._warm_start = None
    _remove_tree(self.warm_start_dir, "warm start removed")

  def save(self, step: int, params, opt_state, meta: dict) -> None:
    _save(self.manager, step, params, opt_state, meta)

  def restore(self, step: int, params_like, opt_state_like) -> tuple[Any, Any, dict]:
    """Restores into the structure and shardings of the given templates (arrays or ShapeDtypeStructs)."""
    return _restore(self.manager, step, params_like, opt_state_like)

  def restore_params(self, step: int, params_like):
    """Restores only the parameters of a step (e.g. for `jaxcredit credit`)."""
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, params_like)
    out = _checked_restore(self.manager, step, ocp.args.Composite(params=ocp.args.StandardRestore(abstract)))
    return out["params"]

  def has_reference(self) -> bool:
    return os.path.isdir(self.reference_dir)

  def remove_reference(self) -> None:
    """Removes a reference left by a run that died before its step-0 checkpoint (orbax will not overwrite it)."""
    _remove_tree(self.reference_dir, "stale reference removed")

  def save_reference(self, params) -> None:
    with ocp.StandardCheckpointer() as checkpointer:
      checkpointer.save(self.reference_dir, params)
      checkpointer.wait_until_finished()

  def restore_reference(self, params_like):
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, params_like)
    with ocp.StandardCheckpointer() as checkpointer:
      return checkpointer.restore(self.reference_dir, abstract)


def _remove_tree(path: str, barrier: str) -> None:
  """Removes a folder of the (shared) workdir: process 0 removes it, every process waits for it."""
  multihost.barrier(barrier + " (before)")
  if multihost.is_primary() and os.path.isdir(path):
    shutil.rmtree(path)
  multihost.barrier(barrier)


def _save(manager: ocp.CheckpointManager, step: int, params, opt_state, meta: dict) -> None:
  manager.save(
    step,
    args=ocp.args.Composite(
      params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt_state), meta=ocp.args.JsonSave(meta)
    ),
    force=True,
  )
  manager.wait_until_finished()


def _checked_restore(manager: ocp.CheckpointManager, step: int, args):
  """`manager.restore(step, args=args)`, with a checkpoint that lost a part (its params/ or opt_state/ folder gone:
  orbax's KeyError 'Item "params" was not found') refused in one line naming the step's folder (issue 54)."""
  try:
    return manager.restore(step, args=args)
  except (KeyError, FileNotFoundError) as e:
    folder = os.path.join(os.fspath(manager.directory), str(step))
    raise ValueError(
      f"the checkpoint {folder} is incomplete ({' '.join(str(e).split())[:200]}); remove that step's folder to resume "
      "from the one before it, or use a new workdir"
    ) from None


def _restore(manager: ocp.CheckpointManager, step: int, params_like, opt_state_like) -> tuple[Any, Any, dict]:
  abstract = lambda t: jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, t)
  out = _checked_restore(
    manager,
    step,
    ocp.args.Composite(
      params=ocp.args.StandardRestore(abstract(params_like)),
      opt_state=ocp.args.StandardRestore(abstract(opt_state_like)),
      meta=ocp.args.JsonRestore(),
    ),
  )
  return out["params"], out["opt_state"], out["meta"]
