"""configs/trace_search.py and configs/crest_bfcl.py run one RL step with the SmolLM2 policy (shrunk in batch and
turn length, never in model). Success may be 0; the checks are that the rollouts reach the environment, its units
are verified and the method credits them.

Both are `slow` (minutes of SmolLM2 on a CPU; a BFCL prompt with its tools is 1.7k-4.3k tokens, re-read every
turn): they run in CI (.ci/run sets JAXCREDIT_RUN_SLOW=1) or with `pytest -m slow`. configs/grpo_bfcl.py trains on
the same environment with GRPO's credit, which every environment shares: it is validated and its tasks built here in
the default suite (its RL step on SmolLM2 took 97 s of CI and showed nothing crest_bfcl's does not).
"""

import importlib.util
import json
import os

import numpy as np
import pytest

from jaxcredit.train.commands import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(name, tmp_path):
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", os.path.join(ROOT, "configs", f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  c.workdir = str(tmp_path / name)
  c.model.cache_dir = str(tmp_path.parent / "converted")
  c.compilation_cache_dir = str(tmp_path.parent / "xla")
  c.progress = False
  c.tensorboard = False
  c.total_steps = 2
  c.rollout.prompts_per_step = 1
  c.rollout.group_size = 2
  c.eval.batch_size = 2  # one sampler batch size: one compile
  c.sft.steps = 0
  c.eval.before_sft = c.eval.after_sft = c.eval.at_end = False
  c.rollout.export_jsonl = True
  return c


def _rows(c):
  with open(os.path.join(c.workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["phase"] == "rl"]


def _exported(c, step):
  with open(os.path.join(c.workdir, "rollouts", f"step_{step}.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
def test_trace_search_one_step(tmp_path):
  c = _config("trace_search", tmp_path)
  c.total_steps = 1
  c.sampling.max_new_tokens = 24
  c.env.search.max_tool_calls = 4
  c.env.search.max_hops = 2
  trainer.train(c)
  rows = _rows(c)
  assert [r["step"] for r in rows] == [1]
  for r in rows:
    assert r["method"] == "trace" and r["action_tokens"] > 0 and np.isfinite(r["loss"])
    assert r["pass/gold_answer/seconds"] > 0 and "env/evidence_found" in r
  records = _exported(c, 1)
  assert len(records) == 2 and all(len(r["advantages"]) == len(r["token_ids"]) for r in records)
  assert records[0]["messages"][0]["role"] == "system" and "search" in records[0]["messages"][0]["content"]


def test_the_grpo_bfcl_config_validates_and_builds_its_tasks(tmp_path):
  from jaxcredit.envs import make_env_spec
  from jaxcredit.train import config as config_lib

  c = _config("grpo_bfcl", tmp_path)
  config_lib.validate(c)
  assert c.credit.method == "grpo" and c.env.name == "bfcl_multi_turn"
  env = make_env_spec(c.env)
  tasks = env.make_tasks("train", 4, c.seed)
  assert len(tasks) == 4 and len(env.make_tasks("eval", 2, None)) == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["crest_bfcl"])
def test_bfcl_configs_one_step(name, tmp_path):
  c = _config(name, tmp_path)
  c.sampling.max_new_tokens = 12
  c.env.bfcl_multi_turn.classes = "TradingBot"  # the shortest prompts (1.7k-1.9k tokens with compact tools)
  c.env.num_train_tasks = 40
  c.eval.num_tasks = 4  # the TradingBot eval split has 7
  c.sampling.max_len = 2560
  c.teacher.max_len = 3072
  c.env.bfcl_multi_turn.max_turns = 2
  c.env.bfcl_multi_turn.max_steps_per_unit = 1  # every message ends a request: units are reached and verified
  c.total_steps = 1  # one RL step of SmolLM2 on 1.7k-token prompts is minutes here; trace_search runs two
  trainer.train(c)
  rows = _rows(c)
  assert [r["step"] for r in rows] == [1]
  for r in rows:
    assert r["method"] == name.split("_")[0] and r["action_tokens"] > 0 and np.isfinite(r["loss"])
    # training rollouts read text with the strict parser: BFCL's checkers' accuracy, not bfcl-eval's official number
    assert 0.0 <= r["env/bfcl_checker_accuracy"] <= 1.0 and 0.0 <= r["env/bfcl_unit_pass_rate"] <= 1.0
    assert "env/bfcl_official_accuracy" not in r
  for step in (1,):
    for rec in _exported(c, step):
      units = [u for u in rec["unit_ids"] if u >= 0]
      assert len(rec["unit_rewards"]) == max(units) + 1  # every unit the rollout acted in was verified
      assert rec["num_turns"] >= 1 and set(rec["unit_rewards"]) <= {0.0, 1.0}
      roles = [m["role"] for m in rec["messages"]]
      assert roles[:2] == ["system", "user"] and roles.count("user") >= len(rec["unit_rewards"])
  if name == "crest_bfcl":
    assert rows[0]["units_mean"] >= 2 and "pass/teacher_privileged/seconds" in rows[0]
    rec = _exported(c, 1)[0]
    adv = np.asarray(rec["advantages"])
    assert np.isfinite(adv).all()
