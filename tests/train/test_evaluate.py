"""`jaxcredit eval`'s pieces without a model: the intervals checked by hand, pass@k, the metric table's counts and
interval kinds, the refusal to resume another eval's folder, and the command line's argument errors."""

import json
import math
import types

import pytest

from jaxcredit.train.commands import evaluate
from jaxcredit.train.config import base_config
from tests.fixtures.cli import run_cli


def test_wilson_interval_by_hand():
  # 7 of 10: p = 0.7, z² = 3.841459; c = (0.7 + 0.192073) / 1.384146 = 0.644493;
  # h = 1.959964 / 1.384146 · √(0.021 + 0.009604) = 1.416008 · 0.174939 = 0.247716.
  low, high = evaluate.wilson_interval(7, 10)
  assert low == pytest.approx(0.644493 - 0.247716, abs=1e-5) and high == pytest.approx(0.644493 + 0.247716, abs=1e-5)
  assert (round(low, 4), round(high, 4)) == (0.3968, 0.8922)  # the textbook value
  # 0 of 5: c = h = (z²/10) / (1 + z²/5) = 0.384146 / 1.768292 = 0.217242; the interval is [0, 2c].
  low, high = evaluate.wilson_interval(0, 5)
  assert low == 0.0 and high == pytest.approx(2 * 0.217242, abs=1e-5)
  low, high = evaluate.wilson_interval(5, 5)  # symmetric: [1 - 0.434484, 1]
  assert high == 1.0 and low == pytest.approx(1 - 2 * 0.217242, abs=1e-5)
  with pytest.raises(ValueError, match="successes=6, n=5"):
    evaluate.wilson_interval(6, 5)


def test_mean_interval_and_pass_at_k_by_hand():
  # mean 2, s = √((1 + 0 + 1) / 2) = 1, n = 3: 2 ± 1.959964 / √3 = 2 ± 1.131585
  low, high = evaluate.mean_interval([1.0, 2.0, 3.0])
  assert low == pytest.approx(2 - 1.131585, abs=1e-6) and high == pytest.approx(2 + 1.131585, abs=1e-6)
  assert evaluate.mean_interval([0.5]) is None
  assert evaluate.pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
  assert evaluate.pass_at_k(4, 0, 4) == 0.0 and evaluate.pass_at_k(4, 1, 4) == 1.0
  with pytest.raises(ValueError, match="k=5"):
    evaluate.pass_at_k(4, 1, 5)


def _result(reward, tool_calls=1, turns=2, finish="answer", value=0.0):
  return types.SimpleNamespace(
    reward=reward,
    tool_calls=tool_calls,
    builder=types.SimpleNamespace(num_turns=turns),
    finish=finish,
    env=types.SimpleNamespace(value=value),
  )


def _env(with_metrics=True):
  metrics = (lambda envs: {"value_mean": sum(e.value for e in envs) / len(envs)}) if with_metrics else None
  return types.SimpleNamespace(is_success=lambda r: r >= 1.0, metrics=metrics)


def test_one_sample_per_task_gets_wilson_intervals_over_the_tasks():
  by_task = [[_result(1.0, value=1.0)], [_result(0.0, finish="no_answer")], [_result(1.0, tool_calls=3, value=2.0)]]
  heldout = {
    "success_rate": 2 / 3,
    "tool_calls": 5 / 3,
    "mean_turns": 2.0,
    "answered_frac": 2 / 3,
    "env/value_mean": 1.0,
    "num_tasks": 3,
  }
  table = evaluate.metric_table(_env(), by_task, heldout)
  assert table["success_rate"] == {
    "value": 2 / 3,
    "count": 3,
    "ci95": list(evaluate.wilson_interval(2, 3)),
    "interval": "wilson",
  }
  assert table["answered_frac"]["interval"] == "wilson"
  # tool calls 1, 1, 3: mean 5/3, s = √((4/9 + 4/9 + 16/9) / 2) = 1.154701, half = 1.959964 · 1.154701 / √3
  half = 1.959964 * 1.154701 / math.sqrt(3)
  assert table["tool_calls"]["ci95"] == pytest.approx([5 / 3 - half, 5 / 3 + half], abs=1e-5)
  assert table["tool_calls"]["interval"] == "normal" and table["mean_turns"]["ci95"] == [2.0, 2.0]
  env = table["env/value_mean"]  # a bootstrap of the per-task values 1, 0, 2: within their range, reproducible
  assert env["interval"] == "bootstrap" and env["count"] == 3 and 0.0 <= env["ci95"][0] < 1.0 < env["ci95"][1] <= 2.0
  assert evaluate.metric_table(_env(), by_task, heldout)["env/value_mean"] == env
  assert "pass@1" not in table and "mean@1" not in table


def test_k_samples_per_task_give_pass_at_k_and_mean_at_k():
  by_task = [[_result(1.0), _result(0.0)], [_result(0.0), _result(0.0)], [_result(1.0), _result(1.0)]]
  heldout = {"success_rate": 0.5, "tool_calls": 1.0, "mean_turns": 2.0, "answered_frac": 1.0, "num_tasks": 6}
  table = evaluate.metric_table(_env(with_metrics=False), by_task, heldout)
  assert table["pass@2"] == {
    "value": 2 / 3,
    "count": 3,
    "ci95": list(evaluate.wilson_interval(2, 3)),
    "interval": "wilson",
  }
  # per-task success rates 0.5, 0, 1: mean 0.5, s = 0.5, 0.5 ± 1.959964 · 0.5 / √3 = 0.5 ± 0.565792, cut to [0, 1]
  assert table["mean@2"]["value"] == 0.5 and table["mean@2"]["interval"] == "normal"
  assert table["mean@2"]["ci95"] == [0.0, 1.0]
  # rates 0, 0, 1 (one task of three passes both samples): 1/3 ± 1.959964 · 0.57735 / √3 = 1/3 ± 0.653321, cut at 0
  by_task[0] = [_result(0.0), _result(0.0)]
  cut = evaluate.metric_table(_env(with_metrics=False), by_task, dict(heldout, success_rate=1 / 3))["mean@2"]
  assert cut["ci95"] == pytest.approx([0.0, 1 / 3 + 0.653321], abs=1e-6)
  assert table["success_rate"] == table["mean@2"] and table["success_rate"]["count"] == 3


def test_an_environments_own_metric_reaches_the_trainers_row_and_the_eval_table():
  """The path of a benchmark metric: `EnvSpec.metrics` (here arithmetic's math-verify accuracy) -> the trainer's
  `env_metrics_of` ("env/..." in its eval row) -> `metric_table` (eval.json, with a bootstrap interval) -> the table."""
  from jaxcredit.envs import arithmetic
  from jaxcredit.train.loop import heldout

  spec = arithmetic.env_spec()
  task = arithmetic.ArithmeticTask(task_id="t/0", question="2*(3+4)?", answer="14", source="x", expression="2*(3+4)")
  by_task = []
  for answer in ("14", "$\\frac{28}{2}$", "15"):  # math-verify: right, right (the reward: no), wrong
    env = spec.make_env(task)
    env.step(f"<answer>{answer}</answer>")
    by_task.append([types.SimpleNamespace(reward=env.reward(), tool_calls=0, builder=None, finish="answer", env=env)])
  row = heldout.env_metrics_of(spec, [rs[0].env for rs in by_task])
  assert row == {"env/math_verify_accuracy": pytest.approx(2 / 3)}
  for rs in by_task:
    rs[0].builder = types.SimpleNamespace(num_turns=1)
  heldout = {"success_rate": 1 / 3, "tool_calls": 0.0, "mean_turns": 1.0, "answered_frac": 1.0, **row, "num_tasks": 3}
  table = evaluate.metric_table(spec, by_task, heldout)
  m = table["env/math_verify_accuracy"]
  assert m["value"] == pytest.approx(2 / 3) and m["count"] == 3 and m["interval"] == "bootstrap"
  assert 0.0 <= m["ci95"][0] <= 2 / 3 <= m["ci95"][1] <= 1.0
  assert "env/math_verify_accuracy  0.667" in evaluate.format_table({"metrics": table})


def test_a_folder_of_another_eval_is_refused_naming_the_key(tmp_path):
  c = base_config()
  header = evaluate.eval_header(c, "smollm2", 1)
  assert header["decoding"]["greedy"] is True and header["split"] == {
    "env": "arithmetic",
    "name": "eval",
    "num_tasks": 64,
  }
  assert evaluate.check_resumable(str(tmp_path), header) is False
  (tmp_path / "eval.json").write_text(json.dumps({"status": "running", **header}))
  assert evaluate.check_resumable(str(tmp_path), header) is True
  c.progress = False  # an ignored key: still the same eval
  assert evaluate.check_resumable(str(tmp_path), evaluate.eval_header(c, "smollm2", 1)) is True
  c.sampling.max_new_tokens = 7
  with pytest.raises(ValueError, match=r"config.sampling.max_new_tokens: the folder's eval has 48, now 7"):
    evaluate.check_resumable(str(tmp_path), evaluate.eval_header(c, "smollm2", 1))
  with pytest.raises(ValueError, match=r"samples: the folder's eval has 1, now 4"):
    evaluate.check_resumable(str(tmp_path), evaluate.eval_header(base_config(), "smollm2", 4))


def test_parse_model_finds_a_training_workdir_and_its_step(tmp_path):
  w = tmp_path / "run"
  (w / "checkpoints").mkdir(parents=True)
  (w / "config.json").write_text("{}")
  assert evaluate.parse_model(str(w)) == (str(w), None)
  assert evaluate.parse_model(f"{w}@3") == (str(w), 3)
  assert evaluate.parse_model("Qwen/Qwen3-4B@main") is None
  assert evaluate.parse_model(str(tmp_path)) is None


@pytest.mark.parametrize(
  "args,words",
  [
    (["--samples", "0"], ["--samples must be an integer >= 1", "'0'"]),
    (["--samples=two"], ["--samples must be an integer >= 1", "'two'"]),
    # Issue 54 case 7: listed every task-sample pair first and was killed by the OOM killer; bounded before any work.
    (["--samples", "1000000000"], ["--samples 1000000000 x config.eval.num_tasks = 64", "lower --samples"]),
    (["--model"], ["--model needs a value"]),
    (["--config.eval.num_tasks=0"], ["config.eval.num_tasks"]),
  ],
)
def test_bad_arguments_exit_2_naming_the_flag(args, words):
  p = run_cli("eval", "--config", "configs/quickstart.py", *args)
  assert p.returncode == 2, p.stderr
  assert all(w in p.stderr for w in words), p.stderr


def test_an_out_path_that_is_a_file_is_refused(tmp_path):
  (tmp_path / "f").write_text("")
  p = run_cli("eval", "--config", "configs/quickstart.py", "--out", str(tmp_path / "f"))
  assert p.returncode == 2 and f"--out {tmp_path / 'f'} is a file" in p.stderr
