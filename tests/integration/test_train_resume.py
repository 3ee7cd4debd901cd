"""The whole job end to end on the tiny model (the session's GGUF, tests/conftest.py): warm start, RL, eval,
checkpoints, curves; then a resume that runs exactly one more RL step and no warm-start step; then a refused config
change."""

import json
import os

import jax
import numpy as np
import pytest

from jaxcredit.train.commands import trainer
from jaxcredit.train.config import base_config


def _config(tmp_path, tiny, source=None):
  c = base_config()
  c.workdir = str(tmp_path / "run")
  c.model.source = str(source or tiny.gguf_path)
  c.model.cache_dir = tiny.cache_dir
  c.compilation_cache_dir = ""
  c.progress = False
  c.total_steps = 2
  c.checkpoint_every = 1
  c.env.num_train_tasks = 40
  c.sampling.max_new_tokens = 6
  c.sampling.max_len = 1024  # the tiny byte-level vocabulary makes prompts long
  c.sampling.chunk_size = 3
  c.rollout.prompts_per_step = 2
  c.rollout.group_size = 2
  c.sft.steps = 2
  c.sft.batch_size = 2
  c.train.length_bucket = 256
  c.eval.num_tasks = 2
  c.eval.batch_size = 4
  return c


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_train_resume_and_refusal(tmp_path, tiny):
  c = _config(tmp_path, tiny)
  trainer.train(c)
  rows = _rows(c.workdir)
  assert [r["step"] for r in rows if r["phase"] == "sft"] == [1, 2]
  assert [r["step"] for r in rows if r["phase"] == "rl"] == [1, 2]
  assert [r["stage"] for r in rows if r["phase"] == "eval"] == ["before_warm_start", "after_warm_start", "rl_step_2"]
  rl = [r for r in rows if r["phase"] == "rl"]
  assert all(r["action_tokens"] > 0 and "td_reward_abs_mean" in r for r in rl)
  assert os.path.getsize(os.path.join(c.workdir, "curves.png")) > 10_000
  assert sorted(os.listdir(os.path.join(c.workdir, "checkpoints")))[-1] == "2"

  c.total_steps = 3
  trainer.train(c)
  rows = _rows(c.workdir)
  assert [r["step"] for r in rows if r["phase"] == "sft"] == [1, 2], "the resumed run repeated the warm start"
  assert [r["step"] for r in rows if r["phase"] == "rl"] == [1, 2, 3]
  assert "3" in os.listdir(os.path.join(c.workdir, "checkpoints"))

  before = open(os.path.join(c.workdir, "metrics.jsonl")).read()
  c.optim.learning_rate = 3e-4
  with pytest.raises(ValueError, match=r"optim.learning_rate: checkpoint has 1e-05, config has 0.0003"):
    trainer.train(c)
  assert open(os.path.join(c.workdir, "metrics.jsonl")).read() == before
  assert "3" in os.listdir(os.path.join(c.workdir, "checkpoints"))

  # Issue 54: a checkpoint that lost its params/ folder ended in orbax's KeyError; one line names the step's folder.
  import shutil

  c.optim.learning_rate = 1e-5
  c.total_steps = 4
  step3 = os.path.join(c.workdir, "checkpoints", "3")
  shutil.rmtree(os.path.join(step3, "params"))
  with pytest.raises(ValueError, match=rf"the checkpoint {step3} is incomplete .*remove that step's folder"):
    trainer.train(c)


def test_a_crash_between_reference_and_step0_checkpoint_still_resumes(tmp_path, tiny, monkeypatch):
  """The reference is written right before the step-0 checkpoint; a run that died between the two leaves a
  `reference/` but no checkpoint, and the rerun starts over instead of failing on orbax's refusal to overwrite."""
  from jaxcredit.train.loop import checkpoint as ckpt_lib

  c = _config(tmp_path, tiny)
  c.sft.steps = 0
  c.total_steps = 1
  c.eval.before_sft = c.eval.after_sft = c.eval.at_end = False
  real_save = ckpt_lib.Checkpointer.save

  def dying_save(self, step, *a, **kw):
    raise KeyboardInterrupt("killed before the step-0 checkpoint")

  monkeypatch.setattr(ckpt_lib.Checkpointer, "save", dying_save)
  with pytest.raises(KeyboardInterrupt):
    trainer.train(c)
  assert os.path.isdir(os.path.join(c.workdir, "reference"))
  assert not os.listdir(os.path.join(c.workdir, "checkpoints"))
  monkeypatch.setattr(ckpt_lib.Checkpointer, "save", real_save)
  trainer.train(c)
  assert [r["step"] for r in _rows(c.workdir) if r["phase"] == "rl"] == [1]
  assert sorted(os.listdir(os.path.join(c.workdir, "checkpoints"))) == ["0", "1"]


def test_ppo_epochs_and_mini_batches_run_several_updates_per_step(tmp_path, tiny):
  c = _config(tmp_path, tiny)
  c.sft.steps = 0
  c.total_steps = 1
  c.eval.before_sft = c.eval.after_sft = c.eval.at_end = False
  c.train.ppo_epochs = 2
  c.train.mini_batch_size = 2
  c.optim.learning_rate = 1e-2
  trainer.train(c)
  (row,) = [r for r in _rows(c.workdir) if r["phase"] == "rl"]
  assert row["updates"] == 4
  # The tiny random policy earns no reward, so its advantages are 0 and the ratio stays 1 here; that the clip acts
  # once the policy moves is tests/train/test_ppo_updates.py's check. This one checks the trainer's wiring.
  assert 0 <= row["clip_frac_last"] <= 1 and row["ratio_dev_last"] >= 0


def test_one_warm_start_as_a_model_folder_then_rl_with_periodic_evals(tmp_path, tiny):
  """`jaxcredit sft` writes the warm-started policy as a model folder; a run from it (sft.steps=0) evaluates every
  `eval.every` steps, and a resume neither repeats an eval nor loses one cut off by a stop after its checkpoint."""
  from flax import nnx

  from jaxcredit import models
  from jaxcredit.train.loop import checkpoint as ckpt_lib

  c = _config(tmp_path, tiny)
  c.eval.before_sft = False
  c.sft.learning_rate = 1e-2  # two steps that visibly move the weights
  c.sft.loss_tokens = "all"
  c.eval.sft_every = 1  # the warm start's curve: an eval after step 1; step 2's is the after_warm_start eval
  c.sft.model_every = 1  # and the policy after step 1 as its own model folder
  trainer.train(c, sft_only=True)
  evals = [r for r in _rows(c.workdir) if r["phase"] == "eval"]
  assert [(r["stage"], r["step"], r.get("sft_step")) for r in evals] == [
    ("sft_step_1", 0, 1),
    ("after_warm_start", 0, None),
  ]
  folder = os.path.join(c.workdir, "warm_start_model")
  source = json.load(open(os.path.join(folder, "source.json")))
  assert source["sft_steps"] == 2 and source["warm_start_of"] == tiny.gguf_path
  model, _ = models.load_model(folder)
  params = nnx.state(model, nnx.Param)
  saved = ckpt_lib.Checkpointer(c.workdir).restore_params(0, params)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(saved)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  # The step-1 folder is the policy of a warm start stopped after one step: to the bit, and not the final one.
  assert sorted(f for f in os.listdir(c.workdir) if f.startswith("warm_start_model")) == [
    "warm_start_model",
    "warm_start_model_step_1",
  ]
  step1 = os.path.join(c.workdir, "warm_start_model_step_1")
  assert json.load(open(os.path.join(step1, "source.json")))["sft_steps"] == 1
  one = _config(tmp_path, tiny)
  one.workdir = str(tmp_path / "one_step")
  one.eval.before_sft = one.eval.after_sft = False
  one.sft.learning_rate, one.sft.loss_tokens, one.sft.steps = 1e-2, "all", 1
  trainer.train(one, sft_only=True)
  p1 = jax.tree.leaves(nnx.state(models.load_model(step1)[0], nnx.Param))
  stopped = jax.tree.leaves(nnx.state(models.load_model(os.path.join(one.workdir, "warm_start_model"))[0], nnx.Param))
  for a, b in zip(p1, stopped):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(p1, jax.tree.leaves(params))) > 0
  init, _ = models.load_model(tiny.gguf_path, cache_dir=c.model.cache_dir)
  moved = [
    float(np.abs(np.asarray(a) - np.asarray(b)).max())
    for a, b in zip(jax.tree.leaves(nnx.state(init, nnx.Param)), jax.tree.leaves(params))
  ]
  assert max(moved) > 1e-4, "the folder holds the initial weights, not the warm-started ones"

  rl = _config(tmp_path, tiny, folder)
  rl.workdir = str(tmp_path / "rl")
  rl.sft.steps = 0
  rl.total_steps = 3
  rl.eval.every = 1
  trainer.train(rl)
  evals = [r for r in _rows(rl.workdir) if r["phase"] == "eval"]
  assert [(r["step"], r["stage"]) for r in evals] == [(1, "rl_step_1"), (2, "rl_step_2"), (3, "rl_step_3")]

  # A stop after step 3's checkpoint and before its eval (as if the eval row were never written): the resume
  # evaluates step 3 first, then step 4 at the end, each once.
  path = os.path.join(rl.workdir, "metrics.jsonl")
  rows = [r for r in _rows(rl.workdir) if not (r["phase"] == "eval" and r["step"] == 3)]
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  rl.total_steps = 4
  trainer.train(rl)
  evals = [r for r in _rows(rl.workdir) if r["phase"] == "eval"]
  assert [r["step"] for r in evals] == [1, 2, 3, 4]
