"""`jaxcredit compare` of eval folders: B - A per metric and per category with the paired interval, checked by hand;
the tasks each model alone passed; evals of other tasks, unfinished or old evals, and a mix with a training run
refused. The folders are written by `jaxcredit eval`'s own writer (`evaluate._evaluate`, `to_record`) with a
scripted sampler: no model."""

import json
import math
import os
import types

import pytest

from jaxcredit.rollout.multiturn import RolloutResult
from jaxcredit.train.commands import evaluate
from jaxcredit.train.loop import heldout
from jaxcredit.train.config import base_config
from jaxcredit.trajectory import RolloutBuilder
from jaxcredit.viz import compare_evals
from tests.fixtures.cli import run_cli

CATEGORIES = ["base", "base", "base", "miss_func", "miss_func"]
A = {"success": [1, 1, 0, 0, 1], "calls": [1, 1, 1, 1, 1]}
B = {"success": [1, 0, 1, 1, 1], "calls": [2, 0, 1, 3, 1]}


def _metrics(envs):
  """BFCL multi-turn's shape: the mean, and the mean per category the sessions hold."""
  out = {"official": sum(e.ok for e in envs) / len(envs)}
  for c in sorted({e.category for e in envs}):
    group = [e for e in envs if e.category == c]
    out[f"official/{c}"] = sum(e.ok for e in group) / len(group)
  return out


def write_eval(folder, model, scripted, *, task_ids=None, num_tasks=5):
  """An eval folder as `jaxcredit eval` writes it: rollouts.jsonl and eval.json by `evaluate._evaluate`, the
  sampler replaced by the scripted results (success 1/0 -> reward 1.0/0.0, tool calls as given)."""
  c = base_config()
  c.eval.num_tasks, c.eval.batch_size, c.progress = num_tasks, 2, False
  task_ids = task_ids or [f"t{i}" for i in range(num_tasks)]
  tasks = [types.SimpleNamespace(task_id=t, category=CATEGORIES[i]) for i, t in enumerate(task_ids)]
  env = types.SimpleNamespace(is_success=lambda r: r >= 1.0, metrics=_metrics, unit_rewards=None, tools=None)
  run = types.SimpleNamespace(
    config=c, env=env, tok=types.SimpleNamespace(vocab_size=100), tasks=tasks, model_info={"source": model}
  )

  def sample(run, batch, offset, *, greedy):
    out = []
    for task in batch:
      i = tasks.index(task)
      b = RolloutBuilder.from_prompt([1, 2])
      b.append_action([3, 4], [-0.5, -0.25])
      ok = scripted["success"][i]
      out.append(
        RolloutResult(
          builder=b,
          env=types.SimpleNamespace(ok=ok, category=task.category),
          reward=float(ok),
          finish="answer",
          tool_calls=scripted["calls"][i],
          tool_errors=0,
          messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        )
      )
    return out

  os.makedirs(folder)
  with pytest.MonkeyPatch.context() as m:
    m.setattr(heldout, "sample_eval_batch", sample)
    evaluate._evaluate(run, evaluate.eval_header(c, model, 1), str(folder), 1, False, 0.0)
  return str(folder)


@pytest.fixture
def evals(tmp_path):
  return write_eval(tmp_path / "a", "base-model", A), write_eval(tmp_path / "b", "trained", B)


def test_paired_differences_per_metric_and_category_by_hand(evals, tmp_path):
  a, b = evals
  info = compare_evals.compare_evals([a, b], str(tmp_path / "cmp"))
  (c,) = info["comparisons"]
  assert (c["a"], c["b"], c["model_a"], c["model_b"], c["count"]) == (a, b, "base-model", "trained", 5)
  # success d = B - A = [0, -1, 1, 1, 0]: mean 0.2; Σd² = 3, s² = (3 - 5 · 0.04) / 4 = 0.7, s = 0.836660;
  # half = 1.959964 · 0.836660 / √5 = 0.733353.
  s = c["metrics"]["success_rate"]
  assert (s["a"], s["b"], s["count"]) == (0.6, 0.8, 5) and s["diff"] == pytest.approx(0.2)
  assert s["ci95"] == pytest.approx([0.2 - 0.733353, 0.2 + 0.733353], abs=1e-5)
  assert (c["only_a"], c["only_b"]) == (1, 2)  # task 1 only A passed; tasks 2 and 3 only B
  # tool calls d = [1, -1, 0, 2, 0]: mean 0.4; Σd² = 6, s² = (6 - 5 · 0.16) / 4 = 1.3; half = 1.959964 · 1.140175 / √5
  t = c["metrics"]["tool_calls"]
  assert t["diff"] == pytest.approx(0.4) and t["ci95"] == pytest.approx([0.4 - 0.999390, 0.4 + 0.999390], abs=1e-5)
  # an environment's per-category metric: over that category's tasks only, d = [0, -1, 1]: 0 ± 1.959964 / √3
  o = c["metrics"]["env/official/base"]
  assert o["count"] == 3 and o["diff"] == 0.0 and o["ci95"] == pytest.approx([-1.131585, 1.131585], abs=1e-5)
  assert c["metrics"]["env/official"]["diff"] == pytest.approx(0.2)
  assert set(c["categories"]) == {"base", "miss_func"}
  base, miss = c["categories"]["base"], c["categories"]["miss_func"]
  assert base["metrics"]["success_rate"]["ci95"] == pytest.approx([-1.131585, 1.131585], abs=1e-5)
  assert (base["count"], base["only_a"], base["only_b"]) == (3, 1, 1)
  assert "env/official/base" not in base["metrics"]  # the category's own rows repeat it
  # miss_func d = [1, 0]: mean 0.5, s² = (1 - 2 · 0.25) / 1 = 0.5; half = 1.959964 · 0.707107 / √2 = 0.979982
  assert miss["metrics"]["success_rate"]["diff"] == 0.5
  assert miss["metrics"]["success_rate"]["ci95"] == pytest.approx([0.5 - 0.979982, 0.5 + 0.979982], abs=1e-5)
  assert (miss["count"], miss["only_a"], miss["only_b"]) == (2, 0, 1)
  with open(info["json"]) as f:
    assert json.load(f)["comparisons"][0]["metrics"]["success_rate"] == s
  # no discordant task: the interval is [0, 0]
  same = compare_evals.paired_difference([1, 0, 1], [1, 0, 1])
  assert same["diff"] == 0.0 and same["ci95"] == [0.0, 0.0] and math.isclose(same["a"], 2 / 3)


def test_the_command_prints_the_table_and_writes_the_json(evals, tmp_path):
  a, b = evals
  out = tmp_path / "cmp"
  p = run_cli("compare", a, b, "--out", str(out))
  assert p.returncode == 0, p.stderr
  assert "success_rate" in p.stdout and "+0.200" in p.stdout and "passed by A only: 1 tasks; by B only: 2" in p.stdout
  assert "miss_func" in p.stdout and (out / "compare_evals.json").is_file()


def test_evals_of_other_tasks_are_refused_naming_what_differs(evals, tmp_path):
  a, _ = evals
  other = write_eval(tmp_path / "c", "x", B, task_ids=["t0", "t1", "t2", "t3", "u4"])
  with pytest.raises(ValueError, match=r"task 4 is 't4' in the first, 'u4' in the second"):
    compare_evals.compare_evals([a, other], str(tmp_path / "cmp"))
  fewer = write_eval(tmp_path / "d", "x", B, num_tasks=4)
  with pytest.raises(ValueError, match=r"split.num_tasks is 5 in the first, 4 in the second"):
    compare_evals.compare_evals([a, fewer], str(tmp_path / "cmp"))
  p = run_cli("compare", a, fewer, "--out", str(tmp_path / "cmp"))
  assert p.returncode == 2 and "split.num_tasks" in p.stderr


def test_an_old_or_unfinished_eval_is_refused_saying_what_to_do(evals, tmp_path):
  a, b = evals
  path = os.path.join(b, "eval.json")
  with open(path) as f:
    info = json.load(f)
  with open(path, "w") as f:
    json.dump({k: v for k, v in info.items() if k != "per_task"}, f)
  with pytest.raises(ValueError, match="no per-task values.*rerun the same `jaxcredit eval`"):
    compare_evals.compare_evals([a, b], str(tmp_path / "cmp"))
  with open(path, "w") as f:
    json.dump(dict(info, status="running"), f)
  with pytest.raises(ValueError, match="has not finished"):
    compare_evals.compare_evals([a, b], str(tmp_path / "cmp"))


def test_an_eval_folder_with_a_training_run_is_refused(evals, tmp_path):
  a, _ = evals
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text("{}")
  (run / "metrics.jsonl").write_text(json.dumps({"phase": "rl", "step": 1, "success_rate": 0.5}) + "\n")
  p = run_cli("compare", a, str(run), "--out", str(tmp_path / "cmp"))
  assert p.returncode == 2
  assert "cannot mix eval folders" in p.stderr and a in p.stderr and str(run) in p.stderr
  assert not (tmp_path / "cmp").exists()
