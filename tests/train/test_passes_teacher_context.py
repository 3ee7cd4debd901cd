"""The teacher passes' contexts as the method needs them (docs/teacher-passes.md, "Budgets" and "Per-unit contexts";
issue 32): under the default config HSD's teacher reads a whole peer transcript and CrEST's every earlier unit's
ground truth; a forced cut is counted and warned about once; CrEST's per-unit contexts map token for token.

Host side only: the teacher model is replaced by a recorder of the `TeacherBatch` each pass builds (the pass itself
is tested against plain forwards in tests/scoring/test_teacher_pass.py)."""

import glob
import logging
import os

import jax
import numpy as np
import pytest

from jaxcredit.envs.spec import EnvSpec
from jaxcredit.plain_text import encode_plain
from jaxcredit.rollout.chat_format import ChatFormat
from jaxcredit.rollout.multiturn import RolloutResult, transcript
from jaxcredit.scoring import teacher as tp
from jaxcredit.train import config as config_lib
from jaxcredit.train.tables import passes as passes_lib
from jaxcredit.train.tables.methods import METHODS
from jaxcredit.trajectory import RolloutBuilder, pack
from tests.fixtures.tiny_chat import tiny_tokenizer
from tests.fixtures.tiny_run import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLD = "<answer>42</answer>"
UNIT_GT = ["GT-A cd(folder='docs') -> ok", "GT-B ls() -> ['a.txt']", "GT-C cat('a.txt') -> 'hi'"]


class RecordingFns:
  """Stands in for `PassFns`: records each teacher batch and returns zeros (all valid) instead of running a model."""

  def __init__(self):
    self.batches = []
    self.warned_context_cut = False

  def teacher(self, teacher, student):
    def run(params, batch, traj, student_params):
      self.batches.append(batch)
      z = np.zeros(traj.tokens_BxL.shape, np.float32)
      with_student = None if student is None else z  # a divergence pass: the policy's divergence and entropy too
      return tp.TeacherPassResult(
        z, z, with_student, batch.valid_B.copy(), list(batch.reasons), student_entropy_BxL=with_student
      )

    return run


def env_spec(units: bool) -> EnvSpec:
  return EnvSpec(
    make_tasks=None,
    make_env=None,
    initial_messages=lambda task: [{"role": "user", "content": task}],
    stop_strings=(),
    max_turns=4,
    is_success=lambda r: r > 0.5,
    demonstration=None,
    gold_answer_text=lambda task: GOLD,
    privileged_info=lambda task: "\n".join(UNIT_GT),
    unit_privileged_info=(lambda task: UNIT_GT) if units else None,
  )


def context(config, tok, env, tasks, results, knobs):
  return passes_lib.PassContext(
    config=config,
    knobs=knobs,
    tok=tok,
    env=env,
    tasks=tasks,
    messages=[r.messages for r in results],
    rewards=[r.reward for r in results],
    key=jax.random.key(0),
    models={"policy": passes_lib.Model(None, None, None), "reference": passes_lib.Model(None, None, None)},
    teacher="reference",
    fns=RecordingFns(),
    sampler_for=None,
  )


@pytest.fixture(scope="module")
def tok():
  return tiny_tokenizer()


def rollout(tok, task, turns):
  """A rollout built as `run_rollouts` builds one: turns = [(assistant text, observation role, observation)]."""
  fmt = ChatFormat.from_tokenizer(tok)
  messages = [{"role": "user", "content": task}]
  b = RolloutBuilder.from_prompt(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True)))
  for text, role, obs in turns:
    b.append_action(tok.encode(text) + [tok.eos_id], [-1.0] * (len(tok.encode(text)) + 1))
    messages.append({"role": "assistant", "content": text})
    if role is not None:
      if role == "user":
        b.next_unit()
      b.append_context(fmt.observation_ids(tok, obs, True, role))
      b.mark_boundary()
      messages.append({"role": role, "content": obs})
  return b, messages


# ---------------------------------------------------------------------------------------------------------------
# Budgets


def _load(path):
  return load_config(os.path.splitext(os.path.basename(path))[0], os.path.dirname(path))


def test_every_shipped_config_derives_budgets_that_hold_a_whole_rollout_and_the_gold_answer():
  """No shipped config cuts a context: each method with a teacher pass gets a context budget of at least a whole
  rollout plus a one-turn gold answer, and a sequence budget of at least that plus the rollout itself."""
  paths = sorted(
    glob.glob(os.path.join(ROOT, "configs", "*.py")) + glob.glob(os.path.join(ROOT, "configs", "paper", "*.py"))
  )
  checked = set()
  for path in paths:
    c = _load(path)
    if METHODS[c.credit.method].teacher is None:
      continue
    context, seq = config_lib.teacher_budgets(c)
    assert (c.teacher.max_context_tokens, c.teacher.max_len) == (0, 0), path  # derived, not a fixed number
    assert context >= c.sampling.max_len + c.sampling.max_new_tokens, path
    assert seq >= c.sampling.max_len + context, path
    checked.add(c.credit.method)
  assert checked == {"crest", "hsd", "hsd_grpo", "gear", "gear_v0", "toolopd", "opd", "sgcd", "sgcd_v0"}
  c = config_lib.base_config()
  c.credit.method = "crest"
  assert config_lib.teacher_budgets(c)[0] == 288 + 48 + config_lib.TEACHER_CONTEXT_SLACK
  c.teacher.max_context_tokens, c.teacher.max_len = 100, 400  # an explicit number is used as given
  assert config_lib.teacher_budgets(c) == (100, 400)
  c.teacher.max_len = -1
  with pytest.raises(ValueError, match="config.teacher.max_len"):
    config_lib.validate(c)


def _hsd_batch(tok, config, long_peer: str):
  """Group of two: rollout 0 failed, rollout 1 (its only possible peer) succeeded with a long transcript."""
  b0, m0 = rollout(tok, "What is 6*7?", [("<answer>41</answer>", None, None)])
  b1, m1 = rollout(tok, "What is 6*7?", [(long_peer, "tool", "42"), (GOLD, None, None)])
  traj = pack([b0, b1], [0.0, 1.0], [0, 0], max_turns=2, pad_id=tok.pad_id, length_bucket=16)
  results = [RolloutResult(b, None, r, "answer", 0, 0, m) for b, r, m in ((b0, 0.0, m0), (b1, 1.0, m1))]
  ctx = context(config, tok, env_spec(units=False), ["What is 6*7?"] * 2, results, config.credit.hsd)
  out = passes_lib.teacher_peer(ctx, traj)
  return ctx, traj, out, transcript(m1)


def test_hsd_teacher_holds_the_whole_peer_transcript_under_the_default_config(tok):
  config = config_lib.base_config()
  config.credit.method = "hsd"
  long_peer = "<tool_call>" + " ".join(f"step{k}" for k in range(60)) + "</tool_call>"  # 425 tokens (1 per byte)
  ctx, traj, out, peer_text = _hsd_batch(tok, config, long_peer)
  assert len(encode_plain(tok, peer_text)) > 400  # far over the old 128-token budget
  assert out.peer_B.tolist() == [1, -1] and out.valid_B.tolist() == [True, True]
  batch = ctx.fns.batches[0]
  prompt = tok.decode(batch.tokens_BxS[0, : batch.teacher_prompt_len_B[0]].tolist())
  assert f"A successful attempt at this task:\n{peer_text}\nThe correct final answer: {GOLD}" in prompt
  assert out.context_cut_tokens_B.tolist() == [0, 0]
  row = passes_lib.pass_metrics("teacher_peer", out, 0.1)
  assert row["pass/teacher_peer/context_cut"] == 0.0 and row["pass/teacher_peer/context_cut_tokens"] == 0


def test_a_forced_cut_is_counted_and_warned_once(tok, caplog):
  config = config_lib.base_config()
  config.credit.method = "hsd"
  config.teacher.max_context_tokens = 128  # the old default
  long_peer = "<tool_call>" + " ".join(f"step{k}" for k in range(60)) + "</tool_call>"
  with caplog.at_level(logging.WARNING, logger="jaxcredit.train.tables.passes"):
    ctx, traj, out, peer_text = _hsd_batch(tok, config, long_peer)
    passes_lib.teacher_peer(ctx, traj)  # a second step of the same run: no second warning
  full = f"A successful attempt at this task:\n{peer_text}\nThe correct final answer: {GOLD}"
  # one token per byte: the peer's context keeps its last 128 tokens; the fallback (gold only) is not cut
  assert out.context_cut_tokens_B.tolist() == [len(encode_plain(tok, full)) - 128, 0]
  prompt = tok.decode(ctx.fns.batches[0].tokens_BxS[0, : ctx.fns.batches[0].teacher_prompt_len_B[0]].tolist())
  assert full[-128:] in prompt and full[-129:] not in prompt
  row = passes_lib.pass_metrics("teacher_peer", out, 0.1)
  assert row["pass/teacher_peer/context_cut"] == 0.5
  assert row["pass/teacher_peer/context_cut_tokens"] == len(encode_plain(tok, full)) - 128
  warnings = [r for r in caplog.records if "config.teacher.max_context_tokens = 128" in r.getMessage()]
  assert len(warnings) == 1


# ---------------------------------------------------------------------------------------------------------------
# CrEST's per-unit contexts


def _session(tok):
  """Three units: unit 0 (a call and its result, then "Done."), unit 1, unit 2 (each opened by a user message)."""
  return rollout(
    tok,
    "Open docs.",
    [
      ("call cd", "tool", "ok"),
      ("Done.", "user", "Now list it."),
      ("call ls", "tool", "['a.txt']"),
      ("Done.", "user", "Show a.txt."),
      ("call cat", None, None),
    ],
  )


def _crest(tok, mode, units=True):
  config = config_lib.base_config()
  config.credit.method = "crest"
  config.credit.crest.teacher_context = mode
  b, m = _session(tok)
  traj = pack([b], [1.0], [0], unit_rewards=[[1.0, 0.0, 1.0]], max_turns=5, pad_id=tok.pad_id, length_bucket=16)
  ctx = context(
    config, tok, env_spec(units), ["Open docs."], [RolloutResult(b, None, 1.0, "answer", 0, 0, m)], config.credit.crest
  )
  out = passes_lib.teacher_privileged(ctx, traj)
  return traj, ctx.fns.batches[0], out


def test_crest_unit_contexts_are_mapped_token_for_token(tok):
  traj, batch, out = _crest(tok, "per_unit")
  assert out.valid_B.tolist() == [True] and out.context_cut_tokens_B.tolist() == [0]
  n, pl = int(traj.token_mask_BxL[0].sum()), int(traj.prompt_len_B[0])
  pos = batch.teacher_pos_BxL[0]
  seq = batch.tokens_BxS[0]
  # every mapped teacher token equals the rollout's token, the prompt is the rollout's own (unit 0 has no context)
  assert np.array_equal(seq[pos[pl:n]], traj.tokens_BxL[0, pl:n])
  assert np.array_equal(seq[:pl], traj.tokens_BxL[0, :pl]) and batch.offset_B[0] == 0
  units = traj.unit_ids_BxL[0]
  first = {u: int(np.flatnonzero(units == u)[0]) for u in (0, 1, 2)}
  last0 = int(np.flatnonzero(units == 0)[-1])

  def seen(p):  # the teacher's text before rollout token p
    return tok.decode(seq[: pos[p]].tolist())

  assert not any(g[:4] in seen(last0) for g in UNIT_GT)  # unit 0 sees no ground truth
  assert UNIT_GT[0] in seen(first[1]) and "GT-B" not in seen(first[1])  # unit 1 sees unit 0's only
  assert UNIT_GT[0] in seen(first[2]) and UNIT_GT[1] in seen(first[2]) and "GT-C" not in seen(n - 1)
  # the context is inside the user message that opens the unit, in the config's wrapper
  wrapped = "Now list it.\n\nReference (not visible to the assistant being trained): " + UNIT_GT[0] + "<|im_end|>"
  assert wrapped in seen(first[1])
  # the map is piecewise: one offset per unit
  offsets = {u: int(pos[first[u]] - first[u]) for u in (0, 1, 2)}
  block = len(encode_plain(tok, config_lib.DEFAULT_CONTEXT_WRAPPER.replace("{context}", UNIT_GT[0])))
  assert offsets[0] == 0 and offsets[1] == block and offsets[2] > offsets[1]


def test_crest_all_and_outcome_only_contexts(tok):
  """teacher_context="all" (v1's reading): every unit sees the whole session's ground truth in the initial prompt,
  one offset; an outcome-only verifier (U = 1): the one unit sees the gold answer."""
  traj, batch, out = _crest(tok, "all")
  prompt = tok.decode(batch.tokens_BxS[0, : batch.teacher_prompt_len_B[0]].tolist())
  assert "\n".join(UNIT_GT) in prompt and out.valid_B.tolist() == [True]
  pl, n = int(traj.prompt_len_B[0]), int(traj.token_mask_BxL[0].sum())
  assert np.all(batch.teacher_pos_BxL[0, pl:n] == np.arange(pl, n) + batch.offset_B[0]) and batch.offset_B[0] > 0
  traj, batch, out = _crest(tok, "per_unit", units=False)
  prompt = tok.decode(batch.tokens_BxS[0, : batch.teacher_prompt_len_B[0]].tolist())
  assert "trained): " + GOLD in prompt and "GT-A" not in prompt
  c = config_lib.base_config()
  c.credit.method = "crest"
  c.credit.crest.teacher_context = "previous"
  with pytest.raises(ValueError, match="config.credit.crest.teacher_context"):
    config_lib.validate(c)


# ---------------------------------------------------------------------------------------------------------------
# SGCD: the sibling-contrast summary and the teacher shown it


class StubSampler:
  """Stands in for the teacher's sampler: records the prompts and answers each with `text`."""

  def __init__(self, tok, text):
    self.tok, self.text, self.prompts, self.params = tok, text, [], None

  def generate(self, prompts, params, key):
    self.prompts += [list(p) for p in prompts]
    self.params = params
    ids = self.tok.encode(self.text) + [self.tok.eos_id]
    return type("Out", (), {"tokens": [list(ids) for _ in prompts]})()


def _sgcd_batch(tok, config):
  """Group 0: rollout 0 failed, rollout 1 succeeded; group 1: both failed (no contrast to summarise)."""
  turns = {
    0: [("<answer>41</answer>", None, None)],
    1: [("<tool_call>6*7</tool_call>", "tool", "42"), (GOLD, None, None)],
    2: [("<answer>40</answer>", None, None)],
    3: [("<answer>43</answer>", None, None)],
  }
  built = [rollout(tok, "What is 6*7?", turns[i]) for i in range(4)]
  rewards = [0.0, 1.0, 0.0, 0.0]
  traj = pack([b for b, _ in built], rewards, [0, 0, 1, 1], max_turns=2, pad_id=tok.pad_id, length_bucket=16)
  results = [RolloutResult(b, None, r, "answer", 0, 0, m) for (b, m), r in zip(built, rewards)]
  ctx = context(config, tok, env_spec(units=False), ["What is 6*7?"] * 4, results, config.credit.sgcd)
  return ctx, traj, [m for _, m in built]


def test_sgcd_summary_compares_a_successful_and_a_failed_sibling_and_conditions_the_teacher(tok):
  config = config_lib.base_config()
  config.credit.method = "sgcd"
  config.sampling.max_len = 1024  # one token per byte: the tiny run's budget
  config.credit.sgcd.summary_max_tokens = 24
  ctx, traj, messages = _sgcd_batch(tok, config)
  sampler = StubSampler(tok, "Calling the calculator decided it.")
  ctx.sampler_for = lambda model: sampler
  out = passes_lib.sibling_summary(ctx, traj)
  assert out.mixed_B.tolist() == [True, True, False, False]
  assert out.siblings_Bx2.tolist() == [[1, 0], [1, 0], [-1, -1], [-1, -1]]
  assert out.summaries == ["Calling the calculator decided it."] * 2 + ["", ""]
  assert out.reasons == ["", "", "not_mixed", "not_mixed"] and out.valid_B.tolist() == [True, True, False, False]
  assert out.summary_tokens_B.tolist() == [35, 35, 0, 0]  # 34 bytes and the stop token
  # One generation for the one mixed group: greedy, at most summary_max_tokens, both transcripts whole.
  assert len(sampler.prompts) == 1 and sampler.params.max_new_tokens == 24 and sampler.params.top_p < 1e-3
  prompt = tok.decode(sampler.prompts[0])
  assert "Task: What is 6*7?" in prompt
  assert f"Successful attempt:\n{transcript(messages[1])}\n\nFailed attempt:\n{transcript(messages[0])}\n" in prompt
  assert passes_lib.pass_metrics("sibling_summary", out, 0.1)["pass/sibling_summary/dropped_not_mixed"] == 2

  traj.passes["sibling_summary"] = out
  teacher = passes_lib.teacher_sibling(ctx, traj)
  assert teacher.reasons == ["", "", "not_mixed", "not_mixed"]
  batch = ctx.fns.batches[0]
  for i in (0, 1):  # both siblings (and any other rollout of the group) are scored with the group's summary
    text = tok.decode(batch.tokens_BxS[i, : batch.teacher_prompt_len_B[i]].tolist())
    assert "Reference (not visible to the assistant being trained): Calling the calculator decided it." in text
  assert batch.valid_B.tolist() == [True, True, False, False]


def test_sgcd_summary_that_cannot_fit_or_comes_out_empty_is_dropped_by_reason(tok):
  config = config_lib.base_config()
  config.credit.method = "sgcd"
  config.sampling.max_len = 1024
  config.credit.sgcd.summary_max_tokens = config.sampling.max_len - 8  # no room left for the prompt
  ctx, traj, _ = _sgcd_batch(tok, config)
  ctx.sampler_for = lambda model: StubSampler(tok, "advice")
  assert passes_lib.sibling_summary(ctx, traj).reasons[:2] == ["over_budget"] * 2
  config.credit.sgcd.summary_max_tokens = 24
  ctx.sampler_for = lambda model: StubSampler(tok, "")
  assert passes_lib.sibling_summary(ctx, traj).reasons[:2] == ["empty_summary"] * 2


@pytest.mark.parametrize(
  "summarizer,writer", [("", "reference"), ("policy", "policy"), ("ckpt/summariser", "summarizer")]
)
def test_sgcd_summarizer_knob_picks_the_model_that_writes_the_reference(tok, summarizer, writer):
  """credit.sgcd.summarizer: "" lets the method's teacher write (here the reference, a stand-in for the paper's
  external LLM); "policy" / "reference" name those; any other value is a checkpoint, run.py's models["summarizer"].
  The teacher that scores with the summary stays the method's teacher."""
  config = config_lib.base_config()
  config.credit.method = "sgcd"
  config.sampling.max_len = 1024
  config.credit.sgcd.summary_max_tokens = 24
  config.credit.sgcd.summarizer = summarizer
  ctx, traj, _ = _sgcd_batch(tok, config)
  ctx.models["summarizer"] = passes_lib.Model(None, None, None)
  asked = []
  sampler = StubSampler(tok, "advice")
  ctx.sampler_for = lambda model: asked.append(model) or sampler
  out = passes_lib.sibling_summary(ctx, traj)
  assert out.summaries[:2] == ["advice"] * 2
  assert len(asked) == 1 and asked[0] is ctx.models[writer]
  assert passes_lib.summarizer_model(ctx) == writer and ctx.teacher == "reference"


def test_sgcd_siblings_are_one_success_and_one_failure_of_the_same_group_drawn_by_the_key():
  success = np.asarray([True, False, True, False, False, False, True, True])
  valid = np.asarray([True, True, True, True, True, True, True, False])
  groups = np.asarray([0, 1, 0, 1, 0, 1, 1, 0])  # interleaved: group 0 = 0, 2, 4, 7; group 1 = 1, 3, 5, 6
  seen = set()
  for seed in range(24):
    pairs = passes_lib.sibling_pairs(success, valid, groups, jax.random.key(seed))
    np.testing.assert_array_equal(pairs, passes_lib.sibling_pairs(success, valid, groups, jax.random.key(seed)))
    for g, (good_set, bad_set) in {0: ({0, 2}, {4}), 1: ({6}, {1, 3, 5})}.items():
      rows = np.flatnonzero(groups == g)
      assert len({tuple(p) for p in pairs[rows].tolist()}) == 1  # one pair per group
      good, bad = pairs[rows[0]]
      assert good in good_set and bad in bad_set  # rollout 7 succeeded but is not valid
      seen.add((g, int(good), int(bad)))
  assert len(seen) == 5  # every allowed pair of both groups was drawn
  only_failures = passes_lib.sibling_pairs(np.zeros(8, bool), valid, groups, jax.random.key(0))
  assert (only_failures == -1).all()


def test_a_teacher_prompt_is_the_rollouts_own_prompt_and_a_record_without_messages_gets_the_tasks():
  """Issue 55: the passes read the prompt the rollout was sampled from (its messages before the first reply), not one
  rebuilt from the task; a JSONL record that keeps no messages falls back to the environment's initial messages."""
  import types

  sampled = [{"role": "system", "content": "tools: add"}, {"role": "user", "content": "2 + 2?"}]
  chat = sampled + [{"role": "assistant", "content": "<answer>4</answer>"}, {"role": "user", "content": "and 3 + 3?"}]
  env = types.SimpleNamespace(initial_messages=lambda task: [{"role": "user", "content": f"rebuilt {task}"}])
  ctx = types.SimpleNamespace(messages=[chat, []], tasks=["t0", "t1"], env=env)
  assert passes_lib._prompt_messages(ctx, 0) == sampled
  assert passes_lib._prompt_messages(ctx, 1) == [{"role": "user", "content": "rebuilt t1"}]
