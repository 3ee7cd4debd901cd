"""SamplerSession (the prefix cache of multi-turn rollouts) against a fresh `Sampler.generate` on the same histories.

A session keeps each named row's KV cache between calls and prefills only the tokens that are new; a fresh generate
prefills the whole history. Under greedy decoding both must draw the same tokens and record the same log-probs
(float32 noise: the cached keys were computed in other batch shapes).
"""

import dataclasses

import jax
import numpy as np
import pytest

from jaxcredit.sampling import Sampler, SamplingParams
from tests.sampling.sampling_reference import CFG, MAX_LEN, PAD_ID

GREEDY = SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=6)
SAMPLED = SamplingParams(temperature=0.8, max_new_tokens=6)


def decode_text(ids):
  return "".join(chr(0x100 + 2 * i) + chr(0x101 + 2 * i) for i in ids)


def observations(rng, lengths):
  return [[int(t) for t in rng.integers(1, CFG.vocab_size, n)] for n in lengths]


def assert_same(session_out, fresh_out):
  assert session_out.tokens == fresh_out.tokens
  assert session_out.finish_reasons == fresh_out.finish_reasons
  for a, b in zip(session_out.logprobs, fresh_out.logprobs):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)


@pytest.fixture()
def fresh_sampler(model):
  # Its own Sampler: the stats below count only this test's calls.
  return Sampler(model, max_len=MAX_LEN, pad_id=PAD_ID, chunk_size=4, prompt_bucket=8)


def test_four_turns_prefill_each_context_token_once_and_match_fresh_generates(fresh_sampler, sampler, prompts):
  """Histories grow by the sampled tokens and an observation per turn; rows drop out and come back reordered."""
  rng = np.random.default_rng(0)
  session = fresh_sampler.session()
  histories = {i: list(p) for i, p in enumerate(prompts)}
  context_tokens = sum(len(p) for p in prompts)
  active = [0, 1, 2]
  out = session.generate([histories[i] for i in active], GREEDY, jax.random.key(0), ids=active)
  assert fresh_sampler.stats["prefill_tokens"] == context_tokens
  for turn, next_active in enumerate([[0, 1, 2], [2, 0], [2]]):
    obs = observations(rng, [3 + 2 * turn + i for i in range(len(active))])
    for i, ids, o in zip(active, out.tokens, obs):
      histories[i] += ids + o
    prefilled = {i: len(o) for i, o in zip(active, obs)}
    active = next_active
    before = fresh_sampler.stats["prefill_tokens"]
    out = session.generate([histories[i] for i in active], GREEDY, jax.random.key(1), ids=active)
    # Only the observations are new: every sampled token was written to the cache while it was drawn.
    assert fresh_sampler.stats["prefill_tokens"] - before == sum(prefilled[i] for i in active)
    assert_same(out, sampler.generate([histories[i] for i in active], GREEDY, jax.random.key(1)))
  assert fresh_sampler.stats["rebuilds"] == 0


def test_tokens_cut_by_a_stop_string_leave_the_cache(fresh_sampler, sampler, prompts):
  """The device fed tokens past a stop string within the chunk; the next call must not attend to them."""
  free = sampler.generate(prompts, GREEDY, jax.random.key(2))
  params = dataclasses.replace(GREEDY, stop_strings=(decode_text([free.tokens[0][1]]),))
  session = fresh_sampler.session()
  out = session.generate(prompts, params, jax.random.key(2), decode_text=decode_text)
  assert out.finish_reasons[0] == "stop_string" and len(out.tokens[0]) == 2
  obs = observations(np.random.default_rng(1), [4, 4, 4])
  histories = [p + t + o for p, t, o in zip(prompts, out.tokens, obs)]
  assert_same(
    session.generate(histories, GREEDY, jax.random.key(3)), sampler.generate(histories, GREEDY, jax.random.key(3))
  )


def test_an_edited_history_keeps_only_the_common_prefix(fresh_sampler, sampler, prompts):
  session = fresh_sampler.session()
  session.generate(prompts, GREEDY, jax.random.key(4))
  edited = [list(p) for p in prompts]
  edited[1][3] = (edited[1][3] + 1) % CFG.vocab_size  # a token inside the cached prefix changes
  edited[2] = edited[2][:9]  # a history shorter than what the cache holds
  before = fresh_sampler.stats["prefill_tokens"]
  out = session.generate(edited, GREEDY, jax.random.key(5))
  # Row 0 is unchanged: its last token runs again for the first logits; row 1 from the edit; row 2 its last one.
  assert fresh_sampler.stats["prefill_tokens"] - before == 1 + (len(edited[1]) - 3) + 1
  assert_same(out, sampler.generate(edited, GREEDY, jax.random.key(5)))


def test_sampled_continuations_match_a_fresh_generate_with_the_same_key(fresh_sampler, sampler, prompts):
  session = fresh_sampler.session()
  out = session.generate(prompts, SAMPLED, jax.random.key(6))
  histories = [p + t + [5, 6, 7] for p, t in zip(prompts, out.tokens)]
  again = session.generate(histories, SAMPLED, jax.random.key(7))
  fresh = fresh_sampler.generate(histories, SAMPLED, jax.random.key(7))  # same chunk size: same keys per step
  # Same logits up to float32 noise, same key: the same draws except where the noise flips a near tie.
  agree = [a == b for a, b in zip(again.tokens, fresh.tokens)]
  assert sum(agree) >= 2
  for a, b, same in zip(again.logprobs, fresh.logprobs, agree):
    if same:
      np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)


def test_new_parameters_never_reuse_the_old_cache(model, other_model, prompts):
  sampler = Sampler(model, max_len=MAX_LEN, pad_id=PAD_ID, chunk_size=4, prompt_bucket=8)
  session = sampler.session()
  out = session.generate(prompts, GREEDY, jax.random.key(8))
  histories = [p + t for p, t in zip(prompts, out.tokens)]
  sampler.update_model(other_model)
  before = sampler.stats["prefill_tokens"]
  after = session.generate(histories, GREEDY, jax.random.key(9))
  assert sampler.stats["prefill_tokens"] - before == sum(len(h) for h in histories)  # all of it, again
  reference = Sampler(other_model, max_len=MAX_LEN, pad_id=PAD_ID, chunk_size=4, prompt_bucket=8)
  assert_same(after, reference.generate(histories, GREEDY, jax.random.key(9)))


def test_a_long_kept_row_and_a_long_new_row_share_one_extension(fresh_sampler, sampler, prompts):
  """Histories end together: row 0 keeps 40 cached tokens and adds 3, a new row brings 40 tokens of its own. Laid
  out one after the other they would need 40 + 40 slots before decoding; aligned at their ends, 43."""
  rng = np.random.default_rng(5)
  session = fresh_sampler.session()
  long_prompt = [int(t) for t in rng.integers(1, CFG.vocab_size, 34)]
  out = session.generate([long_prompt], GREEDY, jax.random.key(14), ids=["a"])
  histories = [long_prompt + out.tokens[0] + [3, 4, 5], [int(t) for t in rng.integers(1, CFG.vocab_size, 40)]]
  before = fresh_sampler.stats["prefill_tokens"]
  again = session.generate(histories, GREEDY, jax.random.key(15), ids=["a", "b"])
  assert fresh_sampler.stats["prefill_tokens"] - before == 3 + 40
  assert fresh_sampler.stats["rebuilds"] == 0
  assert_same(again, sampler.generate(histories, GREEDY, jax.random.key(15)))


def test_a_call_that_does_not_fit_rebuilds_the_cache(model, sampler, prompts):
  """With the smallest capacity (max_len + chunk_size) a 57-token new row pads to a 64-token block, which with 8
  decode steps passes the 68 slots: the session prefills every row again, with the same result."""
  small = Sampler(model, max_len=MAX_LEN, pad_id=PAD_ID, chunk_size=4, prompt_bucket=8, capacity=MAX_LEN + 4)
  session = small.session()
  first = session.generate(prompts[:1], GREEDY, jax.random.key(16))
  histories = [prompts[0] + first.tokens[0] + [7], [int(t) % CFG.vocab_size for t in range(3, 60)]]
  out = session.generate(histories, GREEDY, jax.random.key(17))
  assert small.stats["rebuilds"] == 1
  assert_same(out, sampler.generate(histories, GREEDY, jax.random.key(17)))


def test_ids_must_name_each_prompt_once(fresh_sampler, prompts):
  session = fresh_sampler.session()
  for ids in ([0, 0, 1], [0, 1], [0, None, 2], [0, [1], 2]):
    with pytest.raises(ValueError, match="ids must name each"):
      session.generate(prompts, GREEDY, jax.random.key(0), ids=ids)


@pytest.mark.parametrize(
  "kwargs, name", [(dict(window_bucket=0), "window_bucket"), (dict(capacity=MAX_LEN), "capacity")]
)
def test_sampler_rejects_a_bad_window_or_capacity(model, kwargs, name):
  with pytest.raises(ValueError, match=f"Sampler {name}"):
    Sampler(model, max_len=MAX_LEN, pad_id=PAD_ID, chunk_size=4, **kwargs)
