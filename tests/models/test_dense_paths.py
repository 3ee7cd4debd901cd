"""The decoder's two layouts for dense layers (flattened [B·L, D] products on CPU, [B, L, D] einsums elsewhere)
give the same logits and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcredit.models import decoder

from tests.fixtures.tiny_model import tiny_decoder_config


def test_flattened_and_einsum_dense_layers_agree(monkeypatch):
  for tied in (True, False):
    cfg = tiny_decoder_config(intermediate_size=48, qk_norm=True, tie_word_embeddings=tied)
    model = decoder.Decoder(cfg, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (3, 7)), jnp.int32)

    def loss(state):
      logits, _ = nnx.merge(graphdef, state)(tokens)
      return jnp.sum(jax.nn.log_softmax(logits)[..., 5]), logits

    outs = {}
    for flat in (True, False):
      monkeypatch.setattr(decoder, "_flatten_dots", lambda flat=flat: flat)
      (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(state)  # traced anew: no jit cache across flags
      outs[flat] = (logits, grads)
    np.testing.assert_allclose(outs[True][0], outs[False][0], rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(outs[True][1]), jax.tree.leaves(outs[False][1])):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert float(jnp.max(jnp.abs(outs[True][0]))) > 0.01
