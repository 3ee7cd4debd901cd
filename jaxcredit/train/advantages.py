"""From a batch of rollouts (and the passes a method needs) to token advantages, per `config.credit.method`.

The batch is group-major: rollout b belongs to group b // G. Group functions of `jaxcredit.credit` are
vmapped over the P groups, per-rollout functions over all B rollouts.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxcredit import credit
from jaxcredit.trajectory import Trajectory

# Methods whose credit needs a pass the trainer cannot run yet, and what that pass is.
NEEDS_MISSING_PASS = {
    "crest": "a privileged self-teacher pass (teacher log-probs and entropies on the rollout's tokens) and "
             "per-user-turn verified rewards",
    "toolopd": "a hindsight-skill teacher pass (log-probs with and without the skill summary)",
    "hsd": "a peer-conditioned teacher pass (the policy conditioned on a successful peer rollout)",
    "gear": "a ground-truth-conditioned teacher pass (per-token divergence and entropy)",
    "opd": "a teacher model pass (teacher log-probs of the sampled tokens)",
}


def check_method_supported(method: str) -> None:
  """Refuses, by name, a method whose teacher pass does not exist yet (never a silent fallback to GRPO)."""
  if method in NEEDS_MISSING_PASS:
    raise NotImplementedError(
        f"config.credit.method={method!r} needs {NEEDS_MISSING_PASS[method]}, which the trainer does not "
        f"run yet. Its credit function is available as a library call (jaxcredit.credit); for training, "
        f"use one of grpo, drgrpo, rloo, trace.")


@functools.partial(jax.jit, static_argnames=("method", "group_size", "scale", "eps", "beta", "dense_norm"))
def token_advantages(
    rewards_B, sample_mask_B, turn_ids_BxL, action_mask_BxL, gold_logp_BxT1, boundary_mask_BxT1, turn_mask_BxT,
    *, method: str, group_size: int, scale: str = "group", eps: float = 1e-6, beta: float = 1.0,
    dense_norm: str = "group_rms"):
  """Token advantages [B, L] float32 and turn advantages [B, T] (zeros for outcome-only methods).

  Args:
    rewards_B, sample_mask_B: outcome rewards and validity, group-major (B = P * G).
    turn_ids_BxL, action_mask_BxL: the trajectory's token layout.
    gold_logp_BxT1, boundary_mask_BxT1: TRACE's boundary scores (ignored by other methods).
    turn_mask_BxT: real turns.
    method: "grpo", "drgrpo", "rloo" or "trace".
  """
  b = rewards_B.shape[0]
  p = b // group_size
  grp = lambda x: x.reshape(p, group_size, *x.shape[1:])
  t = turn_mask_BxT.shape[1]
  if method in ("grpo", "drgrpo"):
    s = "none" if method == "drgrpo" else scale
    out_PxG = jax.vmap(lambda r, m: credit.grpo_advantages(r, m, scale=s, eps=eps))(grp(rewards_B), grp(sample_mask_B))
    turn_BxT = jnp.broadcast_to(out_PxG.reshape(b, 1), (b, t)) * turn_mask_BxT
  elif method == "rloo":
    out_PxG = jax.vmap(credit.rloo_advantages)(grp(rewards_B), grp(sample_mask_B))
    turn_BxT = jnp.broadcast_to(out_PxG.reshape(b, 1), (b, t)) * turn_mask_BxT
  elif method == "trace":
    fn = lambda r, g, bm, tm, sm: credit.trace_advantages(r, g, bm, tm, sm, beta=beta, scale=scale,
                                                          dense_norm=dense_norm, eps=eps)
    turn_BxT = jax.vmap(fn)(grp(rewards_B), grp(gold_logp_BxT1), grp(boundary_mask_BxT1), grp(turn_mask_BxT),
                            grp(sample_mask_B)).reshape(b, t)
  else:
    raise ValueError(f"token_advantages: unsupported method {method!r}")
  adv_BxL = jax.vmap(credit.turn_to_token)(turn_BxT, turn_ids_BxL, action_mask_BxL)
  td_BxT = jnp.zeros_like(turn_BxT)
  if method == "trace":
    td_BxT = jax.vmap(credit.trace_td_rewards)(gold_logp_BxT1, boundary_mask_BxT1)
  return adv_BxL, turn_BxT, td_BxT


def compute(traj: Trajectory, gold_logp_BxT1: np.ndarray | None, boundary_mask_BxT1: np.ndarray | None,
            credit_cfg, group_size: int):
  """Host wrapper: returns numpy (adv_BxL, turn_adv_BxT, td_rewards_BxT)."""
  check_method_supported(credit_cfg.method)
  if gold_logp_BxT1 is None:
    gold_logp_BxT1 = np.zeros(traj.boundary_mask_BxT1.shape, np.float32)
    boundary_mask_BxT1 = np.zeros(traj.boundary_mask_BxT1.shape, bool)
  out = token_advantages(
      traj.rewards_B, traj.sample_mask_B, traj.turn_ids_BxL, traj.action_mask_BxL, gold_logp_BxT1,
      boundary_mask_BxT1, traj.turn_mask_BxT, method=credit_cfg.method, group_size=group_size,
      scale=credit_cfg.scale, eps=float(credit_cfg.eps), beta=float(credit_cfg.beta),
      dense_norm=credit_cfg.dense_norm)
  return tuple(np.asarray(x) for x in out)
