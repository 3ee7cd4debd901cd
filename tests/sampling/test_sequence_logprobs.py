"""logprobs_from_logits against a loop reference; sequence_logprobs does not depend on where the padding is."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcredit.models.logprobs import logprobs_from_logits
from tests.sampling.sampling_reference import CFG, MAX_LEN, PAD_ID, full_logprobs, pack_left


def reference(logits_BxLxV, tokens_BxL, mask_BxL, temperature):
  out = np.zeros(tokens_BxL.shape, np.float64)
  for b in range(tokens_BxL.shape[0]):
    for t in range(1, tokens_BxL.shape[1]):
      if mask_BxL[b, t] and mask_BxL[b, t - 1]:
        z = logits_BxLxV[b, t - 1].astype(np.float64) / temperature
        out[b, t] = z[tokens_BxL[b, t]] - z.max() - np.log(np.exp(z - z.max()).sum())
  return out


def test_logprobs_from_logits_matches_loop_reference_under_jit_and_vmap():
  rng = np.random.default_rng(0)
  logits_BxLxV = (3 * rng.standard_normal((3, 7, 11))).astype(np.float32)
  tokens_BxL = rng.integers(0, 11, (3, 7)).astype(np.int32)
  mask_BxL = np.array(
    [
      [1, 1, 1, 1, 1, 1, 1],  # unpadded
      [0, 0, 0, 1, 1, 1, 1],  # left padded
      [1, 1, 1, 1, 0, 0, 0],
    ],  # right padded
    bool,
  )
  expected = reference(logits_BxLxV, tokens_BxL, mask_BxL, 0.6)
  got = jax.jit(logprobs_from_logits)(logits_BxLxV, tokens_BxL, mask_BxL, 0.6)
  assert got.dtype == jnp.float32 and got.shape == (3, 7)
  np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
  assert np.all(np.asarray(got)[~mask_BxL] == 0) and np.all(np.asarray(got)[:, 0] == 0)
  assert np.asarray(got)[1, 3] == 0  # a row's first real token has no real prefix
  per_row = jax.vmap(lambda l, t, m: logprobs_from_logits(l[None], t[None], m[None], 0.6)[0])(
    logits_BxLxV, tokens_BxL, mask_BxL
  )
  np.testing.assert_allclose(per_row, got, atol=1e-6, rtol=0)


def test_logprobs_from_logits_rejects_bad_ranks():
  with pytest.raises(ValueError, match="logits_BxLxV"):
    logprobs_from_logits(jnp.zeros((2, 5)), jnp.zeros((2, 5), jnp.int32), jnp.ones((2, 5), bool), 1.0)
  with pytest.raises(ValueError, match="tokens_BxL"):
    logprobs_from_logits(jnp.zeros((2, 5, 3)), jnp.zeros((2, 4), jnp.int32), jnp.ones((2, 4), bool), 1.0)


def test_sequence_logprobs_is_the_same_left_padded_and_right_padded(model):
  rng = np.random.default_rng(3)
  rows = [[int(t) for t in rng.integers(1, CFG.vocab_size, n)] for n in (9, 30, MAX_LEN)]
  left_BxT, left_mask_BxT = pack_left(rows)
  right_BxT = np.full_like(left_BxT, PAD_ID)
  right_mask_BxT = np.zeros_like(left_mask_BxT)
  for i, row in enumerate(rows):
    right_BxT[i, : len(row)] = row
    right_mask_BxT[i, : len(row)] = True
  left = full_logprobs(model, left_BxT, left_mask_BxT, 0.8)
  right = full_logprobs(model, right_BxT, right_mask_BxT, 0.8)
  np.testing.assert_allclose(left[left_mask_BxT], right[right_mask_BxT], atol=1e-5, rtol=0)
  assert np.all(left[~left_mask_BxT] == 0) and np.all(right[~right_mask_BxT] == 0)
  assert np.all(left[left_mask_BxT] <= 0)
