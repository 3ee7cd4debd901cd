"""SIGTERM (a preempted TPU VM) or Ctrl-C during the warm start or RL: the step in flight finishes and is
checkpointed, the command exits with one line (0 for SIGTERM, 130 for Ctrl-C), and the same command resumes after
that step; the resumed run's later metrics equal those of a run that was never stopped."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.fixtures.tiny_run import ROOT, metrics_rows, tiny_run_overrides


def _command(tmp_path, tiny, total_steps, *, workdir="run", command="train", sft_steps=0):
  overrides = tiny_run_overrides(
    tiny.gguf_path,
    f"{tmp_path}/{workdir}",
    tiny.cache_dir,
    total_steps=total_steps,
    checkpoint_every=1000,
    sft__steps=sft_steps,
    sft__batch_size=2,
    sft__checkpoint_every=1000,
  )
  return [sys.executable, "-m", "jaxcredit.cli", command, "--config", "configs/quickstart.py", *overrides]


def _rows(tmp_path, phase, workdir="run"):
  return metrics_rows(tmp_path / workdir, phase)


def _rl_steps(tmp_path):
  return [r["step"] for r in _rows(tmp_path, "rl")]


def _stop_when(proc, ready, signum):
  deadline = time.time() + 600
  while not ready() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.5)
  assert proc.poll() is None, proc.communicate()[1][-3000:]
  proc.send_signal(signum)
  return proc.communicate(timeout=600)[1]


def _same(a, b, keys):
  for k in keys:
    assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), (k, a[k], b[k])


@pytest.mark.slow
@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_signal_during_rl_checkpoints_the_step_and_the_run_resumes(tmp_path, tiny, signum, code):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen(
    _command(tmp_path, tiny, 1000), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  err = _stop_when(proc, lambda: _rl_steps(tmp_path), signum)
  assert proc.returncode == code, err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  last = err.strip().splitlines()[-1]
  steps = _rl_steps(tmp_path)
  name = signal.Signals(signum).name
  assert last.startswith(f"jaxcredit train: stopped by {name} after RL step {steps[-1]}, checkpointed in "), last
  assert str(steps[-1]) in os.listdir(tmp_path / "run" / "checkpoints")

  p = subprocess.run(
    _command(tmp_path, tiny, steps[-1] + 1), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
  )
  assert p.returncode == 0, p.stderr[-3000:]
  assert f"resuming at RL step {steps[-1]}" in p.stdout
  assert _rl_steps(tmp_path) == steps + [steps[-1] + 1]
  if signum == signal.SIGTERM:  # the resumed step equals the same step of a run never stopped
    p = subprocess.run(
      _command(tmp_path, tiny, steps[-1] + 1, workdir="uninterrupted"),
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    resumed, straight = _rows(tmp_path, "rl")[-1], _rows(tmp_path, "rl", "uninterrupted")[-1]
    assert resumed["step"] == straight["step"] == steps[-1] + 1
    _same(resumed, straight, ("loss", "grad_norm", "reward_mean", "tool_calls"))


@pytest.mark.slow
def test_sigterm_during_the_warm_start_resumes_it_mid_way(tmp_path, tiny):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  sft = dict(command="sft", sft_steps=8)
  proc = subprocess.Popen(
    _command(tmp_path, tiny, 1, **sft),
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  err = _stop_when(proc, lambda: _rows(tmp_path, "sft"), signal.SIGTERM)
  assert proc.returncode == 0, err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  stopped = _rows(tmp_path, "sft")[-1]["step"]
  assert 1 <= stopped < 8, stopped
  last = err.strip().splitlines()[-1]
  assert last.startswith(f"jaxcredit sft: stopped by SIGTERM after warm-start step {stopped}, checkpointed in "), last
  assert os.listdir(tmp_path / "run" / "warm_start") == [str(stopped)]
  assert not (tmp_path / "run" / "checkpoints").is_dir() or not os.listdir(tmp_path / "run" / "checkpoints")

  p = subprocess.run(_command(tmp_path, tiny, 1, **sft), cwd=ROOT, env=env, capture_output=True, text=True)
  assert p.returncode == 0, p.stderr[-3000:]
  assert f"resuming the warm start at step {stopped}" in p.stdout
  rows = _rows(tmp_path, "sft")
  assert [r["step"] for r in rows] == list(range(1, 9))
  assert os.listdir(tmp_path / "run" / "checkpoints") == ["0"] and not (tmp_path / "run" / "warm_start").exists()

  p = subprocess.run(
    _command(tmp_path, tiny, 1, workdir="uninterrupted", **sft), cwd=ROOT, env=env, capture_output=True, text=True
  )
  assert p.returncode == 0, p.stderr[-3000:]
  straight = _rows(tmp_path, "sft", "uninterrupted")
  for a, b in zip(rows, straight):  # every step, those after the resume included, equals the uninterrupted run's
    assert a["step"] == b["step"]
    _same(a, b, ("loss", "grad_norm", "action_tokens"))
