"""One writer per output: `train`, `sft`, `eval` and `credit --out` hold a lock on what they write, so a second
process pointed at the same workdir, eval folder or credit file is refused at once, naming the holder.

The lock is an advisory `fcntl.flock` on a small file beside the output (`<folder>/.jaxcredit.lock`, or
`.<name>.jaxcredit.lock` next to an output file), holding the holder's command, process id, host and start time as
JSON. The kernel releases a flock when its process exits, however it exits (a crash, SIGKILL, the OOM killer), so a
lock left by a dead process is stale by construction and the next run simply takes it; the file itself stays (removing
it would let two processes lock two different files of the same name). On a file system without flock (some network
mounts) the lock is skipped with a warning: nothing stops a second writer there.

Without this, two `train` runs started a second apart in one workdir both exited 0 with metrics.jsonl holding steps
1, 2, 3, 1, 2, 3, and two evals into one folder wrote every rollout twice (issue 54).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import socket
from typing import Iterator

log = logging.getLogger(__name__)

LOCK_NAME = ".jaxcredit.lock"


class OutputBusyError(RuntimeError):
  """Another live process holds the output's lock; the message names it and the output."""


def lock_path(output: str, *, is_file: bool = False) -> str:
  """The lock file of an output folder (`<folder>/.jaxcredit.lock`) or output file (`.<name>.jaxcredit.lock` in its
  folder)."""
  if is_file:
    folder, name = os.path.split(os.path.abspath(output))
    return os.path.join(folder, f".{name}{LOCK_NAME}")
  return os.path.join(output, LOCK_NAME)


def _holder(fd: int) -> str:
  """The holder's description from the lock file's JSON, or "another process" when it cannot be read."""
  try:
    os.lseek(fd, 0, os.SEEK_SET)
    info = json.loads(os.read(fd, 4096).decode() or "{}")
    return (
      f"`jaxcredit {info.get('command', '?')}` (pid {info.get('pid', '?')} on {info.get('host', '?')}, since "
      f"{info.get('started', '?')})"
    )
  except (OSError, ValueError):
    return "another process"


@contextlib.contextmanager
def hold(output: str, command: str, *, is_file: bool = False) -> Iterator[str]:
  """Holds the lock of `output` (a folder, created if missing, or with `is_file` a file path whose folder must exist
  or is created) for the `with` block; yields the lock file's path.

  Raises:
    OutputBusyError: a live process holds it: "<output> is being written by `jaxcredit train` (pid 123 on host, since
      2026-12-06T15:00:00); wait for it to end, stop it, or choose another folder".
  """
  path = lock_path(output, is_file=is_file)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      what = "file" if is_file else "folder"
      raise OutputBusyError(
        f"{output} is being written by {_holder(fd)}; wait for it to end, stop it, or choose another {what}"
      ) from None
    except OSError as e:
      if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        raise
      log.warning("%s: this file system does not lock files (%s); a second writer would not be refused", output, e)
      yield path
      return
    info = {
      "command": command,
      "pid": os.getpid(),
      "host": socket.gethostname(),
      "started": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(info).encode())
    try:
      yield path
    finally:
      fcntl.flock(fd, fcntl.LOCK_UN)
  finally:
    os.close(fd)
