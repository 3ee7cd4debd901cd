"""Sampler against full-forward references on a small random decoder (batch 3, prompts of 5, 11 and 17 tokens)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit.models.decoder import Decoder
from jaxcredit.sampling import SampleOutput, Sampler, SamplingParams
from jaxcredit.sampling.sampler import _top_p_keep
from tests.sampling.sampling_reference import CFG, MAX_LEN, PAD_ID, full_logits, full_logprobs, naive_greedy, pack_left
from tests.shared_cases import case

NUM_NEW = 20  # crosses the chunk boundaries at 8 and 16 (chunk_size 8) and ends mid-chunk
GREEDY = SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=NUM_NEW)


def decode_text(ids: list[int]) -> str:
  """Two characters per token, unique to it, so a stop string can end inside a token."""
  return "".join(chr(0x100 + 2 * i) + chr(0x101 + 2 * i) for i in ids)


def temperature_consistency_tol() -> float:
  return case("temperature-consistency")["tol"]


def log_softmax_np(x: np.ndarray) -> np.ndarray:
  x = x.astype(np.float64)
  return x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))


def nucleus_mass(logp_NxV: np.ndarray, top_p: float) -> np.ndarray:
  """Probability mass of the top-p nucleus of each row (what a renormalised log-prob would subtract)."""
  probs_NxV = np.sort(np.exp(logp_NxV), axis=-1)[:, ::-1]
  return np.where(np.cumsum(probs_NxV, axis=-1) - probs_NxV < top_p, probs_NxV, 0).sum(-1)


def check_output(out: SampleOutput, batch: int):
  assert isinstance(out, SampleOutput)
  assert len(out.tokens) == len(out.logprobs) == len(out.finish_reasons) == batch
  for tokens, logp in zip(out.tokens, out.logprobs):
    assert all(isinstance(t, int) and 0 <= t < CFG.vocab_size for t in tokens)
    assert logp.dtype == np.float32 and logp.shape == (len(tokens),)
    assert np.all(np.isfinite(logp)) and np.all(logp <= 0)


def test_temperature_consistency_recorded_logprobs_equal_full_forward(model, sampler, prompts):
  """Shared case `temperature-consistency`: the recorded log-probs are the trainer's, so the ratio is 1."""
  temperature, top_p = 0.6, 0.9
  out = sampler.generate(
    prompts, SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=NUM_NEW), jax.random.key(0)
  )
  check_output(out, 3)
  assert out.finish_reasons == ["length"] * 3 and all(len(t) == NUM_NEW for t in out.tokens)

  tokens_BxT, mask_BxT = pack_left([p + t for p, t in zip(prompts, out.tokens)])
  logp_BxT = full_logprobs(model, tokens_BxT, mask_BxT, temperature)
  logits_BxTxV = full_logits(model, tokens_BxT, mask_BxT)
  tol = temperature_consistency_tol()
  truncation_gap = 0.0
  for i, (tokens, recorded) in enumerate(zip(out.tokens, out.logprobs)):
    n = len(tokens)
    np.testing.assert_allclose(recorded, logp_BxT[i, -n:], atol=tol, rtol=0)
    assert np.max(np.abs(np.exp(recorded - logp_BxT[i, -n:]) - 1)) < tol
    # Every draw lies in the top-p nucleus, and the record is the untruncated log-prob, not the renormalised one.
    logp_NxV = log_softmax_np(logits_BxTxV[i, -n - 1 : -1] / temperature)
    drawn_N = logp_NxV[np.arange(n), tokens]
    mass_before_N = np.where(logp_NxV > drawn_N[:, None], np.exp(logp_NxV), 0).sum(-1)
    assert np.all(mass_before_N < top_p)
    truncation_gap = max(truncation_gap, float(np.max(-np.log(nucleus_mass(logp_NxV, top_p)))))
  assert truncation_gap > 1e-2  # so a sampler recording the truncated log-prob would fail above


def test_tiny_top_p_is_greedy_and_equals_naive_argmax_decoding(model, sampler, prompts):
  out = sampler.generate(prompts, GREEDY, jax.random.key(1))
  check_output(out, 3)
  assert out.tokens == naive_greedy(model, prompts, NUM_NEW)
  assert out.finish_reasons == ["length"] * 3
  # Greedy at another temperature draws the same tokens; the record follows the temperature.
  cold = sampler.generate(prompts, dataclasses.replace(GREEDY, temperature=0.6), jax.random.key(2))
  assert cold.tokens == out.tokens
  tokens_BxT, mask_BxT = pack_left([p + t for p, t in zip(prompts, out.tokens)])
  logp_BxT = full_logprobs(model, tokens_BxT, mask_BxT, 0.6)
  for i, recorded in enumerate(cold.logprobs):
    np.testing.assert_allclose(recorded, logp_BxT[i, -NUM_NEW:], atol=1e-4, rtol=0)


def test_prompt_filling_the_cache_exactly(model, sampler):
  """len(prompt) + max_new_tokens == max_len: the bucket is capped and the last slot is the last write."""
  rng = np.random.default_rng(7)
  prompts = [[int(t) for t in rng.integers(1, CFG.vocab_size, n)] for n in (MAX_LEN - NUM_NEW, 30, 10)]
  out = sampler.generate(prompts, GREEDY, jax.random.key(3))
  assert out.tokens == naive_greedy(model, prompts, NUM_NEW)


def test_batches_in_one_bucket_share_the_compilation_and_the_rows(sampler, prompts):
  """3 and 4 rows are both run as 4 (batch_buckets): same programs, and row i draws the same tokens."""
  params = SamplingParams(temperature=1.0, max_new_tokens=NUM_NEW)
  four = sampler.generate(prompts + [prompts[0]], params, jax.random.key(4))
  counts = sampler.trace_counts
  three = sampler.generate(prompts, params, jax.random.key(4))
  assert sampler.trace_counts == counts
  assert three.tokens == four.tokens[:3]
  assert all(np.array_equal(a, b) for a, b in zip(three.logprobs, four.logprobs))


def test_same_key_same_output_other_key_other_output(sampler, prompts):
  params = SamplingParams(temperature=1.0, max_new_tokens=NUM_NEW)
  a = sampler.generate(prompts, params, jax.random.key(5))
  b = sampler.generate(prompts, params, jax.random.key(5))
  c = sampler.generate(prompts, params, jax.random.key(6))
  assert a.tokens == b.tokens and all(np.array_equal(x, y) for x, y in zip(a.logprobs, b.logprobs))
  assert a.tokens != c.tokens


@pytest.mark.parametrize(
  "params", [GREEDY, SamplingParams(temperature=1.0, max_new_tokens=NUM_NEW)], ids=["greedy", "temperature-1"]
)
def test_stop_token_ids_truncate_inclusively(sampler, prompts, params):
  key = jax.random.key(11)
  free = sampler.generate(prompts, params, key)
  stop_ids = (free.tokens[0][5], free.tokens[2][12])
  out = sampler.generate(prompts, dataclasses.replace(params, stop_token_ids=stop_ids), key)
  check_output(out, 3)
  for i in range(3):
    hits = [j for j, t in enumerate(free.tokens[i]) if t in stop_ids]
    end = hits[0] + 1 if hits else NUM_NEW
    # Rows are independent and the keys the same, so a stopped row is a prefix of the free run.
    assert out.tokens[i] == free.tokens[i][:end]
    np.testing.assert_array_equal(out.logprobs[i], free.logprobs[i][:end])
    assert out.finish_reasons[i] == ("stop_token" if hits else "length")
  assert out.finish_reasons[0] == out.finish_reasons[2] == "stop_token"
  assert len(out.tokens[0]) <= 6


def test_stop_strings_truncate_at_the_completing_token(sampler, prompts):
  key = jax.random.key(12)
  free = sampler.generate(prompts, GREEDY, key)
  # The second character of token 7 and the first of token 8: row 1 stops on token 8, in the second chunk.
  straddling = decode_text(free.tokens[1])[15:17]
  whole = decode_text([free.tokens[2][3]])
  stop_strings = (straddling, whole)
  out = sampler.generate(prompts, dataclasses.replace(GREEDY, stop_strings=stop_strings), key, decode_text=decode_text)
  check_output(out, 3)
  for i in range(3):
    ends = [k for k in range(1, NUM_NEW + 1) if any(s in decode_text(free.tokens[i][:k]) for s in stop_strings)]
    end = ends[0] if ends else NUM_NEW
    assert out.tokens[i] == free.tokens[i][:end]
    np.testing.assert_array_equal(out.logprobs[i], free.logprobs[i][:end])
    assert out.finish_reasons[i] == ("stop_string" if ends else "length")
  assert len(out.tokens[1]) <= 9 and len(out.tokens[2]) <= 4
  assert out.finish_reasons[1] == out.finish_reasons[2] == "stop_string"


def test_stop_token_that_completes_a_stop_string_counts_as_stop_token(sampler, prompts):
  key = jax.random.key(13)
  free = sampler.generate(prompts, GREEDY, key)
  stop_id = free.tokens[0][5]
  params = dataclasses.replace(GREEDY, stop_token_ids=(stop_id,), stop_strings=(decode_text([stop_id]),))
  out = sampler.generate(prompts, params, key, decode_text=decode_text)
  for i in range(3):
    end = free.tokens[i].index(stop_id) + 1 if stop_id in free.tokens[i] else NUM_NEW
    assert out.tokens[i] == free.tokens[i][:end]
    assert out.finish_reasons[i] == ("stop_token" if stop_id in free.tokens[i] else "length")


def test_update_model_changes_outputs_without_recompiling(model, other_model, sampler, prompts):
  key = jax.random.key(21)
  before = sampler.generate(prompts, GREEDY, key)
  counts = sampler.trace_counts
  assert counts["prefill"] >= 1 and counts["decode"] >= 1
  sampler.update_model(other_model)
  try:
    after = sampler.generate(prompts, GREEDY, key)
    assert sampler.trace_counts == counts
    assert after.tokens != before.tokens
    assert after.tokens == naive_greedy(other_model, prompts, NUM_NEW)
  finally:
    sampler.update_model(model)
  assert sampler.generate(prompts, GREEDY, key).tokens == before.tokens
  assert sampler.trace_counts == counts


def test_update_model_from_a_trainer_split_and_mesh_does_not_recompile(model, other_model, sampler, prompts):
  """The trainer splits (Param, rest), places params with a NamedSharding and merges them back."""
  key = jax.random.key(22)
  sampler.generate(prompts, GREEDY, key)
  counts = sampler.trace_counts
  graphdef, params, rest = nnx.split(other_model, nnx.Param, ...)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  params = jax.device_put(params, jax.tree.map(lambda _: replicated, params))
  sampler.update_model(nnx.merge(graphdef, params, rest))
  try:
    assert sampler.generate(prompts, GREEDY, key).tokens == naive_greedy(other_model, prompts, NUM_NEW)
    assert sampler.trace_counts == counts
  finally:
    sampler.update_model(model)


def test_released_weights_refuse_to_sample_until_bound_again(model, sampler, prompts):
  """A trainer frees the sampler's copy for the update; sampling then names the fix, and the next update_model
  samples as before, without recompiling."""
  key = jax.random.key(23)
  before = sampler.generate(prompts, GREEDY, key)
  counts = sampler.trace_counts
  sampler.release_weights()
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(sampler._state))
  try:
    with pytest.raises(ValueError, match="released .* call update_model"):
      sampler.generate(prompts, GREEDY, key)
  finally:
    sampler.update_model(model)
  assert sampler.generate(prompts, GREEDY, key).tokens == before.tokens
  assert sampler.trace_counts == counts


def test_update_model_rejects_another_architecture(sampler):
  for change in (dict(num_layers=3), dict(qk_norm=True)):
    other = nnx.eval_shape(lambda: Decoder(dataclasses.replace(CFG, **change), rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="build a new Sampler"):
      sampler.update_model(other)


@pytest.mark.parametrize(
  "kwargs, field",
  [
    (dict(temperature=0.0), "temperature"),
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_p=float("nan")), "top_p"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=2.0), "max_new_tokens"),
    (dict(stop_token_ids=(-1,)), "stop_token_ids"),
    (dict(stop_token_ids=("a",)), "stop_token_ids"),
    (dict(stop_strings="</answer>"), "stop_strings"),
    (dict(stop_strings=("",)), "stop_strings"),
  ],
)
def test_sampling_params_validation(kwargs, field):
  with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
    SamplingParams(**kwargs)


def test_generate_validation(sampler, prompts):
  key = jax.random.key(0)
  params = SamplingParams(max_new_tokens=NUM_NEW)
  cases = [
    (([], params), "prompts is empty"),
    (([[1, 2], []], params), "prompt 1 is empty"),
    (
      (prompts + [[1] * (MAX_LEN - NUM_NEW + 1)], params),
      f"prompt 3 has {MAX_LEN - NUM_NEW + 1} tokens \\+ max_new_tokens={NUM_NEW} = {MAX_LEN + 1} > max_len={MAX_LEN}",
    ),
    (([[1, CFG.vocab_size]], params), "prompt 0 holds ids outside"),
    (([[1, -1]], params), "prompt 0 holds ids outside"),
    ((prompts, dataclasses.replace(params, stop_strings=("x",))), "needs decode_text"),
    ((prompts, dataclasses.replace(params, stop_token_ids=(CFG.vocab_size,))), "stop_token_ids"),
    ((prompts, dict(temperature=1.0)), "SamplingParams"),
  ]
  for (batch, p), message in cases:
    with pytest.raises(ValueError, match=message):
      sampler.generate(batch, p, key)


@pytest.mark.parametrize(
  "kwargs, name",
  [
    (dict(max_len=1), "max_len"),
    (dict(chunk_size=0), "chunk_size"),
    (dict(prompt_bucket=0), "prompt_bucket"),
    (dict(batch_buckets=(0, 8)), "batch_buckets"),
    (dict(batch_buckets=(8, 4)), "batch_buckets"),
    (dict(pad_id=CFG.vocab_size), "pad_id"),
    (dict(pad_id=-1), "pad_id"),
  ],
)
def test_sampler_constructor_validation(model, kwargs, name):
  with pytest.raises(ValueError, match=name):
    Sampler(model, **{**dict(max_len=MAX_LEN, pad_id=PAD_ID), **kwargs})


def test_top_p_keep_matches_sorted_reference():
  rng = np.random.default_rng(0)
  logits_BxV = rng.standard_normal((5, 300)).astype(np.float32) * 3
  logits_BxV[3, [7, 20]] = logits_BxV[3].max() + 1.0  # a tie for the most likely token
  logits_BxV[4, :250] = -1e9  # tokens of probability 0
  logp_BxV = np.asarray(jax.nn.log_softmax(jnp.asarray(logits_BxV), axis=-1))
  keep = jax.jit(_top_p_keep)
  for top_p in (1e-6, 0.05, 0.3, 0.9, 0.99):
    got_BxV = np.asarray(keep(jnp.asarray(logp_BxV), jnp.float32(top_p)))
    for b in range(len(logp_BxV)):
      order = np.argsort(-logp_BxV[b], kind="stable")
      probs = np.exp(logp_BxV[b, order].astype(np.float64))
      mass_before = np.cumsum(probs) - probs
      # Tokens tied with the boundary token go with it: use the mass of strictly more likely tokens.
      mass_strictly_above = np.array([probs[probs > q].sum() for q in probs])
      expected = np.zeros(logp_BxV.shape[1], bool)
      expected[order[mass_strictly_above < top_p]] = True
      np.testing.assert_array_equal(got_BxV[b], expected, err_msg=f"row {b} top_p {top_p}")
      if b != 3:  # without ties this is the sorted nucleus
        assert expected.sum() == max(1, int(np.sum(mass_before < top_p)))
  tie_row = np.asarray(keep(jnp.asarray(logp_BxV), jnp.float32(1e-6)))[3]
  assert np.flatnonzero(tie_row).tolist() == [7, 20]


@pytest.mark.parametrize("vocab, block", [(300, 128), (1000, 128), (7, 4)])
def test_inverse_cdf_draws_follow_the_distribution_and_never_a_zero_probability_id(vocab, block):
  """20,000 draws per row: every id's frequency within 5 standard errors of its probability; -inf ids never."""
  from jaxcredit.sampling.sampler import sample_inverse_cdf

  rng = np.random.default_rng(vocab)
  logits = rng.normal(0, 2, (3, vocab)).astype(np.float32)
  logits[0, rng.choice(vocab, vocab // 2, replace=False)] = -np.inf  # a masked nucleus
  logits[1, :] = -np.inf
  logits[1, vocab - 1] = 0.0  # all the mass on the last id
  logits[2, : vocab - 2] = -np.inf  # mass in the last two ids only
  logp = jax.nn.log_softmax(jnp.asarray(logits), axis=-1)
  draws = 20_000
  keys = jax.random.split(jax.random.key(vocab), draws)
  ids = np.asarray(jax.jit(jax.vmap(lambda k: sample_inverse_cdf(k, logp, block)))(keys))  # [draws, 3]
  probs = np.exp(np.asarray(logp, np.float64))
  for row in range(3):
    counts = np.bincount(ids[:, row], minlength=vocab)
    assert counts[probs[row] == 0].sum() == 0
    stderr = np.sqrt(probs[row] * (1 - probs[row]) / draws)
    np.testing.assert_array_less(np.abs(counts / draws - probs[row]), 5 * stderr + 1e-9)
