"""The command line rejects what a user can get wrong, naming it, before any work starts."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(*args, cwd=ROOT):
  return subprocess.run([sys.executable, "-m", "jaxcredit.cli", *args], cwd=cwd, capture_output=True, text=True,
                        timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))


def test_unknown_config_key_is_rejected_by_name(tmp_path):
  p = _cli("train", "--config", "configs/quickstart.py", "--config.nope_key=1",
           f"--config.workdir={tmp_path}/w")
  assert p.returncode != 0
  assert "nope_key" in p.stderr
  assert not os.path.exists(tmp_path / "w")


def test_method_without_teacher_pass_is_refused(tmp_path):
  p = _cli("train", "--config", "configs/quickstart.py", "--config.credit.method=gear",
           f"--config.workdir={tmp_path}/w")
  assert p.returncode == 1
  assert "gear" in p.stderr and "teacher" in p.stderr


def test_unknown_command_and_help():
  p = _cli("fly")
  assert p.returncode == 2 and "unknown command 'fly'" in p.stderr
  p = _cli("--help")
  assert p.returncode == 0 and "train" in p.stdout and "sft" in p.stdout


def test_config_that_fails_to_build_leaves_nothing_behind(tmp_path):
  p = _cli("train", "--config", "configs/quickstart.py", "--config.mesh.data=3", f"--config.workdir={tmp_path}/w")
  assert p.returncode == 1
  assert "config.mesh" in p.stderr and "needs 3 devices" in p.stderr
  assert not os.path.exists(tmp_path / "w" / "config.json")


@pytest.mark.parametrize("override,key", [
    ("--config.loss.aggregation=bogus", "loss.aggregation"),
    ("--config.sampling.temperature=nan", "sampling.temperature"),
    ("--config.optim.learning_rate=-1", "optim.learning_rate"),
    ("--config.credit.gold_reduce=max", "credit.gold_reduce"),
])
def test_bad_values_are_refused_before_anything_is_written(tmp_path, override, key):
  p = _cli("train", "--config", "configs/quickstart.py", override, f"--config.workdir={tmp_path}/w")
  assert p.returncode == 1 and key in p.stderr, p.stderr[-2000:]
  assert not os.path.exists(tmp_path / "w")


def test_missing_config_file_and_missing_flag(tmp_path):
  p = _cli("train", "--config", "configs/nope.py")
  assert p.returncode == 2 and "config file not found: configs/nope.py" in p.stderr and "Traceback" not in p.stderr
  p = _cli("train", f"--config.workdir={tmp_path}/w")
  assert p.returncode == 2 and "--config is required" in p.stderr
