"""chunked_logprobs_and_entropies against full logits + log_softmax: values, gradients, memory; and
sequence_logprobs(_and_entropies) against logprobs_from_logits on tiny random decoders."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit.models import Decoder
from jaxcredit.sampling import (
  chunked_logprobs_and_entropies,
  logprobs_from_logits,
  sequence_logprobs,
  sequence_logprobs_and_entropies,
)

from tests.fixtures.tiny_model import tiny_decoder_config


def naive(h_BxLxD, head_DxV, targets_BxL, temperature):
  """Full float32 logits, log_softmax, gather; entropy -Σ p log p."""
  z_BxLxV = (
    jnp.einsum(
      "bld,dv->blv", h_BxLxD.astype(jnp.float32), head_DxV.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST
    )
    / temperature
  )
  logp_BxLxV = jax.nn.log_softmax(z_BxLxV, axis=-1)
  logp_BxL = jnp.take_along_axis(logp_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]
  entropy_BxL = -jnp.sum(jnp.exp(logp_BxLxV) * logp_BxLxV, axis=-1)
  return logp_BxL, entropy_BxL


def draw(b, l, d, v, seed=0, scale=1.0):
  rng = np.random.default_rng(seed)
  h = jnp.asarray(rng.standard_normal((b, l, d)), jnp.float32)
  head = jnp.asarray(scale * rng.standard_normal((d, v)) / np.sqrt(d), jnp.float32)
  targets = jnp.asarray(rng.integers(0, v, (b, l)), jnp.int32)
  w_logp = jnp.asarray(rng.standard_normal((b, l)), jnp.float32)
  w_ent = jnp.asarray(rng.standard_normal((b, l)), jnp.float32)
  return h, head, targets, w_logp, w_ent


# (B, L, D, V, seq_chunk, vocab_chunk, temperature, logit scale)
CASES = [
  (2, 37, 16, 1000, 8, 128, 0.7, 4.0),  # neither L nor V divisible by the chunks
  (2, 16, 8, 257, 4, 128, 1.6, 8.0),  # L divisible; the last vocabulary chunk holds a single real column
  (3, 5, 8, 300, None, None, 0.5, 3.0),  # defaults: whole L and V in one chunk
]


@pytest.mark.parametrize("b,l,d,v,lc,vc,temperature,scale", CASES)
def test_values_and_gradients_match_full_logits(b, l, d, v, lc, vc, temperature, scale):
  h, head, targets, w_logp, w_ent = draw(b, l, d, v, seed=l + v, scale=scale)

  @jax.jit
  def run(h, head, t):
    out = {}
    for name, fn in [
      ("chunked", lambda h, head, t: chunked_logprobs_and_entropies(h, head, targets, t, seq_chunk=lc, vocab_chunk=vc)),
      ("naive", lambda h, head, t: naive(h, head, targets, t)),
    ]:
      # Gradients of Σ w_logp · logp and of Σ w_ent · entropy separately (a combined objective could hide
      # two compensating errors), as one batched backward pass.
      values, vjp = jax.vjp(fn, h, head, t)
      zero = jnp.zeros_like(w_logp)
      grads = jax.vmap(vjp)((jnp.stack([w_logp, zero]), jnp.stack([zero, w_ent])))
      out[name] = (values, jax.tree_util.tree_map(lambda g: g[0], grads), jax.tree_util.tree_map(lambda g: g[1], grads))
    return out

  out = run(h, head, jnp.float32(temperature))
  (got_logp, got_ent), got_d_logp, got_d_ent = out["chunked"]
  (want_logp, want_ent), want_d_logp, want_d_ent = out["naive"]
  assert got_logp.dtype == jnp.float32 and got_logp.shape == (b, l) and got_ent.shape == (b, l)
  np.testing.assert_allclose(got_logp, want_logp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_ent, want_ent, rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(got_logp) < 0) and np.all(np.asarray(got_ent) > 0)
  # The distributions are far from uniform and from one-hot, so a wrong normaliser would show.
  assert 0.05 * np.log(v) < float(np.mean(want_ent)) < 0.95 * np.log(v)

  for got, want in ((got_d_logp, want_d_logp), (got_d_ent, want_d_ent)):
    (got_dh, got_dhead, got_dt), (want_dh, want_dhead, want_dt) = got, want
    assert float(jnp.max(jnp.abs(want_dhead))) > 1e-2 and float(jnp.max(jnp.abs(want_dh))) > 1e-2
    np.testing.assert_allclose(got_dh, want_dh, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_dhead, want_dhead, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_dt, want_dt, rtol=1e-4, atol=1e-4)


def test_bfloat16_inputs_accumulate_in_float32():
  h, head, targets, w_logp, w_ent = draw(2, 21, 32, 700, seed=7, scale=4.0)
  h16, head16 = h.astype(jnp.bfloat16), head.astype(jnp.bfloat16)

  @jax.jit
  def run(h, head, h16, head16):
    values, vjp = jax.vjp(
      lambda h, head: chunked_logprobs_and_entropies(h, head, targets, 0.8, seq_chunk=8, vocab_chunk=256), h16, head16
    )
    want, want_vjp = jax.vjp(lambda h, head: naive(h, head, targets, 0.8), h, head)
    rounded = naive(h16.astype(jnp.float32), head16.astype(jnp.float32), targets, 0.8)
    return values, vjp((w_logp, w_ent)), rounded, want, want_vjp((w_logp, w_ent))

  (got_logp, got_ent), got_grads, rounded, (want_logp, want_ent), want_grads = run(h, head, h16, head16)
  assert got_logp.dtype == jnp.float32 and got_ent.dtype == jnp.float32
  # Against float32 on the same (rounded) inputs: only the summation order differs.
  np.testing.assert_allclose(got_logp, rounded[0], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(got_ent, rounded[1], rtol=1e-4, atol=1e-4)
  # Against float32 on the unrounded inputs: bfloat16's 8 bits of mantissa.
  np.testing.assert_allclose(got_logp, want_logp, rtol=0.05, atol=0.05)
  np.testing.assert_allclose(got_ent, want_ent, rtol=0.05, atol=0.05)
  assert got_grads[0].dtype == jnp.bfloat16 and got_grads[1].dtype == jnp.bfloat16
  for g, e in zip(got_grads, want_grads):
    g, e = np.asarray(g.astype(jnp.float32)), np.asarray(e)
    assert np.linalg.norm(g - e) < 0.03 * np.linalg.norm(e)


def test_out_of_range_target_gets_a_huge_negative_logp_and_a_correct_entropy():
  h, head, targets, _, _ = draw(1, 4, 8, 50, seed=11)
  targets = targets.at[0, 2].set(50).at[0, 3].set(-1)
  logp, ent = jax.jit(lambda h, head, targets: chunked_logprobs_and_entropies(h, head, targets, 1.0, vocab_chunk=16))(
    h, head, targets
  )
  _, want_ent = naive(h, head, jnp.clip(targets, 0, 49), 1.0)
  assert np.all(np.asarray(logp[0, 2:]) < -1e29) and np.all(np.isfinite(np.asarray(logp)))
  np.testing.assert_allclose(ent, want_ent, rtol=1e-5, atol=1e-5)


def _max_intermediate_size(jaxpr) -> int:
  """The element count of the largest value any equation of `jaxpr` (or of a sub-jaxpr) produces."""
  biggest = 0
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      biggest = max(biggest, int(np.prod(getattr(var.aval, "shape", ()), dtype=np.int64)))
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      biggest = max(biggest, _max_intermediate_size(sub))
  return biggest


def test_gradient_never_holds_the_logits():
  b, l, d, v, lc, vc = 2, 256, 32, 32768, 64, 4096
  logits_bytes = b * l * v * 4  # 64 MiB

  def grad_fn(fn):
    def objective(h, head):
      logp, entropy = fn(h, head)
      return jnp.sum(logp) + jnp.sum(entropy)

    return jax.jit(jax.grad(objective, argnums=(0, 1)))

  targets = lambda h: jnp.zeros(h.shape[:2], jnp.int32)
  chunked = lambda h, head: chunked_logprobs_and_entropies(h, head, targets(h), 1.0, seq_chunk=lc, vocab_chunk=vc)
  spec = lambda length: (jax.ShapeDtypeStruct((b, length, d), jnp.float32), jax.ShapeDtypeStruct((d, v), jnp.float32))

  # No value in the differentiated program is as large as even one sequence chunk's full-vocabulary logits.
  jaxpr = jax.make_jaxpr(grad_fn(chunked))(*spec(l)).jaxpr
  assert _max_intermediate_size(jaxpr) <= max(b * l * d, d * v, b * lc * vc) < b * lc * v

  temp = grad_fn(chunked).lower(*spec(l)).compile().memory_analysis().temp_size_in_bytes
  naive_temp = (
    grad_fn(lambda h, head: naive(h, head, targets(h), 1.0))
    .lower(*spec(l))
    .compile()
    .memory_analysis()
    .temp_size_in_bytes
  )
  assert naive_temp >= logits_bytes  # the measure does see [B, L, V] buffers when there are some
  assert temp < logits_bytes / 3, (temp, logits_bytes)
  # Doubling L adds the hidden states and their gradient, nowhere near another B·L·V·4 bytes.
  temp_2l = grad_fn(chunked).lower(*spec(2 * l)).compile().memory_analysis().temp_size_in_bytes
  assert temp_2l - temp < logits_bytes / 16, (temp, temp_2l)


def test_rejects_bad_arguments():
  h, head, targets, _, _ = draw(2, 5, 4, 10)
  f = chunked_logprobs_and_entropies
  with pytest.raises(ValueError, match="h_BxLxD"):
    f(h[0], head, targets, 1.0)
  with pytest.raises(ValueError, match="head_DxV"):
    f(h, head[None], targets, 1.0)
  with pytest.raises(ValueError, match="head_DxV"):
    f(h, head[:3], targets, 1.0)
  with pytest.raises(ValueError, match="targets_BxL"):
    f(h, head, targets[:, :4], 1.0)
  with pytest.raises(ValueError, match="targets_BxL"):
    f(h, head, targets.astype(jnp.float32), 1.0)
  for bad in (0, -3, 2.0, True):
    with pytest.raises(ValueError, match="seq_chunk"):
      f(h, head, targets, 1.0, seq_chunk=bad)
    with pytest.raises(ValueError, match="vocab_chunk"):
      f(h, head, targets, 1.0, vocab_chunk=bad)
  for bad in (0.0, -1.0, np.ones(2)):
    with pytest.raises(ValueError, match="temperature"):
      f(h, head, targets, bad)
  with pytest.raises(ValueError, match="tokens_BxL"):
    sequence_logprobs(None, jnp.zeros((5,), jnp.int32), jnp.ones((5,), bool), 1.0)
  with pytest.raises(ValueError, match="token_mask_BxL"):
    sequence_logprobs(None, jnp.zeros((2, 5), jnp.int32), jnp.ones((2, 4), bool), 1.0)
  with pytest.raises(ValueError, match="vocab_chunk"):
    sequence_logprobs(None, jnp.zeros((2, 5), jnp.int32), jnp.ones((2, 5), bool), 1.0, vocab_chunk=0)


def tiny_decoder(tied: bool, seed: int) -> Decoder:
  cfg = tiny_decoder_config(vocab_size=97, head_dim=16, tie_word_embeddings=tied)
  model = Decoder(cfg, rngs=nnx.Rngs(seed))
  model.embedding[...] = model.embedding[...] * 30.0  # spread the logits (std 0.02 init is near uniform)
  if not tied:
    model.lm_head[...] = model.lm_head[...] * 30.0
  return model


def batch():
  rng = np.random.default_rng(2)
  tokens = rng.integers(1, 97, (3, 11)).astype(np.int32)
  mask = np.array([[1] * 11, [0] * 4 + [1] * 7, [1] * 6 + [0] * 5], bool)
  return jnp.asarray(np.where(mask, tokens, 0)), jnp.asarray(mask)


def full_entropies(logits_BxLxV, mask_BxL, temperature):
  logp = jax.nn.log_softmax(logits_BxLxV[:, :-1] / temperature, axis=-1)
  ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
  return jnp.pad(jnp.where(mask_BxL[:, 1:] & mask_BxL[:, :-1], ent, 0.0), ((0, 0), (1, 0)))


@pytest.mark.parametrize("tied", [True, False])
def test_sequence_logprobs_matches_full_logits_on_a_decoder(tied):
  """Tied (head = embeddingᵀ) and untied (lm_head) output heads, left- and right-padded rows, under nnx.jit."""
  model = tiny_decoder(tied, seed=int(tied))
  tokens, mask = batch()

  @nnx.jit
  def run(model, temperature):
    logits = model(tokens, token_mask_BxL=mask)[0]
    return (
      sequence_logprobs_and_entropies(model, tokens, mask, temperature, seq_chunk=4, vocab_chunk=40),
      sequence_logprobs(model, tokens, mask, temperature),  # default chunks: one of each here
      logprobs_from_logits(logits, tokens, mask, temperature),
      full_entropies(logits, mask, temperature),
    )

  (got_logp, got_ent), default_chunks_logp, want_logp, want_ent = run(model, 0.7)
  np.testing.assert_allclose(got_logp, want_logp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_ent, want_ent, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(default_chunks_logp, want_logp, rtol=1e-5, atol=1e-5)
  zero = ~np.asarray(mask[:, 1:] & mask[:, :-1])
  assert np.all(np.asarray(got_logp)[:, 0] == 0) and np.all(np.asarray(got_ent)[:, 0] == 0)
  assert np.all(np.asarray(got_logp)[:, 1:][zero] == 0) and np.all(np.asarray(got_ent)[:, 1:][zero] == 0)
  assert np.all(np.asarray(got_logp)[:, 1:][~zero] < 0) and np.all(np.asarray(got_ent)[:, 1:][~zero] > 0)
  assert float(np.max(np.asarray(got_ent))) < 0.9 * np.log(97)  # not uniform
