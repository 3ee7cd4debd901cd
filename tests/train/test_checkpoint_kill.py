"""`kill -9` while a checkpoint is being written leaves the previous checkpoint loadable: orbax writes each step
into a temporary folder and renames it when complete, and the trainer's Checkpointer only sees complete steps."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np

from jaxcredit.train.loop.checkpoint import Checkpointer

SAVER = textwrap.dedent("""
    import sys
    import numpy as np
    from jaxcredit.train.loop.checkpoint import Checkpointer

    ckpt = Checkpointer(sys.argv[1], max_to_keep=2)
    for step in range(1, 1000):
      # Each step's arrays hold the step number: a restore shows which step it read, and whether it is whole.
      params = {"w": np.full((2048, 1024), step, np.float32), "b": np.full((7,), step, np.float32)}
      opt_state = {"mu": np.full((2048, 1024), -step, np.float32)}
      ckpt.save(step, params, opt_state, {"rl_step": step})
      print(step, flush=True)
""")


def _kill_during_saves(workdir, delay_s) -> list[str]:
  """Starts the saver, waits until step 2 is written, kills it with SIGKILL `delay_s` later; the folder listing."""
  proc = subprocess.Popen(
    [sys.executable, "-c", SAVER, str(workdir)],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  saved = 0
  while saved < 2:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()[-3000:]
    saved = int(line)
  time.sleep(delay_s)
  proc.send_signal(signal.SIGKILL)
  proc.wait(timeout=60)
  return sorted(os.listdir(workdir / "checkpoints"))


def test_kill_9_during_a_save_leaves_the_previous_step_loadable(tmp_path):
  like_p = {"w": np.zeros((2048, 1024), np.float32), "b": np.zeros((7,), np.float32)}
  like_o = {"mu": np.zeros((2048, 1024), np.float32)}
  caught_mid_save = False
  for attempt, delay_s in enumerate((0.2, 0.3, 0.1, 0.25, 0.15, 0.35, 0.05, 0.4)):
    workdir = tmp_path / str(attempt)
    listing = _kill_during_saves(workdir, delay_s)
    partial = [n for n in listing if "orbax-checkpoint-tmp" in n]
    ckpt = Checkpointer(str(workdir), max_to_keep=2)
    latest = ckpt.latest_step()
    assert latest is not None and latest >= 2, listing
    if partial:  # killed while writing step latest + 1: that step is invisible, the one before it whole
      caught_mid_save = True
      assert partial == [f"{latest + 1}.orbax-checkpoint-tmp"], listing
    params, opt_state, meta = ckpt.restore(latest, like_p, like_o)
    assert meta == {"rl_step": latest}
    for leaf in jax.tree.leaves(params):
      np.testing.assert_array_equal(np.asarray(leaf), latest)
    np.testing.assert_array_equal(np.asarray(opt_state["mu"]), -latest)
    ckpt.save(latest + 1, like_p, like_o, {"rl_step": latest + 1})  # a rerun goes on saving after the kill
    assert ckpt.latest_step() == latest + 1
    if caught_mid_save:
      break
  assert caught_mid_save, "no kill landed inside a save in 8 tries"
