"""The update of one RL step: its batch (`jaxcredit.trajectory.UpdateBatch`), built from the step's trajectory and
the method's output (`loss_batch`: the method's arrays, the reference's log-probs, the engine's off-policy correction
`engine_correction`, laid out by `update_batch`), packed (`pack_update_batch`, `make_packer`), the loss configuration
of the method (`loss_config_of`) and PPO's epochs of mini-batch updates (`ppo_updates`). `abstract_update_batch` runs
the same builders under `jax.eval_shape`: the batch `jaxcredit plan` lowers the update on.

Packing. The rollouts of a group start with the same prompt. Right-padded one per row (the trajectory layout), a step
at [B, L] runs the model on every rollout's copy of the prompt, on its padding, and the output head (a V x D product
per position) on every slot, although the loss reads only the action tokens. `pack_update_batch` lays out instead,
per row, the group's longest common prefix once (segment 0) followed by each rollout's continuation (segments
1, 2, ...), which attends to the prefix and to itself (`jaxcredit.models.attention.packed_attention_mask`, with
`prefix_limit` the prefix length), at the RoPE positions it has in its own rollout. The loss then scores the K
action slots of each row with `jaxcredit.models.logprobs.packed_slot_logprobs`. Every scored token keeps exactly
its context, so log-probs, losses and gradients equal the unpacked ones up to float summation order
(tests/train/test_packing.py); on the quickstart the update runs on 35-40% of the slots
(docs/benchmarks.md, "Packing the update"). The rows are built and laid out by `jaxcredit.packed_rows` (the layout
TRACE's gold scoring shares) and embedded in the batch as laid out (`UpdateBatch.packed`); every per-slot array is
read at the scored slots by one function (`embed_packed`), so an array's name says [N, K] in both layouts.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxcredit import multihost, sharding
from jaxcredit.packed_rows import PackedRow, lay_out_rows
from jaxcredit.train.loop import step as step_lib
from jaxcredit.train.loop.run import Run
from jaxcredit.train.tables.engines import ENGINES
from jaxcredit.train.tables.methods import METHODS
from jaxcredit.trajectory import PackedLayout, UpdateBatch, pad_length


def ppo_updates(
  update,
  params,
  opt_state,
  batch: UpdateBatch,
  mesh,
  *,
  epochs: int,
  mini_batch_size: int,
  seed: tuple[int, int],
  pack: Callable[[UpdateBatch], UpdateBatch] | None = None,
):
  """`epochs` passes over one step's rollouts, each split into mini-batches of `mini_batch_size` rollouts (0: the
  whole batch), one optimizer update per mini-batch: PPO's epochs and mini-batches, with verl's and TRL's meaning.
  One epoch of the whole batch is exactly one update, as without PPO epochs.

  Every pass draws a fresh order of the rollouts from `seed` (the run's seed and the RL step, so a resumed run
  repeats it). The behaviour log-probs stay those of the sampler, so from the second update on the ratio departs
  from 1 and the PPO clip acts. Each mini-batch's loss is normalised by its own tokens.

  Args:
    update: `step.make_update_fn`'s (params, opt_state, batch) -> (params, opt_state, metrics).
    batch: the step's unpacked batch, host arrays (`update_batch`).
    mesh: where each mini-batch is placed (`sharding.shard_batch`).
    pack: applied to each mini-batch before it is placed (`make_packer`: group rows, scored slots), or None: the
      trajectory rows as they are.

  Returns:
    (params, opt_state, metrics): metrics are the mean over the updates of each scalar, plus "updates",
    "update_slots" / "update_scored_slots" (token slots the model and the output head ran on, summed),
    "clip_last" / "ratio_dev_last" (the last update's clip fraction and mean |ratio - 1|) and "clip_max" /
    "ratio_dev_max" (their largest over the updates).
  """
  b = batch.num_rows
  size = mini_batch_size or b
  num_mini_batches = b // size
  rng = np.random.default_rng(list(seed))
  rows, slots, scored = [], 0, 0
  for _ in range(epochs):
    order = rng.permutation(b) if epochs * num_mini_batches > 1 else np.arange(b)
    for k in range(num_mini_batches):
      idx = np.sort(order[k * size : (k + 1) * size])
      mini = batch.take(idx)
      mini = pack(mini) if pack is not None else mini.for_device()
      slots += int(np.size(mini.tokens_NxL))
      scored += int(np.size(mini.action_mask_NxK))
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


def make_packer(run: Run) -> Callable[[UpdateBatch], UpdateBatch] | None:
  """`pack_if_short` with the run's buckets, rows a multiple of the data-parallel size times the micro-batches (a
  mini-batch with a rollout longer than `train.pack_max_row_len` stays unpacked); None when `train.pack_rollouts` is
  off."""
  c = run.config
  if not c.train.pack_rollouts:
    return None
  dp = sharding.data_parallel_size(run.mesh)
  return functools.partial(
    pack_if_short,
    length_bucket=c.train.length_bucket,
    max_row_len=c.train.pack_max_row_len,
    rows_multiple=dp * c.train.num_micro_batches,
    slot_bucket=c.train.slot_bucket,
  )


def rows_batch(
  tokens_BxL,
  token_mask_BxL,
  action_mask_BxL,
  behavior_logp_BxL,
  *,
  adv_BxL=None,
  ref_logp_BxL=None,
  behavior_weight_BxL=None,
  inputs: Mapping[str, Any] | None = None,
  group_ids_B=None,
) -> UpdateBatch:
  """The unpacked update batch, one rollout per row (N = B, K = L): the token arrays as given, every per-token array
  the loss terms read as float32. Plain array methods only, so `jax.eval_shape` runs it on abstract arrays
  (`abstract_update_batch`)."""

  def f32(x):
    return None if x is None else x.astype(np.float32)

  return UpdateBatch(
    tokens_NxL=tokens_BxL,
    token_mask_NxL=token_mask_BxL,
    action_mask_NxK=action_mask_BxL,
    behavior_logp_NxK=behavior_logp_BxL,
    adv_NxK=f32(adv_BxL),
    ref_logp_NxK=f32(ref_logp_BxL),
    behavior_weight_NxK=f32(behavior_weight_BxL),
    inputs_NxK={k: f32(v) for k, v in (inputs or {}).items()},
    group_ids_N=group_ids_B,
  )


def update_batch(
  traj,
  *,
  adv_BxL=None,
  ref_logp_BxL=None,
  behavior_logp_BxL=None,
  behavior_weight_BxL=None,
  inputs: Mapping[str, Any] | None = None,
) -> UpdateBatch:
  """The update's batch from a trajectory (`rows_batch`): its tokens, its action mask (a rollout out of the loss,
  `traj.sample_mask_B` False, scores nothing), the sampler's log-probs or `behavior_logp_BxL` in their place
  (`engine_correction`), its group ids (for packing) and what the loss terms read: the advantages, the reference's
  log-probs, the importance weights and the method's inputs (`LossInput.batch_arrays`: {batch key: [B, L(, D)]})."""

  def host(x):
    return None if x is None else np.asarray(x)

  return rows_batch(
    traj.tokens_BxL,
    traj.token_mask_BxL,
    traj.action_mask_BxL & traj.sample_mask_B[:, None],
    traj.behavior_logp_BxL if behavior_logp_BxL is None else behavior_logp_BxL,
    adv_BxL=host(adv_BxL),
    ref_logp_BxL=host(ref_logp_BxL),
    behavior_weight_BxL=host(behavior_weight_BxL),
    inputs={k: np.asarray(v) for k, v in (inputs or {}).items()},
    group_ids_B=traj.group_ids_B,
  )


def embed_packed(batch: UpdateBatch, rows, source_row_NxK, source_slot_NxK, rollout_ids_NxK) -> UpdateBatch:
  """The packed batch: the rows as laid out (`rows`: `packed_rows.PackedRows`) and every per-slot array of the
  unpacked `batch` read at the scored slots, `x[source_row_NxK, source_slot_NxK]` (0 / False where
  `rows.slot_mask_NxK` is False). Plain array operations, so `jax.eval_shape` runs it (`abstract_update_batch`)."""
  xp = jnp if isinstance(source_row_NxK, jax.core.Tracer) else np
  mask_NxK = rows.slot_mask_NxK

  def at_slots(x):
    if x is None:
      return None
    g = x[source_row_NxK, source_slot_NxK]
    return xp.where(mask_NxK if g.ndim == 2 else mask_NxK[..., None], g, xp.zeros((), g.dtype))

  # the input's rollouts counted on the first row (the Dr.GRPO denominator's sequence count)
  rollouts_N = xp.where(xp.arange(mask_NxK.shape[0]) == 0, np.float32(batch.num_rows), np.float32(0))
  return UpdateBatch(
    tokens_NxL=rows.tokens_NxL,
    token_mask_NxL=rows.token_mask_NxL,
    action_mask_NxK=at_slots(batch.action_mask_NxK),
    behavior_logp_NxK=at_slots(batch.behavior_logp_NxK),
    adv_NxK=at_slots(batch.adv_NxK),
    ref_logp_NxK=at_slots(batch.ref_logp_NxK),
    behavior_weight_NxK=at_slots(batch.behavior_weight_NxK),
    inputs_NxK={k: at_slots(v) for k, v in batch.inputs_NxK.items()},
    packed=PackedLayout(
      positions_NxL=rows.positions_NxL,
      segment_ids_NxL=rows.segment_ids_NxL,
      prefix_limit_NxL=rows.prefix_limit_NxL,
      slots_NxK=rows.slots_NxK,
      rollout_ids_NxK=rollout_ids_NxK,
      rollouts_N=rollouts_N.astype(np.float32),
    ),
  )


def _common_prefix(rows: list[np.ndarray]) -> int:
  """Length of the longest common prefix of 1-D token arrays."""
  n = min(len(r) for r in rows)
  first = rows[0][:n]
  p = n
  for r in rows[1:]:
    diff = np.flatnonzero(r[:n] != first)
    if diff.size:
      p = min(p, int(diff[0]))
  return p


def pack_update_batch(
  batch: UpdateBatch,
  *,
  length_bucket: int = 128,
  max_row_len: int = 1024,
  rows_multiple: int = 1,
  slot_bucket: int = 64,
) -> UpdateBatch:
  """Packs an unpacked update batch (`update_batch`) into group rows with scored slots (the module docstring).

  Rollouts are grouped by `batch.group_ids_N` (None: each its own group). A group's rows start with the longest
  common prefix of its rollouts' tokens; continuations are appended while the row stays within
  max(max_row_len, the longest rollout rounded up to length_bucket), else a new row repeats the prefix. Rollouts
  without an action token are left out (they add nothing to any loss; they still count in `packed.rollouts_N`).

  Args:
    batch: unpacked, host arrays; each row's real tokens contiguous from slot 0, its action tokens among them.
    length_bucket: the row length is rounded up to a multiple of this.
    max_row_len: tokens per row before a group spills onto a new row (0: as long as the longest rollout's
      unpacked row). Longer rows share a prompt among more rollouts, but a packed row attends through a dense
      [L, L] mask, so attention's cost per token grows with L: on 2 CPU cores 512 was fastest both for
      SmolLM2-135M and for a 4-layer 256-wide model (docs/benchmarks.md, "Packing the update").
    rows_multiple: the number of rows is rounded up to a multiple of this (data-parallel size times
      micro-batches), with empty rows.
    slot_bucket: K, the scored slots per row, is rounded up to a multiple of this.

  Returns:
    The packed batch (`UpdateBatch.packed` set, `group_ids_N` None), numpy arrays.

  Raises:
    ValueError: naming the field, for a batch already packed, a per-slot array that is not [N, L] (or [N, L, D]),
      group ids that are not [N], a mask whose real tokens are not contiguous from slot 0, an action token on
      padding, or bucket sizes < 1.
  """
  if batch.packed is not None:
    raise ValueError("pack_update_batch: the batch is already packed")
  for name, value in (("length_bucket", length_bucket), ("rows_multiple", rows_multiple), ("slot_bucket", slot_bucket)):
    if value < 1:
      raise ValueError(f"pack_update_batch: {name} must be >= 1, got {value}")
  tokens = np.asarray(batch.tokens_NxL)
  mask = np.asarray(batch.token_mask_NxL).astype(bool)
  scored = np.asarray(batch.action_mask_NxK).astype(bool)
  b, length = tokens.shape
  if mask.shape != (b, length):
    raise ValueError(f"pack_update_batch: token_mask_NxL has shape {mask.shape}, expected the tokens' {(b, length)}")
  for k, v in batch.scored_arrays().items():
    if np.shape(v)[:2] != (b, length) or np.ndim(v) > 3:
      raise ValueError(
        f"pack_update_batch: {k} has shape {np.shape(v)}, expected the tokens' {(b, length)} (or [N, L, D])"
      )
  groups = np.asarray(np.arange(b) if batch.group_ids_N is None else batch.group_ids_N)
  if groups.shape != (b,):
    raise ValueError(f"pack_update_batch: group_ids_N has shape {groups.shape}, expected {(b,)}")
  lengths = mask.sum(axis=1)
  if (mask != (np.arange(length)[None, :] < lengths[:, None])).any():
    raise ValueError("pack_update_batch: token_mask_NxL must hold each row's real tokens contiguously from slot 0")
  if (scored & ~mask).any():
    raise ValueError("pack_update_batch: action_mask_NxK marks padding slots")

  kept = [i for i in range(b) if scored[i].any()]
  longest = int(max((lengths[i] for i in kept), default=1))
  cap = max(int(max_row_len), pad_length(longest, length_bucket))
  # rows: (prefix_len, prefix source rollout, [rollouts]); each row's used length is prefix + its continuations.
  rows: list[tuple[int, int, list[int]]] = []
  for g in dict.fromkeys(groups[kept].tolist()):
    members = [i for i in kept if groups[i] == g]
    p = _common_prefix([tokens[i, : lengths[i]] for i in members])
    in_row: list[int] = []
    used = p
    for i in members:
      extra = int(lengths[i]) - p
      if in_row and used + extra > cap:
        rows.append((p, members[0], in_row))
        in_row, used = [], p
      in_row.append(i)
      used += extra
    rows.append((p, members[0], in_row))

  packed, sources = [], []  # per row: the PackedRow, and (rollout, its scored positions) per segment
  for p, source, members in rows:
    packed_row, segments = PackedRow(tokens[source, :p]), []
    for i in members:
      at = packed_row.append(tokens[i, p : lengths[i]], p, p)
      t = np.flatnonzero(scored[i])
      packed_row.score(np.where(t < p, t, at + t - p))
      segments.append((i, t))
    packed.append(packed_row)
    sources.append(segments)
  laid = lay_out_rows(
    packed,
    token_dtype=tokens.dtype,
    length_bucket=length_bucket,
    rows_multiple=rows_multiple,
    slot_bucket=slot_bucket,
  )
  shape_NxK = laid.slots_NxK.shape
  source_row, source_slot = np.zeros(shape_NxK, np.int64), np.zeros(shape_NxK, np.int64)
  rollout_ids = np.zeros(shape_NxK, np.int32)
  for r, segments in enumerate(sources):
    start = 0
    for seg, (i, t) in enumerate(segments):
      end = start + len(t)
      source_row[r, start:end], source_slot[r, start:end], rollout_ids[r, start:end] = i, t, seg
      start = end
  return embed_packed(batch, laid, source_row, source_slot, rollout_ids)


def pack_if_short(
  batch: UpdateBatch,
  *,
  length_bucket: int = 128,
  max_row_len: int = 512,
  rows_multiple: int = 1,
  slot_bucket: int = 64,
) -> UpdateBatch:
  """`pack_update_batch` when every rollout's row (its length rounded up to `length_bucket`) fits `max_row_len`;
  otherwise the batch as it is (`for_device`: without its group ids). A packed row attends through a dense [L, L]
  segment mask (memory O(L^2) per row, where the unpacked path's attention can be chunked), so long rollouts
  (BFCL's 2k-6k token prompts) stay on the unpacked path.

  Raises:
    ValueError: as `pack_update_batch`, and for max_row_len < 1.
  """
  if max_row_len < 1:
    raise ValueError(f"pack_if_short: max_row_len must be >= 1, got {max_row_len}")
  lengths = np.asarray(batch.token_mask_NxL).astype(bool).sum(axis=1)
  if pad_length(int(lengths.max(initial=1)), length_bucket) > max_row_len:
    return batch.for_device()
  return pack_update_batch(
    batch,
    length_bucket=length_bucket,
    max_row_len=max_row_len,
    rows_multiple=rows_multiple,
    slot_bucket=slot_bucket,
  )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _AbstractRows:
  """`packed_rows.PackedRows`' arrays as a pytree, for `jax.eval_shape(embed_packed, ...)`."""

  tokens_NxL: Any
  token_mask_NxL: Any
  positions_NxL: Any
  segment_ids_NxL: Any
  prefix_limit_NxL: Any
  slots_NxK: Any
  slot_mask_NxK: Any


def abstract_update_batch(
  cfg: step_lib.PolicyLossConfig,
  *,
  batch_size: int,
  seq_len: int,
  hidden_size: int,
  packed_slots: int = 0,
  behavior_weights: bool = False,
) -> UpdateBatch:
  """The update batch for the loss `cfg` as `jax.ShapeDtypeStruct`s, from the trainer's own builders under
  `jax.eval_shape` (`rows_batch`, then `embed_packed` when `packed_slots` > 0): what `jaxcredit plan` lowers the
  update on. Its arrays: the tokens, the action mask, the behaviour log-probs and what each active loss term reads
  (`LossTerm.batch_keys`: the advantages, the reference's log-probs, the method's inputs, [.., D] for a `*_BxLxD`
  field), and the importance weights when `behavior_weights`.

  Args:
    cfg: the loss (`loss_config_of`); its active terms decide the arrays.
    batch_size, seq_len: the rollouts [B, L]; packed, the rows N = B of L slots.
    hidden_size: D of a `*_BxLxD` input (the policy's width).
    packed_slots: K > 0: the packed layout with K scored slots per row; 0: one right-padded rollout per row.
    behavior_weights: the truncated importance weights of an external engine or of `rollout.async_depth`.
  """
  sds = jax.ShapeDtypeStruct
  shape = (batch_size, seq_len)
  trainer_keys: set[str] = set()
  inputs: dict[str, Any] = {}
  for term in step_lib.loss_terms(cfg):
    row = step_lib.LOSS_TERMS[term]
    trainer_keys.update(row.trainer_arrays)
    if row.input is not None:
      for field, key in zip(row.input.keys(), row.input.batch_keys()):
        inputs[key] = sds(shape + ((hidden_size,) if field.endswith("_BxLxD") else ()), np.float32)
  f32 = sds(shape, np.float32)
  per_token = {
    "adv_BxL": f32 if "adv" in trainer_keys else None,
    "ref_logp_BxL": f32 if "ref_logp" in trainer_keys else None,
    "behavior_weight_BxL": f32 if behavior_weights else None,
    "inputs": inputs,
  }
  unpacked = jax.eval_shape(
    lambda t, m, a, lp, kw: rows_batch(t, m, a, lp, **kw),
    sds(shape, np.int32),
    sds(shape, np.bool_),
    sds(shape, np.bool_),
    f32,
    per_token,
  )
  if packed_slots <= 0:
    return unpacked
  slots = (batch_size, packed_slots)
  rows = _AbstractRows(
    tokens_NxL=sds(shape, np.int32),
    token_mask_NxL=sds(shape, np.bool_),
    positions_NxL=sds(shape, np.int32),
    segment_ids_NxL=sds(shape, np.int32),
    prefix_limit_NxL=sds(shape, np.int32),
    slots_NxK=sds(slots, np.int32),
    slot_mask_NxK=sds(slots, np.bool_),
  )
  index = sds(slots, np.int32)
  return jax.eval_shape(embed_packed, unpacked, rows, index, index, index)


def engine_correction(run: Run, params, traj):
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
  if run.state.policy_logp is None:
    run.state.policy_logp = step_lib.make_logp_fn(run.graphdef, run.rest, c.sampling.temperature)
  trainer = np.asarray(
    multihost.to_host(run.state.policy_logp(params, traj.tokens_BxL, traj.token_mask_BxL)), np.float32
  )
  engine = np.asarray(traj.behavior_logp_BxL, np.float32)
  # A non-finite engine log-prob is no evidence of the engine's policy (`trajectory.drop_invalid_behavior_logp`).
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


def loss_batch(
  run: Run, params, ref_params, traj, out, ref_logp, *, off_policy: bool = False
) -> tuple[UpdateBatch, dict]:
  """The update's batch (`update_batch`): the method's advantages and its loss terms' typed inputs
  (`MethodOutput.input_arrays`), the reference's log-probs when an active term reads them (`ref_logp`: the KL, HSD's reference KL), and, for rollouts from an external
  engine or sampled with older weights than `params` (`off_policy`: `rollout.async_depth`, or an engine's
  `rollout.max_staleness`), the trainer's own behaviour log-probs under `params` and the truncated importance
  weights (`engine_correction`). Returns (batch, the engine-correction metrics or {}).

  Raises:
    ValueError: a loss term's input missing or misshapen (`MethodOutput.input_arrays`), naming the method.
  """
  c = run.config
  try:
    inputs = out.input_arrays(step_lib.term_inputs(METHODS[c.credit.method].loss_terms))
  except ValueError as e:
    raise ValueError(f"method {c.credit.method!r}: {e}") from None
  ref = None if ref_logp is None else multihost.to_host(ref_logp(ref_params, traj.tokens_BxL, traj.token_mask_BxL))
  behavior_logp, weight, engine_row = None, None, {}
  if ENGINES[c.rollout.engine].external or off_policy:
    behavior_logp, weight, engine_row = engine_correction(run, params, traj)
  batch = update_batch(
    traj,
    adv_BxL=out.adv_BxL,
    ref_logp_BxL=ref,
    behavior_logp_BxL=behavior_logp,
    behavior_weight_BxL=weight,
    inputs=inputs,
  )
  return batch, engine_row


def loss_config_of(c: ml_collections.ConfigDict) -> step_lib.PolicyLossConfig:
  """The loss: PPO-clip, the KL term when `loss.kl_coef > 0`, and the method's own terms weighted by its knobs, with
  the gradient caps its terms name (`LossTerm.cap_knob`, e.g. ToolOPD's `distill_max_grad_ratio`)."""
  method = METHODS[c.credit.method]
  knobs = c.credit[c.credit.method]
  weights: dict[str, float] = {}
  for t in method.loss_terms:
    knob = step_lib.LOSS_TERMS[t].knob
    if knob:
      weights[knob] = float(knobs[knob])
  caps = tuple(
    (t, float(knobs[step_lib.LOSS_TERMS[t].cap_knob]))
    for t in method.loss_terms
    if step_lib.LOSS_TERMS[t].cap_knob and step_lib.LOSS_TERMS[t].cap_knob in knobs
  )
  return step_lib.PolicyLossConfig(
    eps_low=c.loss.eps_low,
    eps_high=c.loss.eps_high,
    aggregation=c.loss.aggregation,
    kl_coef=c.loss.kl_coef,
    kl_estimator=c.loss.kl_estimator,
    temperature=c.sampling.temperature,
    terms=("policy",) + method.loss_terms,
    max_len=c.sampling.max_len,
    knob_weights=tuple(sorted(weights.items())),
    grad_caps=caps,
  )
