"""`jaxcredit train --config configs/X.py` for every method: an RL step on the quickstart task with a tiny random
model (the session's tiny GGUF, tests/conftest.py), through the same configs users run; `toolopd` (three passes and a
distillation term) runs 2 steps, so one run shows a step that starts from a trained, checkpointed step. Then a toy
method added as one function, one METHODS row and one config trains a step without touching any other module."""

import os

import numpy as np
import pytest

from jaxcredit.rollout import jsonl as jsonl_lib
from jaxcredit.train.commands import trainer
from jaxcredit.train.tables.methods import METHODS, Method, MethodOutput

from tests.fixtures.tiny_model import CFG, random_params, write_gguf
from tests.fixtures.tiny_run import CONFIGS, metrics_rows, tiny_run_config


def _config(name, workdir, tiny, config_dir=CONFIGS):
  """The tiny run of configs/`name`.py (the methods share the sampler's and most steps' executables)."""
  c = tiny_run_config(name, workdir, tiny, config_dir=config_dir, teacher__max_len=2048)
  if c.credit.method == "toolopd":
    c.credit.toolopd.skill_max_tokens = 4
  if c.credit.method in ("sgcd", "sgcd_v0"):
    c.credit[c.credit.method].summary_max_tokens = 4
    # The tiny random policy never succeeds, so no group has both outcomes: "keep" trains them as GRPO (the shipped
    # "skip" would leave every rollout out of the update).
    c.credit[c.credit.method].mixed_groups = "keep"
  return c


def _rl_rows(workdir):
  return metrics_rows(workdir, "rl")


TWO_STEPS = "toolopd"
"""The method whose run takes 2 RL steps (every other method's takes 1: its second step ran the same programs on
the same kind of rollouts, about a quarter of each run's time)."""


OWN_METHODS = sorted(name for name, m in METHODS.items() if not m.variant_of)
"""The methods that train here: a variant row (`Method.variant_of`, e.g. gear_v0) runs its row's passes and loss
terms and differs only in its credit function, which tests/train/test_methods.py runs."""


@pytest.mark.parametrize("name", OWN_METHODS)
def test_method_trains(name, tiny, tmp_path):
  steps = 2 if name == TWO_STEPS else 1
  c = _config(name, tmp_path / name, tiny)
  c.total_steps = steps
  c.log_rollouts_every, c.log_rollouts_count = steps, 3
  trainer.train(c)
  rows = _rl_rows(c.workdir)
  assert [r["step"] for r in rows] == list(range(1, steps + 1))
  for r in rows:
    assert r["method"] == name and r["action_tokens"] > 0
    assert np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"])
    for p in METHODS[name].passes:
      assert r[f"pass/{p}/seconds"] > 0 and 0 <= r[f"pass/{p}/dropped"] <= 4
    if name == "hsd":  # no reward term: the full-vocabulary KL to the peer (here: gold-answer) teacher is the loss
      assert r["loss_vocab_kl"] > 0 and r["loss_policy"] == 0.0 and np.isfinite(r["loss_reference_kl"])
      assert r["hsd_distilled_frac"] == 1.0
    if name == "sgcd":  # no group with both outcomes: no summary, every rollout GRPO's, none skipped ("keep")
      assert r["sgcd_mixed_groups"] == 0 and r["sgcd_groups_skipped"] == 0
      assert r["pass/sibling_summary/dropped_not_mixed"] == 4
    # The sampler kept each rollout's cache across turns: every context token prefilled once, every action token
    # decoded once, unless a turn did not fit the cache and was prefilled again.
    assert r["sampler_prefill_tokens"] + r["sampler_decode_tokens"] == r["tokens"] or r["sampler_rebuilds"] > 0
  assert sorted(os.listdir(os.path.join(c.workdir, "checkpoints")))[-1] == str(steps)
  # Rollout samples: the whole groups of the last step's first 3 rollouts (groups of 2: all 4), credited, with every
  # pass output (per-token ones per token).
  assert os.listdir(os.path.join(c.workdir, "rollout_samples")) == [f"step_{steps}.jsonl"]
  samples = jsonl_lib.read_jsonl(os.path.join(c.workdir, "rollout_samples", f"step_{steps}.jsonl"))
  assert [r["rollout_id"] for r in samples] == [f"step{steps}_{i}" for i in range(4)]
  for r in samples:
    assert r["method"] == name and len(r["advantages"]) == len(r["token_ids"])
    passes = r["metadata"]["passes"]
    assert set(passes) == set(METHODS[name].passes)
    for outputs in passes.values():
      per_token = [v for k, v in outputs.items() if k.endswith("_BxL")]
      assert all(len(v) == len(r["token_ids"]) for v in per_token)
    for k, v in r["metadata"].get("credit_details", {}).items():  # the method's details, cut to the rollout
      if k.endswith("_BxL"):
        assert len(v) == len(r["token_ids"]), k
      elif k.endswith("_BxT"):
        assert len(v) == r["num_turns"], k
  assert os.path.isfile(os.path.join(c.workdir, "viewer", f"step_{steps}", "index.html"))
  if "distill" in METHODS[name].loss_terms:
    assert all("loss_distill" in r for r in rows)
    # ToolOPD's distillation gradient is capped at half the policy gradient's norm: at most 1/3 of the two.
    for r in rows:
      assert r["grad_norm_distill"] >= 0 and 0 <= r["grad_scale_distill"] <= 1
      assert 0 <= r["grad_share_distill"] <= 1 / 3 + 1e-6


def test_a_toy_method_is_one_function_one_row_one_config(tiny, tmp_path, monkeypatch):
  """The toy method: every action token gets the rollout's reward minus 0.5. No other module changes."""

  def toy(traj, knobs):
    adv = (traj.rewards_B[:, None] - knobs["baseline"]) * traj.action_mask_BxL
    return MethodOutput(adv.astype(np.float32), metrics={"toy_baseline": knobs["baseline"]})

  monkeypatch.setitem(METHODS, "toy", Method(toy, {"baseline": 0.5}, summary="reward minus a constant"))
  (tmp_path / "toy.py").write_text(
    "from jaxcredit.train.config import base_config\n\n\ndef get_config():\n"
    "  c = base_config()\n  c.credit.method = 'toy'\n  return c\n"
  )
  c = _config("toy", tmp_path / "run", tiny, config_dir=str(tmp_path))
  c.total_steps = 1
  trainer.train(c)
  rows = _rl_rows(c.workdir)
  assert len(rows) == 1 and rows[0]["method"] == "toy" and rows[0]["toy_baseline"] == 0.5
  assert rows[0]["adv_mean"] in (-0.5, 0.5) or -0.5 < rows[0]["adv_mean"] < 0.5  # reward 0 or 1, minus 0.5


def test_reference_and_teacher_passes_use_the_sampling_temperature(tiny, tmp_path):
  """Shared case io-kl-reference-temperature, in the trainer: at RL step 1 the reference equals the policy, so the
  KL term is 0; a self-teacher without context (OPD with teacher.source="policy") reproduces the log-probs the
  sampler recorded at temperature 0.8, so the teacher-policy gap is 0 within the sampler's 1e-4."""
  c = _config("opd", tmp_path / "run", tiny)
  c.teacher.source = "policy"
  c.loss.kl_coef = 0.1
  c.total_steps = 1
  assert c.sampling.temperature == 0.8
  trainer.train(c)
  row = _rl_rows(c.workdir)[0]
  assert abs(row["kl"]) < 1e-6
  assert abs(row["teacher_policy_gap"]) < 1e-4
  assert row["pass/teacher_plain/dropped"] == 0


def test_toolopd_with_a_teacher_checkpoint_and_a_refused_vocabulary(tiny, tmp_path):
  """A separate teacher checkpoint scores and writes the hindsight skills (its own sampler); a teacher whose
  vocabulary differs from the policy's is refused naming both sizes, before anything is written."""
  import dataclasses

  gguf_path = tiny.gguf_path
  c = _config("toolopd", tmp_path / "run", tiny)
  c.teacher.source = str(gguf_path)
  c.total_steps = 1
  trainer.train(c)
  row = _rl_rows(c.workdir)[0]
  assert row["pass/hindsight_skill/seconds"] > 0 and "loss_distill" in row

  other_cfg = dataclasses.replace(CFG, vocab_size=CFG.vocab_size + 16)
  other = write_gguf(tmp_path / "other.gguf", "llama", other_cfg, random_params(other_cfg))
  c = _config("toolopd", tmp_path / "run2", tiny)
  c.teacher.source = str(other)
  with pytest.raises(ValueError, match=rf"vocabulary of {CFG.vocab_size + 16} tokens.*policy's has {CFG.vocab_size}"):
    trainer.train(c)
  assert not os.path.exists(os.path.join(c.workdir, "config.json"))
  # The same number of tokens, two of them swapped (issue 54: tokenizers were compared by size only).
  from tests.fixtures import tiny_model

  tokens = list(tiny_model.TOKENS)
  i = tokens.index("hello")
  tokens[i], tokens[i + 1] = tokens[i + 1], tokens[i]
  with pytest.MonkeyPatch.context() as m:
    m.setattr(tiny_model, "TOKENS", tokens)
    swapped = write_gguf(tmp_path / "swapped.gguf", "llama", CFG, random_params(CFG))
  c = _config("toolopd", tmp_path / "run3", tiny)
  c.teacher.source = str(swapped)
  with pytest.raises(ValueError, match=rf"the same size \({CFG.vocab_size}\) but other tokens: id {i} is"):
    trainer.train(c)


def test_a_pass_over_budget_drops_only_the_dense_term_and_is_counted(tiny, tmp_path):
  """CrEST with a teacher budget no rollout fits: every teacher pass is dropped as over_budget, counted in the
  metrics, and the step trains on the unmodulated (GRPO) advantages; nothing reads log p = 0 as a score."""
  c = _config("crest", tmp_path / "run", tiny)
  c.teacher.max_len = 64
  c.total_steps = 1
  trainer.train(c)
  row = _rl_rows(c.workdir)[0]
  assert row["pass/teacher_privileged/dropped"] == 4
  assert row["pass/teacher_privileged/dropped_over_budget"] == 4
  assert row["crest_weight_std"] == 0.0 and "teacher_policy_gap" not in row  # no valid pass: no gap to report
  assert np.isfinite(row["loss"])
