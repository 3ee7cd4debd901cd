"""SIGTERM (a preempted TPU VM) or Ctrl-C during RL: the step in flight finishes and is checkpointed, the command
exits with one line (0 for SIGTERM, 130 for Ctrl-C), and the same command resumes after that step."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.models.test_gguf import CFG, random_params, write_gguf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _command(tmp_path, gguf_path, total_steps):
  return [
    sys.executable,
    "-m",
    "jaxcredit.cli",
    "train",
    "--config",
    "configs/quickstart.py",
    f"--config.workdir={tmp_path}/run",
    f"--config.model.source={gguf_path}",
    f"--config.model.cache_dir={tmp_path}/converted",
    "--config.compilation_cache_dir=",
    "--config.progress=False",
    f"--config.total_steps={total_steps}",
    "--config.checkpoint_every=1000",
    "--config.env.num_train_tasks=40",
    "--config.sampling.max_new_tokens=6",
    "--config.sampling.max_len=1024",
    "--config.sampling.chunk_size=3",
    "--config.rollout.prompts_per_step=2",
    "--config.rollout.group_size=2",
    "--config.sft.steps=0",
    "--config.train.length_bucket=256",
    "--config.eval.before_sft=False",
    "--config.eval.after_sft=False",
    "--config.eval.at_end=False",
  ]


def _rl_steps(tmp_path):
  path = tmp_path / "run" / "metrics.jsonl"
  if not path.is_file():
    return []
  return [r["step"] for r in map(json.loads, path.read_text().splitlines()) if r["phase"] == "rl"]


@pytest.mark.slow
@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_signal_during_rl_checkpoints_the_step_and_the_run_resumes(tmp_path, signum, code):
  gguf_path = write_gguf(tmp_path / "tiny.gguf", "llama", CFG, random_params(CFG))
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen(
    _command(tmp_path, gguf_path, 1000), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  deadline = time.time() + 600
  while not _rl_steps(tmp_path) and proc.poll() is None and time.time() < deadline:
    time.sleep(1)
  assert proc.poll() is None, proc.communicate()[1][-3000:]
  proc.send_signal(signum)
  _, err = proc.communicate(timeout=600)
  assert proc.returncode == code, err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  last = err.strip().splitlines()[-1]
  steps = _rl_steps(tmp_path)
  name = signal.Signals(signum).name
  assert last.startswith(f"jaxcredit train: stopped by {name} after RL step {steps[-1]}, checkpointed in "), last
  assert str(steps[-1]) in os.listdir(tmp_path / "run" / "checkpoints")

  p = subprocess.run(
    _command(tmp_path, gguf_path, steps[-1] + 1), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
  )
  assert p.returncode == 0, p.stderr[-3000:]
  assert f"resuming at RL step {steps[-1]}" in p.stdout
  assert _rl_steps(tmp_path) == steps + [steps[-1] + 1]
