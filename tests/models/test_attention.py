"""Chunked (flash-style XLA) and splash (Pallas, interpret mode on CPU) attention equal full attention.

Full attention (`decoder.attention`) materialises the [L, S] scores and is the reference. Values and gradients
are compared at real query positions (a pad query's own output is meaningless in every implementation).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit.models import Decoder
from jaxcredit.models.chunked_attention import chunked_causal_attention
from jaxcredit.models.decoder import attention

from tests.fixtures.tiny_model import tiny_decoder_config


def _inputs(b, l, h, k, dh, seed=0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(b, l, h, dh)), jnp.float32)
  key = jnp.asarray(rng.normal(size=(b, l, k, dh)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(b, l, k, dh)), jnp.float32)
  mask = np.ones((b, l), bool)
  mask[0, : l // 7] = False  # left padding
  if b > 1:
    mask[1, l - l // 5 :] = False  # right padding
  mask = jnp.asarray(mask)
  w = jnp.asarray(rng.normal(size=(b, l, h, dh)), jnp.float32) * mask[..., None, None]
  return q, key, v, mask, w


def _full(q, k, v, mask):
  l = q.shape[1]
  return attention(q, k, v, jnp.tril(jnp.ones((l, l), bool))[None] & mask[:, None, :])


def _compare(fn, q, k, v, mask, w, tol):
  ref = _full(q, k, v, mask)
  out = jax.jit(fn)(q, k, v)
  real = mask[..., None, None]
  assert float(jnp.max(jnp.abs(jnp.where(real, ref - out, 0.0)))) <= tol
  assert float(jnp.max(jnp.abs(ref))) > 0.1  # a real comparison, not zeros against zeros
  g_ref = jax.grad(lambda *a: jnp.sum(_full(*a, mask) * w), argnums=(0, 1, 2))(q, k, v)
  g_out = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) * w), argnums=(0, 1, 2)))(q, k, v)
  for name, a, b in zip("qkv", g_ref, g_out):
    err = float(jnp.max(jnp.abs(a - b)))
    assert err <= tol * max(1.0, float(jnp.max(jnp.abs(a)))), (name, err)


@pytest.mark.parametrize("l,h,k,block", [(37, 4, 4, 8), (64, 4, 2, 16), (50, 8, 2, 64), (33, 4, 1, 5)])
def test_chunked_attention_equals_full_attention(l, h, k, block):
  q, key, v, mask, w = _inputs(2, l, h, k, 16)
  _compare(lambda q, k, v: chunked_causal_attention(q, k, v, mask, block), q, key, v, mask, w, 1e-5)


def test_chunked_attention_compiles_no_square_score_matrix():
  """The compiled forward+backward of L=4096 needs far less scratch than one [H, L, L] float32 score tensor."""
  b, l, h, k, dh = 1, 4096, 2, 1, 16
  q = jax.ShapeDtypeStruct((b, l, h, dh), jnp.float32)
  kv = jax.ShapeDtypeStruct((b, l, k, dh), jnp.float32)
  mask = jax.ShapeDtypeStruct((b, l), jnp.bool_)
  loss = lambda q, k, v, m: jnp.sum(chunked_causal_attention(q, k, v, m, 256))
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv, mask).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  assert temp < b * h * l * l * 4 / 8, temp


def test_splash_attention_interpret_mode_equals_full_attention():
  from jaxcredit.models.splash import splash_causal_attention

  q, key, v, mask, w = _inputs(1, 128, 4, 2, 128, seed=1)
  _compare(lambda q, k, v: splash_causal_attention(q, k, v, mask, block=128), q, key, v, mask, w, 1e-5)


def test_decoder_with_chunked_attention_equals_full():
  cfg = tiny_decoder_config(intermediate_size=48, head_dim=16, qk_norm=True, attention_impl="full")
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 64, (2, 45)))
  mask = jnp.asarray(np.arange(45)[None, :] >= np.array([[0], [6]]))
  outs = {}
  for impl in ("full", "chunked"):
    model = Decoder(dataclasses.replace(cfg, attention_impl=impl, attention_chunk=16), rngs=nnx.Rngs(0))
    outs[impl] = nnx.jit(lambda m, t, k: m(t, token_mask_BxL=k)[0])(model, tokens, mask)
  diff = jnp.where(mask[..., None], outs["full"] - outs["chunked"], 0.0)
  assert float(jnp.max(jnp.abs(diff))) <= 1e-5


def test_full_attention_equals_a_per_head_reference_and_zeroes_queries_without_keys():
  # The full path's head-major products against a plain per-head loop (query head h reads kv head h // G), with a
  # left-padded row whose pad queries see no key: their output is 0 and every gradient stays finite.
  b, l, h, k, dh = 2, 12, 6, 2, 8
  q, key, v, mask, w = _inputs(b, l, h, k, dh, seed=3)
  allowed = np.tril(np.ones((l, l), bool))[None] & np.asarray(mask)[:, None, :]
  ref = np.zeros((b, l, h, dh))
  for bi in range(b):
    for hi in range(h):
      s = np.asarray(q)[bi, :, hi] @ np.asarray(key)[bi, :, hi // (h // k)].T / np.sqrt(dh)
      for qi in range(l):
        if allowed[bi, qi].any():
          e = np.exp(s[qi] - s[qi][allowed[bi, qi]].max()) * allowed[bi, qi]
          ref[bi, qi, hi] = (e / e.sum()) @ np.asarray(v)[bi, :, hi // (h // k)]
  out = jax.jit(attention)(q, key, v, jnp.asarray(allowed))
  np.testing.assert_allclose(np.asarray(out), ref, atol=1e-5)
  assert not allowed[0, 0].any() and float(jnp.max(jnp.abs(out[0, 0]))) == 0.0  # a pad query: zero output
  grads = jax.grad(lambda *a: jnp.sum(attention(*a, jnp.asarray(allowed)) * w), argnums=(0, 1, 2))(q, key, v)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
  assert float(jnp.max(jnp.abs(grads[0][0, 0]))) == 0.0  # no gradient through a query that sees nothing
