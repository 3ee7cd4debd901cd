"""A server this process starts and stops: the vLLM engine's (`jaxcredit.sampling.vllm_engine.launch_server`) and an
OpenEnv environment's (`jaxcredit.envs.openenv`).

`launch` starts a command as its own process group with its output in a log file, polls `ready()` until it answers,
and returns a `ServerProcess`; `ServerProcess.stop` sends SIGTERM to the group, then SIGKILL. On Linux the server
also gets SIGTERM when the launching process dies, even by SIGKILL (prctl PR_SET_PDEATHSIG), and an `atexit` hook
stops it at interpreter exit, so a killed run leaves no server behind.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# Run first in the server's Python, which then becomes the server (exec): SIGTERM it when the launching process
# dies, even by SIGKILL (Linux prctl PR_SET_PDEATHSIG, kept across exec; elsewhere only `ServerProcess.stop` and the
# atexit hook stop it). A wrapper rather than a `preexec_fn`: forking a multithreaded (JAX) process to run Python
# code before exec can deadlock.
_DIE_WITH_PARENT = (
  "import ctypes, os, shutil, signal, sys\n"
  "try:\n"
  "  ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)\n"
  "except (OSError, AttributeError):\n"
  "  pass\n"
  "exe = shutil.which(sys.argv[1]) or sys.argv[1]\n"
  "os.execv(exe, sys.argv[1:])"
)


class ServerProcess:
  """A server this process launched: a process group, its URL, its log file, and how to stop it."""

  def __init__(self, proc: subprocess.Popen, url: str, log_path: Path):
    self.proc, self.url, self.log_path = proc, url, log_path
    atexit.register(self.stop)

  @property
  def pid(self) -> int:
    return self.proc.pid

  def running(self) -> bool:
    return self.proc.poll() is None

  def log_tail(self, lines: int = 15) -> str:
    try:
      return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
      return ""

  def stop(self, grace_s: float = 20.0) -> None:
    """SIGTERM to the server's process group, SIGKILL after `grace_s`; idempotent."""
    if self.proc.poll() is not None:
      return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
      try:
        os.killpg(self.proc.pid, sig)
      except ProcessLookupError:
        return
      try:
        self.proc.wait(wait)
        return
      except subprocess.TimeoutExpired:
        continue


def launch(
  cmd: Sequence[str],
  *,
  url: str,
  ready: Callable[[], bool],
  log_path: str | os.PathLike,
  what: str,
  error: type[Exception] = RuntimeError,
  env: Mapping[str, str] | None = None,
  cwd: str | os.PathLike | None = None,
  startup_timeout_s: float = 120.0,
  poll_s: float = 1.0,
  progress: Callable[[str], None] | None = None,
) -> ServerProcess:
  """Starts `cmd` as its own process group and waits until `ready()` is true.

  Args:
    cmd: the command and its arguments (the first found on PATH when it is not a path).
    url: the address the server will answer at (kept on the returned `ServerProcess`).
    ready: polled every `poll_s` seconds; True once the server answers (exceptions count as not yet).
    log_path: the server's stdout and stderr are appended here.
    what: the server's name in messages ("the vLLM server", "the OpenEnv server").
    error: the exception type raised when it does not start.
    env: the server's environment (default: this process's).
    cwd: the server's working directory (default: this process's).
    startup_timeout_s: how long to wait for `ready()`.
    progress: called with a short status line while waiting.

  Returns:
    The running `ServerProcess`, stopped by `stop()` and at interpreter exit.

  Raises:
    `error`: the command exited, or did not answer within `startup_timeout_s` (with the tail of its log); the
      process group is stopped first.
  """
  log_path = Path(log_path)
  log_path.parent.mkdir(parents=True, exist_ok=True)
  with open(log_path, "ab") as log:
    try:
      proc = subprocess.Popen(
        [sys.executable, "-c", _DIE_WITH_PARENT, *cmd],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=None if env is None else dict(env),
        cwd=cwd,
        start_new_session=True,
      )
    except OSError as e:
      raise error(f"{what} could not be started ({' '.join(cmd[:3])}): {e}") from None
  server = ServerProcess(proc, url, log_path)
  deadline = time.time() + startup_timeout_s
  t0 = time.time()
  try:
    while True:
      if proc.poll() is not None:
        raise error(
          f"{what} ({' '.join(cmd[:3])}) exited with code {proc.returncode} while starting; the end of "
          f"{log_path}:\n{server.log_tail()}"
        )
      try:
        answered = bool(ready())
      except Exception:  # noqa: BLE001 - not answering yet, whatever the client raises
        answered = False
      if answered:
        return server
      if time.time() > deadline:
        raise error(
          f"{what} did not answer at {url} within {startup_timeout_s:.0f} s; the end of {log_path}:\n"
          f"{server.log_tail()}"
        )
      if progress is not None:
        progress(f"waiting for {what} at {url} ({time.time() - t0:.0f} s)")
      time.sleep(poll_s)
  except BaseException:
    server.stop()
    raise
