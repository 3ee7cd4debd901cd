"""`jaxcredit compare`: runs grouped by config (seeds form a band), curves and final values computed from
metrics.jsonl, PNG/JSON/HTML written; bad input refused with the path named."""

import json
import os


from jaxcredit import cli
from jaxcredit.viz import compare


def make_run(root, name, method, seed, success, *, evals=(), dense_norm="group_rms"):
  w = root / name
  w.mkdir()
  config = {"seed": seed, "workdir": str(w), "total_steps": len(success), "credit": {"method": method}}
  config["credit"]["trace"] = {"dense_norm": dense_norm}
  (w / "config.json").write_text(json.dumps(config))
  rows = [{"phase": "sft", "step": 1, "loss": 2.0}]
  rows += [
    {"phase": "rl", "step": i + 1, "success_rate": s, "reward_mean": s, "mean_turns": 2.0}
    for i, s in enumerate(success)
  ]
  rows += [{"phase": "eval", "step": 0, "stage": "before_warm_start", "success_rate": 0.0}]
  rows += [{"phase": "eval", "step": step, "success_rate": s} for step, s in evals]
  (w / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(w)


def test_seeds_of_one_setting_make_one_curve_with_a_band(tmp_path):
  runs = [
    make_run(tmp_path, "grpo_s0", "grpo", 0, [0.0, 0.5, 0.5], evals=[(0, 0.25), (3, 0.5)]),
    make_run(tmp_path, "grpo_s1", "grpo", 1, [0.5, 0.5, 1.0], evals=[(0, 0.25), (3, 0.75)]),
    make_run(tmp_path, "trace_s0", "trace", 0, [0.0, 1.0]),
    make_run(tmp_path, "trace_none_s0", "trace", 0, [0.25, 0.25], dense_norm="none"),
  ]
  # A warm-start eval (eval.sft_every) is at RL step 0 too; written last here, it still never starts the curve.
  with open(os.path.join(runs[0], "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"phase": "eval", "step": 0, "stage": "sft_step_5", "sft_step": 5, "success_rate": 1.0}) + "\n")
  out = compare.compare_runs(runs, str(tmp_path / "cmp"))
  labels = [g["label"] for g in out["groups"]]
  assert labels == [
    "credit.method=grpo credit.trace.dense_norm=group_rms",
    "credit.method=trace credit.trace.dense_norm=group_rms",
    "credit.method=trace credit.trace.dense_norm=none",
  ]
  assert out["groups"][0]["seeds"] == [0, 1]
  data = json.load(open(out["json"]))
  c = data["curves"]["rl/success_rate"][labels[0]]
  assert c["steps"] == [1, 2, 3] and c["mean"] == [0.25, 0.5, 0.75] and c["lo"] == [0.0, 0.5, 0.5]
  assert c["hi"] == [0.5, 0.5, 1.0] and c["runs"] == 2
  assert out["groups"][0]["final"]["eval/success_rate"] == {"step": 3, "mean": 0.625, "lo": 0.5, "hi": 0.75}
  # The evals before and during the warm start (also step 0) are not the curve's start.
  assert data["curves"]["eval/success_rate"][labels[0]]["mean"] == [0.25, 0.625]
  assert out["groups"][1]["final"]["rl/success_rate"]["mean"] == 1.0
  # Panels nobody logged (kl, tool calls) are left out; the PNG is a real image, embedded in the page.
  assert "rl/kl" not in data["curves"] and "rl/mean_turns" in data["curves"]
  assert open(out["png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(out["png"]) > 10_000
  assert "data:image/png;base64," in open(out["html"]).read()


def test_a_resumed_run_keeps_one_value_per_step(tmp_path):
  w = make_run(tmp_path, "r", "grpo", 0, [0.0, 0.0])
  with open(os.path.join(w, "metrics.jsonl"), "a") as f:  # step 2 run again after a resume
    f.write(json.dumps({"phase": "rl", "step": 2, "success_rate": 1.0}) + "\n")
  c = compare.curve([compare.load_run(w)], "rl", "success_rate")
  assert c["steps"] == [1, 2] and c["mean"] == [0.0, 1.0]


def test_bad_workdirs_are_refused_with_their_path(tmp_path, capsys):
  good = make_run(tmp_path, "g", "grpo", 0, [0.0])
  assert cli.main(["jaxcredit", "compare", good, str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
  assert "missing has no metrics.jsonl" in capsys.readouterr().err
  assert cli.main(["jaxcredit", "compare", good, good, "--out", str(tmp_path / "o")]) == 2
  assert "listed twice" in capsys.readouterr().err
  with open(os.path.join(good, "metrics.jsonl"), "a") as f:
    f.write("{not json\n")
  assert cli.main(["jaxcredit", "compare", good, "--out", str(tmp_path / "o")]) == 2
  assert "metrics.jsonl, line 4: not JSON" in capsys.readouterr().err
  assert not os.path.exists(tmp_path / "o")  # nothing written for a refused comparison


def test_a_link_to_a_listed_run_and_rows_without_a_step_are_refused(tmp_path, capsys):
  good = make_run(tmp_path, "g", "grpo", 0, [0.0])
  os.symlink(good, tmp_path / "link")
  assert cli.main(["jaxcredit", "compare", good, str(tmp_path / "link"), "--out", str(tmp_path / "o")]) == 2
  assert "listed twice" in capsys.readouterr().err
  bad = make_run(tmp_path, "b", "grpo", 0, [0.0])
  with open(os.path.join(bad, "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"phase": "rl", "success_rate": 0.5}) + "\n")
  assert cli.main(["jaxcredit", "compare", bad, "--out", str(tmp_path / "o")]) == 2
  assert "metrics.jsonl, line 4: expected a JSON object with an integer 'step'" in capsys.readouterr().err
