"""jaxcredit.credit: dense credit assignment for multi-turn tool-use RL, as pure JAX functions.

Every function handles one rollout or one group (rlax style) and depends on jax only. Batch with `jax.vmap`
over leading axes; under `jax.jit`, pass knobs (keyword-only arguments) as static arguments, e.g.
`jax.jit(grpo_advantages, static_argnames=("scale", "eps"))` or `jax.jit(functools.partial(...))`.

Shape letters: P prompts (groups), G rollouts per group, T turns, U verified units (user turns), L tokens.
"""

from jaxcredit.credit._checks import KnobError
from jaxcredit.credit.crest import crest_advantages
from jaxcredit.credit.crest import crest_token_weights
from jaxcredit.credit.crest import crest_turn_advantages
from jaxcredit.credit.distill import opd_token_advantages
from jaxcredit.credit.gear import gear_advantages
from jaxcredit.credit.gear import gear_segments
from jaxcredit.credit.gear import gear_v0_advantages
from jaxcredit.credit.gear import gear_v0_segments
from jaxcredit.credit.gigpo import gigpo_advantages
from jaxcredit.credit.hsd import hsd_select_peers
from jaxcredit.credit.hsd import hsd_token_advantages
from jaxcredit.credit.hsd import hsd_token_kl
from jaxcredit.credit.outcome import grpo_advantages
from jaxcredit.credit.outcome import rloo_advantages
from jaxcredit.credit.outcome import turn_to_token
from jaxcredit.credit.sgcd import sgcd_token_weights
from jaxcredit.credit.sgcd import sgcd_v0_token_weights
from jaxcredit.credit.toolopd import toolopd_token_weights
from jaxcredit.credit.trace import trace_advantages
from jaxcredit.credit.trace import trace_state_values
from jaxcredit.credit.trace import trace_td_rewards
from jaxcredit.credit.trace import trace_turn_rewards

__all__ = (
  "KnobError",
  "grpo_advantages",
  "rloo_advantages",
  "turn_to_token",
  "trace_state_values",
  "trace_td_rewards",
  "trace_turn_rewards",
  "trace_advantages",
  "crest_turn_advantages",
  "crest_token_weights",
  "crest_advantages",
  "toolopd_token_weights",
  "hsd_select_peers",
  "hsd_token_advantages",
  "hsd_token_kl",
  "gear_segments",
  "gear_advantages",
  "gear_v0_segments",
  "gear_v0_advantages",
  "opd_token_advantages",
  "gigpo_advantages",
  "sgcd_token_weights",
  "sgcd_v0_token_weights",
)
