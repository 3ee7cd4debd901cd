"""`rollout.async_depth`: the rollouts of the next steps sampled on a thread while the learner learns (issue 37).

The synchronous loop (`async_depth=0`, the default) is checked against a run recorded before the pipeline existed
(tests/data/async_depth0_run.json, written by this file with JAXCREDIT_RECORD_GOLDEN=1 at commit 7b4a233): the same
losses, gradient norms, rewards and token counts step by step.
"""

import hashlib
import json
import os

import numpy as np
import pytest

from jaxcredit.train import trainer
from jaxcredit.train.config import base_config
from jaxcredit.train.methods import METHODS, Method, MethodOutput

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


def _rollout_digest(workdir, step) -> str:
  """sha256 of the step's exported rollouts' token ids, in order."""
  with open(os.path.join(str(workdir), "rollouts", f"step_{step}.jsonl")) as f:
    ids = [json.loads(line)["token_ids"] for line in f]
  return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def test_async_depth_0_reproduces_the_recorded_synchronous_run(tmp_path, tiny):
  c = _config(tmp_path / "sync", tiny)
  trainer.train(c)
  rows = _rl_rows(c.workdir)
  got = [{**{k: r[k] for k in RECORDED}, "tokens_sha256": _rollout_digest(c.workdir, r["step"])} for r in rows]
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
