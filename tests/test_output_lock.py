"""One writer per output (issue 54 case 5): a second process writing to a held workdir, eval folder or credit file is
refused at once naming the holder; a lock left by a killed process is free again; every command that writes an
output folder or file takes it (train, sft, eval, credit --out)."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from jaxcredit import output_lock
from jaxcredit.output_lock import OutputBusyError
from tests.fixtures.cli import run_cli
from tests.fixtures.tiny_run import tiny_run_config, tiny_run_overrides

HOLDER = textwrap.dedent(
  """
  import sys, time
  from jaxcredit import output_lock
  with output_lock.hold(sys.argv[1], sys.argv[2], is_file=sys.argv[3] == "file"):
    print("held", flush=True)
    time.sleep(600)
  """
)


@pytest.fixture
def holder():
  """Starts a process holding a lock (output, command, "file"/"folder"); kills every one at the end."""
  procs = []

  def start(output, command="train", kind="folder"):
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(output), command, kind], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    procs.append(p)
    return p

  yield start
  for p in procs:
    p.kill()
    p.wait()


def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_holders_lock_is_free(tmp_path, holder):
  out = tmp_path / "run"
  p = holder(out, "train")
  with pytest.raises(OutputBusyError) as e:
    with output_lock.hold(str(out), "eval"):
      pass
  message = str(e.value)
  assert message.startswith(f"{out} is being written by `jaxcredit train` (pid {p.pid} on ")
  assert message.endswith("wait for it to end, stop it, or choose another folder")
  p.send_signal(signal.SIGKILL)  # a crash: the kernel releases the lock, the file stays
  p.wait()
  assert os.path.isfile(out / output_lock.LOCK_NAME)
  with output_lock.hold(str(out), "eval") as path:
    assert path == str(out / output_lock.LOCK_NAME)
    with pytest.raises(OutputBusyError, match="jaxcredit eval"):  # also refused within one process
      with output_lock.hold(str(out), "train"):
        pass
  with output_lock.hold(str(out), "train"):  # released at the end of the block
    pass


def test_a_file_output_is_locked_beside_it(tmp_path, holder):
  out = tmp_path / "credited.jsonl"
  holder(out, "credit", "file")
  with pytest.raises(OutputBusyError, match="choose another file"):
    with output_lock.hold(str(out), "credit", is_file=True):
      pass
  with output_lock.hold(str(tmp_path / "other.jsonl"), "credit", is_file=True):  # another file of the folder: free
    pass
  assert not out.exists()  # the lock never creates the output itself


@pytest.mark.parametrize("command", ["train", "sft"])
def test_train_and_sft_refuse_a_held_workdir_before_writing_anything(command, tmp_path, tiny, holder):
  c = tiny_run_config("quickstart", tmp_path / "w", tiny)
  holder(c.workdir, "train")
  from jaxcredit.train.commands import trainer

  with pytest.raises(OutputBusyError, match="is being written by `jaxcredit train`"):
    trainer.train(c, sft_only=command == "sft")
  assert sorted(os.listdir(c.workdir)) == [output_lock.LOCK_NAME]  # no config.json, no metrics


def test_eval_and_credit_refuse_a_held_output_with_one_line_and_exit_2(tmp_path, tiny, holder):
  out = tmp_path / "ev"
  holder(out, "eval")
  overrides = tiny_run_overrides(tiny.gguf_path, tmp_path / "unused", tiny.cache_dir, eval__num_tasks=2)
  r = run_cli("eval", "--config", "configs/quickstart.py", *overrides, "--out", str(out))
  assert r.returncode == 2, r.stderr[-2000:]
  assert (
    r.stderr.strip().splitlines()[-1].startswith(f"jaxcredit eval: error: {out} is being written by `jaxcredit eval`")
  )
  assert sorted(os.listdir(out)) == [output_lock.LOCK_NAME]

  rollouts = tmp_path / "in.jsonl"
  rollouts.write_text("")
  credited = tmp_path / "out.jsonl"
  holder(credited, "credit", "file")
  r = run_cli("credit", "--config", "configs/grpo.py", "--in", str(rollouts), "--out", str(credited))
  assert r.returncode == 2, r.stderr[-2000:]
  assert "is being written by `jaxcredit credit`" in r.stderr.strip().splitlines()[-1]
