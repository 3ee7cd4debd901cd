"""Environments and rollout files in the trainer: the README's one-file environment trains; exported rollouts, shuffled,
get from `jaxcredit credit` the advantages the trainer computed for them."""

import itertools
import json
import os
import random
import re

import numpy as np
import pytest

from jaxcredit import cli
from jaxcredit.envs import ENVS
from jaxcredit.rollout import jsonl
from jaxcredit.train.loop import export
from jaxcredit.train.commands import offline_credit
from jaxcredit.train.commands import trainer
from tests.fixtures.tiny_run import ROOT, metrics_rows, tiny_run_config


def _readme_block(title: str) -> str:
  """The first python block after `title` in docs/environments.md (the README's before the site, issue 56)."""
  with open(os.path.join(ROOT, "docs", "environments.md")) as f:
    text = f.read()
  after = text[text.index(title) :]
  return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def test_the_readme_environment_is_one_file_and_trains(tiny, tmp_path):
  (tmp_path / "reverse_word.py").write_text(_readme_block("**Your own environment**"))
  try:
    c = tiny_run_config("reverse_word", tmp_path / "run", tiny, config_dir=str(tmp_path))
    assert c.env.name == "reverse_word" and c.env.reverse_word.max_turns == 3
    c.total_steps = 1
    c.env.num_train_tasks = 4
    trainer.train(c)
    rows = metrics_rows(c.workdir, "rl")
    assert len(rows) == 1 and rows[0]["action_tokens"] > 0 and np.isfinite(rows[0]["loss"])
  finally:
    ENVS.pop("reverse_word", None)


@pytest.fixture
def alternating_rewards(monkeypatch):
  """A random tiny model never solves a task: rollouts get rewards 1, 0, 1, 0, ... in creation order instead, so
  groups have advantages to compare."""
  from jaxcredit.envs.arithmetic import ArithmeticEnv

  counter = itertools.count()
  init = ArithmeticEnv.__init__

  def init_with_reward(self, *args, **kwargs):
    init(self, *args, **kwargs)
    self.test_reward = float(next(counter) % 2)

  monkeypatch.setattr(ArithmeticEnv, "__init__", init_with_reward)
  monkeypatch.setattr(ArithmeticEnv, "reward", lambda self: self.test_reward)


@pytest.mark.parametrize("method", ["trace", "gigpo"])
def test_credit_on_shuffled_exported_rollouts_matches_the_trainer(method, tiny, tmp_path, alternating_rewards):
  c = tiny_run_config(method, tmp_path / "run", tiny)
  c.total_steps = 1
  c.rollout.prompts_per_step = 2
  c.rollout.group_size = 3
  c.rollout.export_jsonl = True
  trainer.train(c)
  exported = jsonl.read_jsonl(os.path.join(c.workdir, "rollouts", "step_1.jsonl"))
  assert len(exported) == 6 and all(r["method"] == method for r in exported)
  assert sorted(r["group_id"] for r in exported) == [0, 0, 0, 1, 1, 1]
  assert any(any(a != 0 for a in r["advantages"]) for r in exported)

  shuffled = [{k: v for k, v in r.items() if k not in ("advantages", "turn_advantages", "method")} for r in exported]
  random.Random(0).shuffle(shuffled)
  assert [r["group_id"] for r in shuffled] != sorted(r["group_id"] for r in shuffled)  # not group-major
  src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
  jsonl.write_jsonl(src, shuffled)
  argv = [
    "jaxcredit",
    "credit",
    "--config",
    os.path.join(ROOT, "configs", f"{method}.py"),
    "--in",
    str(src),
    "--out",
    str(out),
    f"--config.workdir={c.workdir}",
    f"--config.model.source={c.model.source}",
    f"--config.model.cache_dir={c.model.cache_dir}",
    f"--config.sampling.max_len={c.sampling.max_len}",
    f"--config.teacher.max_len={c.teacher.max_len}",
    f"--config.env.num_train_tasks={c.env.num_train_tasks}",
    "--config.eval.num_tasks=4",
    f"--config.train.length_bucket={c.train.length_bucket}",
    f"--config.compilation_cache_dir={c.compilation_cache_dir}",
  ]
  assert cli.main(argv) == 0
  credited = {r["rollout_id"]: r for r in jsonl.read_jsonl(out)}
  for r in exported:
    np.testing.assert_allclose(credited[r["rollout_id"]]["advantages"], r["advantages"], atol=2e-5, rtol=0)
    assert credited[r["rollout_id"]]["method"] == method


def test_credit_refuses_small_groups_and_unknown_tasks(tiny, tmp_path):
  c = tiny_run_config("trace", tmp_path / "run", tiny)
  c.total_steps = 1
  c.rollout.export_jsonl = True
  trainer.train(c)
  records = jsonl.read_jsonl(os.path.join(c.workdir, "rollouts", "step_1.jsonl"))
  lonely = [dict(records[0], group_id="alone")] + records[1:]
  jsonl.write_jsonl(tmp_path / "lonely.jsonl", lonely)
  with pytest.raises(ValueError, match="groups of at least 2"):
    offline_credit.credit_file(c, str(tmp_path / "lonely.jsonl"), str(tmp_path / "o.jsonl"))
  unknown = [dict(r, task_id="no/such/task") for r in records]
  jsonl.write_jsonl(tmp_path / "unknown.jsonl", unknown)
  with pytest.raises(ValueError, match="no/such/task"):
    offline_credit.credit_file(c, str(tmp_path / "unknown.jsonl"), str(tmp_path / "o.jsonl"))
  assert not os.path.exists(tmp_path / "o.jsonl")
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps(records[0]) + "\n{not json\n")
  assert (
    cli.main(
      [
        "jaxcredit",
        "credit",
        "--config",
        os.path.join(ROOT, "configs", "trace.py"),
        "--in",
        str(bad),
        "--out",
        str(tmp_path / "o.jsonl"),
      ]
    )
    == 2
  )


def _records(rewards_by_group, **extra):
  from jaxcredit.trajectory import RolloutBuilder

  out = []
  for g, rewards in rewards_by_group.items():
    for k, r in enumerate(rewards):
      b = RolloutBuilder.from_prompt([1, 2, 3])
      b.append_action([4, 5], [-0.5, -0.25])
      out.append(jsonl.rollout_to_record(b, rollout_id=f"{g}-{k}", group_id=g, reward=r, **extra))
  return out


def test_credit_without_passes_loads_no_model_and_refuses_bad_files(tmp_path):
  """GRPO needs no pass: credit reads, groups and writes without a model. Duplicate ids, absurd turn counts and a
  directory as --out are refused with exit code 2 and one line."""
  from jaxcredit.train.config import base_config

  records = _records({"g2": [0.0, 0.0], "g1": [1.0, 0.0]})
  records = [records[2], records[0], records[3], records[1]]  # g1, g2, g1, g2
  jsonl.write_jsonl(tmp_path / "in.jsonl", records)
  c = base_config()
  c.credit.method = "grpo"
  c.workdir = str(tmp_path / "never_written")
  info = offline_credit.credit_file(c, str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"))
  assert info == {"rollouts": 4, "groups": 2, "method": "grpo"}
  adv = {r["rollout_id"]: r["advantages"] for r in jsonl.read_jsonl(tmp_path / "out.jsonl")}
  s = 1 / np.sqrt(2)  # (1 - 0.5) / std([1, 0], ddof=1)
  np.testing.assert_allclose(adv["g1-0"], [0, 0, 0, s, s], atol=1e-6)
  np.testing.assert_allclose(adv["g1-1"], [0, 0, 0, -s, -s], atol=1e-6)
  assert adv["g2-0"] == adv["g2-1"] == [0.0] * 5
  assert not os.path.exists(c.workdir)

  jsonl.write_jsonl(tmp_path / "dup.jsonl", records + [records[0]])
  with pytest.raises(ValueError, match="appears more than once"):
    offline_credit.credit_file(c, str(tmp_path / "dup.jsonl"), str(tmp_path / "o.jsonl"))
  jsonl.write_jsonl(tmp_path / "turns.jsonl", [dict(records[0], num_turns=10**9)] + records[1:])
  with pytest.raises(ValueError, match="num_turns=1000000000"):
    offline_credit.credit_file(c, str(tmp_path / "turns.jsonl"), str(tmp_path / "o.jsonl"))
  base = ["jaxcredit", "credit", "--config", os.path.join(ROOT, "configs", "grpo.py")]
  assert cli.main(base + ["--in", str(tmp_path / "in.jsonl"), "--out", str(tmp_path)]) == 2
  assert cli.main(base + ["--in", "--out", str(tmp_path / "o.jsonl")]) == 2
  assert cli.main(base + ["--in", str(tmp_path), "--out", str(tmp_path / "o.jsonl")]) == 2


def test_credit_finds_each_rollouts_own_task_when_tasks_have_no_id(tiny, tmp_path, monkeypatch):
  """Tasks that are plain strings (as the README's environment's) carry no id: TRACE's gold pass must still score
  each rollout against its own task's gold answer, found by the rollout's prompt, never the first task's. A record
  whose prompt is no task's is refused naming the rollout."""
  from jaxcredit.envs import Env, EnvSpec
  from jaxcredit.trajectory import RolloutBuilder

  words = ["credit", "tensor", "reward"]
  asked = []

  def gold(word):
    asked.append(word)
    return f"<answer>{word[::-1]}</answer>"

  spec = EnvSpec(
    make_tasks=lambda split, num, seed: [words[i % len(words)] for i in range(num)],
    make_env=None,
    initial_messages=lambda w: [{"role": "user", "content": f"Reverse {w}."}],
    stop_strings=("</answer>",),
    max_turns=2,
    is_success=lambda r: r >= 1.0,
    demonstration=None,
    gold_answer_text=gold,
    privileged_info=lambda w: w[::-1],
  )
  monkeypatch.setitem(ENVS, "no_ids", Env(lambda node: spec, {}, "plain-string tasks"))
  c = tiny_run_config("trace", tmp_path / "run", tiny)
  c.env.name, c.env.num_train_tasks, c.eval.num_tasks = "no_ids", 3, 3
  records = []
  for g, word in enumerate(["reward", "tensor"]):  # not the first task's word
    for k in range(2):
      b = RolloutBuilder.from_prompt([10 + g, 20, 30])
      b.append_action([40 + k, 50], [-0.5, -0.25])
      messages = spec.initial_messages(word) + [{"role": "assistant", "content": "<answer>x</answer>"}]
      records.append(
        jsonl.rollout_to_record(b, rollout_id=f"{word}-{k}", group_id=g, reward=float(k), messages=messages)
      )
  assert all(r["task_id"] is None for r in records)
  offline_credit.credit_records(c, records, source="in.jsonl")
  assert sorted(set(asked)) == ["reward", "tensor"]  # before: every rollout got "credit"'s gold answer

  stranger = [dict(records[0], messages=[{"role": "user", "content": "Reverse nothing."}])] + records[1:]
  with pytest.raises(ValueError, match=r"in.jsonl: rollout 'reward-0' has no task_id and its prompt .* is none of"):
    offline_credit.credit_records(c, stranger, source="in.jsonl")


def test_credit_refuses_token_ids_outside_the_policy_vocabulary(tiny, tmp_path):
  """Issue 35 case 8: a rollout whose action holds id 60000 (the tiny vocabulary has 300 ids) was credited with exit
  0 (its passes scored a clamped embedding row). Refused before any model runs, naming the file, line and field;
  -1 likewise."""
  from jaxcredit.envs import make_env_spec

  c = tiny_run_config("trace", tmp_path / "run", tiny)
  task = export.task_id_of(make_env_spec(c.env).make_tasks("train", c.env.num_train_tasks, c.seed)[0])
  for bad_id in (60000, -1):
    records = _records({"g": [1.0, 0.0]}, task_id=task)
    records[1]["token_ids"][3] = bad_id  # the first action token
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"in\.jsonl, line 2: field 'token_ids\[3\]': .*{bad_id}"):
      offline_credit.credit_file(c, str(src), str(tmp_path / "out.jsonl"))
    assert not os.path.exists(tmp_path / "out.jsonl")


def test_credit_refuses_groups_of_unequal_size(tmp_path, capsys):
  """docs/rollouts-jsonl.md: groups of unequal size are refused (in one line, exit code 2), not credited with a
  baseline over a ragged group."""
  from jaxcredit.train.config import base_config

  records = _records({"a": [1.0, 0.0, 0.0], "b": [1.0, 0.0]})
  jsonl.write_jsonl(tmp_path / "in.jsonl", records)
  c = base_config()
  c.credit.method = "grpo"
  c.workdir = str(tmp_path / "never_written")
  with pytest.raises(
    ValueError,
    match=re.escape(
      "grpo needs groups of one size; in "
      + str(tmp_path / "in.jsonl")
      + " group 'b' has 2 rollouts but group 'a' has 3"
    ),
  ):
    offline_credit.credit_file(c, str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"))
  base = ["jaxcredit", "credit", "--config", os.path.join(ROOT, "configs", "grpo.py")]
  capsys.readouterr()
  assert cli.main(base + ["--in", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "out.jsonl")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "group 'b' has 2 rollouts but group 'a' has 3" in err[0], err
  assert not os.path.exists(tmp_path / "out.jsonl")


def test_viz_refuses_token_ids_outside_the_policy_vocabulary(tiny, tmp_path):
  """Issue 35 case 8 (viz): the viewer decoded sample ids with the policy tokenizer whatever they were; an id the
  tokenizer does not have is refused naming the file, line and field, before any page is written."""
  from jaxcredit.train.commands import report

  c = tiny_run_config("grpo", tmp_path / "run", tiny)
  records = _records({"g": [1.0, 0.0]})
  records[0]["token_ids"][4] = 60000
  os.makedirs(os.path.join(c.workdir, "rollout_samples"))
  path = os.path.join(c.workdir, "rollout_samples", "step_1.jsonl")
  with open(path, "w", encoding="utf-8") as f:
    f.write("".join(json.dumps(r) + "\n" for r in records))
  with pytest.raises(ValueError, match=r"step_1\.jsonl, line 1: field 'token_ids\[4\]': id 60000 is outside the vocab"):
    report.view_samples(c.workdir, config=c, methods=["grpo"])
  assert not os.path.exists(os.path.join(c.workdir, "viewer"))


@pytest.mark.parametrize("env_name,method", [("chain", "trace"), ("session", "crest")])
def test_the_long_horizon_testbed_environments_train_a_step(env_name, method, tiny, tmp_path):
  """The chain and session environments in `jaxcredit train` with the methods made for them: one RL step of the tiny
  policy, the environment's metrics in the row; in a session the tiny policy's messages end requests, so later
  requests arrive as user messages and CrEST's rollouts hold several units. The session run resamples tied groups
  for one round (`rollout.resample_tied_groups`): the tiny policy never succeeds, so every group stays tied; it is
  warm-started for a step first, on demonstrations that span every request."""
  c = tiny_run_config(method, tmp_path / "run", tiny, total_steps=1, env__name=env_name)
  c.rollout.resample_tied_groups = int(env_name == "session")
  c.sft.steps = int(env_name == "session")  # a session's demonstration spans several units (it once failed to pack)
  c.rollout.export_jsonl = env_name == "session"
  trainer.train(c)
  rows = metrics_rows(c.workdir, "rl")
  assert len(rows) == 1 and np.isfinite(rows[0]["loss"]) and rows[0]["action_tokens"] > 0
  key = {"chain": "env/chain_progress", "session": "env/session_unit_success"}[env_name]
  assert key in rows[0], sorted(rows[0])
  if env_name == "session":
    assert {k: rows[0][k] for k in ("resample_rounds", "resampled_groups", "tied_groups_left")} == {
      "resample_rounds": 1,
      "resampled_groups": 0,
      "tied_groups_left": c.rollout.prompts_per_step,
    }
    exported = jsonl.read_jsonl(os.path.join(c.workdir, "rollouts", "step_1.jsonl"))
    assert max(max(r["turn_ids"]) for r in exported) >= 1
    assert max(len(r["unit_rewards"]) for r in exported) >= 2
