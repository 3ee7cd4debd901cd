"""`jaxcredit viz`: the credit viewer's pages for a run's rollout samples, with every requested method's advantages
on the same rollouts (docs/viewer.md).

    view_samples("runs/quickstart", methods=["trace", "grpo", "gear"])   # -> runs/quickstart/viewer/step_N/index.html

The trainer writes rollout samples (`config.log_rollouts_every`): whole prompt groups of a step, with the advantages
it trained on, every pass output and the method's details. The trained method is shown as trained; every other
method is computed again on the same rollouts by `offline_credit.credit_records`, running the passes it needs with the
workdir's latest checkpoint (and its reference). The page of each method says which.
"""

from __future__ import annotations

import json
import os
import re

import ml_collections

from jaxcredit.models import load_tokenizer, resolve_source
from jaxcredit.rollout import jsonl as jsonl_lib
from jaxcredit.train import config as config_lib
from jaxcredit.train.commands import offline_credit
from jaxcredit.train.loop.checkpoint import saved_steps
from jaxcredit.train.tables.methods import METHODS
from jaxcredit.viz import page

_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")


def sample_steps(workdir: str) -> list[int]:
  """The RL steps with rollout samples in `workdir/rollout_samples`, ascending."""
  folder = os.path.join(workdir, "rollout_samples")
  if not os.path.isdir(folder):
    return []
  return sorted(int(m.group(1)) for m in map(_STEP_FILE.match, os.listdir(folder)) if m)


def run_config(workdir: str) -> ml_collections.ConfigDict:
  """The training config recorded in `workdir/config.json`, over today's defaults (so that a run recorded before a
  key existed still builds), with `workdir` set to where the run is now. A run whose method or environment is a row
  its config file registers gets it again (`register_rows`).

  Raises:
    ValueError: no config.json in the workdir, or one that is not a JSON object; a row the run needs whose config
      file is gone (`register_rows`).
  """
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise ValueError(f"{workdir} has no config.json: not a jaxcredit training workdir")
  try:
    with open(path) as f:
      saved = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
  if not isinstance(saved, dict):
    raise ValueError(f"{path}: expected a JSON object (the training config), got {type(saved).__name__}")
  register_rows(saved)
  config = config_lib.base_config()  # after the rows: it holds a node of knobs per METHODS row
  try:
    config.update(saved)
  except (TypeError, AttributeError, ValueError) as e:
    raise ValueError(f"{path}: a key does not fit the training config ({e})") from None
  config.workdir = workdir
  return config


def register_rows(saved: dict) -> None:
  """Registers again the rows a run's config file added to the tables, when the recorded config (`saved`, a
  config.json dict) names a method or an environment that is not a row here: the file recorded as `config_file`
  (set by the CLI to the `--config` file) is run again (`config.load_config_file`). Nothing is done otherwise.

  Raises:
    ValueError: naming the method or environment and the file, when no file was recorded or it cannot be loaded.
  """
  from jaxcredit.envs import ENVS

  method = (saved.get("credit") or {}).get("method")
  env = (saved.get("env") or {}).get("name")
  missing = [f"method {method!r}" for m in [method] if m and m not in METHODS]
  missing += [f"environment {env!r}" for e in [env] if e and e not in ENVS]
  if not missing:
    return
  spec = saved.get("config_file") or ""
  what = " and ".join(missing)
  if not spec:
    raise ValueError(
      f"the run's {what} is not a registered row here, and its config.json records no config_file that registers "
      f"it (runs trained before config_file was recorded, or not through the jaxcredit CLI)"
    )
  try:
    config_lib.load_config_file(spec)
  except Exception as e:  # noqa: BLE001 - whatever the user's file raises, said with its name
    raise ValueError(f"the run's {what} is registered by its config file {spec}, which could not be loaded: {e!r}")
  still = [m for m in [method] if m and m not in METHODS] + [e for e in [env] if e and e not in ENVS]
  if still:
    raise ValueError(f"the run's config file {spec} was loaded but registers no row {still}")


def view_samples(
  workdir: str,
  *,
  step: int | None = None,
  methods: list[str] | None = None,
  out_dir: str | None = None,
  config: ml_collections.ConfigDict | None = None,
  rollouts: str | None = None,
) -> dict:
  """Writes the viewer's pages for one step's rollout samples, or for the rollouts of a JSONL file (`rollouts`,
  e.g. a `jaxcredit eval` folder's rollouts.jsonl) credited with the workdir's config and latest checkpoint.

  Args:
    workdir: a training workdir with rollout samples (`config.log_rollouts_every` > 0).
    step: the RL step (default: the latest with samples).
    methods: method names (keys of METHODS), one tab each, in order; default the trained method, then GRPO.
    out_dir: default `workdir/viewer/step_<step>`.
    config: the run's config (default: `workdir/config.json`); other methods use its knobs and models.
    rollouts: a rollouts JSONL file to show instead of the workdir's samples (`step` is then ignored; a method
      without the file's advantages is computed now, a group method needing groups of its size, e.g.
      `jaxcredit eval --samples K`); default out_dir `workdir/viewer/<the file's folder name>`.

  Returns:
    {"index": path of index.html, "rollouts": pages written, "step": step (None for `rollouts`), "methods": names}.

  Raises:
    ValueError: no samples (or none at `step`), a sample line with a token id outside the tokenizer's vocabulary
      (file, line and field named), an unknown method, or a method that cannot be computed here
      (the message names it and why: a missing teacher, a group too small, ...).
  """
  if rollouts is not None:
    if not os.path.isfile(rollouts):
      raise ValueError(f"--rollouts {rollouts}: not a file")
    path, step = rollouts, None
  else:
    steps = sample_steps(workdir)
    if not steps:
      raise ValueError(
        f"{workdir}/rollout_samples holds no step_N.jsonl: train with --config.log_rollouts_every=N to write "
        "rollout samples"
      )
    step = steps[-1] if step is None else int(step)
    if step not in steps:
      raise ValueError(f"no rollout samples for step {step} in {workdir}/rollout_samples; steps with samples: {steps}")
    path = os.path.join(workdir, "rollout_samples", f"step_{step}.jsonl")
  config = run_config(workdir) if config is None else config
  config_lib.validate(config)
  tok = load_tokenizer(resolve_source(config.model.source), cache_dir=config.model.cache_dir or None)
  records = jsonl_lib.read_jsonl(path, vocab_size=tok.vocab_size)  # the pages decode every id with it
  if not records:
    raise ValueError(f"{path} holds no rollouts")
  trained = records[0].get("method") or config.credit.method
  if methods is None:
    methods = [trained] + (["grpo"] if trained != "grpo" else [])
  unknown = [m for m in methods if m not in METHODS]
  if unknown:
    raise ValueError(f"unknown method(s) {unknown}; known: {sorted(METHODS)}")
  latest = max(saved_steps(workdir), default=None)
  credited, notes, peer_ids = {}, {}, {}
  for name in methods:
    if name == trained and step is not None and all("advantages" in r for r in records):
      credited[name] = records
      notes[name] = f"as trained at step {step}"
      peer_ids[name] = [f"step{step}_{i}" for i in range(_batch_size(records, step))]
      continue
    c = ml_collections.ConfigDict(config.to_dict())
    c.credit.method = name
    if METHODS[name].teacher is None:
      c.teacher.source = ""  # the trained method's teacher: a method without a teacher pass refuses one
    try:
      credited[name], _ = offline_credit.credit_records(c, records, source=path, details=True)
    except ValueError as e:
      raise ValueError(f"method {name!r}: {e}") from None
    needs = METHODS[name].passes
    notes[name] = (
      f"computed now; passes {', '.join(needs)} scored with "
      + (f"the checkpoint of step {latest}" if latest is not None else "config.model.source")
      if needs
      else "computed now (no passes)"
    )
    peer_ids[name] = [r["rollout_id"] for r in records]
  if out_dir is None and step is None:
    out_dir = os.path.join(workdir, "viewer", os.path.basename(os.path.dirname(os.path.abspath(path))))
  out_dir = out_dir or os.path.join(workdir, "viewer", f"step_{step}")
  try:
    index = page.write_rollout_pages(
      out_dir,
      credited,
      tok.decode,
      step=step,
      summaries={m: METHODS[m].summary for m in methods},
      notes=notes,
      peer_ids=peer_ids,
      title=f"jaxcredit: rollouts of step {step} ({os.path.basename(os.path.abspath(workdir))})"
      if step is not None
      else f"jaxcredit: rollouts of {path}",
    )
  except (TypeError, AttributeError, KeyError) as e:  # metadata.passes / credit_details of another layout
    raise ValueError(f"{path}: a record's pass outputs or credit details have an unexpected layout ({e!r})") from None
  return {"index": index, "rollouts": len(records), "step": step, "methods": list(methods)}


def _batch_size(records, step: int) -> int:
  """The step's batch size as far as the sample's rollout ids ("step{N}_{i}") tell."""
  prefix = f"step{step}_"
  rows = [int(r["rollout_id"][len(prefix) :]) for r in records if re.fullmatch(rf"{prefix}\d+", r["rollout_id"])]
  return max(rows, default=-1) + 1
