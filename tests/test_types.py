"""The type check of the trainer (`jaxcredit/train/`) and the step's types it passes around (the trajectory, the
pass outputs, the rollout engine's protocol): mypy finds no error. The step's data are declared types (issue 55), so
a method that reads a field its pass does not declare, or a pass that returns another class, is a type error here
before it is a runtime error at a run's first step."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKED = ["jaxcredit/train", "jaxcredit/trajectory.py", "jaxcredit/sampling/engine.py"]


def test_the_trainer_and_the_steps_types_type_check(tmp_path):
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "mypy",
      "--ignore-missing-imports",  # jax, flax, orbax, ... ship partial or no stubs
      "--follow-imports=silent",  # the modules these import are read for their types, not checked themselves
      "--cache-dir",
      str(tmp_path / "mypy_cache"),
      *CHECKED,
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stdout + out.stderr
  assert "Success: no issues found" in out.stdout
