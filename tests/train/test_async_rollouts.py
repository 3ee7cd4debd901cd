"""`rollout.async_depth`: the rollouts of the next steps sampled on a thread while the learner learns (issue 37).

The synchronous loop (`async_depth=0`, the default) is checked against a run recorded before the pipeline existed
(tests/data/async_depth0_run.json, written by this file with JAXCREDIT_RECORD_GOLDEN=1 on the code of commit 7b4a233):
the same losses, gradient norms, rewards, token counts, rollouts and checkpoint records step by step.
"""

import hashlib
import json
import os
import signal
import threading

import numpy as np
import pytest

from jaxcredit.train.loop import rl_step as rl_step_lib
from jaxcredit.train.commands import trainer
from jaxcredit.train.config import base_config, check_ranges, validate
from jaxcredit.train.tables.methods import METHODS, Method, MethodOutput
from jaxcredit.train.loop.run import TrainingStopped

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "async_depth0_run.json")
RECORDED = ("loss", "grad_norm", "reward_mean", "action_tokens", "tokens", "adv_std")


def _push(traj, knobs):
  """Every action token gets the rollout's reward minus 0.5: the tiny policy never succeeds, so each step pushes
  its sampled tokens down, and the next step's samples depend on the weights."""
  adv = (traj.rewards_B[:, None] - knobs["baseline"]) * traj.action_mask_BxL
  return MethodOutput(adv.astype(np.float32))


@pytest.fixture(autouse=True)
def _push_method(monkeypatch):
  monkeypatch.setitem(METHODS, "push", Method(_push, {"baseline": 0.5}, summary="reward minus a constant"))


def _config(workdir, tiny, **settings):
  c = base_config()
  c.workdir = str(workdir)
  c.model.source = str(tiny.gguf_path)
  c.model.cache_dir = tiny.cache_dir
  c.compilation_cache_dir = ""
  c.progress = False
  c.tensorboard = False
  c.total_steps = 3
  c.checkpoint_every = 1
  c.max_checkpoints_to_keep = 10
  c.env.num_train_tasks = 16
  c.sampling.max_new_tokens = 6
  c.sampling.max_len = 1024  # the tiny byte-level vocabulary makes prompts long
  c.sampling.chunk_size = 3
  c.rollout.prompts_per_step = 2
  c.rollout.group_size = 2
  c.rollout.export_jsonl = True
  c.sft.steps = 0
  c.train.length_bucket = 256
  c.credit.method = "push"
  c.optim.learning_rate = 1e-3  # large enough that a step's weights change the next step's samples
  c.eval.before_sft = c.eval.after_sft = c.eval.at_end = False
  for key, value in settings.items():
    node = c
    *parents, leaf = key.split("__")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


def _rl_rows(workdir):
  with open(os.path.join(str(workdir), "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["phase"] == "rl"]


def _checkpoint_meta(workdir, step) -> dict:
  """The JSON the RL checkpoint of `step` stores beside the arrays (prompt order, policy version)."""
  with open(os.path.join(str(workdir), "checkpoints", str(step), "meta", "metadata")) as f:
    return json.load(f)


def _rollout_digest(workdir, step) -> str:
  """sha256 of the step's exported rollouts' token ids, in order."""
  with open(os.path.join(str(workdir), "rollouts", f"step_{step}.jsonl")) as f:
    ids = [json.loads(line)["token_ids"] for line in f]
  return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def test_async_depth_0_reproduces_the_recorded_synchronous_run(tmp_path, tiny):
  c = _config(tmp_path / "sync", tiny)
  trainer.train(c)
  rows = _rl_rows(c.workdir)
  got = [
    {
      **{k: r[k] for k in RECORDED},
      "tokens_sha256": _rollout_digest(c.workdir, r["step"]),
      "checkpoint_meta": _checkpoint_meta(c.workdir, r["step"]),
    }
    for r in rows
  ]
  if os.environ.get("JAXCREDIT_RECORD_GOLDEN"):
    with open(GOLDEN, "w") as f:
      json.dump({"steps": got}, f, indent=1)
  with open(GOLDEN) as f:
    want = json.load(f)["steps"]
  assert [r["step"] for r in rows] == [1, 2, 3]
  for step, (g, w) in enumerate(zip(got, want, strict=True), start=1):
    for k in RECORDED:
      np.testing.assert_allclose(g[k], w[k], rtol=1e-4, atol=1e-6, err_msg=f"RL step {step}: {k}")
    assert g["tokens_sha256"] == w["tokens_sha256"], f"RL step {step}: other rollouts than the recorded run's"
    assert g["checkpoint_meta"] == w["checkpoint_meta"], f"RL step {step}: the checkpoint's prompt order or version"


def _exported(workdir, step) -> list[dict]:
  with open(os.path.join(str(workdir), "rollouts", f"step_{step}.jsonl")) as f:
    return [json.loads(line) for line in f]


def _no_rollout_thread_left() -> bool:
  return not any(t.name == "jaxcredit-rollouts" and t.is_alive() for t in threading.enumerate())


def test_async_depth_1_samples_one_step_ahead_within_the_staleness_bound(tmp_path, tiny):
  c = _config(tmp_path / "async", tiny, total_steps=4, rollout__async_depth=1)
  trainer.train(c)
  rows = _rl_rows(c.workdir)
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  # Step 1 from the weights it starts from; step 2 sampled while step 1 learnt (the same weights, one update old);
  # step 3 with step 1's update while step 2 learnt; and so on: never more than async_depth = 1 behind.
  assert [r["policy_staleness"] for r in rows] == [0, 1, 1, 1]
  versions = [_exported(c.workdir, s)[0]["metadata"]["policy_version"] for s in (1, 2, 3, 4)]
  assert versions == [0, 0, 1, 2], versions  # the sampled versions advance
  # The stale steps carry the off-policy correction (the trainer's own log-probs, truncated IS weights) and its
  # metrics; the first step is on-policy and has none.
  assert "engine_is_weight_mean" not in rows[0]
  assert all(0.0 < r["engine_is_weight_mean"] <= c.loss.engine_is_cap for r in rows[1:])
  assert all(r["engine_logp_gap_max"] > 0 for r in rows[1:]), "an update should move the sampled tokens' log-probs"
  assert all(r["learner_wait_s"] >= 0 and r["sampler_idle_s"] >= 0 for r in rows)
  assert _no_rollout_thread_left()


def test_a_stop_mid_run_checkpoints_drops_the_rollouts_in_flight_and_resumes_on_the_same_prompts(
  tmp_path, tiny, monkeypatch
):
  straight = _config(tmp_path / "straight", tiny, total_steps=4, rollout__async_depth=1)
  trainer.train(straight)

  learn = trainer.learn_step

  def learn_then_stop(run, params, *a, **kw):
    out = learn(run, params, *a, **kw)
    if a[-1] == 2:  # rl_step: SIGTERM arrives while step 2 learns (step 3's rollouts are in flight)
      os.kill(os.getpid(), signal.SIGTERM)
    return out

  monkeypatch.setattr(trainer, "learn_step", learn_then_stop)
  c = _config(tmp_path / "stopped", tiny, total_steps=4, rollout__async_depth=1)
  with pytest.raises(TrainingStopped):
    trainer.train(c)
  assert _no_rollout_thread_left()
  assert [r["step"] for r in _rl_rows(c.workdir)] == [1, 2]
  assert sorted(os.listdir(os.path.join(c.workdir, "checkpoints")))[-1] == "2"
  monkeypatch.setattr(trainer, "learn_step", learn)
  trainer.train(c)  # resumes at step 3: step 3's and 4's prompts and keys drawn again from the checkpoint
  assert [r["step"] for r in _rl_rows(c.workdir)] == [1, 2, 3, 4]
  for step in (1, 2, 3, 4):
    want = [r["messages"][:2] for r in _exported(straight.workdir, step)]
    assert [r["messages"][:2] for r in _exported(c.workdir, step)] == want, f"step {step}'s prompts differ"
  # Before the stop, the same rollouts as the run that was not stopped (same weights, prompts and keys).
  for step in (1, 2):
    assert _rollout_digest(c.workdir, step) == _rollout_digest(straight.workdir, step)


def test_async_depth_refuses_resampling_tied_groups():
  c = base_config()
  c.rollout.async_depth = 1
  c.rollout.resample_tied_groups = 2
  with pytest.raises(ValueError, match=r"config.rollout.async_depth=1 with config.rollout.resample_tied_groups=2"):
    validate(c)
  c.rollout.async_depth = -1
  with pytest.raises(ValueError, match="config.rollout.async_depth"):
    check_ranges(c)


def test_a_failure_on_the_rollout_thread_is_raised_as_itself_after_the_steps_sampled_before_it(
  tmp_path, tiny, monkeypatch
):
  """Sampling step 2 fails on the thread: step 1, sampled before it, is still learnt and checkpointed, and the
  learner raises the thread's own exception (so the CLI reports it in one line), noting the step."""
  sample = rl_step_lib.sample_local
  calls = []

  def failing(run, model, prompt_ids, key, *, version):
    calls.append(1)
    if len(calls) == 2:
      raise ValueError("the environment server went away")
    return sample(run, model, prompt_ids, key, version=version)

  monkeypatch.setattr(rl_step_lib, "sample_local", failing)
  c = _config(tmp_path / "fails", tiny, total_steps=3, rollout__async_depth=1)
  with pytest.raises(ValueError, match="the environment server went away") as info:
    trainer.train(c)
  assert "(raised on the rollout thread while sampling RL step 2)" in info.value.__notes__
  assert [r["step"] for r in _rl_rows(c.workdir)] == [1]
  assert "1" in os.listdir(os.path.join(c.workdir, "checkpoints"))
  assert _no_rollout_thread_left()
