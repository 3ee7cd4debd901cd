"""Every shipped config's environment makes the tasks it asks for (its train and eval sizes fit the splits), and the
BFCL configs' caps leave every held-out session winnable by ground-truth play (issue 53)."""

import glob
import os

import pytest

from jaxcredit.envs import make_env_spec
from jaxcredit.train.loop import run as run_lib
from tests.fixtures.tiny_run import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(
  glob.glob(os.path.join(ROOT, "configs", "*.py")) + glob.glob(os.path.join(ROOT, "configs", "paper", "*.py"))
)


def _load(path):
  return load_config(os.path.splitext(os.path.basename(path))[0], os.path.dirname(path))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.relpath(p, ROOT))
def test_a_config_makes_its_tasks(path):
  c = _load(path)
  if c.env.name.startswith("bfcl"):
    pytest.importorskip("bfcl_eval")
  env = make_env_spec(c.env)
  assert len(env.make_tasks("train", c.env.num_train_tasks, c.seed)) == c.env.num_train_tasks
  assert len(env.make_tasks("eval", c.eval.num_tasks, None)) == c.eval.num_tasks


def test_bfcl_caps_are_reported_and_the_paper_config_has_none(capsys):
  pytest.importorskip("bfcl_eval")
  paper = _load(os.path.join(ROOT, "configs", "paper", "crest_qwen3_4b_bfcl.py"))
  env = make_env_spec(paper.env)
  tasks = {
    "train": env.make_tasks("train", paper.env.num_train_tasks, paper.seed),
    "eval": env.make_tasks("eval", None, None),
  }
  assert run_lib.report_unwinnable(env, tasks) == {} and capsys.readouterr().out == ""
  # the paper's protocol split too: all 400 held-out sessions and the 100 training ones finish under these caps
  paper.env.bfcl_multi_turn.protocol = "crest"
  paper.env.bfcl_multi_turn.train_categories = ""
  env = make_env_spec(paper.env)
  assert (
    run_lib.report_unwinnable(
      env, {"train": env.make_tasks("train", None, 0), "eval": env.make_tasks("eval", None, None)}
    )
    == {}
  )
  # the paper config's earlier cap of 12 turns: 26 of CrEST's 400 held-out sessions under the training caps
  paper.env.bfcl_multi_turn.max_turns = 12
  paper.env.bfcl_multi_turn.eval_max_turns = 12
  paper.env.bfcl_multi_turn.eval_decoder = "training"
  env = make_env_spec(paper.env)
  counts = run_lib.report_unwinnable(env, {"eval": env.make_tasks("eval", None, None)})["eval"]
  assert counts == {
    "base: more assistant turns than max_turns=12": 2,
    "miss_func: more assistant turns than max_turns=12": 11,
    "miss_param: more assistant turns than max_turns=12": 11,
    "long_context: more assistant turns than max_turns=12": 2,
  }
  assert "caps: 26 of 400 eval tasks cannot be finished by ground-truth play" in capsys.readouterr().out
  # the one-host first look keeps its short training sessions and says so; its held-out sessions are all winnable
  small = _load(os.path.join(ROOT, "configs", "crest_bfcl.py"))
  env = make_env_spec(small.env)
  report = run_lib.report_unwinnable(
    env,
    {
      "train": env.make_tasks("train", small.env.num_train_tasks, 0),
      "eval": env.make_tasks("eval", small.eval.num_tasks, None),
    },
  )
  assert set(report) == {"train"} and sum(report["train"].values()) > 0


def test_plan_reports_the_caps_it_finds(capsys):
  pytest.importorskip("bfcl_eval")
  from jaxcredit.train.commands import plan

  small = _load(os.path.join(ROOT, "configs", "crest_bfcl.py"))
  caps = plan.unwinnable_tasks(small)
  assert set(caps) == {"train"} and "train tasks cannot be finished by ground-truth play" in capsys.readouterr().out
  assert plan.unwinnable_tasks(_load(os.path.join(ROOT, "configs", "quickstart.py"))) == {}  # no caps to check
