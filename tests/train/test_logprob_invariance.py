"""The trainer's per-token log-probs are a property of each rollout, not of how the update batches it (issue 54's
invariance test): scored alone, in micro-batches of any size, and packed with its group they agree within float32
rounding."""

import numpy as np
from flax import nnx

from jaxcredit.models.decoder import Decoder
from jaxcredit.train.loop import step as step_lib
from jaxcredit.train.loop.update import pack_update_batch, rows_batch

from tests.fixtures.tiny_model import tiny_decoder_config

B, L, T = 4, 16, 0.8


def _setup():
  graphdef, params, rest = step_lib.split_model(Decoder(tiny_decoder_config(), rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(0)
  lengths = np.asarray([16, 9, 12, 6])
  token_mask = np.arange(L)[None, :] < lengths[:, None]
  tokens = rng.integers(0, 64, size=(B, L)).astype(np.int32)
  tokens[1, :3], tokens[3, :3] = tokens[0, :3], tokens[2, :3]  # two groups sharing 3-token prompts
  batch = rows_batch(
    tokens,
    token_mask,
    token_mask & (np.arange(L)[None, :] >= 3),
    np.zeros((B, L), np.float32),
    # where each scored slot came from (100 * rollout + position), to follow it through the packing
    inputs={"where": np.broadcast_to(np.arange(L, dtype=np.float32), (B, L)) + 100 * np.arange(B)[:, None]},
    group_ids_B=np.asarray([0, 0, 1, 1]),
  )
  return None, graphdef, params, rest, batch


def test_trainer_logprobs_do_not_depend_on_the_micro_batch_or_the_packing():
  """A public report (a JAX RL bring-up log): the trainer's log-probs differed 6.2x more at micro-batch 4 than at 1 on
  the same data and weights. Here each rollout's per-token log-probs are the same, within float32 rounding, scored
  alone, in micro-batches of 1, 2 and 4 rows, and packed with its group (the loss's own paths)."""
  _, graphdef, params, rest, batch = _setup()
  tokens, mask = batch.tokens_NxL, batch.token_mask_NxL
  logp = step_lib.make_logp_fn(graphdef, rest, T)
  whole = np.asarray(logp(params, tokens, mask))
  for size in (1, 2):
    parts = np.concatenate(
      [np.asarray(logp(params, tokens[i : i + size], mask[i : i + size])) for i in range(0, B, size)]
    )
    np.testing.assert_allclose(parts, whole, atol=2e-6, rtol=0)
  packed = pack_update_batch(
    batch,
    length_bucket=8,
    max_row_len=64,
    slot_bucket=8,
  )
  model_logp = step_lib._scored_logp(graphdef, params, rest, packed, T)
  got = np.asarray(model_logp)
  assert packed.packed is not None
  scored = packed.action_mask_NxK
  where = packed.inputs_NxK["where"][scored].astype(int)
  want = whole[where // 100, where % 100]
  np.testing.assert_allclose(got[scored], want, atol=2e-6, rtol=0)
