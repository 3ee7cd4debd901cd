"""What a run writes about its rollouts: JSONL exports with the advantages computed for them (`export_rollouts`,
docs/rollouts-jsonl.md), each rollout's pass outputs and credit details as JSON values (`pass_outputs_of`,
`rollout_values`) and the credit viewer's pages of the latest sample (`write_viewer`)."""

from __future__ import annotations

import os
import re

import numpy as np

from jaxcredit.rollout import jsonl as jsonl_lib
from jaxcredit.trajectory import Rollouts
from jaxcredit.train.tables import pass_outputs
from jaxcredit.train.tables.methods import METHODS
from jaxcredit.train.loop.run import Run
from jaxcredit.viz import page as viz_page


def write_viewer(run: Run) -> str | None:
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


def sample_rows(group_ids_B, count: int) -> list[int]:
  """The rollouts of the groups that hold the first `count` rollouts, in batch order: whole groups, so that a
  group method's advantages can be computed again from the sample (`jaxcredit viz`)."""
  group_ids = [int(g) for g in np.asarray(group_ids_B)]
  keep = set(group_ids[:count])
  return [i for i, g in enumerate(group_ids) if g in keep]


def export_rollouts(
  run: Run,
  path: str,
  rollouts: Rollouts,
  out,
  *,
  rollout_ids,
  rows=None,
  with_passes: bool = False,
) -> None:
  """Writes `rollouts` as JSONL (jaxcredit/rollout/jsonl.py; docs/rollouts-jsonl.md), with the advantages computed
  for them (`out`, the method's `MethodOutput`): one line per rollout, its group id the index of its prompt group.
  `rows`: which rollouts (default all); `with_passes`: also every pass output of each rollout under
  metadata["passes"] (`pass_outputs_of`) and the method's per-rollout details (TRACE's state values, GEAR's
  segments, ...) under metadata["credit_details"]. Each record's metadata holds its tool calls and errors, the
  process that sampled it when several did, and the policy version that sampled it when known."""
  traj = rollouts.traj
  rows = range(rollouts.batch_size) if rows is None else list(rows)
  several = len(set(rollouts.process_B.tolist())) > 1
  records = []
  for i in rows:
    task = rollouts.tasks[i]
    records.append(
      jsonl_lib.rollout_to_record(
        rollouts.builders[i],
        rollout_id=rollout_ids[i],
        group_id=int(traj.group_ids_B[i]),
        reward=rollouts.rewards[i],
        unit_rewards=[float(x) for x in traj.unit_rewards_BxU[i][traj.unit_mask_BxU[i]]],
        messages=rollouts.messages[i],
        task_id=task_id_of(task),
        finish=rollouts.finish[i],
        tools=run.env.tools(task) if run.env.tools is not None else None,
        metadata={
          "tool_calls": int(rollouts.tool_calls_B[i]),
          "tool_errors": int(rollouts.tool_errors_B[i]),
          **({"passes": pass_outputs_of(traj, i)} if with_passes else {}),
          **({"credit_details": rollout_values(out.details, i, traj)} if with_passes and out.details else {}),
          **({"process": int(rollouts.process_B[i])} if several else {}),
          **({"policy_version": int(rollouts.policy_version)} if rollouts.policy_version is not None else {}),
        },
      )
    )
  turn_adv = None if out.turn_adv_BxT is None else out.turn_adv_BxT[list(rows)]
  records = jsonl_lib.attach_credit(records, out.adv_BxL[list(rows)], turn_adv, method=run.config.credit.method)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  jsonl_lib.write_jsonl(path, records)


def pass_outputs_of(traj, i: int) -> dict:
  """Rollout i's share of every pass output (`traj.passes[name]`, cut by its class's declared axes:
  `PassOutput.rollout_values`), as JSON values."""
  tokens, turns = int(traj.token_mask_BxL[i].sum()), int(traj.turn_mask_BxT[i].sum())
  return {name: output.rollout_values(i, turns=turns, tokens=tokens) for name, output in traj.passes.items()}


_SUFFIX_AXES = {"_BxLxD": ("B", "L", "D"), "_BxT1": ("B", "T1"), "_BxL": ("B", "L"), "_BxT": ("B", "T"), "_B": ("B",)}


def rollout_values(outputs: dict, i: int, traj) -> dict:
  """Rollout i's share of `MethodOutput.details` as JSON values (`pass_outputs.rollout_values`), each entry's axes
  read from its shape suffix (`*_BxL` per token, cut to the rollout's tokens; `*_BxT` per turn; `*_BxT1` per
  boundary; `*_B` per rollout); a list of one entry per rollout is per rollout; other values, and vectors per token
  (`*_BxLxD`), are left out."""
  b = traj.batch_size
  axes: dict[str, tuple[str, ...]] = {}
  for key, value in outputs.items():
    if isinstance(value, (list, tuple)) and len(value) == b:
      axes[key] = ("B",)
    elif np.ndim(value) >= 1 and np.shape(value)[0] == b:
      axes[key] = next(
        (ax for suffix, ax in _SUFFIX_AXES.items() if key.endswith(suffix)), ("B",) + ("?",) * (np.ndim(value) - 1)
      )
  tokens, turns = int(traj.token_mask_BxL[i].sum()), int(traj.turn_mask_BxT[i].sum())
  return pass_outputs.rollout_values(outputs, axes, i, turns=turns, tokens=tokens)


def task_id_of(task) -> str | None:
  for key in ("task_id", "query_id", "id"):
    v = getattr(task, key, None)
    if v is not None:
      return str(v)
  return None
