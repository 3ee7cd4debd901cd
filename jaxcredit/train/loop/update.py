"""The update of one RL step: the batch the loss reads (`loss_batch`: the method's arrays, the reference's log-probs,
the engine's off-policy correction `engine_correction`, laid out by `update_batch`), the loss configuration of the
method (`loss_config_of`), packing (`make_packer`) and PPO's epochs of mini-batch updates (`ppo_updates`)."""

from __future__ import annotations

import functools
from typing import Callable

import jax
import ml_collections
import numpy as np

from jaxcredit import multihost, sharding
from jaxcredit.train.loop import packing
from jaxcredit.train.loop import step as step_lib
from jaxcredit.train.tables.engines import ENGINES
from jaxcredit.train.tables.methods import METHODS
from jaxcredit.train.loop.run import Run


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
    batch: host arrays with a leading [B] axis (`update_batch`).
    mesh: where each mini-batch is placed (`sharding.shard_batch`).
    pack: applied to each mini-batch before it is placed (`make_packer`: group rows, scored slots), or None: the
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


def make_packer(run: Run) -> Callable[[dict], dict] | None:
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


def update_batch(traj, extra: dict, behavior_logp_BxL=None) -> dict:
  """The update's batch: the trajectory's token arrays and group ids plus what the loss terms read
  (`LossTerm.batch_keys`); its arrays are those of `step.update_batch_layout` (unpacked), the table `jaxcredit plan`
  lowers the update on. `behavior_logp_BxL` replaces the sampler's log-probs (`engine_correction`)."""
  return {
    "group_ids_B": traj.group_ids_B,
    "tokens_BxL": traj.tokens_BxL,
    "token_mask_BxL": traj.token_mask_BxL,
    "action_mask_BxL": traj.action_mask_BxL & traj.sample_mask_B[:, None],
    "behavior_logp_BxL": traj.behavior_logp_BxL if behavior_logp_BxL is None else behavior_logp_BxL,
    **{k: np.asarray(v, np.float32) for k, v in extra.items()},
  }


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


def loss_batch(run: Run, params, ref_params, traj, out, ref_logp, *, off_policy: bool = False) -> tuple[dict, dict]:
  """The update's batch (`update_batch`): the method's arrays (`MethodOutput.batch_arrays`: its advantages and its
  loss terms' typed inputs), the reference's log-probs when the KL term is on, and, for rollouts from an external
  engine or sampled with older weights than `params` (`off_policy`: `rollout.async_depth`, or an engine's
  `rollout.max_staleness`), the trainer's own behaviour log-probs under `params` and the truncated importance
  weights (`engine_correction`). Returns (batch, the engine-correction metrics or {}).

  Raises:
    ValueError: a loss term's input missing or misshapen (`MethodOutput.batch_arrays`), naming the method.
  """
  c = run.config
  try:
    extra = out.batch_arrays(step_lib.term_inputs(METHODS[c.credit.method].loss_terms))
  except ValueError as e:
    raise ValueError(f"method {c.credit.method!r}: {e}") from None
  if ref_logp is not None:
    extra["ref_logp_BxL"] = multihost.to_host(ref_logp(ref_params, traj.tokens_BxL, traj.token_mask_BxL))
  behavior_logp, engine_row = traj.behavior_logp_BxL, {}
  if ENGINES[c.rollout.engine].external or off_policy:
    behavior_logp, extra["behavior_weight_BxL"], engine_row = engine_correction(run, params, traj)
  return update_batch(traj, extra, behavior_logp), engine_row


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
