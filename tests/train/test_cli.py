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


@pytest.mark.parametrize("overrides,words", [
    (["--config.credit.method=opd"], ["config.teacher.source", "opd"]),            # OPD has no default teacher
    (["--config.credit.method=nope"], ["config.credit.method", "nope"]),
    (["--config.credit.method=hsd", "--config.credit.hsd.fallback=maybe"], ["config.credit.hsd.fallback"]),
    (["--config.credit.method=crest", "--config.credit.crest.tau=nan"], ["config.credit.crest.tau"]),
    (["--config.teacher.context_wrapper=no placeholder"], ["config.teacher.context_wrapper"]),
    (["--config.env.name=bfcl"], ["config.env.name", "arithmetic"]),
    # Values that would otherwise fail late (after the warm start) or silently (a flipped sign):
    (["--config.credit.method=grpo", "--config.teacher.source=policy"], ["config.teacher.source", "no teacher pass"]),
    (["--config.credit.method=toolopd", "--config.credit.toolopd.distill_coef=-0.1"],
     ["config.credit.toolopd.distill_coef", ">= 0"]),
    (["--config.credit.method=toolopd", "--config.credit.toolopd.skill_template=Task: {question}"],
     ["config.credit.toolopd.skill_template", "question"]),
    (["--config.credit.method=toolopd", "--config.credit.toolopd.skill_max_tokens=288"],
     ["config.credit.toolopd.skill_max_tokens"]),
    (["--config.train.num_micro_batches=3"], ["config.train.num_micro_batches", "8 rollouts"]),
    # Out of a credit function's range: refused by its own check, named under the method's node.
    (["--config.credit.method=crest", "--config.credit.crest.temperature=-1"],
     ["config.credit.crest", "`temperature` must be > 0"]),
    (["--config.credit.method=gigpo", "--config.credit.gigpo.gamma=2.0"], ["config.credit.gigpo", "`gamma`"]),
    (["--config.credit.method=hsd", "--config.credit.hsd.success_threshold=inf"],
     ["config.credit.hsd", "success_threshold"]),
    (["--config.credit.method=toolopd", "--config.credit.toolopd.skill_template={task.nope}"],
     ["config.credit.toolopd.skill_template"]),
])
def test_bad_method_teacher_and_env_settings_are_refused_by_name(tmp_path, overrides, words):
  p = _cli("train", "--config", "configs/quickstart.py", *overrides, f"--config.workdir={tmp_path}/w")
  assert p.returncode == 1, p.stderr[-2000:]
  assert all(w in p.stderr for w in words), p.stderr[-2000:]
  assert not os.path.exists(tmp_path / "w")


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
    ("--config.credit.trace.gold_reduce=max", "credit.trace.gold_reduce"),
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


def test_an_infinite_knob_the_credit_function_allows_passes_validation():
  from jaxcredit.train.config import base_config, validate
  c = base_config()
  c.credit.method = "crest"
  c.credit.crest.tau = float("-inf")     # gate closed: CrEST is plain per-unit GRPO
  c.teacher.context_wrapper = ""         # no insertion
  validate(c)
