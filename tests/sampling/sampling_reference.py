"""A small random decoder and slow, obvious full-forward references for the sampling tests."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcredit.models.decoder import Decoder
from jaxcredit.sampling import sequence_logprobs

from tests.fixtures.tiny_model import tiny_decoder_config

CFG = tiny_decoder_config(vocab_size=128, hidden_size=64, intermediate_size=128, head_dim=16, tie_word_embeddings=False)
MAX_LEN = 64
PAD_ID = 0
PROMPT_LENGTHS = (5, 11, 17)  # all left-padded to 24 with prompt_bucket=8


def make_model(seed: int) -> Decoder:
  """A random decoder whose next-token distributions are peaked enough for top-p and greedy to mean something.

  Initialised at std 0.02 the logits are almost uniform; a scaled untied head spreads them (at temperature 0.6
  the most likely token has about 0.4 of the mass and the 0.9-nucleus about 12 tokens). A tied head would
  mostly predict the input token again. Random norm weights make the norms matter.
  """
  model = Decoder(CFG, rngs=nnx.Rngs(seed))
  model.embedding[...] = model.embedding[...] * 10.0
  model.lm_head[...] = model.lm_head[...] * 12.0
  rng = np.random.default_rng(seed)
  for owner, name in [(model, "final_norm"), (model.layers, "attn_norm"), (model.layers, "mlp_norm")]:
    param = getattr(owner, name)
    param[...] = jnp.asarray(1.0 + 0.3 * rng.standard_normal(param[...].shape), jnp.float32)
  return model


@jax.jit
def _full_logits(graphdef, state, tokens_BxT, mask_BxT):
  return nnx.merge(graphdef, state)(tokens_BxT, token_mask_BxL=mask_BxT)[0]


@jax.jit
def _full_logprobs(graphdef, state, tokens_BxT, mask_BxT, temperature):
  return sequence_logprobs(nnx.merge(graphdef, state), tokens_BxT, mask_BxT, temperature)


def full_logits(model, tokens_BxT, mask_BxT) -> np.ndarray:
  """Float32 logits of a plain causal forward pass (no cache)."""
  graphdef, state = nnx.split(model)
  return np.asarray(_full_logits(graphdef, state, jnp.asarray(tokens_BxT), jnp.asarray(mask_BxT)))


def full_logprobs(model, tokens_BxT, mask_BxT, temperature) -> np.ndarray:
  """`sequence_logprobs` under jit, as the trainer calls it."""
  graphdef, state = nnx.split(model)
  return np.asarray(
    _full_logprobs(graphdef, state, jnp.asarray(tokens_BxT), jnp.asarray(mask_BxT), jnp.float32(temperature))
  )


def pack_left(rows: list[list[int]], width: int = MAX_LEN) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads rows to a fixed width (one compilation for every reference call)."""
  tokens_BxT = np.full((len(rows), width), PAD_ID, np.int32)
  mask_BxT = np.zeros((len(rows), width), bool)
  for i, row in enumerate(rows):
    tokens_BxT[i, width - len(row) :] = row
    mask_BxT[i, width - len(row) :] = True
  return tokens_BxT, mask_BxT


def naive_greedy(model, prompts: list[list[int]], num_new: int) -> list[list[int]]:
  """Argmax decoding by re-running the full forward pass over the whole sequence for every new token."""
  rows = [list(p) for p in prompts]
  for _ in range(num_new):
    logits_BxTxV = full_logits(model, *pack_left(rows))
    for row, logits_V in zip(rows, logits_BxTxV[:, -1]):
      row.append(int(np.argmax(logits_V)))
  return [row[len(p) :] for row, p in zip(rows, prompts)]
