"""Multi-host training: 2 processes x 4 CPU devices (jax.distributed over gloo, a 127.0.0.1 coordinator) run
`jaxcredit train` for 2 RL steps of the quickstart pipeline on a tiny model. Each process samples its own prompt
groups; every process then holds every rollout, and the sharded update runs on the global batch. A 1-process x
8-device replay of the same rollouts gives the same losses, gradient norms and parameters (plain SGD, learning
rate 1: the parameter change is the gradient)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from tests.fixtures.multidevice import child_env
from tests.fixtures.tiny_model import CFG, random_params, write_gguf
from tests.fixtures.tiny_run import tiny_run_config, tiny_run_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


UNCAPPED = "--config.credit.toolopd.distill_max_grad_ratio=inf"
"""ToolOPD's distillation without its gradient cap: the tiny random policy's groups all tie (GRPO's gradient 0), and
the capped distillation would then be 0 too (tests/train/test_loss_terms.py checks the cap), while these runs check
that every step of a pass that samples learns on every process."""


def _overrides(tmp_path, policy, teacher, *, method="opd", prompts=4):
  return tiny_run_overrides(
    policy,
    f"{tmp_path}/run",
    f"{tmp_path}/converted",
    total_steps=2,
    checkpoint_every=1,
    max_checkpoints_to_keep=10,
    env__num_train_tasks=40,
    rollout__prompts_per_step=prompts,
    rollout__export_jsonl=True,
    sft__steps=1,
    sft__batch_size=8,
    eval__at_end=True,
    eval__num_tasks=3,  # uneven over 2 processes: 2 + 1
    eval__batch_size=2,
    mesh__fsdp=8,
    credit__method=method,
    teacher__source=teacher,
    optim__name="sgd",
    optim__learning_rate=1.0,
    optim__max_grad_norm=0,
  )


def _start(overrides, workdir, num_processes=2, devices=4):
  port = _free_port()
  procs = []
  for i in range(num_processes):
    env = child_env(
      devices,
      JAXCREDIT_DISTRIBUTED="1",
      JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
      JAX_NUM_PROCESSES=str(num_processes),
      JAX_PROCESS_ID=str(i),
      PYTHONFAULTHANDLER="1",
    )
    cmd = [sys.executable, "-m", "jaxcredit.cli", "train", "--config", "configs/quickstart.py"]
    cmd += [*overrides, f"--config.workdir={workdir}"]
    procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
  return procs


def _wait(procs):
  outs = []
  for p in procs:
    try:
      out, _ = p.communicate(timeout=900)
    except subprocess.TimeoutExpired:
      # Where each process was when it stopped answering: SIGABRT makes Python's faulthandler (PYTHONFAULTHANDLER,
      # set by _start) print every thread's stack before the process dies; then the last lines of each output.
      for q in procs:
        if q.poll() is None:
          q.send_signal(signal.SIGABRT)
      tails = []
      for q in procs:
        try:
          tails.append((q.communicate(timeout=60)[0] or "")[-6000:])
        except subprocess.TimeoutExpired:
          q.kill()
          tails.append((q.communicate()[0] or "")[-6000:])
      raise AssertionError(
        "a process did not finish in 900 s; the output of each:\n"
        + "\n".join(f"--- process {k}:\n{tail}" for k, tail in enumerate(tails))
      ) from None
    outs.append((p.returncode, out))
  return outs


def _launch(tmp_path, overrides, workdir, num_processes=2, devices=4):
  return _wait(_start(overrides, workdir, num_processes, devices))


def _models(tmp_path):
  policy = write_gguf(tmp_path / "policy.gguf", "llama", CFG, random_params(CFG, seed=0))
  teacher = write_gguf(tmp_path / "teacher.gguf", "llama", CFG, random_params(CFG, seed=1))
  return policy, teacher


def _check_run(run_dir):
  """Each process sampled whole groups of different prompts; the metrics were written once; every step learned."""
  for step in (1, 2):
    records = [json.loads(line) for line in open(run_dir / "rollouts" / f"step_{step}.jsonl")]
    assert len(records) == 8
    by_process = {}
    for r in records:
      by_process.setdefault(r["metadata"]["process"], []).append(r)
    assert sorted(by_process) == [0, 1]
    groups = [{r["group_id"] for r in rs} for rs in by_process.values()]
    assert not groups[0] & groups[1], "a group spans processes"
    for rs in by_process.values():
      assert len(rs) == 4 and all(sum(x["group_id"] == r["group_id"] for x in rs) == 2 for r in rs)
    assert {r["task_id"] for r in by_process[0]}.isdisjoint({r["task_id"] for r in by_process[1]})
  rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
  rl = [r for r in rows if r["phase"] == "rl"]
  assert [r["step"] for r in rl] == [1, 2]
  assert all(r["grad_norm"] > 0 for r in rl)
  evals = [r for r in rows if r["phase"] == "eval"]
  assert len(evals) == 1 and evals[0]["num_tasks"] == 3
  return rl


@pytest.mark.slow
def test_two_processes_sample_their_own_groups_and_train_like_one(tmp_path):
  policy, teacher = _models(tmp_path)
  overrides = _overrides(tmp_path, policy, teacher)
  run_dir = tmp_path / "run"
  outs = _launch(tmp_path, overrides, run_dir)
  for k, (code, out) in enumerate(outs):
    assert code == 0, f"process {k} exited {code}:\n{out[-6000:]}"
  rl = _check_run(run_dir)

  # The same rollouts on 1 process x 8 devices: the same losses, gradients and parameters.
  out_path = tmp_path / "replay.json"
  env = child_env(8)
  cmd = [
    sys.executable,
    "-m",
    "tests.integration.multihost_replay",
    str(run_dir),
    str(tmp_path / "replay"),
    str(out_path),
  ]
  proc = subprocess.run([*cmd, "--", *overrides], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
  replay = json.loads(out_path.read_text())
  assert replay["devices"] == 8 and replay["processes"] == 1
  for theirs, mine in zip(rl, replay["steps"]):
    assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-6), mine
    assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-6), mine
    # The parameters after the step agree to 1e-6 of the step's change (the gradient), up to the float32 rounding
    # of parameter minus gradient (one unit in the last place of the largest parameter).
    assert mine["change"] > 0.01
    assert mine["diff"] <= 1e-6 * mine["change"] + float(np.finfo(np.float32).eps) * mine["scale"], mine


@pytest.mark.slow
def test_two_processes_sample_ahead_on_their_threads_with_async_depth(tmp_path):
  """`rollout.async_depth=1` on 2 processes: each process's rollout thread samples its own groups of the next step
  while the shared update runs; a pass that samples with the policy (ToolOPD's hindsight skills) waits for it."""
  policy, teacher = _models(tmp_path)
  overrides = _overrides(tmp_path, policy, teacher, method="toolopd")
  overrides = [o for o in overrides if not o.startswith("--config.teacher.source")] + [UNCAPPED]
  outs = _launch(tmp_path, [*overrides, "--config.rollout.async_depth=1"], tmp_path / "run")
  for k, (code, out) in enumerate(outs):
    assert code == 0, f"process {k} exited {code}:\n{out[-6000:]}"
  rl = _check_run(tmp_path / "run")
  assert [r["policy_staleness"] for r in rl] == [0, 1]
  assert "engine_is_weight_mean" in rl[1] and "engine_is_weight_mean" not in rl[0]


@pytest.mark.slow
def test_a_pass_that_samples_runs_on_every_process(tmp_path):
  """ToolOPD's hindsight skills are generated by the policy itself: each process generates them on its own copy."""
  policy, teacher = _models(tmp_path)
  overrides = _overrides(tmp_path, policy, teacher, method="toolopd") + [UNCAPPED]
  outs = _launch(tmp_path, [o for o in overrides if not o.startswith("--config.teacher.source")], tmp_path / "run")
  for k, (code, out) in enumerate(outs):
    assert code == 0, f"process {k} exited {code}:\n{out[-6000:]}"
  rl = _check_run(tmp_path / "run")
  assert all(r["pass/hindsight_skill/dropped"] < 8 for r in rl), rl


def test_groups_that_cannot_be_split_over_the_processes_are_refused_before_anything_is_written(
  tiny, tmp_path, monkeypatch
):
  """The check itself, in this process with jax reporting 2 processes: the trainer's build refuses 3 prompt groups
  naming the field, before the workdir is written. The whole path with two real processes is the slow test
  below."""
  from jaxcredit.train.loop import run as run_lib

  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: 0)
  c = tiny_run_config("quickstart", tmp_path / "run", tiny, rollout__prompts_per_step=3)
  with pytest.raises(ValueError, match=r"config\.rollout\.prompts_per_step=3.*over 2 processes"):
    run_lib.build_run(c)
  assert not (tmp_path / "run" / "config.json").exists()
  c.rollout.prompts_per_step, c.mesh.data = 4, 2  # 2 groups and one device per process: accepted
  run_lib.check_processes(c)


@pytest.mark.slow
def test_groups_that_cannot_be_split_over_the_processes_are_refused(tmp_path):
  """Two real processes (about 13 s): each exits 1 with the message, nothing written."""
  policy, teacher = _models(tmp_path)
  outs = _launch(tmp_path, _overrides(tmp_path, policy, teacher, prompts=3), tmp_path / "run")
  for code, out in outs:
    assert code == 1, out[-3000:]
    assert "config.rollout.prompts_per_step=3" in out and "over 2 processes" in out, out[-3000:]
  assert not (tmp_path / "run" / "config.json").exists()


@pytest.mark.slow
def test_sigterm_to_one_process_stops_every_process_after_the_same_step(tmp_path):
  """A preempted pod host: SIGTERM reaches one process; all of them checkpoint the same step, exit 0, and the same
  command resumes after it."""
  policy, teacher = _models(tmp_path)
  overrides = [o for o in _overrides(tmp_path, policy, teacher) if not o.startswith("--config.total_steps")]
  run_dir = tmp_path / "run"
  procs = _start([*overrides, "--config.total_steps=1000", "--config.eval.at_end=False"], run_dir)
  metrics = run_dir / "metrics.jsonl"
  deadline = time.time() + 600
  while time.time() < deadline and all(p.poll() is None for p in procs):
    if metrics.is_file() and '"phase": "rl"' in metrics.read_text():
      break
    time.sleep(0.5)
  assert all(p.poll() is None for p in procs), _wait(procs)
  procs[1].send_signal(signal.SIGTERM)
  outs = _wait(procs)
  steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"phase": "rl"' in line]
  for k, (code, out) in enumerate(outs):
    assert code == 0, f"process {k} exited {code}:\n{out[-4000:]}"
    assert f"stopped by SIGTERM after RL step {steps[-1]}, checkpointed in" in out, out[-3000:]
  assert str(steps[-1]) in os.listdir(run_dir / "checkpoints")
  resumed = _launch(
    tmp_path, [*overrides, f"--config.total_steps={steps[-1] + 1}", "--config.eval.at_end=False"], run_dir
  )
  for k, (code, out) in enumerate(resumed):
    assert code == 0, f"process {k} exited {code}:\n{out[-4000:]}"
    assert f"resuming at RL step {steps[-1]}" in out
  rl = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"phase": "rl"' in line]
  assert rl == steps + [steps[-1] + 1]
